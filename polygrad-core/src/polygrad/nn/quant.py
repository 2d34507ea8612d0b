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

from polygrad import config
from polygrad.definitions.quant_formats import BY_NAME, BlockFormatDef
from polygrad.device import open_device
from polygrad.dtype import dtypes
from polygrad.engine import capture
from polygrad.errors import DeviceError, QuantizationError
from polygrad.nn.quantizers import QUANTIZERS
from polygrad.tensor import Tensor



def block_format(name: Any) -> BlockFormatDef:
    """The block format named `name` ("q8_0" or "Q8_0"); QuantizationError listing the formats otherwise.

    >>> block_format("q4_0").block_bytes
    18
    """
    key = name.upper() if isinstance(name, str) else name
    if key in BY_NAME:
        return BY_NAME[key]
    known = ", ".join(repr(n.lower()) for n in BY_NAME)
    raise QuantizationError(f"unknown quantization format {name!r}; use one of {known}")


def quantizable_format(name: Any) -> BlockFormatDef:
    """block_format(name) when float weights can be rounded to it (QUANTIZERS), else a QuantizationError
    listing those formats."""
    f = block_format(name)
    if f.name not in QUANTIZERS:
        known = ", ".join(repr(n.lower()) for n in QUANTIZERS)
        raise QuantizationError(f"format {name!r} is read from GGUF files but polygrad does not quantize to it; "
                                f"quantize to one of {known}")
    return f


QUANTIZE_CHUNK = 1 << 20  # values quantize_rows rounds at once (blocks are independent: any split, same bytes)


