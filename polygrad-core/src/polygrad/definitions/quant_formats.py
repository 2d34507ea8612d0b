"""The quantized block formats: llama.cpp's (GGML's) layouts, so blocks interoperate with GGUF files.

Stage: shared (definition). Input: nothing. Output: `FORMATS` (one `BlockFormatDef` per format a weight
can be kept in) and `BY_NAME`. polygrad/nn/quant.py quantizes to them and dequantizes them (as plain
tensor arithmetic, so polygrad-js runs the kernels without a table of its own); polygrad-hf reads them
for GGUF tensors. GGUF names a format in upper case ("Q8_0"), `polygrad.quantize` takes either case.

Every format is a run of blocks along a row; one block holds `block` weights in `block_bytes`. Scales
are little-endian float16 unless said otherwise; weight j of a block is w[j], byte k of it b[k].

32-weight blocks (d: float16 in b[0..1]; Q4_1 and Q5_1 add a float16 `m` in b[2..3]):
  Q8_0: 32 int8 quants q[j] from b[2];                                    w[j] = d * q[j]
  Q4_0: 16 bytes of nibbles from b[2]: byte i's low nibble is weight i, its high nibble weight i + 16;
        n is stored unsigned:                                             w[j] = d * (n[j] - 8)
  Q4_1: d, m, then Q4_0's nibbles from b[4]:                              w[j] = d * n[j] + m
  Q5_0: d, a little-endian uint32 qh in b[2..5] whose bit j is weight j's 5th bit, then the low nibbles
        from b[6] as Q4_0's; q = n | bit << 4:                            w[j] = d * (q[j] - 16)
  Q5_1: d, m, qh in b[4..7], nibbles from b[8]:                           w[j] = d * q[j] + m

256-weight super-blocks (the K-quants):
  Q4_K: d, dmin (float16, b[0..3]); 12 bytes of 6-bit sub-block scales and mins s[0..11] (b[4..15]);
        128 bytes of nibbles from b[16]. Weight j = 64c + 32h + i (c < 4, h < 2, i < 32) is the nibble h
        of byte 16 + 32c + i, in sub-block t = 2c + h; its scale and min (6 bits each) are, for t < 4,
        sc = s[t] & 63 and m = s[t + 4] & 63, and for t >= 4 sc = (s[t + 4] & 15) | (s[t - 4] >> 6) << 4,
        m = (s[t + 4] >> 4) | (s[t] >> 6) << 4.                          w = (d * sc) * n - dmin * m
  Q5_K: as Q4_K with 32 bytes qh in b[16..47] and the nibbles from b[48]: weight j = 32t + i takes bit t
        of qh[i] as its 5th bit.                                          w = (d * sc) * q - dmin * m
  Q6_K: 128 bytes of low nibbles ql (b[0..127]), 64 bytes of 2-bit high parts qh (b[128..191]), 16
        int8 scales sc (b[192..207]), d last (b[208..209]). Weight j = 128c + 32t + i (c < 2, t < 4,
        i < 32): the low 4 bits are ql[64c + 32(t % 2) + i] >> 4(t // 2), the high 2 bits
        qh[32c + i] >> 2t, and its scale sc[j // 16].                    w = (d * sc) * (q - 32)
  Q8_K: d a float32 (b[0..3]), 256 int8 quants from b[4], then 16 int16 sums of 16 quants each
        (llama.cpp's dot products use them; dequantization does not).   w[j] = d * q[j]

`groups`: the block's weights as nested axes (their product is `block`), chosen so each weight's byte,
shift and scale index are sums of per-axis terms with no division: polygrad/nn/quant.py dequantizes a
block into this shape and a matmul reduces over these axes, so its loops follow the block's structure.

Round to nearest (`polygrad.nn.quant.quantize_rows`; the 32-weight formats byte for byte the `gguf`
package's quantizer): Q8_0 takes d = max|w| / 127 and q = round(w / d); Q4_0 and Q5_0 take the weight of
largest magnitude M (the first one on a tie) and d = M / -8 (-16), then q = min(15 (31),
trunc(w / d + 8.5 (16.5))); Q4_1 and Q5_1 take m = min w and d = (max w - m) / 15 (31), then
q = min(15 (31), trunc((w - m) / d + 0.5)). The K-quants (gguf cannot quantize them; llama.cpp searches
for their scales): Q4_K (Q5_K) rounds each sub-block's step (max w - min(0, min w)) / 15 (31) and offset
-min(0, min w) to 6 bits of the super-block's d = (largest step) / 63 and dmin = (largest offset) / 63,
then each weight to the nearest of the 16 (32) levels those give; Q6_K rounds each 16-weight sub-block's
max|w| / 31 to an int8 multiple of d = (largest of them) / 127, then w / (d * sc) to -32..31; Q8_K takes
d = max|w| / 127 and q = round(w / d).
"""
from __future__ import annotations

from typing import NamedTuple, Tuple


class BlockFormatDef(NamedTuple):
    name: str                 # as GGUF and llama.cpp spell it ("Q8_0")
    ggml_type: int            # its GGMLQuantizationType value (the GGUF tensor-info type field)
    block: int                # weights per block
    block_bytes: int          # bytes per block: scales and quants
    groups: Tuple[int, ...]   # the block's weights as nested axes (see above); their product is `block`


FORMATS: Tuple[BlockFormatDef, ...] = (
    BlockFormatDef("Q8_0", 8, 32, 34, (2, 16)),
    BlockFormatDef("Q4_0", 2, 32, 18, (2, 16)),
    BlockFormatDef("Q4_1", 3, 32, 20, (2, 16)),
    BlockFormatDef("Q5_0", 6, 32, 22, (2, 2, 8)),
    BlockFormatDef("Q5_1", 7, 32, 24, (2, 2, 8)),
    BlockFormatDef("Q4_K", 12, 256, 144, (2, 2, 2, 32)),
    BlockFormatDef("Q5_K", 13, 256, 176, (2, 2, 2, 32)),
    BlockFormatDef("Q6_K", 14, 256, 210, (2, 2, 2, 2, 16)),
    BlockFormatDef("Q8_K", 15, 256, 292, (8, 32)),
)
BY_NAME = {f.name: f for f in FORMATS}
NAMES: Tuple[str, ...] = tuple(BY_NAME)
