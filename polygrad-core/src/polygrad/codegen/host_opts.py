"""Heuristic optimisations for host devices (CPU, X86: no local memory): `host_opts(ast, caps) -> [Opt]`.

Stage: lowering (device optimisation). Input: a simplified kernel AST and the device's Capabilities
(vector width, registers, threads, staging scratch, L2 size, FMA units and latency: host backends fill
them from polygrad/hostcpu.py's description of the machine). Output: the Opts (opts.py) lower() applies:
register tiles for matmul-like kernels (an outer-product tile, big ones also staging their column
panels; or a tile of dot products), partial accumulators (lanes) for long reductions, vector lanes for
contiguous elementwise kernels, then THREAD when the work pays for a thread handoff. GPU-style devices
get gpu_opts.py instead.
"""
from __future__ import annotations

import math

from polygrad.codegen.analysis import (divides, estimate, product_operand, range_max, range_size, ranges_of, stores_of,
                                      thread_axis)
from polygrad.codegen.opts import Opt, OptKind
from polygrad.codegen.passes import split_kernel
from polygrad.codegen.window_opts import window_tile_opts
from polygrad.contract import Capabilities
from polygrad.dtype import dtypes
from polygrad.uop.ops import AxisKind, Ops, UOp
from polygrad.uop.symbolic import range_coeff


def host_opts(ast: UOp, caps: Capabilities | None) -> list[Opt]:
    """Register tiles or lane accumulators (or vector lanes for an elementwise kernel), then THREAD."""
    opts = heuristic_opts(ast, caps) or elementwise_vector_opts(ast, caps)
    opts = opts + decompress_stage_opts(ast, opts, caps)
    return opts + thread_opt(split_kernel(ast, opts), caps, streams_weight(ast, caps))


# below this much work (operations + stores) per thread a thread handoff costs more than it saves
# (measured on the CPU backend with 2 threads: about 20 us per launch to wake a worker); a kernel is split
# among as many of the device's threads (its cores) as get this much each. A kernel whose time is its
# weight's bytes (streams_weight) is split by time instead: thread_parts
THREAD_PART_WORK = 1 << 16
# a matmul-like kernel stages its column panels (OUTER + STAGE) from this much work on (multiply-adds),
# when B is bigger than a quarter of the L2 (smaller ones stay in cache anyway, and staging costs
# compile time); STAGE_MIN_B_BYTES where the device does not say its L2
STAGE_MIN_WORK = 1 << 25
STAGE_MIN_B_BYTES = 256 * 1024
# a tile's strided row operand is staged per row tile (row_stage_opts) when each copy serves this many
# column tiles: the copy then costs at most 1/64 of the loads it saves from new cache lines
ROW_STAGE_MIN_REUSE = 64
# a reduction whose weight operand is decompressed in the kernel (dequantized from integer loads) computes
# it once per panel into staging scratch (decompress_stage_opts) when the rows it ignores number this many
# or more (or are symbolic: a prompt's tokens). Not measured: the copy is one pass over the panel, where a
# tile of dot products dequantizes it once per 4 rows, so a few tiles already pay for it
DECOMPRESS_STAGE_MIN_ROWS = 16
# a register tile's columns are padded to full vectors (padded_columns) when that adds at most 1/8 of the lanes
PAD_MAX_WASTE = 8
# rows of a register tile over a symbolic range (a Variable batch): each tile computes this many rows,
# so at the Variable's value 1 the FMAs are 4x a plain row's while the column vectors are loaded once,
# as they are for one row (the loads bound such a kernel anyway)
SYMBOLIC_TILE_ROWS = 4
# row counts of a register tile tried where no even count (8, 6, 4, 2) divides any row range
ODD_TILE_ROWS = (7, 5, 3)
# registers a tile of long rows (_long_rows) leaves besides its accumulators: the column vector, the
# broadcast and two for the compiler
LONG_ROWS_SPARE = 4
# row counts tried first for a tile of one vector narrower than the device's (a 56-pixel row in 8-lane vectors
# on a 16-lane device), where they fit the registers with LONG_ROWS_SPARE left. The device's units x latency
# accumulators count full-width FMAs; narrower ones may issue at twice the rate (Zen 4: one 512-bit FMA a
# cycle, two 256-bit), so 8 rows of 8 lanes left the FMAs no slack. A 3x3 conv over 64 channels at 56 x 56
# (forward and input gradient): 16 output channels x 8 pixels ran 1.13x faster than 8 x 8 (one Zen 4 core).
# Only where the code generator holds a 4-vector tile's accumulators (tile_vectors 4: clang with 32
# registers): X86's emitter ran that conv 2x slower with 16 rows, gcc 0.86-1.1x
HALF_VECTOR_ROWS = (16, 12)
# a tile of long rows replaces one of at least this many times fewer rows (7 pixels x 1 vector lost to a
# batch of 16 images' 4 rows x 4 vectors with its input staged: 1.4x slower)
LONG_ROWS_GAIN = 2


def tile_vector_counts(caps: Capabilities | None) -> tuple[int, ...]:
    """Vectors per register-tile row to try, most first: the device's `tile_vectors` (4 where its code
    generator keeps a 4-vector row in registers: the CPU backend with clang), then 2 and 1."""
    most = int(getattr(caps, "tile_vectors", 2) or 2)
    return tuple(v for v in (4, 2, 1) if v <= most)


def register_tile(rows: UOp | None, cols: UOp, caps: Capabilities | None, most: int = 4) -> tuple[int, int]:
    """(rows, vectors) of an outer-product register tile from the device's lanes and registers:
    rows x vectors accumulators, plus one register per vector of the other operand and one broadcast,
    must fit the vector registers; as many vectors per row (up to `most` and the device's tile_vectors)
    as the columns allow."""
    width = max(1, int(getattr(caps, "vector_width", 1) or 1))
    regs = int(getattr(caps, "registers", 0) or 0) or 16
    vecs = next((v for v in tile_vector_counts(caps) if v <= most and divides(cols, v * width)
                 and v + v + 1 <= regs), 0)
    if not vecs:
        return 0, 0
    fits = [r for r in (8, 6, 4, 2) if r * vecs + vecs + 1 <= regs]
    tile_rows = next((r for r in fits if rows is not None and divides(rows, r)), 1)
    return tile_rows, vecs


def column_lanes(cols: UOp, caps: Capabilities | None, most: int = 4) -> int:
    """Columns of a register tile: four (where the device's tile_vectors says so), two or one of the
    device's vectors, or, for a size the width does not divide (a 56-pixel row), one narrower vector
    (half the width, 4 lanes or more) that divides it."""
    width = max(1, int(getattr(caps, "vector_width", 1) or 1))
    _, vecs = register_tile(None, cols, caps, most)
    if vecs:
        return vecs * width
    half = width // 2
    return half if half >= 4 and divides(cols, half) else 0