def quantize_rows(values: np.ndarray, fmt: Any) -> np.ndarray:
    """The uint8 blocks (rows, cols // block, block_bytes) of a float (rows, cols) array, rounded to nearest
    per block (polygrad/nn/quantizers.py; the rules are in definitions/quant_formats.py); for the 32-weight
    formats the same bytes as `gguf.quants.quantize`.

    >>> quantize_rows(np.full((1, 32), 0.5, np.float32), "q8_0")[0, 0, :4].tolist()  # d = 0.5/127, q = 127
    [8, 28, 127, 127]
    """
    f = quantizable_format(fmt)
    arr = np.asarray(values)
    if arr.ndim != 2 or arr.dtype.kind != "f":
        raise QuantizationError(f"quantize_rows takes a 2-d float array, got {arr.dtype} of shape {list(arr.shape)}")
    rows, cols = arr.shape
    if cols % f.block:
        raise QuantizationError(f"{f.name} needs rows of whole {f.block}-value blocks; a row here has {cols} values")
    out = np.empty((rows, cols // f.block, f.block_bytes), np.uint8)
    step = max(1, QUANTIZE_CHUNK // cols)  # rows at a time: the quantizer's temporaries stay a few MB, where a
    for r in range(0, rows, step):         # whole embedding's were several times its float32 size
        blocks = np.ascontiguousarray(arr[r:r + step], dtype=np.float32).reshape(-1, f.block)
        out[r:r + step] = QUANTIZERS[f.name](blocks).reshape(-1, cols // f.block, f.block_bytes)
    return out


def dequantize_blocks(blocks: Tensor, fmt: Any) -> Tensor:
    """float32 values (..., nblocks * block) of uint8 blocks (..., nblocks, block_bytes), as a lazy expression."""
    *lead, nb, _ = blocks.shape
    f = block_format(fmt)
    return _grouped(blocks, f).reshape(*lead, nb * f.block)


class _Fields:
    """Reads a format's fields out of uint8 blocks (..., nblocks, block_bytes), each broadcast over the
    block's grouped shape (..., nblocks, *groups) before any arithmetic: an expand of the buffer itself is
    a plain load in the kernel that reads it, where an expand of a computed value (a scale) would give
    that value a buffer of its own."""

    def __init__(self, blocks: Tensor, f: BlockFormatDef):
        *self.lead, self.nb, _ = blocks.shape
        self.blocks, self.f = blocks, f
        self.full = (*self.lead, self.nb, *f.groups)

    def u8(self, start: int, view: tuple[int, ...]) -> Tensor:
        """Bytes start.. of each block laid out as `view` (one entry per group axis, 1 where it broadcasts)."""
        count = int(np.prod(view))
        raw = self.blocks[..., start:start + count].reshape(*self.lead, self.nb, *view)
        return raw.expand(*self.full)

    def scalar(self, start: int, nbytes: int) -> Tensor:
        """The little-endian unsigned integer of bytes start..start + nbytes of each block (a block's scale)."""
        wide = dtypes.uint16 if nbytes == 2 else dtypes.uint32
        ones = (1,) * len(self.f.groups)
        value = self.u8(start, ones).cast(wide)
        for k in range(1, nbytes):
            value = value | (self.u8(start + k, ones).cast(wide) << 8 * k)
        return value

    def half(self, start: int) -> Tensor:
        """The float16 at bytes start..start + 1, as float32."""
        return self.scalar(start, 2).bitcast(dtypes.float16).cast(dtypes.float32)

    def group_index(self, first: int, last: int, step: int) -> Tensor:
        """step * (the flat index over group axes first..last), uint8, broadcast over the groups: computed in
        the kernel from its loop indices (IOTA), so an unrolled point holds a constant and the value's known
        range drops a shift's range guard (a table of shift amounts was a load, a guard and a select per
        use)."""
        shape = [1] * len(self.f.groups)
        shape[first:last + 1] = self.f.groups[first:last + 1]
        n = int(np.prod(shape))
        idx = Tensor.arange(n, dtype=dtypes.uint8, device=self.blocks.device).reshape(*shape).expand(*self.full)
        return idx if step == 1 else idx * step


def _nibbles(r: _Fields, start: int, view: tuple[int, ...], shift: Tensor) -> Tensor:
    """(byte >> shift) & 15 of the bytes from `start` in `view`: low and high nibbles read the same bytes
    with no select between two loads (a cat gates them, and gated byte loads got no vector lanes: a Q4_0
    prompt ran 4.5x slower)."""
    return (r.u8(start, view) >> shift) & 15


def _q8_0_values(r: _Fields) -> Tensor:
    quants = r.blocks[..., 2:].bitcast(dtypes.int8).reshape(*r.full)
    return quants.cast(dtypes.float32) * r.half(0)


def _q4_0_values(r: _Fields) -> Tensor:
    n = _nibbles(r, 2, (1, 16), r.group_index(0, 0, 4))
    return _offset(n, 8) * r.half(0)


def _offset(q: Tensor, offset: int) -> Tensor:
    """q - offset as float32 for uint8 quants q below 2 * offset: subtracted in int8, where 16 weights take
    one byte vector and the widening to float32 comes after (the same values as q.cast(float32) - offset,
    which is exact)."""
    return (q.bitcast(dtypes.int8) - offset).cast(dtypes.float32)


def _q4_1_values(r: _Fields) -> Tensor:
    n = _nibbles(r, 4, (1, 16), r.group_index(0, 0, 4))
    return r.half(0) * n.cast(dtypes.float32) + r.half(2)


def _five_bits(r: _Fields, qh: int, qs: int) -> Tensor:
    """Q5_0/Q5_1's 5-bit quants: groups (h, a, b) are weight 16h + 8a + b; its low nibble is half h of byte
    qs + 8a + b, its 5th bit bit b of byte qh + 2h + a (bit 16h + 8a + b of the little-endian uint32)."""
    low = _nibbles(r, qs, (1, 2, 8), r.group_index(0, 0, 4))
    high = (r.u8(qh, (2, 2, 1)) >> r.group_index(2, 2, 1)) & 1
    return low | (high << 4)


def _q5_0_values(r: _Fields) -> Tensor:
    return r.half(0) * _offset(_five_bits(r, 2, 6), 16)


def _q5_1_values(r: _Fields) -> Tensor:
    return r.half(0) * _five_bits(r, 4, 8).cast(dtypes.float32) + r.half(2)


def _k_scales(r: _Fields) -> tuple[Tensor, Tensor]:
    """Q4_K/Q5_K's 6-bit sub-block scale and min, as float32 d * sc and dmin * m. Groups (g, c2, h, i):
    sub-block t = 4g + 2c2 + h, and bytes a = s[2c2 + h], b = s[4 + 2c2 + h], c = s[8 + 2c2 + h]. For g = 0
    sc = a & 63 and m = b & 63; for g = 1 sc = (a >> 6) << 4 | c & 15 and m = (b >> 6) << 4 | c >> 4. Both
    are ((x >> 2g) & (63 - 15g)) | ((c >> 4g) & 15g) over the same byte loads, in uint8 (no widening: each
    operation here is evaluated for every weight the kernel reads, and a bundle's work cap counts them)."""
    g = r.group_index(0, 0, 1)
    shift, top, low = g * 2, 63 - g * 15, g * 15
    a, b, c = r.u8(4, (1, 2, 2, 1)), r.u8(8, (1, 2, 2, 1)), r.u8(12, (1, 2, 2, 1))
    sc = ((a >> shift) & top) | (c & low)
    m = ((b >> shift) & top) | ((c >> g * 4) & low)
    return r.half(0) * sc.cast(dtypes.float32), r.half(2) * m.cast(dtypes.float32)


def _q4_k_values(r: _Fields) -> Tensor:
    scale, low = _k_scales(r)
    n = _nibbles(r, 16, (2, 2, 1, 32), r.group_index(2, 2, 4))
    return scale * n.cast(dtypes.float32) - low


def _q5_k_values(r: _Fields) -> Tensor:
    scale, low = _k_scales(r)
    n = _nibbles(r, 48, (2, 2, 1, 32), r.group_index(2, 2, 4))
    high = (r.u8(16, (1, 1, 1, 32)) >> r.group_index(0, 2, 1)) & 1
    return scale * (n | (high << 4)).cast(dtypes.float32) - low


def _q6_k_values(r: _Fields) -> Tensor:
    """Groups (c, hh, t2, i2, i16): weight 128c + 32(2hh + t2) + 16i2 + i16."""
    low = (r.u8(0, (2, 1, 2, 2, 16)) >> r.group_index(1, 1, 4)) & 15
    high = (r.u8(128, (2, 1, 1, 2, 16)) >> r.group_index(1, 2, 2)) & 3
    q = _offset(low | (high << 4), 32)
    sc = r.u8(192, (2, 2, 2, 2, 1)).bitcast(dtypes.int8).cast(dtypes.float32)
    return (r.half(208) * sc) * q


def _q8_k_values(r: _Fields) -> Tensor:
    quants = r.blocks[..., 4:4 + r.f.block].bitcast(dtypes.int8).reshape(*r.full)
    return r.scalar(0, 4).bitcast(dtypes.float32) * quants.cast(dtypes.float32)


_VALUES = {"Q8_0": _q8_0_values, "Q4_0": _q4_0_values, "Q4_1": _q4_1_values, "Q5_0": _q5_0_values,
           "Q5_1": _q5_1_values, "Q4_K": _q4_k_values, "Q5_K": _q5_k_values, "Q6_K": _q6_k_values,
           "Q8_K": _q8_k_values}


def _grouped(blocks: Tensor, f: BlockFormatDef) -> Tensor:
    """float32 values (..., nblocks, *f.groups) of uint8 blocks (..., nblocks, block_bytes): the block's
    structure on axes of its own, so a reduction over a row runs as loops over blocks and groups, with no
    division of the column index (and no per-value test of which nibble or sub-block a weight is in)."""
    nbytes = blocks.shape[-1]
    if nbytes != f.block_bytes:
        raise QuantizationError(f"blocks of {nbytes} bytes are not {f.name} ({f.block_bytes} bytes a block)")
    return _VALUES[f.name](_Fields(blocks, f))


# formats whose matmuls may run on 8-bit activations: a decode step's matvec (_int8_matmul_t) and a
# prompt's rows (_int8_matmul_rows, weights of whole 8-row panels)
INT8_DOT_FORMATS = ("Q8_0", "Q4_0")


def int8_dot_enabled(device: str) -> bool:
    """Whether a Q8_0 or Q4_0 matmul on `device` rounds its activations to 8 bits and sums each block with
    integer dot products (_int8_matmul_t for one row, _int8_matmul_rows for a prompt's): where the device
    declares Capabilities.int8_dot and POLY_INT8_DOT is not 0."""
    return bool(config.get("POLY_INT8_DOT")) and bool(getattr(open_device(device).capabilities, "int8_dot", False))


def _one_row(lead: tuple) -> bool:
    """A decode step's shape: every leading size is 1 (a prompt's rows take _int8_matmul_rows instead)."""
    return all(isinstance(n, int) and n == 1 for n in lead)


def quantize_activations(x: Tensor) -> tuple[Tensor, Tensor]:
    """x (..., cols) rounded to 8 bits per 32-value block, as llama.cpp rounds a matvec's activation: the
    int8 values (..., cols // 32, 32) and the float32 scales d (..., cols // 32) with x ~ q * d, where
    d = max|x| / 127 and q = round(x / d) (half to even; q = 0 in a block of zeros).

    >>> q, d = quantize_activations(Tensor(np.linspace(-1, 1, 32, dtype=np.float32)))
    >>> q.numpy()[0, [0, 16, 31]].tolist(), round(float(d.numpy()[0]) * 127, 6)
    ([-127, 4, 127], 1.0)
    """
    *lead, cols = x.shape
    blocks = x.cast(dtypes.float32).reshape(*lead, cols // 32, 32)
    d = blocks.abs().max(-1) / 127
    # 1 / d per value, from d broadcast first: a buffer broadcast is a plain load in the rounding's kernel,
    # where 1 / d broadcast took a kernel of its own (a launch per rounding, 4 a Qwen2 layer)
    each = d.reshape(*lead, cols // 32, 1).expand(*lead, cols // 32, 32)
    inverse = (each != 0).where(1 / each, 0)
    return (blocks * inverse).round().cast(dtypes.int8).contiguous(), d


def _int8_matmul_t(blocks: Tensor, x: Tensor, fmt: str = "Q8_0") -> Tensor:
    """x @ W.T for Q8_0 or Q4_0 blocks (rows, nb, 34 or 18) and one row x (..., nb * 32), llama.cpp's way: x
    rounded to 8 bits per block (quantize_activations), each block's 32 products summed exactly in int32,
    then scaled once by d_w * d_x in float32. Within a block, product 8k + l (k < 4, l < 8) goes to the sum
    of l over k: 8 contiguous lanes whose 4-product sums the CPU renderer makes one vpdpbusd
    (renderer/int8_dot.py, host_opts.int8_dot_lanes). Differs from the float path by the activation's
    rounding (about 0.5% of the output's scale)."""
    rows, nb, _ = blocks.shape
    lead = x.shape[:-1]
    xq, dx = quantize_activations(x)
    if fmt == "Q4_0":
        sums = _q4_0_block_sums(blocks, xq.reshape(*lead, 1, nb, 2, 2, 8))
    else:
        wq = blocks[..., 2:].bitcast(dtypes.int8).reshape(rows, nb, 4, 8)
        sums = (xq.reshape(*lead, 1, nb, 4, 8).cast(dtypes.int32) * wq.cast(dtypes.int32)).sum(-2)  # (.., rows, nb, 8)

    def byte(k: int) -> Tensor:  # the raw byte broadcast before any arithmetic (see _Fields)
        return blocks[..., k:k + 1].expand(rows, nb, 8).cast(dtypes.uint16)

    dw = (byte(0) | (byte(1) << 8)).bitcast(dtypes.float16).cast(dtypes.float32)  # (rows, nb, 8)
    scale = dw * dx.reshape(*lead, 1, nb, 1)
    # a kernel of its own, as the float path's: under an epilogue (a bias, GELU) the scheduler would give
    # the block sums, a reduction inside the matvec's, a buffer of their own (schedule/fusion.py)
    return (sums.cast(dtypes.float32) * scale).sum((-2, -1)).contiguous()


# weight rows a multi-row int8 matmul's vector lanes hold (host_opts.int8_gemm_opts): one 256-bit vpdpbusd
INT8_GEMM_LANES = 8


def _int8_matmul_rows(blocks: Tensor, scales: Tensor, x: Tensor, fmt: str) -> Tensor:
    """x @ W.T for Q8_0 or Q4_0 blocks (rows, nb, bytes) and many rows x (..., nb * 32) (a prompt), on 8-bit
    activations as _int8_matmul_t: each row of x rounded per block (quantize_activations), each block's 32
    products summed exactly in int32, then scaled by d_w * d_x and summed over blocks in float32.

    A block's values are 2 x 4 x 4 (h, t, k; Q4_0's halves), k the 4 turns of a byte dot product. The
    kernel's vector lanes are 8 weight rows, whose 8-bit values the kernel stages once per panel
    (host_opts.int8_gemm_opts; linearize.stage keeps them bytes, each lane's 4 turns together), so a turn
    is 4 bytes of a row of x, shared by the lanes, against 4 bytes of each weight row: one vpdpbusd
    (renderer/int8_dot.py: DOT4_BCAST), which multiplies unsigned by signed bytes. So the weights are
    staged unsigned, offset: Q4_0's nibbles (the weight + 8), Q8_0's bytes ^ 0x80 (the weight + 128), and the
    block sum less offset x the activations' block sum (a small kernel, once per row and block). Weight row
    8p + l is lane l of panel p (the kernel's ranges). `scales` are the weights' float32 scales laid out
    (rows / 8, nb, 8) (scales_by_lane: kept by QuantWeight.keep_lane_scales, else a kernel per call)."""
    rows, nb, _ = blocks.shape
    lead = x.shape[:-1]
    panels, lanes = rows // INT8_GEMM_LANES, INT8_GEMM_LANES
    xq, dx = quantize_activations(x)
    xq = xq.reshape(*lead, 1, 1, nb, 2, 4, 4)
    blocks = blocks.reshape(panels, lanes, nb, blocks.shape[-1])  # weight row 8p + l: a panel, a lane
    if fmt == "Q4_0":  # value 16h + 4t + k: nibble h of byte 4t + k (the weight + 8)
        full = (panels, lanes, nb, 2, 4, 4)
        qs = blocks[..., 2:18].reshape(panels, lanes, nb, 1, 4, 4).expand(*full)
        shift = Tensor.arange(2, dtype=dtypes.uint8, device=blocks.device).reshape(1, 1, 1, 2, 1, 1).expand(*full)
        unsigned, offset = (qs >> shift * 4) & 15, 8
    else:  # the int8 weight's byte ^ 0x80: the weight + 128
        unsigned, offset = blocks[..., 2:].reshape(panels, lanes, nb, 2, 4, 4) ^ 128, 128
    sums = (xq.cast(dtypes.int32) * unsigned.cast(dtypes.int32)).sum((-3, -2, -1))
    xsum = xq.cast(dtypes.int32).sum((-3, -2, -1)).contiguous()  # (*lead, 1, 1, nb)
    sums = sums - xsum * offset
    dw = scales.permute(0, 2, 1).reshape(*(1,) * len(lead), panels, lanes, nb).expand(*lead, panels, lanes, nb)
    scale = dw * dx.reshape(*lead, 1, 1, nb)
    # a kernel of its own: under an epilogue (a bias, a gated MLP's product) the scheduler would give the
    # block sums, a reduction inside this one, a buffer of their own (schedule/fusion.py)
    return (sums.cast(dtypes.float32) * scale).sum(-1).contiguous().reshape(*lead, rows)


def scales_by_lane(blocks: Tensor) -> Tensor:
    """The float16 scales of Q8_0 or Q4_0 blocks (rows, nb, bytes) as float32 (rows / 8, nb, 8), the layout
    _int8_matmul_rows reads: contiguous along a panel's 8 lanes (float16 lanes would stop the linearizer's
    vectors), 8 rows' blocks read together (laid out (nb, rows), every row was read once per block: a Qwen2
    MLP weight's scales took a third of the matmul's time).

    >>> b = quantize_rows(np.arange(16 * 64, dtype=np.float32).reshape(16, 64), "q8_0")  # (16, 2, 34)
    >>> s = scales_by_lane(Tensor(b)).numpy()  # (2, 2, 8): panel p, block j, lane l is row 8p + l's block j
    >>> bool((s[1, 0] == b[8:, 0, :2].copy().view(np.float16)[:, 0]).all())
    True
    """
    rows, nb, nbytes = blocks.shape
    blocks = blocks.reshape(rows // INT8_GEMM_LANES, INT8_GEMM_LANES, nb, nbytes)
    dw = (blocks[..., 0].cast(dtypes.uint16) | (blocks[..., 1].cast(dtypes.uint16) << 8)).bitcast(dtypes.float16)
    return dw.cast(dtypes.float32).permute(0, 2, 1).contiguous()


def host_scales_by_lane(blocks: np.ndarray) -> np.ndarray:
    """scales_by_lane of Q8_0 or Q4_0 blocks held on the host (uint8 (rows, nb, bytes)), in NumPy: the same
    float32 (rows / 8, nb, 8), bit for bit (a float16 widens exactly). QuantWeight.keep_lane_scales lays a
    weight's scales out once this way: as a kernel, each weight shape's layout was a kernel compiled while
    loading (GPT-2's four, one compiler and linker run after another: 0.54 s of clang CPU on one core, cold)
    and every weight's a launch.

    >>> b = quantize_rows(np.arange(16 * 64, dtype=np.float32).reshape(16, 64), "q8_0")
    >>> bool((host_scales_by_lane(b) == scales_by_lane(Tensor(b)).numpy()).all())
    True
    """
    rows, nb, _ = blocks.shape
    dw = np.ascontiguousarray(blocks[..., :2]).view("<f2")[..., 0]  # each block's first two bytes
    lanes = dw.astype(np.float32).reshape(rows // INT8_GEMM_LANES, INT8_GEMM_LANES, nb)
    return np.ascontiguousarray(lanes.transpose(0, 2, 1))


def _read_only(arr: np.ndarray, like: Tensor) -> Tensor:
    """`arr` as a tensor on `like`'s device: read-only host memory where that device is the host's, which a
    Model shares instead of copying (model/executor.py), as it shares a GGUF file's mapped blocks (kept
    writable, Qwen2-0.5B Q4_0's 45 MB of lane scales left load_hf and a prompt 143 MB above the start's
    resident set, read-only 62 MB); a copy on other devices."""
    arr.flags.writeable = False
    try:
        return Tensor.from_host_view(arr, device=like.device, _runtime=like._runtime)
    except DeviceError:  # not host memory (CUDA), or POLY_DEBUG_ALLOC's guarded allocations
        return Tensor(arr, device=like.device, _runtime=like._runtime).realize()


def _q4_0_block_sums(blocks: Tensor, xq: Tensor) -> Tensor:
    """Per Q4_0 block, lane l < 8: the int32 sum over h, t < 2 of xq[16h + 8t + l] * (nibble h of byte
    8t + l, less 8), for int8 activations xq (..., 1, nb, 2, 2, 8): value 16h + 8t + l is 8k + l with
    k = 2h + t, so each lane sums the same 4 values as Q8_0's, and the two loops over h and t are the 4 turns
    the CPU renderer contracts (renderer/int8_dot.py: DOT4_NIBBLES)."""
    rows, nb, _ = blocks.shape
    full = (rows, nb, 2, 2, 8)
    # the raw bytes and the shift broadcast before any arithmetic (see _Fields)
    qs = blocks[..., 2:18].reshape(rows, nb, 1, 2, 8).expand(*full)
    shift = Tensor.arange(2, dtype=dtypes.uint8, device=blocks.device).reshape(1, 1, 2, 1, 1).expand(*full)
    weights = ((qs >> shift * 4) & 15).cast(dtypes.int32) - 8
    return (xq.cast(dtypes.int32) * weights).sum((-3, -2))


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
    format: str     # "Q8_0", "Q4_K", ... (definitions/quant_formats.py)
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
        """x @ W.T for x (..., cols): (..., rows), summed over blocks and their groups so the kernel's loops
        follow the blocks (see _grouped); the dequantization is part of the matmul's kernel."""
        f = block_format(self.format)
        cols = self.shape[1]
        if x.shape[-1] != cols:
            raise QuantizationError(f"x @ W.T: x has {x.shape[-1]} columns, the {f.name} weight {cols}")
        lead = x.shape[:-1]
        if self.int8_activations(lead):
            if _one_row(lead):
                return _int8_matmul_t(self.blocks, x, f.name)
            scales = self.__dict__.get("lane_scales")
            scales = scales_by_lane(self.blocks) if scales is None else scales
            return _int8_matmul_rows(self.blocks, scales, x, f.name)
        values = _grouped(self.blocks, f)  # (rows, nb, *groups)
        axes = tuple(range(-len(f.groups) - 1, 0))
        out = (x.reshape(*lead, 1, cols // f.block, *f.groups) * values).sum(axes)
        # one row (a decode step): a kernel of its own, its epilogue (bias, GELU) a small one after it; fused,
        # a GELU kept a tile of 4 rows (host_opts: a costly epilogue): GPT-2's 12 Q4_0 fc matvecs took 3.7 ms
        # of a decode step, 1.2 ms apart (benchmarks/bench_int8dot.py --decode q4_0, Zen 4, 2 threads)
        return out.contiguous() if _one_row(lead) else out

    def int8_prompts(self) -> bool:
        """Whether this weight's prompt matmuls (several rows of x) run on 8-bit activations
        (_int8_matmul_rows): a Q8_0 or Q4_0 weight of whole 8-row panels on a device with int8_dot, unless
        POLY_INT8_PROMPTS is 0."""
        return self.format in INT8_DOT_FORMATS and self.shape[0] % INT8_GEMM_LANES == 0 \
            and int8_dot_enabled(self.device) and bool(config.get("POLY_INT8_PROMPTS"))

    def int8_activations(self, lead: tuple) -> bool:
        """Whether x @ W.T for x of leading shape `lead` runs on x rounded to 8 bits (quantize_activations):
        one row on the decode route (_int8_matmul_t), several on the prompt route (int8_prompts)."""
        if _one_row(lead):
            return self.format in INT8_DOT_FORMATS and int8_dot_enabled(self.device)
        return self.int8_prompts()

    def keep_lane_scales(self) -> Tensor:
        """This weight's scales laid out as its prompt matmuls read them (scales_by_lane), computed now and
        kept as the attribute `lane_scales` (a state dict lists it; a Model captures it as a parameter), so
        a prompt does not lay them out again: 4 bytes a block beside the block's 18 (Q4_0) or 34 (Q8_0).
        Without them each prompt matmul lays them out in a small kernel of its own. Computed outside any
        capture's recording (called inside one, they are the captured program's constant).

        >>> qw = QuantWeight.from_float(np.ones((8, 64), np.float32), "q8_0")
        >>> qw.keep_lane_scales() is qw.lane_scales, qw.lane_scales.shape
        (True, (1, 2, 8))
        """
        kept = self.__dict__.get("lane_scales")
        if kept is None:
            if self.format not in INT8_DOT_FORMATS or self.shape[0] % INT8_GEMM_LANES:
                raise QuantizationError(f"a {self.format} weight of {self.shape[0]} rows has no lane scales: only "
                                        f"{' and '.join(INT8_DOT_FORMATS)} weights of whole "
                                        f"{INT8_GEMM_LANES}-row panels take 8-bit prompts")
            with capture.paused():  # a layout of stored bytes: on the host, no kernel to compile (host_scales_by_lane)
                kept = _read_only(host_scales_by_lane(self.blocks.numpy()), self.blocks)
            kept.requires_grad = False
            object.__setattr__(self, "lane_scales", kept)  # a frozen dataclass: its fields stay as given
        return kept

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
