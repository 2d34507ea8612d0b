"""Heuristic optimisations for GPU-style devices (Capabilities.has_local_memory): LOCAL, GROUP, UPCAST, TC.

Stage: lowering (device optimisation). Input: a simplified kernel AST and the device's Capabilities.
Output: the Opts `codegen/opts.apply_opts` applies; `renderer/launch.py` then maps GLOBAL ranges to
grid indices and LOCAL/GROUP ranges to block indices. Host devices never reach this module
(`lower.default_opts` calls it only when `caps.has_local_memory`), so CPU kernels are unchanged.

- TC: a matmul-shaped kernel over float16 or bfloat16 inputs whose sizes fit the tensor-core tile gets
  Opt(TC, reduce axis, 16); the GPU renderer emits mma.sync for it (see the backend's renderer). A
  float32 matmul (no epilogue) gets Opt(TC, reduce axis, 8), TF32 tensor cores, only where the user
  opts in with POLY_ALLOW_TF32=1 (operands rounded to 10 mantissa bits; the default is exact fp32).
  A device that declares warpgroup tensor cores (`wgmma_f16` / `wgmma_bf16`: CUDA sm_90 with
  POLY_CUDA_WGMMA=1) gets Opt(TC, reduce axis, WGMMA_DEPTH) instead for a float16 / bfloat16 matmul of
  any size from TILE_MIN_SIDE rows and columns (the wgmma kernel guards its edges).
- TILE: a matmul-shaped kernel over float32 inputs (any sizes, batches, strides, and an elementwise
  epilogue such as a bias and an activation: matmul_with_epilogue), or an implicit GEMM (a
  convolution forward or backward: several row, column and reduce ranges, gated loads: implicit_gemm) of at least
  TILE_MIN_SIDE rows and columns gets Opt(TILE, reduce axis, block rows): the GPU renderer stages
  block tiles of A and B through shared memory (double buffered) and gives each thread a register
  tile. The tile is the largest of MATMUL_TILES whose shared memory fits `caps.shared_memory_bytes`
  and whose grid still has TILE_MIN_BLOCKS blocks; none fits: the UPCAST/LOCAL opts below.
- GROUP: one reduction over a long range with few outputs (a full sum, a row norm): the threads of a
  block share the range (GROUP amount threads) and combine through shared memory.
  Row reductions with many outputs (softmax's max and sum, layernorm's mean and variance, a matrix-
  vector product's rows: `row_group_opts`) on a device with warps (`caps.warp_size`): each row is reduced
  by a group of threads, a warp for rows of up to ROW_ELEMENTS * warp elements and up to GROUP_AMOUNTS[0]
  for longer ones, thread g reading points g, g + group, ... (coalesced along the row) and the group
  combining by warp shuffles (and shared memory across warps); LOCAL then puts several rows in a block.
  A row whose length the group does not divide has its last pass padded (opts.apply_opts).
- UPCAST: a register tile (4 x 4 outputs per thread) for matmul-like kernels; 4 consecutive outputs
  per thread (float4 loads and stores) for contiguous elementwise kernels.
- LOCAL: the innermost global ranges are split into blocks of up to LOCAL_THREADS threads (an odd-sized
  innermost range padded to a multiple of the warp first, on a device with warps). A kernel
  with an accumulating store gets LOCAL alone (lowering keeps it only where `caps.atomic_add` holds
  and every such store is an ADD: each point then adds atomically).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from polygrad import config
from polygrad.codegen.analysis import has_accumulating_store, range_max, range_size
from polygrad.codegen.opts import Opt, OptKind, apply_opts
from polygrad.codegen.passes import simplify_indices
from polygrad.uop.ops import ALU, AxisKind, Ops, UOp
from polygrad.uop.symbolic import range_coeff

LOCAL_THREADS = 256
LOCAL_AMOUNTS = (256, 128, 64, 32, 16, 8, 4, 2)
GROUP_AMOUNTS = (256, 128, 64, 32)
GROUP_MIN_REDUCE = 2048   # a shorter reduction runs fast enough in one thread
GROUP_MAX_OUTPUTS = 2048  # with more outputs the grid alone fills the device
TILE = 4                  # register tile side (rows and columns per thread) of matmul-like kernels
TC_TILE = (16, 8, 16)     # mma.sync m16n8k16: rows, columns, reduce of one warp's tile
# tensor-core families by operand dtype name: (Capabilities.tensor_cores entry, one mma's rows, columns,
# reduce); "float" is TF32 (m16n8k8), chosen only with POLY_ALLOW_TF32=1
TC_FAMILIES = {"half": ("mma_f16", TC_TILE), "bfloat16": ("mma_bf16", TC_TILE), "float": ("mma_tf32", (16, 8, 8))}
# warpgroup tensor cores (wgmma, sm_90a) by operand dtype name: the Capabilities.tensor_cores entry; their
# Opt(TC) amount is WGMMA_DEPTH, the k depth of one shared-memory stage (64 halves: one 128-byte swizzle row)
WGMMA_FAMILIES = {"half": "wgmma_f16", "bfloat16": "wgmma_bf16"}
WGMMA_DEPTH = 64
TILE_MIN_SIDE = 16        # a thinner matmul (a matrix-vector product) reads better one output per thread
MAX_GRID_Y = 65535        # a tiled kernel's row tiles run on grid y (CUDA's limit)
TILE_MIN_BLOCKS = 256     # a bigger tile only while the grid keeps this many blocks (about two per SM of
                          # a big GPU; not tuned on a GPU yet)
ROW_ELEMENTS = 32         # a grouped row keeps about this many elements per thread (a warp per row up to
                          # 32 * 32 = 1024 elements, more threads for longer rows; not tuned on a GPU yet)
ROW_MIN = 32              # a shorter row stays one thread's loop (a grouped one would leave lanes idle)


@dataclass(frozen=True)
class MatmulTile:
    """A shared-memory matmul tile: each block computes bm x bn outputs, staging bk-deep slices of A
    (bm x bk) and B (bk x bn) through shared memory in two buffers; each of its
    (bm / tm) * (bn / tn) threads keeps a tm x tn register tile. Shared rows are padded by `pad`
    floats (16-byte aligned rows; the transposing stores of A spread over more banks)."""

    bm: int
    bn: int
    bk: int
    tm: int
    tn: int
    pad: int = 4

    @property
    def threads(self) -> int:
        return (self.bm // self.tm) * (self.bn // self.tn)

    @property
    def shared_bytes(self) -> int:
        return 2 * self.bk * ((self.bm + self.pad) + (self.bn + self.pad)) * 4


# keyed by block rows (Opt(TILE).amount); every tile has 256 threads and 4 elements of A and of B per
# thread per stage (one float4 load each where aligned)
MATMUL_TILES = {64: MatmulTile(64, 64, 16, 4, 4), 128: MatmulTile(128, 128, 8, 8, 8)}


def _ranges(ast: UOp) -> dict[int, UOp]:
    return {n.arg[0]: n for n in ast.toposort() if n.op is Ops.RANGE}


def _single_store(ast: UOp) -> UOp | None:
    """The kernel's one block (END over a STORE, or a STORE without ranges), else None."""
    if len(ast.src) != 1:
        return None
    block = ast.src[0]
    if block.op is Ops.STORE or (block.op is Ops.END and block.src[0].op is Ops.STORE):
        return block
    return None