def heuristic_opts(ast: UOp, caps: Capabilities | None = None) -> list[Opt]:
    """Register-tile matmul-like kernels: an outer-product tile (outer_tile_opts; big ones also stage
    their column panels) or a tile of dot products (dot_tile_opts); else give a long reduction several
    accumulators (vector lanes)."""
    if caps is not None and caps.vector_width <= 1:
        return []
    ends = [n for n in ast.src if n.op is Ops.END]
    if len(ends) != 1 or not isinstance(ends[0].src[0], UOp) or ends[0].src[0].op is not Ops.STORE:
        return []
    reduces = [n for n in ast.toposort() if n.op is Ops.REDUCE]
    if not reduces:
        return []
    glob = [r for r in ends[0].src[1:] if r.arg[1] == AxisKind.GLOBAL]
    loads = [n.src[0] for n in ast.toposort() if n.op is Ops.LOAD]
    store_index = ends[0].src[0].src[0]
    opts: list[Opt] = []
    if caps is not None and caps.int8_dot:
        lanes = int8_dot_lanes(reduces)
        if lanes is not None:
            rows = int8_dot_rows(reduces, glob)
            tile = [Opt(OptKind.UPCAST, rows.arg[0], INT8_DOT_ROWS)] if rows is not None else []
            return [Opt(OptKind.SPLIT_REDUCE, lanes.arg[0], INT8_DOT_LANES), *tile]
        gemm = int8_gemm_opts(ast, glob, reduces, caps)
        if gemm:
            return gemm
    if glob and caps is not None:
        window = window_tile_opts(glob, reduces[0], loads, store_index, caps)
        if window is not None:
            return window
        tile = outer_tile_opts(ast, glob, reduces[0], loads, store_index, caps)
        if tile:
            return tile
    dot = dot_tile_opts(glob, reduces[0], loads, caps, _streams_rows(ast, reduces[0])) if caps is not None else []
    if dot:
        return dot
    red = reduces[0]
    inner = red.src[-1]
    cols = column_reduce_opts(glob, inner, loads, store_index, caps) if caps is not None else []
    if cols:
        return cols
    if inner.arg[1] == AxisKind.REDUCE and divides(inner, 8) and range_size(inner) >= _lanes_from(red):
        opts.append(Opt(OptKind.SPLIT_REDUCE, inner.arg[0], 8))
    elif inner.arg[1] == AxisKind.REDUCE and range_size(inner) is None and range_max(inner) >= 64:
        # a sum or maximum over a Variable (a softmax over a prompt's tokens): lanes, the last vector padded
        # with the identity (opts._split_symbolic_reduce; other reductions are left as they are)
        opts.append(Opt(OptKind.SPLIT_REDUCE, inner.arg[0], 8))
    return opts or (scalar_dot_tile_opts(glob, red, loads, caps) if caps is not None else [])


def _lanes_from(red: UOp) -> int:
    """The shortest constant reduction heuristic_opts gives 8 lanes: 64 values, or 32 for a maximum, whose
    value lanes leave as it was (but the sign of a zero maximum of +0 and -0) where a shorter sum's would
    round in another order: a decode step's activation blocks (quant.quantize_activations' max|x| of each
    32 values, else one chain of NaN-aware compares per block: Qwen2-0.5B's 4864-wide row 4.5 -> 1.1 us)."""
    return 32 if red.arg is Ops.MAX else 64


# lanes of a contracted byte dot product (renderer/int8_dot.py): 8 int32 lanes of 4 bytes, one 256-bit vpdpbusd
INT8_DOT_LANES = 8
BYTE_DTYPES = (dtypes.int8, dtypes.uint8)


def int8_dot_lanes(reduces: list[UOp]) -> UOp | None:
    """The range to make the lanes of a sum of int32 block sums of 8-bit products (nn/quant.py's decode
    matvec: per 32-value block, REDUCE(ADD) over the block's 4 turns of two bytes at 8k + l, inside a sum
    over blocks and l < 8): l, whose 8 lanes turn the 4-turn inner sum into one dot product
    (renderer/int8_dot.py); None for any other kernel. Q8_0's turns are one range k < 4; Q4_0's are two
    ranges h, t < 2 (value 16h + 8t + l is nibble h of byte 8t + l)."""
    for inner in reduces:
        if inner.dtype is not dtypes.int32 or inner.arg is not Ops.ADD:
            continue
        byte_loads = [n.src[0] for n in inner.src[0].toposort() if n.op is Ops.LOAD and n.dtype in BYTE_DTYPES]
        if len(byte_loads) != 2 or not _byte_dot_turns(inner.src[1:], byte_loads):
            continue
        for outer in reduces:
            if outer is inner or inner not in outer.src[0].toposort():
                continue
            for r in outer.src[1:]:
                if range_size(r) == INT8_DOT_LANES and all(range_coeff(ix.src[1], r) == 1 for ix in byte_loads):
                    return r
    return None


# weight rows a one-row int8 matvec computes together (int8_dot_rows): the activation's block (its load, byte
# shuffle and 8 x sum) is prepared once for them. Zen 4, clang 14, a Qwen2 4864 x 896 Q4_0 matvec's block loop:
# 17.3 -> 15.3 instructions a block and row (with the prefetch), 0.181 -> 0.133 ms in L3, 0.183 -> 0.142 from
# memory (one thread). 2 rows made clang unroll the block loop by 7, an odd count that kept split_chains' IFs
INT8_DOT_ROWS = 4
# the longest weight row, in bytes, a tile of rows reads: from memory (the decode case: a model is larger
# than the cache) several interleaved rows were slower than one where a row is longer (Q4_0, one thread, best
# of several under load 6: 504-byte rows 0.183 -> 0.142 ms, 576 0.088 -> 0.082, 432 0.100 -> 0.102, 864
# 0.050 -> 0.098, 2736 0.155 -> 0.257) and for every Q8_0 shape tried (408 to 952-byte rows: 1.5-3x slower,
# prefetched or not), so Q8_0 (one 4-turn range, no nibbles) keeps one row a turn
INT8_DOT_ROW_BYTES = 640


def int8_dot_rows(reduces: list[UOp], glob: list[UOp]) -> UOp | None:
    """The global range of weight rows of nn/quant.py's Q4_0 decode matvec (whose lanes int8_dot_lanes found)
    to unroll by INT8_DOT_ROWS: the range that moves one byte load of the block sum (the weight's) by at most
    INT8_DOT_ROW_BYTES and not the other (the activation's), of a constant size INT8_DOT_ROWS divides; None
    otherwise (one row a turn: Q8_0, long rows, other sizes). The rows' updates share the activation's load,
    which renderer/int8_dot.py contracts once for them."""
    for inner in reduces:
        if inner.dtype is not dtypes.int32 or inner.arg is not Ops.ADD or len(inner.src) != 3:
            continue  # (Q4_0's two 2-turn ranges h, t; Q8_0's one)
        byte_loads = [n.src[0] for n in inner.src[0].toposort() if n.op is Ops.LOAD and n.dtype in BYTE_DTYPES]
        if len(byte_loads) != 2:
            continue
        for r in glob:
            size = range_size(r)
            steps = sorted(range_coeff(ix.src[1], r) or 0 for ix in byte_loads)
            if size is not None and size % INT8_DOT_ROWS == 0 and size > INT8_DOT_ROWS and steps[0] == 0 \
                    and 0 < steps[1] <= INT8_DOT_ROW_BYTES and all(range_coeff(ix.src[1], r) is not None
                                                                  for ix in byte_loads):
                return r
    return None


# rows of x an int8 prompt matmul's register tile holds (int8_gemm_opts): one int32 and one float32 accumulator
# of 8 weight rows each
INT8_GEMM_ROWS = 4


