"""PADTO of a reduce range (codegen/opts.py): a reduction over k points that no lane count divides is padded to
a multiple of the lanes; the added points' loads are gated off (they read nothing and give 0) and each sum or
maximum adds its identity there, so SPLIT_REDUCE then takes full vectors (a 3x3 conv weight gradient over 14-
and 7-pixel rows). Values against NumPy on CPU, INTERP and X86, with NaN after each input so that a read past
the end that was not gated shows; the heuristic's choice (host_opts.padded_reduce_opts) is guarded by the opts
it picks, on devices with and without masked vector moves."""
from dataclasses import replace

import numpy as np
import pytest

from polygrad import Device, dtypes
from polygrad.backend_api import Capabilities
from polygrad.codegen.lower import lower
from polygrad.codegen.opts import Opt, OptKind, substitute_nodes
from polygrad.device import Buffer, open_device
from polygrad.uop.ops import AxisKind, KernelInfo, Ops, UOp

ROWS = 8
GUARD = 19  # NaNs after each input: a padded point read without its gate poisons the result


def reduce_kernel(k: int, kind: str) -> UOp:
    """out[i] over the k points of row i of a (ROWS x k): "dot" sum(a[i, j] * b[j]), "max" max(a[i, j]),
    "shifted" sum(a[i, j] + 1) (a body that is not 0 where its loads give 0)."""
    out = UOp.placeholder((ROWS,), dtypes.float32, 0)
    a = UOp.placeholder((ROWS * k + GUARD,), dtypes.float32, 1)
    b = UOp.placeholder((k + GUARD,), dtypes.float32, 2)
    i = UOp.range(None, ROWS, 0)
    j = UOp.range(None, k, 1, "reduce")
    x = a[i * k + j].load()
    body = {"dot": x * b[j].load(), "max": x, "shifted": x + 1.0}[kind]
    value = UOp(Ops.REDUCE, dtypes.float32, (body, j), Ops.MAX if kind == "max" else Ops.ADD)
    return UOp(Ops.STORE, None, (out[i], value)).end(i).sink(arg=KernelInfo(name=f"r_pad_{kind}{k}"))


def inputs(k: int, kind: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(k)
    a = rng.standard_normal((ROWS, k)).astype(np.float32)
    if kind == "max":
        a = -np.abs(a) - 1  # all below 0: a padded point that added its 0 instead of -inf would win
    b = rng.standard_normal(k).astype(np.float32)
    want = {"dot": a @ b, "max": a.max(1), "shifted": (a + 1).sum(1)}[kind]
    nan = np.full(GUARD, np.nan, np.float32)
    return np.concatenate([a.ravel(), nan]), np.concatenate([b, nan]), want.astype(np.float32)


def run(device: str, spec, k: int, kind: str) -> np.ndarray:
    dev = open_device(device)
    program = dev.load(spec, dev.compile(dev.render(spec)))
    a, b, _ = inputs(k, kind)
    bufs = [Buffer(device, ROWS, dtypes.float32), Buffer(device, a.size, dtypes.float32),
            Buffer(device, b.size, dtypes.float32)]
    bufs[0].copyin(np.full(ROWS, np.nan, np.float32))
    bufs[1].copyin(a)
    bufs[2].copyin(b)
    program([bufs[g.slot].handle for g in spec.globals], (), False)
    return bufs[0].numpy().copy()


def selects(spec) -> int:
    return sum(1 for x in spec.ast.toposort() if x.op is Ops.WHERE)


@pytest.mark.parametrize("device", [d for d in ("CPU", "INTERP", "X86") if Device.available(d)])
@pytest.mark.parametrize("kind", ["dot", "max", "shifted"])
@pytest.mark.parametrize("k,lanes", [(14, 16), (7, 8), (13, 4)])
def test_padded_reduction_equals_numpy(device, kind, k, lanes):
    """A sum of products, a maximum of negative values and a sum of x + 1 over k points, padded to a multiple
    of `lanes` and split into that many lanes: NumPy's values, the NaNs past each row never read."""
    spec = lower(reduce_kernel(k, kind), None, [Opt(OptKind.PADTO, 1, lanes), Opt(OptKind.SPLIT_REDUCE, 1, lanes)])
    # the reduction was padded, then split into full lanes
    lane_ranges = [x.src[0].arg for x in spec.ast.toposort() if x.op is Ops.RANGE and x.arg[1] is AxisKind.UPCAST]
    assert lane_ranges == [lanes], spec.ast
    # a sum of products of gated loads is 0 at the added points by itself: no select per point
    assert selects(spec) == (0 if kind == "dot" else 1), spec.ast
    np.testing.assert_allclose(run(device, spec, k, kind), inputs(k, kind)[2], rtol=1e-5, atol=1e-5)


def test_padto_of_a_reduce_range_that_divides_or_of_a_product_reduction_is_skipped():
    """PADTO by an amount that divides the reduction changes nothing, and a reduction with no identity to add
    (a product) keeps its range."""
    ast = reduce_kernel(16, "dot")
    assert lower(ast, None, [Opt(OptKind.PADTO, 1, 16)]).ast is lower(ast, None, []).ast
    dot = reduce_kernel(14, "dot")
    red = next(x for x in dot.toposort() if x.op is Ops.REDUCE)
    prod = substitute_nodes(dot, {red: red.replace(arg=Ops.MUL)})
    assert lower(prod, None, [Opt(OptKind.PADTO, 1, 16)]).ast is lower(prod, None, []).ast
    assert lower(dot, None, [Opt(OptKind.PADTO, 1, 16)]).ast is not lower(dot, None, []).ast


AVX512 = Capabilities(threads=1, vector_width=16, registers=32, fma=True, tile_vectors=4, l1_bytes=32 * 1024)


@pytest.mark.parametrize("k,lanes", [(14, 16), (7, 8), (15, 16), (30, 16)])
def test_dot_tile_pads_a_reduction_no_lane_count_divides(k, lanes):
    """A tile of dot products (here rows of `a` against one `b`) whose reduction over k points takes no 16-, 8-
    or 4-lane split pads it where the device masks a vector's last lanes (masked_vectors): 14 -> 16 lanes,
    7 -> 8, 15 -> 16 and 30 -> 32; without masked moves nothing is padded."""
    ast = reduce_kernel(k, "dot")
    masked = [(o.kind, o.amount) for o in lower(ast, replace(AVX512, masked_vectors=True)).opts]
    assert (OptKind.PADTO, lanes) in masked and (OptKind.SPLIT_REDUCE, lanes) in masked, masked
    assert OptKind.PADTO not in [o.kind for o in lower(ast, AVX512).opts]


def test_padding_that_wastes_over_an_eighth_of_the_lanes_is_not_chosen():
    """9 points would take 16 lanes (7 wasted) or 12 in 4-lane vectors (3 of 12), 13 points 16 (3 of 16): none
    within 1/8."""
    for k in (9, 13):
        masked = lower(reduce_kernel(k, "dot"), replace(AVX512, masked_vectors=True))
        assert OptKind.PADTO not in [o.kind for o in masked.opts], masked.opts
