"""Register tiles for window reductions on host devices: `window_tile_opts(...) -> [Opt]`.

Stage: lowering (device optimisation), called by host_opts.heuristic_opts before the outer-product tile.
Input: a simplified kernel AST's global ranges, its reduction, loads and store index, and the device's
Capabilities. Output: the Opts for a kernel whose reduction is a short window over an operand that moves
along every output range (a depthwise convolution, a pooling): each output reads its own few values, so
there is no operand to reuse across a tile as in a matmul. Vector lanes go along the output's contiguous
range (a row of output pixels), padded to a multiple of the lanes where they do not divide it (a 14- or
7-pixel row), and the rows of the tile are another output range (a depthwise convolution's channels),
as many as hide the FMA latency.
"""
from __future__ import annotations

import math

from polygrad.codegen.analysis import range_size
from polygrad.codegen.opts import Opt, OptKind
from polygrad.contract import Capabilities
from polygrad.uop.ops import Ops, UOp
from polygrad.uop.symbolic import range_coeff

# a reduction of at most this many points per output (a 7x7 window) is a window, not a contraction
WINDOW_MAX_POINTS = 64
# the lanes read the moving operand at most this far apart (a stride-2 convolution's input): a row of a
# matrix (a one-row matmul over 64 columns, its weight read 64 apart per output) is not a window
WINDOW_MAX_STRIDE = 4
# fewest lanes worth a vector: a narrower row (a 2x2 map) keeps the scalar loop
WINDOW_MIN_LANES = 4


def window_tile_opts(glob: list[UOp], red: UOp, loads: list[UOp], store_index: UOp,
                     caps: Capabilities) -> list[Opt] | None:
    """Lanes along the output's contiguous range (PADTO first where the lanes do not divide it: the
    points past the end are gated off, one masked vector per row instead of lanes gathered from a plane
    apart per channel), and rows along another output range the moving operand depends on (the
    outermost that divides), enough for `fma_units x fma_latency` accumulators. Only for windows: every
    reduce range constant and WINDOW_MAX_POINTS points or fewer, and each operand of the reduction that
    moves along the lanes moves by at most WINDOW_MAX_STRIDE elements per lane and also moves along every
    other output range (nothing is reused across outputs). None for any other kernel; no opts for a window
    read with a stride along the lanes."""
    width = int(caps.vector_width or 1)
    sizes = [range_size(r) for r in [*glob, *red.src[1:]]]
    if width < WINDOW_MIN_LANES or None in sizes or math.prod(range_size(r) for r in red.src[1:]) > WINDOW_MAX_POINTS:
        return None
    last = next((r for r in reversed(glob) if range_coeff(store_index.src[1], r) == 1), None)
    inside = {n.src[0] for n in red.toposort() if n.op is Ops.LOAD}
    if last is None or not inside:
        return None
    moving = [ix for ix in loads if ix in inside and range_coeff(ix.src[1], last) != 0]
    others = [r for r in glob if r is not last and range_size(r) > 1]
    if not moving or any(range_coeff(ix.src[1], r) in (0, None) for ix in moving for r in [last, *others]):
        return None
    if any(not 1 <= range_coeff(ix.src[1], last) <= WINDOW_MAX_STRIDE for ix in moving):  # (or read backwards)
        return None
    strides = {range_coeff(ix.src[1], last) for ix in moving}
    if strides != {1} and not (strides <= {1, 2} and getattr(caps, "strided_lanes", False)):
        # a strided window (a stride-2 conv or pooling) keeps its loops unless the device reads lanes 2 apart
        # with contiguous loads (`strided_lanes`): as gathers, 16 lanes with 4 channel rows ran 2.7x slower
        # than the plain loop (AVX-512 on Zen 4)
        return []
    lanes = window_lanes(range_size(last), width)
    if not lanes:
        return None
    opts: list[Opt] = []
    # a strided row's loads share their lane mask's arithmetic across the rows: twice the rows (8 x 16 lanes
    # ran 10% faster than 4 on MobileNetV2's 96-channel 112 -> 56 depthwise conv, Zen 4)
    rows = window_rows(others, caps, 2 if strides != {1} else 1)
    if rows is not None:
        opts.append(Opt(OptKind.UPCAST, rows[0].arg[0], rows[1]))
    if range_size(last) % lanes:
        opts.append(Opt(OptKind.PADTO, last.arg[0], lanes))
    return opts + [Opt(OptKind.UPCAST, last.arg[0], lanes)]


def window_lanes(n: int, width: int) -> int:
    """Lanes for a row of n outputs: the device's width or a power-of-two fraction of it (at least
    WINDOW_MIN_LANES), fewest vectors per row first, then fewest padded lanes (7 pixels: 8 lanes, not 16);
    0 when the row is narrower than half the smallest."""
    options = [w for w in (width, width // 2, width // 4) if w >= WINDOW_MIN_LANES and w <= width]
    if not options or 2 * n < min(options):
        return 0
    return min(options, key=lambda w: (-(-n // w), -(-n // w) * w - n))


def window_rows(others: list[UOp], caps: Capabilities, share: int = 1) -> tuple[UOp, int] | None:
    """(range, rows) of the tile's rows: the outermost other output range that divides, by the fewest rows
    that give `share` x fma_units x fma_latency accumulators, at most 8 (else the most that divide)."""
    need = min(8, share * max(2, int(caps.fma_units or 0) * int(caps.fma_latency or 0) or 4))
    counts = sorted({2, 4, 8, need}, key=lambda r: (r < need, r if r >= need else -r))
    for r in others:
        found = next((c for c in counts if c <= 8 and range_size(r) % c == 0), 0)
        if found:
            return r, found
    return None