def int8_gemm_opts(ast: UOp, glob: list[UOp], reduces: list[UOp], caps: Capabilities) -> list[Opt]:
    """nn/quant.py's multi-row int8 matmul (_int8_matmul_rows): a sum over blocks of int32 block sums of two
    8-bit operands whose last turns range (k < 4) moves both by 1, one operand (x's bytes, loaded as they are)
    independent of the two global ranges of weight rows (panels, 8 lanes), the other (the weight, computed)
    independent of x's rows. Its tile: 8 weight rows as the vector lanes, INT8_GEMM_ROWS rows of x unrolled,
    the weight's values staged per panel of 8 rows (OUTER + STAGE of the blocks' slot: the linearizer stages them as
    bytes, each lane's 4 turns together), so a turn is one vpdpbusd per row of x against 4 of its bytes
    (renderer/int8_dot.py: DOT4_BCAST_PACKED) and the rows of the tile share the block sums' loops. []
    for any other kernel."""
    if not getattr(caps, "stage_bytes", 0):
        return []
    for inner in reduces:
        if inner.dtype is not dtypes.int32 or inner.arg is not Ops.ADD or range_size(inner.src[-1]) != 4:
            continue
        product = inner.src[0]
        if product.op is not Ops.MUL or any(f.op is not Ops.CAST for f in product.src):
            continue
        # x's bytes are loaded as they are; the weight's are computed (a BITCAST, Q4_0's nibbles)
        plain = [f.src[0].src[0] for f in product.src if f.src[0].op is Ops.LOAD]
        byte_loads = [n.src[0] for n in product.toposort() if n.op is Ops.LOAD and n.dtype in BYTE_DTYPES]
        if len(byte_loads) != 2 or len(plain) != 1 or any(range_coeff(ix.src[1], inner.src[-1]) != 1
                                                           for ix in byte_loads):
            continue
        x = plain[0]
        w = next(ix for ix in byte_loads if ix is not x)
        # the weight rows: panels and their 8 lanes (nn/quant.py's ranges), x's rows: the last range it alone reads
        cols = [r for r in glob if range_size(r) is not None and range_coeff(x.src[1], r) == 0
                and range_coeff(w.src[1], r) not in (0, None)]
        rows = [r for r in glob if range_coeff(w.src[1], r) == 0 and range_coeff(x.src[1], r) not in (0, None)]
        if len(cols) != 2 or range_size(cols[1]) != INT8_DOT_LANES or not rows:
            continue
        size = range_size(rows[-1])
        tile = next((t for t in (INT8_GEMM_ROWS, 2) if size is None or size % t == 0), 1)
        opts = [Opt(OptKind.UPCAST, rows[-1].arg[0], tile)] if tile > 1 else []
        return opts + [Opt(OptKind.UPCAST, cols[1].arg[0], INT8_DOT_LANES), Opt(OptKind.OUTER, cols[0].arg[0], 0),
                       Opt(OptKind.STAGE, cols[0].arg[0], w.src[0].arg[0])]
    return []


def _byte_dot_turns(turns: tuple[UOp, ...], byte_loads: list[UOp]) -> bool:
    """Whether a block sum's ranges are the 4 turns of a byte dot product: one range k < 4 that moves both
    loads by 8 (Q8_0), or h, t < 2 where t moves both by 8 and h moves one by 16 and the other not at all
    (Q4_0: the activation's second half, the same bytes' high nibbles)."""
    index = [ix.src[1] for ix in byte_loads]
    if len(turns) == 1:
        return range_size(turns[0]) == 4 and all(range_coeff(i, turns[0]) == INT8_DOT_LANES for i in index)
    if len(turns) != 2 or any(range_size(r) != 2 for r in turns):
        return False

    def nibble_turns(h: UOp, t: UOp) -> bool:
        steps = sorted(range_coeff(i, h) for i in index)
        return all(range_coeff(i, t) == INT8_DOT_LANES for i in index) and steps == [0, 2 * INT8_DOT_LANES]
    return nibble_turns(*turns) or nibble_turns(*reversed(turns))


def column_reduce_opts(glob: list[UOp], inner: UOp, loads: list[UOp], store_index: UOp,
                       caps: Capabilities) -> list[Opt]:
    """A reduction along a strided axis whose outputs are contiguous along a global range (a column sum:
    a bias gradient over the batch): lanes across that range, each accumulating its own output, with
    contiguous vector loads. Partial sums of the strided reduction instead walk the columns one at a time
    (a power-of-two row stride maps every load of the walk to the same few cache sets)."""
    if inner.arg[1] != AxisKind.REDUCE or any(range_coeff(ix.src[1], inner) == 1 for ix in loads):
        return []
    for last in reversed(glob):
        if range_size(last) is None or range_coeff(store_index.src[1], last) != 1:
            continue
        coeffs = [range_coeff(ix.src[1], last) for ix in loads]
        if any(c not in (0, 1) for c in coeffs) or 1 not in coeffs:
            continue
        lanes = column_lanes(last, caps)
        return [Opt(OptKind.UPCAST, last.arg[0], lanes)] if lanes else []
    return []


