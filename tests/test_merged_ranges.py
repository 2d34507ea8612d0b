"""split_merged_ranges (codegen/merged_ranges.py): a range read only through (r // c, r % c) pairs and
affine forms of r becomes two ranges before the opts are chosen, so the heuristics can tile it.

The pass on hand-built kernels (split; left alone when the range has other uses or c does not divide
its size; symbolic sizes), then attention's product fused with the interleaving of its heads (what
polygrad-hf's prompt and GQA models compute): one kernel, a register tile on the CPU, values equal to
NumPy on every backend, with a constant and with a Variable sequence length.
"""
from __future__ import annotations

import numpy as np
import pytest

from polygrad import GlobalCounters, Tensor, Variable
from polygrad.codegen.merged_ranges import split_merged_ranges
from polygrad.codegen.passes import simplify_indices
from polygrad.device import Buffer
from polygrad.dtype import dtypes
from polygrad.engine import programs
from polygrad.schedule.template import schedule
from polygrad.uop.ops import KernelInfo, Ops, UOp


def _kernel(n: "int | UOp", size_a: int, index_of, reduce: bool = True) -> UOp:
    """out[r] = sum(a[index_of(r)] * b[k] for k < 2) for 0 <= r < n (a[index_of(r)] with reduce=False)."""
    out = UOp.placeholder((n if isinstance(n, int) else 64,), dtypes.float32, 0)
    a = UOp.placeholder((size_a,), dtypes.float32, 1)
    b = UOp.placeholder((2,), dtypes.float32, 2)
    r = UOp.range(None, n, 0)
    value = UOp(Ops.LOAD, dtypes.float32, (UOp(Ops.INDEX, dtypes.float32, (a, index_of(r))),))
    if reduce:
        k = UOp.range(None, 2, 1, "reduce")
        value = UOp(Ops.REDUCE, dtypes.float32, (value * b[k].load(), k), Ops.ADD)
    return UOp(Ops.STORE, None, (out[r], value)).end(r).sink(arg=KernelInfo(name="k", opts=("generated",)))


def _divisions(ast: UOp) -> list[UOp]:
    return [n for n in ast.toposort() if n.op in (Ops.IDIV, Ops.MOD)]


def _loop_sizes(ast: UOp) -> list:
    return [r.src[0].arg if r.src[0].op is Ops.CONST else r.src[0] for r in ast.src[0].src[1:]]


def _run(ast: UOp, device: str, a: np.ndarray, n: int) -> np.ndarray:
    """out of _kernel(n, ...) with b = (1, 2): 3 * a[index_of(r)]."""
    bufs = [Buffer(device, size, dtypes.float32) for size in (n, a.size, 2)]
    for buf, values in zip(bufs, (np.full(n, np.nan, np.float32), a, np.array([1, 2], np.float32))):
        buf.copyin(values)
    programs.get_program(ast, device)(bufs)
    out = bufs[0]
    return out.numpy()