def _block_ranges(block: UOp) -> tuple[UOp, ...]:
    return block.src[1:] if block.op is Ops.END else ()


def _store_of(block: UOp) -> UOp:
    return block.src[0] if block.op is Ops.END else block


def gpu_opts(ast: UOp, caps: Any) -> list:
    """The heuristic opts for a GPU-style device (module docstring)."""
    end = _single_store(ast)
    if end is None:
        return []
    if has_accumulating_store(ast):  # a scatter-add (caps.atomic_add): scalar atomic stores, blocks of threads
        return _local_opts(ast)
    tc = tensor_core_opts(ast, caps) or tile_opts(ast, caps)
    if tc:
        return tc
    reduces = [n for n in ast.toposort() if n.op is Ops.REDUCE]
    glob = [r for r in _block_ranges(end) if r.arg[1] == AxisKind.GLOBAL and range_size(r) is not None]
    outputs = math.prod(range_size(r) for r in glob)
    opts: list = []
    if len(reduces) == 1 and outputs <= GROUP_MAX_OUTPUTS:
        inner = reduces[0].src[-1]
        size = range_size(inner)
        if inner.arg[1] == AxisKind.REDUCE and size is not None and size >= GROUP_MIN_REDUCE:
            amount = next((a for a in GROUP_AMOUNTS if size % a == 0), 0)
            if amount:
                opts.append(Opt(OptKind.GROUP, inner.arg[0], amount))
    if not opts:
        opts += row_group_opts(ast, caps)
    if not opts and glob:
        opts += _upcast_opts(end, reduces, glob, caps)
    current = simplify_indices(apply_opts(ast, opts)) if opts else ast
    return opts + _local_opts(current, int(getattr(caps, "warp_size", 0) or 0))