def outer_tile_opts(ast: UOp, glob: list[UOp], red: UOp, loads: list[UOp], store_index: UOp,
                    caps: Capabilities) -> list[Opt]:
    """An outer-product register tile: the columns are the innermost global range along which some
    operand (or the output) is contiguous and some operand is reused (does not depend on it), in
    vectors; the rows a range the vector operand does not depend on (a matmul's rows, a conv's output
    channels), unrolled, as many as the registers allow. Big two-range kernels also get their column
    panels staged (stage_opts); when the vector operand would be gathered and is not staged (a batched
    q @ k.T), a tile of dot products (dot_tile_opts) is used instead where it applies."""
    operands = reduce_operands(red, loads)
    # columns along which no operand of the reduction is gathered first (a strided convolution's output
    # channels, its weight stored with them contiguous, rather than its image row, read every other pixel)
    plain = [r for r in glob if all(range_coeff(ix.src[1], r) in (0, 1) for ix in operands)
             and any(range_coeff(ix.src[1], r) == 1 for ix in operands)]
    padded_tile: list[Opt] = []  # the tile of a contiguous output range padded to full vectors, if any
    deep_padded: tuple[UOp, int] | None = None  # such a range whose column panel does not fit the L1
    for last in [r for r in reversed(glob) if r in plain] + [r for r in reversed(glob) if r not in plain]:
        if range_size(last) is None:
            continue
        # a contiguous output counts too: x @ W.T (both operands strided along the output column)
        contiguous = any(range_coeff(ix.src[1], last) == 1 for ix in [*loads, store_index])
        # a tile only pays when some operand is reused across it; a plain row reduction gets
        # partial accumulators instead
        reused = any(range_coeff(ix.src[1], last) == 0 for ix in loads)
        padded = padded_columns(last, caps) if last in plain and range_coeff(store_index.src[1], last) == 1 else 0
        if padded and reused and not padded_tile:
            # kept unless another range's tile is one of long rows (a deep projection: measured faster); a short
            # row in one padded half-width vector only where nothing else tiles (a pointwise conv at 7 x 7 whose
            # weight is contiguous along the output channels: 7 pixels x 32 channels ran 1.5x faster on CPU,
            # 2.7x on X86, than 4 x 7 x 8 lanes)
            full = padded % int(caps.vector_width or 1) == 0
            padded_tile = padded_tile_opts(red, glob, operands, last, padded, caps, store_index) if full else []
            if padded_tile:
                continue
            deep_padded = deep_padded or (last, padded)
        if not (contiguous and reused) or not column_lanes(last, caps):
            continue
        # the widest row the device likes (tile_vectors), narrower while a big kernel's column panel of
        # that width would not fit the staging scratch; two vectors (or what fits) when none does
        # (a dequantized weight's panel of `cols` columns must fit the staging scratch as float32 values)
        decompress = decompressed_rows(ast, red) and bool(getattr(caps, "stage_bytes", 0))
        cols = next((c for c in (column_lanes(last, caps, most) for most in tile_vector_counts(caps))
                     if not _stage_blocked(ast, red, glob, loads, last, c, caps)
                     and not (decompress and not _panel_fits(red, c, caps))), column_lanes(last, caps, 2))
        rows, tile_rows = _tile_rows(glob, operands, last, cols, caps)
        if rows is None:  # no row count fits beside that many vectors: fewer vectors, more rows
            narrower = [c for c in (column_lanes(last, caps, v) for v in tile_vector_counts(caps)) if 0 < c < cols]
            tried = [(c, *_tile_rows(glob, operands, last, c, caps)) for c in narrower]
            cols, rows, tile_rows = next((t for t in tried if t[1] is not None), (cols, rows, tile_rows))
        long_rows = _long_rows(red, glob, operands, last, tile_rows, cols, caps)
        if padded_tile and long_rows is None:
            return padded_tile
        if long_rows is not None:
            rows, tile_rows, cols = long_rows
        along = [ix for ix in loads if last in ix.src[1].toposort()]
        opts: list[Opt] = []
        top = max(r.arg[0] for r in ranges_of(ast))
        if rows is not None:  # the row tile is split first so its upcast loop sits outside the columns
            opts.append(Opt(OptKind.UPCAST, rows.arg[0], tile_rows))
            top += 2
        opts.append(Opt(OptKind.UPCAST, last.arg[0], cols))
        staged = stage_opts(ast, red, glob, rows, last, loads, tile_rows, cols, top + 1, caps)
        if not staged and rows is not None:
            staged = row_stage_opts(glob, red, rows, last, loads, tile_rows, cols, top - 1, caps)
        if staged or all(range_coeff(ix.src[1], last) == 1 for ix in along):
            return opts + staged
        if rows is not None and decompress and _panel_fits(red, cols, caps):
            # a quantized matmul over a prompt's rows: its weight panel is dequantized into staging scratch
            # once (decompress_stage_opts; the copy transposes in registers, linearize.stage_copy) and read
            # as column vectors by every row tile, so each broadcast activation feeds a whole row of the tile
            # and an epilogue (GELU) runs in vectors. A tile of dot products over 4 weight rows read each row
            # tile's activations again per 4 weight rows: GPT-2's 768 x 3072 and 2304 x 768 Q4_0 projections
            # over 512 tokens ran 1.3-2x slower that way (one Zen 4 core; about even at 32 tokens)
            return opts
        return dot_tile_opts(glob, red, loads, caps, _streams_rows(ast, red)) or opts
    if not padded_tile and deep_padded is not None:
        # no other tile (a 3x3 conv over 128 channels at 28 x 28: 28 pixels take no 16- or 8-lane vectors):
        # padded vectors all the same, their panel read from the L2 (11-37x faster than the lanes it had)
        return padded_tile_opts(red, glob, operands, *deep_padded, caps, store_index, fit_l1=False)
    return padded_tile


def padded_columns(last: UOp, caps: Capabilities) -> int:
    """The size `last` is padded to for column vectors (PADTO), or 0: only where the device gates a vector's
    lanes with single masked moves, the width does not divide the size and the padding adds at most
    1/PAD_MAX_WASTE of the lanes, in full-width vectors (a 28- or 56-pixel row: 32 and 64) or else in one
    vector of half the width (a 7-pixel row: 8, not 16; never where half the width divides the size, which
    column_lanes takes unpadded). A pointwise convolution over a 28x28 map had no such range, so its tile took
    the output channels as columns and scattered every accumulator to 16 planes: 1.36x slower than 8
    channels x 2 padded vectors of pixels (AVX-512, Zen 4)."""
    width = int(caps.vector_width or 1)
    size = range_size(last)
    if width < 4 or size is None or size % width == 0 or not getattr(caps, "masked_vectors", False):
        return 0
    half = width // 2
    return padded_within(size, width) or (half if half >= 4 and size < half and padded_within(size, half) else 0)


