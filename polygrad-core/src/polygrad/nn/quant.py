"""Weights kept in llama.cpp's block formats: quantized on the host, dequantized by the kernels that read them.

Stage: graph construction. Input: float weights (NumPy arrays or Tensors) and a format of
polygrad/definitions/quant_formats.py, or a weight's uint8 blocks already in that format (a GGUF
tensor). Output: `quantize_rows` (the uint8 blocks, byte for byte what the `gguf` package writes) and
`QuantWeight`, whose float32 values are a lazy tensor expression (`dequantize`, `matmul_t`, `rows`)
that the scheduler fuses into the matmul or lookup reading it (schedule/fusion.py: DECOMPRESS_RATIO),
so the device holds the blocks alone and each kernel unpacks them in registers.

The dequantization is ordinary tensor arithmetic (slices, casts, shifts, masks, BITCAST, multiplies):
every backend and polygrad-js run it as they run any kernel, and a saved bundle stores it in the kernels
(docs/architecture.md, "Where lowering lives"). It gives the `gguf` package's dequantized values bit for
bit. Blocks run along the columns (a row holds cols / 32 whole blocks), so a row (an output feature of a
projection, a token's embedding) is read without touching any other row.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from polygrad.definitions.quant_formats import BY_NAME, SCALE_BYTES, BlockFormatDef
from polygrad.dtype import dtypes
from polygrad.errors import QuantizationError
from polygrad.tensor import Tensor

PLANNED = ("Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K", "Q8_K")  # llama.cpp formats not kept yet (issue 30)


def block_format(name: Any) -> BlockFormatDef:
    """The block format named `name` ("q8_0" or "Q8_0"); QuantizationError listing the formats otherwise.

    >>> block_format("q4_0").block_bytes
    18
    """
    key = name.upper() if isinstance(name, str) else name
    if key in BY_NAME:
        return BY_NAME[key]
    known = ", ".join(repr(n.lower()) for n in BY_NAME)
    if key in PLANNED:
        raise QuantizationError(f"format {name!r} is not implemented yet; weights can be quantized to {known}")
    raise QuantizationError(f"unknown quantization format {name!r}; use one of {known}")


def quantize_rows(values: np.ndarray, fmt: Any) -> np.ndarray:
    """The uint8 blocks (rows, cols // 32, block_bytes) of a float (rows, cols) array, rounded to nearest
    per block as llama.cpp does (the rules are in definitions/quant_formats.py); the same bytes as
    `gguf.quants.quantize`.

    >>> quantize_rows(np.full((1, 32), 0.5, np.float32), "q8_0")[0, 0, :4].tolist()  # d = 0.5/127, q = 127
    [8, 28, 127, 127]
    """
    f = block_format(fmt)
    arr = np.asarray(values)
    if arr.ndim != 2 or arr.dtype.kind != "f":
        raise QuantizationError(f"quantize_rows takes a 2-d float array, got {arr.dtype} of shape {list(arr.shape)}")
    rows, cols = arr.shape
    if cols % f.block:
        raise QuantizationError(f"{f.name} needs rows of whole {f.block}-value blocks; a row here has {cols} values")
    blocks = arr.astype(np.float32).reshape(rows * cols // f.block, f.block)
    if f.name == "Q8_0":
        scale, quants = _q8_0(blocks)
    else:
        scale, quants = _q4_0(blocks)
    out = np.concatenate([scale.astype(np.float16).view(np.uint8), quants], axis=1)
    return out.reshape(rows, cols // f.block, f.block_bytes)


def _reciprocal(d: np.ndarray) -> np.ndarray:
    """1 / d, and 0 where d is 0 (an all-zero block: every quant becomes the zero point)."""
    with np.errstate(divide="ignore"):
        return np.where(d == 0, np.float32(0), np.float32(1) / d).astype(np.float32)


def _q8_0(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q8_0: d = max|w| / 127; q = w / d rounded half away from zero (in float32, as ggml does)."""
    d = (np.abs(blocks).max(axis=1, keepdims=True) / np.float32(127)).astype(np.float32)
    scaled = blocks * _reciprocal(d)
    magnitude = np.abs(scaled)
    whole = np.floor(magnitude)
    rounded = whole + (magnitude - whole >= np.float32(0.5))  # the fraction is exact: no double rounding
    return d, (np.sign(scaled) * rounded).astype(np.int8).view(np.uint8)


def _q4_0(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_0: d = (the weight of largest magnitude) / -8; nibble = min(15, trunc(w / d + 8.5)), packed in halves."""
    largest = np.take_along_axis(blocks, np.abs(blocks).argmax(axis=1)[:, None], axis=1)
    d = (largest / np.float32(-8)).astype(np.float32)
    nibbles = np.minimum(np.trunc(blocks * _reciprocal(d) + np.float32(8.5)), 15).astype(np.uint8)
    half = blocks.shape[1] // 2
    return d, nibbles[:, :half] | (nibbles[:, half:] << np.uint8(4))


def dequantize_blocks(blocks: Tensor, fmt: Any) -> Tensor:
    """float32 values (..., nblocks * 32) of uint8 blocks (..., nblocks, block_bytes), as a lazy expression."""
    *lead, nb, _ = blocks.shape
    return _grouped(blocks, block_format(fmt)).reshape(*lead, nb * block_format(fmt).block)


def _half_shifts(bits: int, device: str) -> Tensor:
    """(2, 1) uint32 [0, bits] from host data: an expand of a buffer is a plain load in the matmul's kernel (an
    expand of a computed arange would be a kernel and a buffer of its own). Made per call, so a Model capture
    records it as a constant of its own."""
    return Tensor(np.array([[0], [bits]], dtype=np.uint32), device=device)


def _grouped(blocks: Tensor, f: BlockFormatDef) -> Tensor:
    """float32 values (..., nblocks, 2, block / 2) of uint8 blocks (..., nblocks, block_bytes): a block's two
    halves on their own axis, so a reduction over a row runs as loops over blocks and halves, with no
    division of the column index (and Q4_0's low and high nibbles need no per-value test of the half)."""
    *lead, nb, nbytes = blocks.shape
    if nbytes != f.block_bytes:
        raise QuantizationError(f"blocks of {nbytes} bytes are not {f.name} ({f.block_bytes} bytes a block)")
    full = (*lead, nb, 2, f.block // 2)
    # the scale's two bytes are broadcast over the block before any arithmetic: an expand of the buffer
    # itself is a plain load, where an expand of the computed scale would give it a buffer of its own
    lo = blocks[..., 0:1].unsqueeze(-1).expand(*full).cast(dtypes.uint16)
    hi = blocks[..., 1:2].unsqueeze(-1).expand(*full).cast(dtypes.uint16)
    scale = (lo | (hi << 8)).bitcast(dtypes.float16).cast(dtypes.float32)
    quants = blocks[..., SCALE_BYTES:]
    if f.halves:  # 4-bit: low nibbles are weights 0..15, high nibbles 16..31
        mask = (1 << f.bits) - 1
        # half h is (byte >> bits * h) & mask: both halves read the same bytes with no select between two
        # loads (a cat gates them, and gated byte loads got no vector lanes: a Q4_0 prompt ran 4.5x slower)
        nibbles = (quants.unsqueeze(-2) >> _half_shifts(f.bits, blocks.device)) & mask
        values = nibbles.cast(dtypes.float32) - float(f.offset)
    else:  # 8-bit signed quants in block order
        values = quants.bitcast(dtypes.int8).reshape(*full).cast(dtypes.float32)
    return values * scale


@dataclass(frozen=True)
class QuantWeight:
    """A (rows, cols) weight held as its uint8 blocks on the device; its values are computed in the kernels
    that read them.

    >>> w = np.random.default_rng(0).standard_normal((4, 64)).astype(np.float32)
    >>> qw = QuantWeight.from_float(w, "q4_0")
    >>> qw.blocks.shape, qw.nbytes, float(np.abs(qw.dequantize().numpy() - w).max()) < 0.5
    ((4, 2, 18), 144, True)
    """

    blocks: Tensor  # uint8 (rows, cols // 32, block_bytes)
    format: str     # "Q8_0" or "Q4_0" (definitions/quant_formats.py)
    shape: tuple[int, int]

    def __post_init__(self) -> None:
        f = block_format(self.format)
        object.__setattr__(self, "format", f.name)
        rows, cols = self.shape
        want = (rows, cols // f.block, f.block_bytes)
        if cols % f.block or tuple(self.blocks.shape) != want or self.blocks.dtype is not dtypes.uint8:
            raise QuantizationError(f"QuantWeight {f.name} {list(self.shape)} needs uint8 blocks of shape "
                                    f"{list(want)}, got {self.blocks.dtype} {list(self.blocks.shape)}")

    @classmethod
    def from_float(cls, values: Any, fmt: Any, device: str | None = None) -> "QuantWeight":
        """Quantize a float (rows, cols) Tensor or array (quantize_rows) onto `device` (a Tensor's own by default)."""
        if isinstance(values, Tensor):
            if not values.dtype.is_float:
                raise QuantizationError(f"only float weights can be quantized, got a {values.dtype} tensor")
            device = values.device if device is None else device
            values = values.cast(dtypes.float32).numpy()  # 16-bit floats too (bfloat16's host form is its bits)
        blocks = quantize_rows(values, fmt)
        rows, cols = np.shape(values)
        return cls(Tensor(blocks, device=device, dtype=dtypes.uint8).realize(), fmt, (rows, cols))

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.blocks.shape))

    @property
    def device(self) -> str:
        return self.blocks.device

    def dequantize(self) -> Tensor:
        """The float32 (rows, cols) values, lazily: fused into the kernel that reads them."""
        return dequantize_blocks(self.blocks, self.format)

    def matmul_t(self, x: Tensor) -> Tensor:
        """x @ W.T for x (..., cols): (..., rows), summed over blocks and halves so the kernel's loops follow
        the blocks (see _grouped); the dequantization is part of the matmul's kernel."""
        f = block_format(self.format)
        rows, cols = self.shape
        if x.shape[-1] != cols:
            raise QuantizationError(f"x @ W.T: x has {x.shape[-1]} columns, the {f.name} weight {cols}")
        lead = x.shape[:-1]
        values = _grouped(self.blocks, f)  # (rows, nb, 2, block / 2)
        return (x.reshape(*lead, 1, cols // f.block, 2, f.block // 2) * values).sum((-3, -2, -1))

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