def row_group_opts(ast: UOp, caps: Any) -> list:
    """[Opt(GROUP, row range, threads)] for a kernel whose reductions (one, or siblings sharing their range:
    share_reduce_ranges) all run over the same range of at least ROW_MIN points (at most, when symbolic), none inside
    another, with sums and maxima only, where some load reads along the row contiguously and no load that
    moves along the row also moves by 1 along an output range (there LOCAL threads over the outputs read
    coalesced already: a matmul's column operand); on a device with warps. The group: the largest of
    GROUP_AMOUNTS (all multiples of the warp) with ROW_ELEMENTS points a thread, at least one warp."""
    warp = int(getattr(caps, "warp_size", 0) or 0)
    end = _single_store(ast)
    if not warp or end is None:
        return []
    reduces = [n for n in ast.toposort() if n.op is Ops.REDUCE]
    if not reduces or any(len(r.src) != 2 or r.arg not in (Ops.ADD, Ops.MAX) for r in reduces):
        return []
    row = reduces[0].src[1]
    size = range_max(row)  # a symbolic row (a softmax over a Variable's tokens): sized at its largest
    if size < ROW_MIN or row.arg[1] != AxisKind.REDUCE or any(r.src[1] is not row for r in reduces):
        return []
    if any(x.op is Ops.REDUCE for r in reduces for x in r.src[0].toposort()):
        return []
    glob = [r for r in _block_ranges(end) if r.arg[1] == AxisKind.GLOBAL]
    loads = [n.src[0].src[1] for r in reduces for n in r.src[0].toposort() if n.op is Ops.LOAD]
    if not any(range_coeff(ix, row) == 1 for ix in loads):
        return []
    if any(range_coeff(ix, row) != 0 and range_coeff(ix, g) == 1 for ix in loads for g in glob):
        return []
    amount = next((a for a in GROUP_AMOUNTS if a % warp == 0 and a * ROW_ELEMENTS <= size), warp)
    return [Opt(OptKind.GROUP, row.arg[0], amount)]


def _upcast_opts(end: UOp, reduces: list[UOp], glob: list[UOp], caps: Any) -> list:
    store_index = _store_of(end).src[0].src[1]
    last = glob[-1]
    if reduces:
        loads = [n.src[0].src[1] for n in end.toposort() if n.op is Ops.LOAD]
        reused = any(range_coeff(ix, last) == 0 for ix in loads) and len(glob) >= 2
        rows = glob[-2] if len(glob) >= 2 else None
        if reused and rows is not None and range_size(last) % (TILE * 16) == 0 and range_size(rows) % (TILE * 16) == 0:
            return [Opt(OptKind.UPCAST, rows.arg[0], TILE), Opt(OptKind.UPCAST, last.arg[0], TILE)]
        return []
    width = int(getattr(caps, "vector_width", 1) or 1)
    if width > 1 and range_size(last) % (width * 32) == 0 and range_coeff(store_index, last) == 1:
        return [Opt(OptKind.UPCAST, last.arg[0], width)]
    return []


