"""The quantized block formats: llama.cpp's (GGML's) layouts, so blocks interoperate with GGUF files.

Stage: shared (definition). Input: nothing. Output: `FORMATS` (one `BlockFormatDef` per format a weight
can be kept in) and `BY_NAME`. polygrad/nn/quant.py quantizes to them and dequantizes them (as plain
tensor arithmetic, so polygrad-js runs the kernels without a table of its own); polygrad-hf reads them
for GGUF tensors. GGUF names a format in upper case ("Q8_0"), `polygrad.quantize` takes either case.

Every format here is a run of blocks along a row; one block holds `block` weights in `block_bytes`:
a little-endian float16 scale `d` in bytes 0..1, then the quants from byte 2.

  Q8_0: 32 int8 quants q[j];                                          w[j] = d * q[j]
  Q4_0: 16 bytes; byte j's low nibble is weight j, its high nibble weight j + 16 (`halves`);
        the nibble n is stored with `offset` 8 added:                 w[j] = d * (n - 8)

Round to nearest (`polygrad.nn.quant.quantize_rows`, byte for byte the `gguf` package's quantizer):
Q8_0 takes d = max|w| / 127 and q = round(w / d); Q4_0 takes the weight of largest magnitude m
(the first one in the block on a tie) and d = m / -8, then n = min(15, trunc(w / d + 8.5)).
"""
from __future__ import annotations

from typing import NamedTuple, Tuple


class BlockFormatDef(NamedTuple):
    name: str         # as GGUF and llama.cpp spell it ("Q8_0")
    ggml_type: int    # its GGMLQuantizationType value (the GGUF tensor-info type field)
    block: int        # weights per block
    block_bytes: int  # bytes per block: the scale, then the quants
    bits: int         # bits per quant
    offset: int       # added to a quant when stored (0: signed int8; 8: unsigned nibbles)
    halves: bool      # 4-bit quants packed as byte j = weight j | weight j + block/2 << 4


SCALE_BYTES = 2  # the float16 scale at the start of every block
FORMATS: Tuple[BlockFormatDef, ...] = (
    BlockFormatDef("Q8_0", 8, 32, 34, 8, 0, False),
    BlockFormatDef("Q4_0", 2, 32, 18, 4, 8, True),
)
BY_NAME = {f.name: f for f in FORMATS}
NAMES: Tuple[str, ...] = tuple(BY_NAME)