def padded_within(size: int, lanes: int) -> int:
    """`size` rounded up to a multiple of `lanes`, where the padding adds at most 1/PAD_MAX_WASTE of the padded
    points; else 0."""
    padded = -(-size // lanes) * lanes
    return padded if (padded - size) * PAD_MAX_WASTE <= padded else 0


def padded_tile_opts(red: UOp, glob: list[UOp], operands: list[UOp], last: UOp, padded: int,
                     caps: Capabilities, store_index: UOp, fit_l1: bool = True) -> list[Opt]:
    """An outer-product tile whose columns are `last` padded to `padded` points (PADTO; the lanes past the
    end gated off): as many vectors per row as divide it (tile_vector_counts) and fit the registers beside
    their rows and whose column panel (reduction x columns) fits the L1, the rows from _tile_rows as for any
    tile; a row padded to one half-width vector (7 pixels in 8 lanes) takes _short_row_tile's rows first.
    None for a deeper reduction (a 3x3 conv over 64 channels and more), which keeps its tile of long
    rows or its staged panels, measured faster there: 144 -> 24 channels at 56 x 56 got 2 vectors (1.2x
    faster than its 8-lane tile), not 4, whose panel would not fit. With `fit_l1` False the panel may
    outgrow the L1 (the last resort of a kernel that gets no other tile)."""
    width = int(caps.vector_width or 1)
    regs = int(caps.registers or 16)
    lanes = min(width, padded)  # a full vector, or one of half the width (padded_columns)
    k = math.prod(range_size(r) or 0 for r in red.src[1:])
    panel = k * lanes * max(ix.dtype.itemsize for ix in operands)  # bytes per vector of columns
    vecs = next((v for v in tile_vector_counts(caps) if padded % (v * lanes) == 0 and 2 * v + 1 <= regs
                 and 0 < v * panel and (not fit_l1 or v * panel <= (caps.l1_bytes or 32 * 1024))), 0)
    if not vecs:
        return []
    short = _short_row_tile(glob, operands, store_index, last, caps) if lanes < width else None
    if short is not None:
        rows, tile_rows, steps = short
        opts = [Opt(OptKind.UPCAST, rows.arg[0], tile_rows), Opt(OptKind.UPCAST, steps.arg[0], range_size(steps))]
    else:
        rows, tile_rows = _tile_rows(glob, operands, last, vecs * lanes, caps)
        opts = [Opt(OptKind.UPCAST, rows.arg[0], tile_rows)] if rows is not None else []
    return opts + [Opt(OptKind.PADTO, last.arg[0], padded), Opt(OptKind.UPCAST, last.arg[0], vecs * lanes)]


def _short_row_tile(glob: list[UOp], operands: list[UOp], store_index: UOp, last: UOp,
                    caps: Capabilities) -> tuple[UOp, int, UOp] | None:
    """(rows range, rows, steps range) of the tile of a short row padded to one half-width vector (a 3x3 conv at
    7 x 7: 7 pixels in 8 lanes): besides rows of a range the vector operand does not depend on (the output
    channels), the whole global range `steps` along which the vector operand and the output move by `last`'s
    length times their step along it and the broadcast operand does not move (the map's next row of pixels),
    each step a vector of its own: rows x steps accumulators, the broadcast loaded once for a row's `steps`
    vectors, and the vectors of neighbouring steps on the same cache lines. As many rows (8, 6, 4, 2) as
    divide their range and fit the registers, LONG_ROWS_SPARE left. A 3x3 conv over 512 channels at 7 x 7
    (batch 8, 2 threads): 4 channels x 7 rows x 8 lanes ran 2.1x faster than 16 channels x 8 lanes on the CPU
    backend, 2.2x on X86 (and 1.6x faster than 2 channels x 7 rows there). None where no such range or row count
    fits."""
    regs = int(caps.registers or 16)
    size = range_size(last)
    along = [ix for ix in operands if last in ix.src[1].toposort()]
    moved = [*along, store_index]
    if not along or size is None:
        return None

    def is_steps(r: UOp) -> bool:
        moves = [range_coeff(ix.src[1], r) for ix in moved]
        return all(c is not None and c != 0 and c == size * (range_coeff(ix.src[1], last) or 0)
                   for c, ix in zip(moves, moved)) \
            and all(range_coeff(ix.src[1], r) == 0 for ix in operands if ix not in along)
    steps = next((r for r in reversed(glob) if r is not last and range_size(r) is not None
                  and range_size(r) >= 2 and is_steps(r)), None)
    if steps is None:
        return None
    count = range_size(steps)
    rows = [r for r in reversed(glob) if r is not last and r is not steps
            and all(range_coeff(ix.src[1], r) == 0 for ix in along)]
    fits = [(r, n) for r in rows for n in (8, 6, 4, 2) if divides(r, n) and n * count + LONG_ROWS_SPARE <= regs]
    return (fits[0][0], fits[0][1], steps) if fits else None


def reduce_operands(red: UOp, loads: list[UOp]) -> list[UOp]:
    """The loads the reduction reads at every step (all of them when it reads none): an epilogue's loads (a
    residual added after a convolution), read once per output, do not choose the tile's rows."""
    inside = {n.src[0] for n in red.toposort() if n.op is Ops.LOAD}
    return [ix for ix in loads if ix in inside] or loads


def _tile_rows(glob: list[UOp], loads: list[UOp], last: UOp, cols: int, caps: Capabilities) -> tuple[UOp | None, int]:
    """The row range of an outer-product tile with `cols` columns along `last`, and how many rows fit the
    registers with them: a range the vector operand does not depend on (else one some operand ignores)."""
    vecs = max(1, cols // caps.vector_width)
    regs = int(caps.registers or 16)
    fits = [r for r in (8, 6, 4, 2) if r * vecs + vecs + 1 <= regs]
    if cols < caps.vector_width and max(tile_vector_counts(caps)) >= 4:  # one narrower vector: more rows
        fits = [r for r in HALF_VECTOR_ROWS if r + LONG_ROWS_SPARE <= regs] + fits
    along = [ix for ix in loads if last in ix.src[1].toposort()]
    others = [r for r in reversed(glob) if r is not last]
    shared = [r for r in others if along and all(range_coeff(ix.src[1], r) == 0 for ix in along)]
    some = [r for r in others if any(range_coeff(ix.src[1], r) == 0 for ix in loads)]
    # enough independent accumulators to hide the FMA latency at the device's FMA rate (units x latency)
    # where some range allows it, else the largest tile that divides
    need = int(getattr(caps, "fma_units", 0) or 0) * int(getattr(caps, "fma_latency", 0) or 0)
    tiles = [(r, n) for r in shared + some for n in fits if divides(r, n)]
    if not tiles:  # no even count divides: an odd one (a 7x7 map's row of 7 pixels, 2.6x faster than one row)
        odd = [r for r in ODD_TILE_ROWS if r * vecs + vecs + 1 <= regs]
        tiles = [(r, n) for r in shared + some for n in odd if divides(r, n)]
    found = next((t for t in tiles if t[1] * vecs >= need), tiles[0] if tiles else None)
    if found is not None:
        return found
    # no constant range fits: rows over a Variable (a batch, a prompt's tokens), padded in the last tile
    # (opts._split_symbolic). SYMBOLIC_TILE_ROWS keeps a Variable of 1 (decode, batch 1) from paying much
    # for the copies it computes in the padded rows
    sym = next((r for r in shared + some if range_size(r) is None), None)
    rows = next((n for n in fits if n <= SYMBOLIC_TILE_ROWS), 0)
    return (sym, rows) if sym is not None and rows else (None, 1)


def _long_rows(red: UOp, glob: list[UOp], operands: list[UOp], last: UOp, tile_rows: int, cols: int,
               caps: Capabilities) -> tuple[UOp, int, int] | None:
    """(range, rows, columns) of a tile of one vector and a whole short row range, for a reduction so deep
    that the vector operand's column panel (reduction x columns) does not fit the L1: each of its vectors,
    loaded from the L2, then serves every row instead of a few (a 3x3 conv over 256 channels at 14x14:
    14 pixels x 16 output channels ran 1.8x faster than 2 pixels x 64). None where it does not apply or
    does not give LONG_ROWS_GAIN times the rows."""
    width = int(caps.vector_width or 1)
    regs = int(caps.registers or 16)
    along = [ix for ix in operands if last in ix.src[1].toposort()]
    k = math.prod(range_size(r) or 0 for r in red.src[1:])
    if not along or not divides(last, width) or k * cols * along[0].dtype.itemsize <= (caps.l1_bytes or 32 * 1024):
        return None
    # the innermost such range (a row of pixels: the broadcast operand's values side by side), not an outer
    # one (a batch of 16 images as 16 rows ran 1.8x slower than 4 images x 4 vectors, its input staged)
    inner = next((r for r in reversed(glob) if r is not last and all(range_coeff(ix.src[1], r) == 0 for ix in along)),
                 None)
    size = 0 if inner is None else range_size(inner) or 0
    if not LONG_ROWS_GAIN * tile_rows <= size <= regs - LONG_ROWS_SPARE:
        return None
    return inner, size, width


def _stage_blocked(ast: UOp, red: UOp, glob: list[UOp], loads: list[UOp], last: UOp, cols: int,
                   caps: Capabilities) -> bool:
    """A kernel big enough to stage its column panels whose panel of `cols` columns cannot be (too wide
    for the scratch, or too few panels to share among the threads)."""
    rows, tile_rows = _tile_rows(glob, reduce_operands(red, loads), last, cols, caps)
    plan = _stage_plan(red, glob, rows, last, loads, tile_rows, cols, caps)
    return plan is not None and not plan[1]


def dot_tile_opts(glob: list[UOp], red: UOp, loads: list[UOp], caps: Capabilities, stream: bool = True,
                  scalar: bool = False) -> list[Opt]:
    """A tile of dot products, for kernels whose operands are contiguous along the reduction, not
    along an output column (a conv's weight gradient, batched q @ k.T): the innermost reduce range is
    split into vector lanes (SPLIT_REDUCE) and up to two output ranges, each of which some operand does
    not depend on, are unrolled (UPCAST), so each loaded vector serves a row or column of the tile;
    a x b vector accumulators plus a + b operand vectors fit the registers. With no output range that
    divides, the lanes alone (a quantized LM head over 50257 rows: one scalar FMA chain per row before).
    With `stream`, a matvec over a dequantized weight reads its rows one at a time (streamed_row_opts); a
    costly epilogue (GELU) keeps the row tile, whose unrolled rows overlap its scalar chains. With `scalar`,
    where no lane count divides the innermost reduce range, the tile without lanes (scalar_dot_tile_opts)."""
    inner = red.src[-1]
    width = max(1, int(caps.vector_width or 1))
    regs = int(caps.registers or 16)
    if inner.arg[1] != AxisKind.REDUCE or range_size(inner) is None:
        return []
    contiguous = [ix for ix in loads if range_coeff(ix.src[1], inner) == 1]
    if not contiguous or any(range_coeff(ix.src[1], inner) not in (0, 1) for ix in loads):
        return []
    # a full or half vector that divides, else one padded (padded_reduce_opts), else a quarter of the width (a
    # 28-pixel row where the device has no masked moves: a 3x3 conv weight gradient at 28 x 28 ran 30x faster in 4
    # lanes than with no tile; with them, 28 -> 32 in 16 lanes ran 1.6x faster than 4 lanes on CPU, 2.2x on X86)
    lanes = next((n for n in (width, width // 2) if n >= 4 and divides(inner, n) and range_size(inner) >= n), 0)
    pad = [] if lanes else padded_reduce_opts(inner, caps)
    quarter = width // 4
    lanes = pad[0].amount if pad else lanes or (quarter if quarter >= 4 and divides(inner, quarter)
                                                and range_size(inner) >= quarter else 0)
    # a symbolic range (a Variable batch) qualifies too: its last tile is padded (opts._split_symbolic)
    reuse = [r for r in reversed(glob) if any(range_coeff(ix.src[1], r) == 0 for ix in loads)]
    if not (lanes or scalar) or not reuse:
        return []
    if lanes and stream and len(reuse) == 1 and decompressed_operand(red) is not None:
        return pad + streamed_row_opts(red, lanes)
    picked: list[tuple[UOp, int]] = []
    for r in reuse:
        amount = next((a for a in (4, 2) if divides(r, a) or (range_size(r) is None and a <= SYMBOLIC_TILE_ROWS)), 0)
        if amount and len(picked) < 2:
            picked.append((r, amount))
    while picked and math.prod(a for _, a in picked) + sum(a for _, a in picked) > regs:
        picked.pop()
    picked = _with_shift_range(picked, glob, inner, loads, regs)
    if not picked:  # no output range to tile (odd sizes: a vocabulary of 50257): lanes along the reduction
        total = math.prod(range_size(r) or 0 for r in red.src[1:])
        return pad + [Opt(OptKind.SPLIT_REDUCE, inner.arg[0], lanes)] if lanes and total >= 4 * lanes else []
    split = [Opt(OptKind.SPLIT_REDUCE, inner.arg[0], lanes)] if lanes else []
    return pad + [Opt(OptKind.UPCAST, r.arg[0], a) for r, a in picked] + split


def padded_reduce_opts(inner: UOp, caps: Capabilities) -> list[Opt]:
    """[PADTO] of a dot tile's innermost reduce range that neither a full nor a half vector divides (a 3x3 conv
    weight gradient over 28-, 14- or 7-pixel rows), to the most lanes (the device's width, half or a quarter, 4
    or more) whose padding adds at most 1/PAD_MAX_WASTE of them: 28 -> 32, 14 -> 16 in 16 lanes, 7 -> 8 in 8, on
    a 16-lane device; none where a quarter vector divides and nothing wider pads within that (12, 20: 4 lanes).
    Its Opt's amount is the lanes; the points past the end read nothing (masked loads) and add 0. Only where
    the device loads a vector whose last lanes are gated off as one masked move (masked_vectors); [] elsewhere."""
    width = max(1, int(caps.vector_width or 1))
    size = range_size(inner)
    if size is None or not getattr(caps, "masked_vectors", False):
        return []
    for n in (width, width // 2, width // 4):
        if n >= 4 and size % n and padded_within(size, n):
            return [Opt(OptKind.PADTO, inner.arg[0], n)]
    return []


def scalar_dot_tile_opts(glob: list[UOp], red: UOp, loads: list[UOp], caps: Capabilities) -> list[Opt]:
    """The tile of dot products without lanes, for a kernel that gets nothing else: its innermost reduce range
    takes no 4 or more lanes (a 3x3 conv weight gradient over 14- or 7-pixel rows), so it ran one scalar FMA
    chain per output; the tile's independent chains share each load (256 channels at 14 x 14: 7x faster)."""
    return dot_tile_opts(glob, red, loads, caps, stream=False, scalar=True)


def streamed_row_opts(red: UOp, lanes: int) -> list[Opt]:
    """One dot product per row of a dequantized weight against a single vector (a decode step's matvec, an
    LM head): no tile of rows, whose interleaved reads of 2 or 4 rows held a Q8_0 matvec to half the
    memory bandwidth a single stream per row reaches (GPT-2's 3072 x 768 Q8_0 projection read cold, one
    thread: 448 us as 4 rows, 204 us as one). The innermost reduce range becomes the vector lanes and the
    one above it, when even, a second set of accumulators (SPLIT_REDUCE by 2: Q4_0 and Q8_0's halves), so
    two FMA chains overlap (164 us). Not with a GELU epilogue: one row's ~150 dependent scalar operations
    per output then cost the Q4_0 projection more than the stream saved (233 -> 315 us in GPT-2's decode)."""
    inner, outer = red.src[-1], red.src[-2] if len(red.src) > 2 else None
    opts = [Opt(OptKind.SPLIT_REDUCE, inner.arg[0], lanes)]
    if outer is not None and outer.arg[1] == AxisKind.REDUCE and range_size(outer) is not None and divides(outer, 2):
        opts.insert(0, Opt(OptKind.SPLIT_REDUCE, outer.arg[0], 2))
    return opts


def _with_shift_range(picked: list[tuple[UOp, int]], glob: list[UOp], inner: UOp, loads: list[UOp],
                      regs: int) -> list[tuple[UOp, int]]:
    """A dot tile's output ranges plus, unrolled whole, a short output range (2 to 4 points) along which a
    contiguous operand moves by one element, as it does along the lanes (a conv weight gradient's kernel
    column: the input at w + kw) and another operand does not (the output gradient, reused by each
    point). Its points' vectors overlap on the same cache lines, so it adds
    accumulators without adding lines to load; the last picked range gives way (4 -> 2 points) while the
    accumulators would pass regs - 8 (the operand vectors need the rest). The weight gradient of a 3x3
    conv over 56-pixel rows ran 1.15x faster as 4 x 2 x 3 than as 4 x 4."""
    taken = {r for r, _ in picked}
    contiguous = [ix for ix in loads if range_coeff(ix.src[1], inner) == 1]
    shift = next((r for r in glob if r not in taken and range_size(r) in (2, 3, 4)
                  and any(range_coeff(ix.src[1], r) == 1 for ix in contiguous)
                  and any(range_coeff(ix.src[1], r) == 0 for ix in loads)), None)
    if shift is None or not picked:
        return picked
    n = range_size(shift)
    if math.prod(a for _, a in picked) * n > regs - 8 and picked[-1][1] == 4:
        picked = picked[:-1] + [(picked[-1][0], 2)]
    if math.prod(a for _, a in picked) * n > regs - 8:
        return picked
    return picked + [(shift, n)]


def _stage_plan(red: UOp, glob: list[UOp], rows: UOp | None, last: UOp, loads: list[UOp], tile_rows: int,
                cols: int, caps: Capabilities) -> tuple[int, bool] | None:
    """(slot of B, whether its panel of `cols` columns fits) for a kernel big enough to stage on a device
    with staging scratch; None when staging does not apply."""
    # the rows may run over a Variable (a prompt's tokens), whose count is known only at run time: sized at
    # its bound, and staged only where B outgrows half the last-level cache (symbolic_stage_pays)
    if len(glob) != 2 or rows is None or tile_rows < 2 or \
            any(range_size(r) is None for r in [*glob, *red.src[1:]] if r is not rows):
        return None
    k = math.prod(range_size(r) for r in red.src[1:])
    work = range_max(rows) * range_size(last) * k
    others = [ix for ix in loads if range_coeff(ix.src[1], rows) == 0 and last in ix.src[1].toposort()]
    if len(others) != 1 or not getattr(caps, "stage_bytes", 0):
        return None
    b_bytes = range_size(last) * k * others[0].dtype.itemsize
    min_b_bytes = caps.l2_bytes // 4 if caps.l2_bytes else STAGE_MIN_B_BYTES
    if work < STAGE_MIN_WORK or b_bytes <= min_b_bytes or range_max(rows) // tile_rows < 4:
        return None
    if range_size(rows) is None and not symbolic_stage_pays(b_bytes, caps):
        return None
    panels = range_size(last) // cols
    fits = panels >= 2 * max(1, caps.threads) and k * cols * others[0].dtype.itemsize <= caps.stage_bytes
    return others[0].src[0].arg[0], fits


def symbolic_stage_pays(b_bytes: int, caps: Capabilities) -> bool:
    """Whether a matmul whose rows are a Variable stages B's panels: staging copies B once a launch, however
    few rows run, while unstaged each row tile reads B again, from the last-level cache where B fits in half
    of it (cheap: staged, 1 to 16 tokens took up to 2x longer), from memory where it does not (x @ W of
    896 x 4864 and 896 x 9728 at 64 tokens: 3.8x faster staged; 1 thread, Zen 4 with 32 MiB of L3). An
    unknown L3 stages (the constant-rows rule)."""
    return not caps.l3_bytes or b_bytes > caps.l3_bytes // 2


def stage_opts(ast: UOp, red: UOp, glob: list[UOp], rows: UOp | None, last: UOp, loads: list[UOp], tile_rows: int,
               cols: int, panel: int, caps: Capabilities) -> list[Opt]:
    """Cache blocking for a big matmul-like kernel (rows x columns, one reduction): the column panels
    (range id `panel` after the tile splits) become the outermost loop and the operand that does not
    depend on the rows (B) is staged per panel into a contiguous local array, so it stays in cache for
    every row tile, whatever its layout (B, or W.T of `x @ W.T`). Only on devices with stage_bytes
    of launch-private scratch (the CPU: its stack) for the panel."""
    plan = _stage_plan(red, glob, rows, last, loads, tile_rows, cols, caps)
    if plan is None or not plan[1]:
        return []
    return [Opt(OptKind.OUTER, panel, 0), Opt(OptKind.STAGE, panel, plan[0])]


def row_stage_opts(glob: list[UOp], red: UOp, rows: UOp, last: UOp, loads: list[UOp], tile_rows: int, cols: int,
                   row_tiles: int, caps: Capabilities) -> list[Opt]:
    """Stage the operand a register tile broadcasts along its rows (a conv's weight: one value per output
    channel) when it is strided along the innermost reduction: each time the row tiles' loop (range id
    `row_tiles` after the split) advances, its tile_rows x reduction values are copied into a local
    array in the order the tile reads them (STAGE), so every step of the reduction reads one contiguous
    group instead of `tile_rows` values a row apart (a transposed conv's weight, 2304 bytes apart per input
    channel, put every step on new cache lines: the conv's input gradient ran 1.3x slower than its forward).
    Only for big kernels, on a device with staging scratch, when the panel fits it and serves at least
    ROW_STAGE_MIN_REUSE column tiles each time it is copied (an MLP's 512 x 512 weight gradient, 8 tiles
    per copy, ran 4% slower staged); the linearizer skips a gated or twice-loaded operand."""
    inner = red.src[-1]
    reduce_sizes = [range_size(r) for r in red.src[1:]]
    if not getattr(caps, "stage_bytes", 0) or tile_rows < 2 or None in reduce_sizes or range_size(rows) is None:
        return []
    broadcast = [ix for ix in reduce_operands(red, loads)
                 if last not in ix.src[1].toposort() and rows in ix.src[1].toposort()]
    if len(broadcast) != 1 or range_coeff(broadcast[0].src[1], inner) == 1:
        return []
    slot = broadcast[0].src[0].arg[0]
    if sum(1 for ix in loads if ix.src[0].arg[0] == slot) != 1:
        return []
    k = math.prod(reduce_sizes)
    work = k * math.prod(range_max(r) for r in glob)
    if work < STAGE_MIN_WORK or tile_rows * k * broadcast[0].dtype.itemsize > caps.stage_bytes:
        return []
    inside = glob[glob.index(rows) + 1:]  # the loops the row tiles' loop holds
    reuse = math.prod(range_max(r) for r in inside) // (cols if last in inside else 1)
    return [Opt(OptKind.STAGE, row_tiles, slot)] if reuse >= ROW_STAGE_MIN_REUSE else []


def decompressed_operand(red: UOp) -> tuple[UOp, int] | None:
    """(operand, slot) when a reduction's product MUL(a, b) has an operand computed from the values of integer
    loads (a weight dequantized in the kernel: casts, shifts and masks of its blocks' bytes, times a
    scale), not a load itself; slot is the integer buffer it reads most often (the blocks). Integer loads
    that only form an address (a gather's indices) do not count."""
    if red.src[0].op is not Ops.MUL:
        return None
    for operand in red.src[0].src:
        if operand.op is Ops.LOAD:
            continue
        counts: dict[int, int] = {}
        stack, seen = [operand], set()
        while stack:
            x = stack.pop()
            if x in seen or x.op is Ops.INDEX:
                continue
            seen.add(x)
            if x.op is Ops.LOAD and x.dtype.is_int:
                slot = x.src[0].src[0].arg[0]
                counts[slot] = counts.get(slot, 0) + 1
                continue
            stack.extend(x.src)
        if counts:
            return operand, max(counts, key=lambda k: counts[k])
    return None


# an epilogue (the store's value above the reduction) with one of these runs as many scalar instructions per
# output as a 768-long dot product's vector FMAs, or more, in a tile of dot products (GELU: ~150 after
# decompose_transcendentals); an outer-product tile runs it in vectors
COSTLY_EPILOGUE_OPS = frozenset({Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.SQRT, Ops.RECIPROCAL, Ops.FDIV, Ops.POW})


def _streams_rows(ast: UOp, red: UOp) -> bool:
    """Whether a matvec over a dequantized weight may read its rows one at a time (dot_tile_opts' `stream`):
    when its epilogue is cheap; a costly one (GELU) is computed once per output, so a tile of rows shares it.
    Every one-row quantized matvec is a kernel of its own (nn/quant.py), so such a kernel has one product."""
    return not _costly_epilogue(ast, red)


def _costly_epilogue(ast: UOp, red: UOp) -> bool:
    """Whether the store's value computes a transcendental or a division on the reduction's result."""
    stack, seen = [ast.src[0].src[0].src[1]], set()
    while stack:
        x = stack.pop()
        if x in seen or x is red or x.op in (Ops.LOAD, Ops.INDEX, Ops.REDUCE):
            continue
        seen.add(x)
        if x.op in COSTLY_EPILOGUE_OPS:
            return True
        stack.extend(x.src)
    return False


def _panel_fits(red: UOp, cols: int, caps: Capabilities) -> bool:
    """Whether `cols` columns of float32 values over the whole reduction fit the device's staging scratch."""
    sizes = [range_size(r) for r in red.src[1:]]
    return None not in sizes and math.prod(sizes) * cols * 4 <= caps.stage_bytes


def decompressed_rows(ast: UOp, red: UOp) -> bool:
    """Whether reduction `red` of a one-block kernel has a dequantized operand (decompressed_operand) and
    global ranges it does not depend on (rows) numbering at least DECOMPRESS_STAGE_MIN_ROWS at their
    largest (a symbolic range: its bound, a prompt's max_seq_len)."""
    found = decompressed_operand(red)
    if found is None or len(ast.src) != 1 or ast.src[0].op is not Ops.END:
        return False
    used = set(found[0].toposort())
    rows = [r for r in ast.src[0].src[1:] if r.arg[1] == AxisKind.GLOBAL and r not in used]
    return bool(rows) and math.prod(range_max(r) for r in rows) >= DECOMPRESS_STAGE_MIN_ROWS


def decompress_stage_opts(ast: UOp, opts: list[Opt], caps: Capabilities | None) -> list[Opt]:
    """A reduction whose weight operand is dequantized in the kernel (decompressed_operand) and whose rows
    ignore it (a quantized matmul's prompt tokens): the global range its tile's weight values depend on
    (its panel: a register tile's columns' outer range) becomes the outermost loop (OUTER) and, each time
    it advances, the dequantized values are computed once into staging scratch (STAGE of the blocks'
    slot: the linearizer stages the product's operand, not the raw loads), which every row tile then reads.
    Without it each row tile dequantized the whole weight again (a 512-token prompt: 128 times).
    Only on devices with stage_bytes, where the rows number at least DECOMPRESS_STAGE_MIN_ROWS."""
    if not opts or any(o.kind is OptKind.STAGE for o in opts) or not getattr(caps, "stage_bytes", 0):
        return []
    reduces = [n for n in ast.toposort() if n.op is Ops.REDUCE]
    found = decompressed_operand(reduces[0]) if len(reduces) == 1 else None
    if found is None or not decompressed_rows(ast, reduces[0]):
        return []
    operand, slot = found
    # the panel must be a column tile (UPCAST of a range the weight depends on): a panel of one column (an
    # LM head of 50257 rows, untiled) would read every row of the activations again per weight row
    used = set(operand.toposort())
    if not any(o.kind is OptKind.UPCAST and any(r.arg[0] == o.axis for r in used if r.op is Ops.RANGE)
               for o in opts):
        return []
    split = split_kernel(ast, opts)
    value = product_operand(split.src[0], slot)
    if value is None:
        return []
    ranges = [r for r in value.toposort() if r.op is Ops.RANGE]
    panel = [r for r in ranges if r.arg[1] == AxisKind.GLOBAL]
    inner = [r for r in ranges if r.arg[1] != AxisKind.GLOBAL]
    if len(panel) != 1 or any(range_size(r) is None for r in inner):
        return []
    if math.prod(range_size(r) for r in inner) * value.dtype.itemsize > caps.stage_bytes:
        return []
    return [Opt(OptKind.OUTER, panel[0].arg[0], 0), Opt(OptKind.STAGE, panel[0].arg[0], slot)]


def streams_weight(ast: UOp, caps: Capabilities | None) -> bool:
    """Whether the kernel is a one-row byte dot product (nn/quant.py's decode matvec, int8_dot_lanes) on a
    device that contracts it (caps.int8_dot): one instruction does 32 of its multiply-adds (8 int32 lanes
    of 4 bytes), so it runs at the speed its weight's bytes come from memory: Qwen2's 64.5 KB k/v matvec
    takes about 6 us on one Zen 4 core (weights cold), where its operation count (488k: nibble shifts and
    masks counted one by one) at THREAD_PART_WORK's rate would take 150."""
    if caps is None or not caps.int8_dot:
        return False
    return int8_dot_lanes([n for n in ast.toposort() if n.op is Ops.REDUCE]) is not None


def thread_parts(ast: UOp, caps: Capabilities, streams: bool = False) -> int:
    """How many parts the kernel's work pays a thread handoff for, before the device's thread count caps
    it: its operations and stores over THREAD_PART_WORK; or, for a kernel whose time is its bytes read
    (`streams`, see streams_weight) on a device that says its read rate and handoff cost
    (Capabilities.read_gbs, thread_handoff_ns: polygrad/hostcpu.py), its time at one core's read rate
    over the handoff cost (each part must take at least a handoff: a split into p parts saves time
    (1 - 1/p) and costs about one handoff)."""
    ops, mem = estimate(ast)
    if streams and caps.read_gbs > 0 and caps.thread_handoff_ns > 0:
        return int(mem / caps.read_gbs // caps.thread_handoff_ns)  # GB/s = bytes per ns
    return (ops + stores_of(ast)) // THREAD_PART_WORK


def thread_opt(ast: UOp, caps: Capabilities | None, streams: bool = False) -> list[Opt]:
    """THREAD on the outermost global range (or one inside it that splits evenly, analysis.thread_axis),
    split among as many of the device's threads as the work pays a handoff for (thread_parts; none when
    fewer than two)."""
    if caps is None or caps.threads <= 1 or thread_axis(ast) is None:
        return []
    parts = min(caps.threads, thread_parts(ast, caps, streams))
    r = thread_axis(ast, parts)
    parts = min(parts, range_size(r))
    if parts < 2:
        return []
    return [Opt(OptKind.THREAD, r.arg[0], parts)]


def elementwise_vector_opts(ast: UOp, caps: Capabilities | None) -> list[Opt]:
    """An elementwise kernel (one END, no reduce) whose store is contiguous in its last range gets
    that range split into vector lanes (UPCAST by the device's vector width); on a device with
    `masked_lanes`, a range the width does not divide is padded first (PADTO: the last vector's lanes
    past the end are gated off)."""
    width = int(getattr(caps, "vector_width", 1) or 1)
    if width <= 1 or len(ast.src) != 1 or ast.src[0].op is not Ops.END or ast.src[0].src[0].op is not Ops.STORE:
        return []
    end = ast.src[0]
    if any(n.op is Ops.REDUCE for n in end.toposort()):
        return []
    last = end.src[-1]
    if last.arg[1] != AxisKind.GLOBAL or last.src[0].op is not Ops.CONST:
        return []
    if range_coeff(end.src[0].src[0].src[1], last) != 1:
        return []
    if range_size(last) % width == 0:
        return [Opt(OptKind.UPCAST, last.arg[0], width)]
    if not getattr(caps, "masked_lanes", False):
        return []
    # a size the width does not divide: padded to a multiple, the points past the end gated off (masked
    # lanes in the last vector); the padded range keeps its axis id
    return [Opt(OptKind.PADTO, last.arg[0], width), Opt(OptKind.UPCAST, last.arg[0], width)]