def _local_opts(ast: UOp, warp: int = 0) -> list:
    """LOCAL splits of the innermost global ranges until a block has about LOCAL_THREADS threads. With
    `warp` (a device with warps), an innermost range of at least a warp's points that no amount divides (a
    softmax's last kernel writing rows of 4097) is padded to a multiple of the warp (PADTO: the points past
    its end do nothing) and split by it, instead of running one thread a block."""
    end = _single_store(ast)
    if end is None:
        return []
    # a grouped reduction's threads count against the block
    groups = [r for r in ast.toposort() if r.op is Ops.RANGE and r.arg[1] == AxisKind.GROUP]
    threads = math.prod(range_size(r) or 1 for r in groups)
    opts = []
    glob = [r for r in _block_ranges(end) if r.arg[1] == AxisKind.GLOBAL and range_size(r) is not None]
    for r in reversed(glob[-2:]):
        budget = LOCAL_THREADS // threads
        amount = next((a for a in LOCAL_AMOUNTS if a <= budget and range_size(r) % a == 0), 0)
        if amount < 2 and threads == 1 and warp and range_size(r) >= warp and not has_accumulating_store(ast):
            opts.append(Opt(OptKind.PADTO, r.arg[0], warp))
            amount = warp
        if amount < 2:
            break
        opts.append(Opt(OptKind.LOCAL, r.arg[0], amount))
        threads *= amount
        if threads >= LOCAL_THREADS // 2:
            break
    return opts


def tensor_core_opts(ast: UOp, caps: Any) -> list:
    """[Opt(TC, reduce axis, depth of one mma)] for a float16 or bfloat16 matmul (or, with
    POLY_ALLOW_TF32=1, a float32 one) whose sizes fit the mma tile, on a device that declares that
    family of tensor cores; else []."""
    cores = getattr(caps, "tensor_cores", ())
    name = wgmma_dtype(ast)
    if name is not None and WGMMA_FAMILIES[name] in cores:
        i, j, k = matmul_ranges(ast, name)
        if range_size(i) >= TILE_MIN_SIDE and range_size(j) >= TILE_MIN_SIDE:
            return [Opt(OptKind.TC, k.arg[0], WGMMA_DEPTH)]
    for name, (family, tile) in TC_FAMILIES.items():
        if family not in cores or (name == "float" and not config.get("POLY_ALLOW_TF32")):
            continue
        shape = matmul_shape(ast, name)
        if shape is not None:
            return [Opt(OptKind.TC, shape[2].arg[0], tile[2])]
    return []


