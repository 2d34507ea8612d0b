"""Quantized weights kept in llama.cpp's block formats, dequantized by the kernels that read them.

Stage: graph construction (used by decoder.py). Input: a weight's uint8 blocks as a device Tensor of
shape (rows, nblocks, block_bytes), its format (Q8_0 or Q4_0) and its logical (rows, cols). Output:
the float32 values as a lazy Tensor expression (`QuantWeight.dequantize`, `QuantWeight.rows`), which
the scheduler fuses into the matmul or lookup that reads it (schedule/fusion.py: DECOMPRESS_RATIO), so
the device holds the blocks alone and each kernel unpacks them in registers.

The dequantization is ordinary tensor arithmetic (slices, casts, shifts, masks, BITCAST, multiplies):
every backend and polygrad-js run it as they run any kernel, and a saved bundle stores it in the kernels
(docs/architecture.md, "Where lowering lives"). It reproduces the `gguf` package's dequantizer bit for bit:

  Q8_0: 34 bytes per 32 weights: float16 scale d, then 32 int8 q;          w[j] = d * q[j]
  Q4_0: 18 bytes per 32 weights: float16 scale d, then 16 bytes; byte j's low nibble is weight j,
        its high nibble weight j + 16;                                       w[j] = d * (nibble - 8)

Blocks run along the columns (a row holds cols / 32 whole blocks), so a row (an output feature of a
projection, a token's embedding) is read without touching any other row.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from polygrad import Tensor, dtypes

from polygrad_hf.errors import CheckpointError

BLOCK = 32  # weights per block, both formats
BLOCK_BYTES = {"Q8_0": 34, "Q4_0": 18}  # 2 bytes of float16 scale, then the quants


def check_blocks(arr: np.ndarray, fmt: str, shape: tuple[int, int], where: str) -> np.ndarray:
    """The uint8 blocks of a (rows, cols) tensor of `fmt` as a (rows, cols // 32, block_bytes) array;
    CheckpointError naming `where` (the file and tensor) when they do not fit."""
    if fmt not in BLOCK_BYTES:
        raise CheckpointError(f"{where}: block format {fmt!r} is not kept quantized; formats: {list(BLOCK_BYTES)}")
    rows, cols = shape
    if cols % BLOCK:
        raise CheckpointError(f"{where}: {fmt} tensor of shape {[rows, cols]} has rows of {cols} values, not a "
                              f"multiple of the {BLOCK}-value block; llama.cpp writes whole blocks, so the file is "
                              "corrupt")
    want = (rows, cols // BLOCK, BLOCK_BYTES[fmt])
    if arr.dtype != np.uint8 or arr.size != int(np.prod(want)):
        raise CheckpointError(f"{where}: {fmt} tensor of shape {[rows, cols]} needs {int(np.prod(want))} bytes of "
                              f"blocks, got {arr.size} {arr.dtype} values")
    return arr.reshape(want)


def dequantize_blocks(blocks: Tensor, fmt: str) -> Tensor:
    """float32 values (..., nblocks * 32) of uint8 blocks (..., nblocks, block_bytes), as a lazy expression."""
    *lead, nb, _ = blocks.shape
    return _grouped(blocks, fmt).reshape(*lead, nb * BLOCK)


def _grouped(blocks: Tensor, fmt: str) -> Tensor:
    """float32 values (..., nblocks, 2, 16) of uint8 blocks (..., nblocks, block_bytes): a block's two halves
    on their own axis, so a reduction over a row runs as loops over blocks and halves, with no division
    of the column index (and Q4_0's low and high nibbles need no per-value test of the half)."""
    *lead, nb, nbytes = blocks.shape
    if fmt not in BLOCK_BYTES or nbytes != BLOCK_BYTES[fmt]:
        raise CheckpointError(f"blocks of {nbytes} bytes are not {fmt} (formats: {BLOCK_BYTES})")
    full = (*lead, nb, 2, BLOCK // 2)
    # the scale's two bytes are broadcast over the block before any arithmetic: an expand of the buffer
    # itself is a plain load, where an expand of the computed scale would give it a buffer of its own
    lo = blocks[..., 0:1].unsqueeze(-1).expand(*full).cast(dtypes.uint16)
    hi = blocks[..., 1:2].unsqueeze(-1).expand(*full).cast(dtypes.uint16)
    scale = (lo | (hi << 8)).bitcast(dtypes.float16).cast(dtypes.float32)
    quants = blocks[..., 2:]
    if fmt == "Q8_0":
        values = quants.bitcast(dtypes.int8).reshape(*full).cast(dtypes.float32)
    else:  # low nibbles are weights 0..15, high nibbles 16..31
        nibbles = (quants & 15).unsqueeze(-2).cat((quants >> 4).unsqueeze(-2), dim=-2)
        values = nibbles.cast(dtypes.float32) - 8.0
    return values * scale


@dataclass(frozen=True)
class QuantWeight:
    """A (rows, cols) weight held as its uint8 blocks on the device.

    >>> import gguf, numpy as np                                              # doctest: +SKIP
    >>> w = np.random.default_rng(0).standard_normal((4, 64)).astype(np.float32)
    >>> q = gguf.quants.quantize(w, gguf.GGMLQuantizationType.Q4_0)           # (4, 36) uint8
    >>> qw = QuantWeight(Tensor(q.reshape(4, 2, 18)), "Q4_0", (4, 64))
    >>> qw.dequantize().numpy()  # == gguf.quants.dequantize(q, ...), bit for bit
    """

    blocks: Tensor  # uint8 (rows, cols // 32, block_bytes)
    format: str
    shape: tuple[int, int]

    def __post_init__(self) -> None:
        rows, cols = self.shape
        want = (rows, cols // BLOCK, BLOCK_BYTES.get(self.format, -1))
        if cols % BLOCK or tuple(self.blocks.shape) != want or self.blocks.dtype is not dtypes.uint8:
            raise CheckpointError(f"QuantWeight {self.format} {list(self.shape)} needs uint8 blocks of shape "
                                  f"{list(want)}, got {self.blocks.dtype} {list(self.blocks.shape)}")

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.blocks.shape))

    def dequantize(self) -> Tensor:
        """The float32 (rows, cols) values, lazily: fused into the kernel that reads them."""
        return dequantize_blocks(self.blocks, self.format)

    def matmul_t(self, x: Tensor) -> Tensor:
        """x @ W.T for x (..., cols): (..., rows), summed over blocks and halves so the kernel's loops follow
        the blocks (see _grouped); the dequantization is part of the matmul's kernel."""
        rows, cols = self.shape
        nb = cols // BLOCK
        if x.shape[-1] != cols:
            raise CheckpointError(f"x @ W.T: x has {x.shape[-1]} columns, the {self.format} weight {cols}")
        lead = x.shape[:-1]
        values = _grouped(self.blocks, self.format)  # (rows, nb, 2, 16)
        return (x.reshape(*lead, 1, nb, 2, BLOCK // 2) * values).sum((-3, -2, -1))

    def rows(self, ids: Tensor) -> Tensor:
        """Rows at integer `ids` (any shape) as float32 ids.shape + (cols,): the blocks of those rows are
        gathered, then dequantized (an embedding lookup reads tokens x cols weights, not the table)."""
        rows, cols = self.shape
        _, nb, nbytes = self.blocks.shape
        flat = ids.reshape(-1, 1)
        picked = self.blocks.reshape(rows, nb * nbytes).gather(0, flat.expand(flat.shape[0], nb * nbytes))
        return dequantize_blocks(picked.reshape(-1, nb, nbytes), self.format).reshape(*ids.shape, cols)

    def row_range(self, start: Any, stop: Any) -> Tensor:
        """Rows start..stop (ints or Variables) as float32 (stop - start, cols)."""
        return dequantize_blocks(self.blocks[start:stop], self.format)