def test_a_transposed_read_splits_into_two_affine_ranges(device):
    """out[r] = sum_k a[(r % 8) * 4 + r // 8] * b[k]: a 4 x 8 transpose read through one range of 32."""
    ast = simplify_indices(_kernel(32, 32, lambda r: (r % 8) * 4 + r // 8))
    split = split_merged_ranges(ast)
    assert _divisions(ast) and not _divisions(split)
    assert _loop_sizes(split) == [4, 8]  # the outer range first, the inner one just inside it
    a = np.arange(32, dtype=np.float32)
    np.testing.assert_array_equal(_run(ast, device, a, 32), 3 * a.reshape(8, 4).T.reshape(-1))


def test_parts_divided_again_are_split_again():
    """heads x D with the heads grouped by key head (GQA): r // 8 // 2, r // 8 % 2 and r % 8 give three
    ranges of 2, 2 and 8, not eight ranges of 2 (the divisors tried are those of r's own expressions)."""
    ast = simplify_indices(_kernel(32, 32, lambda r: ((r // 8) % 2) * 16 + (r // 16) * 8 + r % 8))
    split = split_merged_ranges(ast)
    assert not _divisions(split)
    assert _loop_sizes(split) == [2, 2, 8]


@pytest.mark.parametrize("n,index_of", [
    (12, lambda r: r // 3 + (r + 1) // 4),  # another use: (r + 1) // 4 is not affine in r // 3, r % 3
    (20, lambda r: r // 8 + r % 8),  # 8 does not divide 20
    (32, lambda r: (r * r) % 8),  # r * r: no split makes it affine
])
def test_ranges_with_other_uses_are_left_alone(n, index_of):
    ast = simplify_indices(_kernel(n, 64, index_of))
    assert _divisions(ast)
    assert split_merged_ranges(ast) is ast


def test_elementwise_kernels_are_left_alone():
    """Their lanes run along the last range: 32 points, not the 8 a split would leave."""
    ast = simplify_indices(_kernel(32, 32, lambda r: (r % 8) * 4 + r // 8, reduce=False))
    assert _divisions(ast) and split_merged_ranges(ast) is ast


def test_a_symbolic_size_splits_when_the_divisor_divides_it():
    """A range of tokens * 8 points read as (r // 8, r % 8) becomes tokens x 8; tokens * 8 + 4 stays."""
    tokens = UOp(Ops.DEFINE_VAR, dtypes.int32, (), ("tokens", 1, 8))
    ast = simplify_indices(_kernel(tokens * 8, 64, lambda r: (r % 8) * 8 + r // 8))
    split = split_merged_ranges(ast)
    assert not _divisions(split)
    outer, inner = _loop_sizes(split)
    assert outer is tokens and inner == 8
    odd = simplify_indices(_kernel(tokens * 8 + 4, 64, lambda r: (r % 8) * 8 + r // 8))
    assert split_merged_ranges(odd) is odd


def _attention_product(b, kv, g, t, length, d, device, seed=0):
    """(probabilities @ values) with GQA's grouping, heads interleaved as polygrad-hf's _attend does;
    the NumPy reference."""
    rng = np.random.default_rng(seed)
    p = rng.standard_normal((b, kv, g, t, t)).astype(np.float32)
    v = rng.standard_normal((b, kv, 1, t, d)).astype(np.float32)
    pt, vt = Tensor(p, device=device).realize(), Tensor(v, device=device).realize()
    if length is not None:
        pt = pt.reshape(b, kv, g, length, length)
        vt = vt.reshape(b, kv, 1, length, d)
    h = kv * g
    out = (pt @ vt).reshape(b, h, length or t, d).permute(0, 2, 1, 3).reshape(b, length or t, h * d)
    want = (p @ v).reshape(b, h, t, d).transpose(0, 2, 1, 3).reshape(b, t, h * d)
    return out, want


@pytest.mark.parametrize("kv,g", [(4, 1), (2, 2)])
def test_attention_product_with_interleaved_heads_gets_a_register_tile(kv, g):
    """The product and the interleaving stay one kernel; over (t, heads, D) instead of (t, heads x D) its
    addresses are affine, and the CPU's heuristics give it a register tile (before the split: no opts)."""
    out, want = _attention_product(1, kv, g, 16, None, 16, "CPU")
    tpl, _ = schedule([out.uop])
    (ast,) = [s.ast for s in tpl.steps if s.kind == "kernel"]
    prog = programs.get_program(ast, "CPU")
    upcast = [o for o in prog.spec.opts if o.kind == "UPCAST"]
    assert len(upcast) == 2, prog.spec.opts
    GlobalCounters.reset()
    np.testing.assert_allclose(out.numpy(), want, rtol=1e-5, atol=1e-5)
    assert GlobalCounters.kernel_count == 1


@pytest.mark.parametrize("kv,g", [(4, 1), (2, 2)])
def test_attention_product_over_a_variable_length_equals_numpy(device, kv, g):
    tokens = Variable("tokens", 1, 16)
    for t in (5, 16):
        out, want = _attention_product(2, kv, g, t, tokens.bind(t), 8, device, seed=t)
        np.testing.assert_allclose(out.numpy(), want, rtol=1e-5, atol=1e-5)


def test_bundles_store_the_split_kernel():
    """A device-independent pass: it runs at save, so polygrad-js's own heuristics see affine addresses."""
    from polygrad.model.format import stored_kernel
    out, _ = _attention_product(1, 2, 2, 8, None, 8, "CPU")
    tpl, _ = schedule([out.uop])
    (ast,) = [s.ast for s in tpl.steps if s.kind == "kernel"]
    assert _divisions(simplify_indices(ast)) and not _divisions(stored_kernel(ast))


def test_a_reshape_beside_a_variable_divides_by_constants_only():
    """GQA's product (b, kv, g, t, D) read as (b, kv * g, t, D) with t a Variable: the heads are regrouped
    alone (h // g, h % g), not through the flat index (divisions by multiples of t, which no split can
    remove: the kernel then had no tile)."""
    tokens = Variable("tokens", 1, 16)
    out, want = _attention_product(1, 2, 2, 5, tokens.bind(5), 8, "CPU")
    tpl, _ = schedule([out.uop])
    (ast,) = [s.ast for s in tpl.steps if s.kind == "kernel"]
    assert all(n.src[1].op is Ops.CONST for n in _divisions(simplify_indices(ast)))
    np.testing.assert_allclose(out.numpy(), want, rtol=1e-5, atol=1e-5)