def tile_opts(ast: UOp, caps: Any) -> list:
    """[Opt(TILE, first reduce axis, block rows)] for a float32 matmul or implicit GEMM (a convolution:
    implicit_gemm) of at least TILE_MIN_SIDE rows and columns whose tile fits the device's shared memory
    (module docstring); else []."""
    if not getattr(caps, "has_local_memory", False):
        return []
    matmul = matmul_with_epilogue(ast)
    if matmul is not None:
        i, j, k, _ = matmul
        rows, cols = range_size(i), range_size(j)
    else:
        shape = implicit_gemm(ast)
        if shape is None:
            return []
        rows, cols = math.prod(range_size(r) for r in shape.rows), math.prod(range_size(r) for r in shape.cols)
        k = shape.reduce[0]
    if rows < TILE_MIN_SIDE or cols < TILE_MIN_SIDE:
        return []
    memory = int(getattr(caps, "shared_memory_bytes", 0) or 0)
    fits = [t for t in MATMUL_TILES.values() if t.shared_bytes <= memory]
    if not fits:
        return []
    blocks = lambda t: -(-rows // t.bm) * -(-cols // t.bn)  # noqa: E731
    big = [t for t in fits if blocks(t) >= TILE_MIN_BLOCKS]
    tile = max(big, key=lambda t: t.bm) if big else min(fits, key=lambda t: t.bm)
    if -(-rows // tile.bm) > MAX_GRID_Y:
        return []
    return [Opt(OptKind.TILE, k.arg[0], tile.bm)]


@dataclass(frozen=True)
class GemmShape:
    """A kernel read as C[rows, cols] = f(sum over `reduce` of A[rows, reduce] * B[cols, reduce]) per batch
    point: `rows` are the global ranges only A's address (index and gate) reads, `cols` those only B's
    reads, `batch` the other global ranges (in the output order), `reduce` the REDUCE's ranges
    (outermost first). `a` and `b` are the two float32 LOADs, `sum` the REDUCE."""

    rows: tuple[UOp, ...]
    cols: tuple[UOp, ...]
    reduce: tuple[UOp, ...]
    batch: tuple[UOp, ...]
    a: UOp
    b: UOp
    sum: UOp


def _address_ranges(load: UOp) -> set[UOp]:
    return {n for n in load.src[0].toposort() if n.op is Ops.RANGE}


def implicit_gemm(ast: UOp) -> GemmShape | None:
    """The GemmShape of a float32 kernel whose stored value is an elementwise epilogue (as in
    matmul_with_epilogue) of one sum, over any number of reduce ranges, of the product of two float32
    loads whose addresses and gates are any expressions of the ranges: a matmul, and the forward,
    input-gradient and weight-gradient kernels of a convolution (rows: batch x output pixels; columns:
    output channels; reduce: input channels x the kernel window, the padding as the loads' gates).
    None unless both rows and columns are non-empty and every range has a constant size."""
    found = _epilogue_of_one_sum(ast)
    if found is None:
        return None
    end, total = found
    body, red = total.src[0], total.src[1:]
    if total.arg not in (Ops.ADD, Ops.FMA) or not red or body.op is not Ops.MUL:
        return None
    if any(x.op is not Ops.LOAD or x.dtype.name != "float" or x.src[0].op is not Ops.INDEX for x in body.src):
        return None
    glob = end.src[1:]
    if any(r.arg[1] != AxisKind.GLOBAL or range_size(r) is None for r in glob):
        return None
    if any(r.op is not Ops.RANGE or r.arg[1] != AxisKind.REDUCE or range_size(r) is None for r in red):
        return None
    a, b = body.src
    ra, rb = _address_ranges(a), _address_ranges(b)
    if not (ra | rb) <= set(glob) | set(red):
        return None
    if glob[-1] in ra and glob[-1] not in rb:  # the output's innermost range among the columns (coalesced stores)
        a, b, ra, rb = b, a, rb, ra
    rows = tuple(r for r in glob if r in ra and r not in rb)
    cols = tuple(r for r in glob if r in rb and r not in ra)
    if not rows or not cols:
        return None
    batch = tuple(r for r in glob if r not in rows and r not in cols)
    return GemmShape(rows, cols, tuple(red), batch, a, b, total)


def matmul_shape(ast: UOp, dtype_name: str = "half") -> tuple[UOp, UOp, UOp] | None:
    """(row range, column range, reduce range) of a matmul over `dtype_name` loads (matmul_ranges: a
    float16 or bfloat16 product may be cast on its way to the float sum, float32 loads are multiplied
    as they are) with sizes dividing that family's mma tile (TC_FAMILIES); None for anything else."""
    shape = matmul_ranges(ast, dtype_name, casts=dtype_name != "float")
    if shape is None:
        return None
    i, j, k = shape
    m, n, kk = TC_FAMILIES[dtype_name][1]
    if range_size(i) % m or range_size(j) % n or range_size(k) % kk:
        return None
    return shape


def tensor_core_dtype(ast: UOp) -> str | None:
    """The operand dtype name ("half", "bfloat16", "float") of a kernel lowered with Opt(TC)."""
    return next((name for name in TC_FAMILIES if matmul_shape(ast, name) is not None), None)


def wgmma_dtype(ast: UOp) -> str | None:
    """The operand dtype name ("half", "bfloat16") of a matmul warpgroup tensor cores can run (any sizes:
    matmul_ranges), else None."""
    return next((name for name in WGMMA_FAMILIES if matmul_ranges(ast, name) is not None), None)


def matmul_ranges(ast: UOp, dtype_name: str, casts: bool = True) -> tuple[UOp, UOp, UOp] | None:
    """(row range, column range, reduce range) of a kernel that stores C[.., i, j] = sum_k A[.., i, k] *
    B[.., k, j] (possibly cast) over loads of dtype `dtype_name` ("half", "float"); with `casts`, the
    loads and their product may be cast on the way to the sum (a float16 product summed in float);
    without, the loads are multiplied and summed as they are. None for anything else."""
    end = _single_store(ast)
    if end is None or end.op is not Ops.END:
        return None
    value = end.src[0].src[1]
    while value.op is Ops.CAST:
        value = value.src[0]
    return _reduce_ranges(end, value, dtype_name, casts)


# what may surround a tiled matmul's sum in the stored value (an epilogue: bias, activation, mask, cast),
# including what lowering decomposes transcendentals into after the opts are chosen (BITCAST, shifts)
EPILOGUE_OPS = frozenset(ALU | {Ops.CAST, Ops.BITCAST})


def _epilogue_of_one_sum(ast: UOp) -> tuple[UOp, UOp] | None:
    """(the END of the kernel's one store, its one REDUCE) when the stored value is an elementwise expression
    (EPILOGUE_OPS over constants, ungated loads and Variables) of exactly one REDUCE, else None."""
    end = _single_store(ast)
    if end is None or end.op is not Ops.END:
        return None
    reduces, stack, seen = [], [end.src[0].src[1]], set()
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        seen.add(n)
        if n.op is Ops.REDUCE:
            reduces.append(n)
        elif n.op is Ops.LOAD:
            if len(n.src[0].src) != 2:
                return None
        elif n.op in EPILOGUE_OPS:
            stack.extend(n.src)
        elif n.op not in (Ops.CONST, Ops.DEFINE_VAR):
            return None
    return (end, reduces[0]) if len(reduces) == 1 else None


def matmul_with_epilogue(ast: UOp) -> tuple[UOp, UOp, UOp, UOp] | None:
    """(row range, column range, reduce range, the REDUCE) of a float32 matmul whose stored value is
    any elementwise expression (EPILOGUE_OPS over constants, ungated loads and Variables) of one
    plain sum of products of two float32 loads: relu(x @ w + b), a relu mask on a gradient, a cast."""
    found = _epilogue_of_one_sum(ast)
    if found is None:
        return None
    end, total = found
    shape = _reduce_ranges(end, total, "float", casts=False)
    return None if shape is None else (*shape, total)


def _reduce_ranges(end: UOp, value: UOp, dtype_name: str, casts: bool) -> tuple[UOp, UOp, UOp] | None:
    """(i, j, k) when `value` is a REDUCE ADD (or its FMA contraction, caps.fma) over k of A[.., i, k] *
    B[.., k, j] (see matmul_ranges)."""
    if value.op is not Ops.REDUCE or value.arg not in (Ops.ADD, Ops.FMA) or len(value.src) != 2:
        return None
    k = value.src[1]
    body = value.src[0]
    while body.op is Ops.CAST and casts:
        body = body.src[0]
    if body.op is not Ops.MUL:
        return None
    operands = []
    for x in body.src:
        while x.op is Ops.CAST and casts:
            x = x.src[0]
        if x.op is not Ops.LOAD or x.dtype.name != dtype_name or len(x.src[0].src) != 2:
            return None
        operands.append(x.src[0].src[1])
    glob = [r for r in end.src[1:] if r.arg[1] == AxisKind.GLOBAL]
    if len(glob) < 2 or any(range_size(r) is None for r in glob) or range_size(k) is None:
        return None
    i, j = glob[-2], glob[-1]
    ia, ib = operands
    if range_coeff(ia, j) != 0:
        ia, ib = ib, ia
    if range_coeff(ia, j) != 0 or range_coeff(ib, i) != 0 or range_coeff(ia, k) is None or range_coeff(ib, k) is None:
        return None
    return i, j, k
