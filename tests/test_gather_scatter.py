"""GATHER and SCATTER, the indexed-access primitives (issue 10 items 5 and 6), against PyTorch.

Embedding, gather, advanced indexing and scatter are one indexed load / one accumulating store per
index element: their cost does not grow with the size of the indexed axis (checked with operation
counts, never timings), their gradients are scatter-adds, and out-of-range indices follow
docs/tensor-semantics.md (IndexError when the values are known on the host; 0 / no write when lazy).
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from polygrad import Tensor, nn
from polygrad.device import GlobalCounters
from polygrad.dtype import dtypes
from polygrad.uop.ops import KernelInfo, Ops, UOp
from test_tensor_nn_util import compare, rand


def _tensor(a, device, **kw):
    return Tensor(a, device=device, **kw)


# ---------------------------------------------------------------------------------------------------
# values and gradients against torch


def test_embedding_matches_torch(device: str) -> None:
    w = rand(11, 5)
    idx = np.array([[1, 3, 3], [10, 0, 3]], np.int64)  # repeated rows: their gradients add up
    emb = nn.Embedding(11, 5)
    emb.weight = _tensor(w, device, requires_grad=True)
    temb = torch.nn.Embedding.from_pretrained(torch.tensor(w), freeze=False)
    out, ref = emb(_tensor(idx, device)), temb(torch.tensor(idx))
    np.testing.assert_array_equal(out.numpy(), ref.detach().numpy())
    up = rand(2, 3, 5, seed=3)
    (out * _tensor(up, device)).sum().backward()
    (ref * torch.tensor(up)).sum().backward()
    np.testing.assert_allclose(emb.weight.grad.numpy(), temb.weight.grad.numpy(), rtol=1e-6, atol=1e-6)


def test_embedding_padding_idx_gets_no_gradient(device: str) -> None:
    emb = nn.Embedding(6, 3, padding_idx=2, device=device)
    temb = torch.nn.Embedding(6, 3, padding_idx=2)
    temb.weight.data = torch.tensor(emb.weight.numpy())
    idx = np.array([2, 0, 2, 5])
    emb.weight.requires_grad = True
    out = emb(_tensor(idx, device))
    out.sum().backward()
    temb(torch.tensor(idx)).sum().backward()
    np.testing.assert_array_equal(out.numpy()[0], 0)
    np.testing.assert_allclose(emb.weight.grad.numpy(), temb.weight.grad.numpy())


GATHER = {
    "dim0": (0, (3, 4), np.array([[0, 2, 1, 0], [2, 2, 0, 1]])),
    "dim1_smaller_index": (1, (3, 4), np.array([[3, 0], [1, 1]])),
    "dim_last_3d": (-1, (2, 3, 4), np.array([[[1], [3], [0]], [[2], [2], [1]]])),
    "dim1_3d": (1, (2, 3, 2), np.array([[[0, 2], [2, 2]], [[1, 0], [0, 1]]])),
}


@pytest.mark.parametrize("name", list(GATHER))
def test_gather_matches_torch(name: str, device: str) -> None:
    dim, shape, idx = GATHER[name]
    compare(lambda x: x.gather(dim, _tensor(idx, device)), lambda x: x.gather(dim, torch.tensor(idx)),
            [rand(*shape)], device)


def test_gather_of_a_lazy_source_and_index(device: str) -> None:
    """The source is computed only at the gathered points; the index may be computed too."""
    a, idx = rand(4, 6), np.array([[5, 0], [1, 1], [2, 3], [4, 4]])
    compare(lambda x: (x.exp() * 2).gather(1, _tensor(idx, device) + 0),
            lambda x: (x.exp() * 2).gather(1, torch.tensor(idx)), [a], device)


def test_take_along_axis_negative(device: str) -> None:
    a, idx = rand(3, 4), np.array([[-1], [0], [-4]])
    got = _tensor(a, device).take_along_axis(_tensor(idx, device), 1).numpy()
    np.testing.assert_array_equal(got, np.take_along_axis(a, idx, 1))


MIXED = {
    "rows": lambda a, mk: a[mk([0, 2])],
    "pairs": lambda a, mk: a[mk([0, 1]), mk([1, 2])],
    "tuple_in_tuple": lambda a, mk: a[(0, 1),],
    "tensor_and_slice": lambda a, mk: a[mk([2, 0]), 1:3],
    "slice_then_tensor": lambda a, mk: a[:, mk([3, 1, 1])],
    "broadcast": lambda a, mk: a[mk([[0], [2]]), mk([1, 3])],
    "list_and_tensor": lambda a, mk: a[[0, 2, 1], mk([3, 0, 0])],
    "negative_tensor": lambda a, mk: a[mk([-1, -3])],
}


@pytest.mark.parametrize("name", list(MIXED))
def test_fancy_indexing_mixed_matches_torch(name: str, device: str) -> None:
    fn = MIXED[name]
    compare(lambda x: fn(x, lambda v: _tensor(np.array(v), device)),
            lambda x: fn(x, lambda v: torch.tensor(np.array(v))), [rand(3, 4)], device)


IDX = np.array([[0, 1, 1], [3, 3, 0]])


@pytest.mark.parametrize("mode", ["sum", "prod", "mean", "amax", "amin"])
@pytest.mark.parametrize("include_self", [True, False])
def test_scatter_reduce_gradients_with_ties_and_zeros(mode: str, include_self: bool, device: str) -> None:
    """Duplicates, ties (amax/amin share the gradient evenly) and zeros (prod) as torch handles them."""
    base = np.array([[1.0, 2.0, 0.0, 5.0], [4.0, -1.0, 2.0, 2.0]], np.float32)
    if mode in ("amax", "amin") and not include_self:
        # an excluded self element equal to the result takes a share of torch's gradient (then dropped);
        # ours gives it all to the values that made the result (docs/tensor-semantics.md)
        base = base + 0.5
    src = np.array([[3.0, 2.0, 0.0], [2.0, 7.0, 4.0]], np.float32)
    compare(lambda a, s: a.scatter_reduce(1, _tensor(IDX, device), s, mode, include_self=include_self),
            lambda a, s: a.scatter_reduce(1, torch.tensor(IDX), s, mode, include_self=include_self),
            [base, src], device)


def test_scatter_add_gradient(device: str) -> None:
    compare(lambda a, s: a.scatter_add(0, _tensor(np.array([[1, 0, 1], [1, 1, 0]]), device), s),
            lambda a, s: a.scatter_add(0, torch.tensor(np.array([[1, 0, 1], [1, 1, 0]])), s),
            [rand(2, 3), rand(2, 3, seed=1)], device)


def test_scatter_last_duplicate_wins_and_keeps_signed_zero(device: str) -> None:
    out = Tensor.ones(2, 3, device=device).scatter(1, _tensor(np.array([[2, 0, 2], [1, 1, 1]]), device),
                                                    _tensor(np.array([[1.0, -0.0, 3.0], [4.0, 5.0, -0.0]],
                                                                     np.float32), device))
    got = out.numpy()
    np.testing.assert_array_equal(got, [[-0.0, 1.0, 3.0], [1.0, -0.0, 1.0]])
    assert np.signbit(got[0, 0]) and np.signbit(got[1, 1])


@pytest.mark.parametrize("dt", [dtypes.int32, dtypes.uint8, dtypes.bool, dtypes.float16, dtypes.bfloat16])
def test_scatter_and_gather_dtypes(dt, device: str) -> None:
    base = np.array([[1, 0, 1, 1], [0, 1, 0, 0]])
    idx = np.array([[3, 3, 0], [1, 2, 2]])
    src = np.array([[0, 1, 1], [1, 1, 0]])
    tdt = {dtypes.int32: torch.int32, dtypes.uint8: torch.uint8, dtypes.bool: torch.bool,
           dtypes.float16: torch.float16, dtypes.bfloat16: torch.bfloat16}[dt]
    tb, ts = torch.tensor(base).to(tdt), torch.tensor(src).to(tdt)
    pb, ps = Tensor(base, device=device).cast(dt), Tensor(src, device=device).cast(dt)
    got = pb.scatter(1, _tensor(idx, device), ps).gather(1, _tensor(idx, device))
    want = tb.scatter(1, torch.tensor(idx), ts).gather(1, torch.tensor(idx))
    assert got.dtype is dt
    np.testing.assert_array_equal(got.float().numpy() if dt is dtypes.bfloat16 else got.numpy(),
                                  want.float().numpy() if dt is dtypes.bfloat16 else want.numpy())
    if dt is not dtypes.bool:
        got = pb.scatter_reduce(1, _tensor(idx, device), ps, "sum").cast(dtypes.float32).numpy()
        want = tb.scatter_reduce(1, torch.tensor(idx), ts, "sum").float().numpy()
        np.testing.assert_array_equal(got, want)


def test_setitem_with_tensors_duplicates_last_wins(device: str) -> None:
    x = Tensor.zeros(3, 4, device=device).contiguous().realize()
    x[_tensor(np.array([0, 2, 0]), device), 1] = _tensor(np.array([1.0, 2.0, 3.0], np.float32), device)
    ref = np.zeros((3, 4), np.float32)
    ref[[0, 2, 0], 1] = [1.0, 2.0, 3.0]
    np.testing.assert_array_equal(x.numpy(), ref)


# ---------------------------------------------------------------------------------------------------
# out-of-range indices (docs/tensor-semantics.md)


HOST_INDEX_ERRORS = {
    "embedding_list_tensor": lambda d: nn.Embedding(4, 2, device=d)(Tensor([1, 4], device=d)),
    "embedding_negative": lambda d: nn.Embedding(4, 2, device=d)(Tensor([-1], device=d)),
    "gather_realized": lambda d: Tensor.ones(2, 3, device=d).gather(1, Tensor([[0], [3]], device=d)),
    "gather_negative": lambda d: Tensor.ones(2, 3, device=d).gather(1, Tensor([[-1], [0]], device=d)),
    "getitem_list": lambda d: Tensor.ones(2, 3, device=d)[[0, 2]],
    "getitem_numpy": lambda d: Tensor.ones(2, 3, device=d)[:, np.array([3])],
    "getitem_realized": lambda d: Tensor.ones(2, 3, device=d)[Tensor([1, -3], device=d)],
    "scatter_realized": lambda d: Tensor.ones(2, 3, device=d).scatter(1, Tensor([[3]], device=d), 1.0),
    "cross_entropy_realized": lambda d: Tensor.ones(2, 3, device=d).cross_entropy(Tensor([0, 3], device=d)),
    "nll_realized": lambda d: Tensor.ones(2, 3, device=d).nll_loss(Tensor([-2, 0], device=d)),
}


@pytest.mark.parametrize("name", list(HOST_INDEX_ERRORS))
def test_host_known_out_of_range_raises_index_error(name: str, device: str) -> None:
    with pytest.raises(IndexError, match="out of bounds"):
        HOST_INDEX_ERRORS[name](device)


def test_lazy_out_of_range_reads_zero_and_writes_nothing(device: str) -> None:
    w = rand(4, 2)
    emb = nn.Embedding(4, 2)
    emb.weight = _tensor(w, device)
    lazy = Tensor([1, 2, 0], device=device) * 2  # [2, 4, 0]: computed, so not checked
    np.testing.assert_array_equal(emb(lazy).numpy(), [w[2], [0, 0], w[0]])
    x = _tensor(w, device)
    np.testing.assert_array_equal(x[lazy - 5].numpy(), [w[1], w[3], [0, 0]])  # -3 wraps, -1 wraps, -5 is out
    np.testing.assert_array_equal(x.gather(1, (Tensor([[1], [0], [1], [0]], device=device) * 5)).numpy(),
                                  [[0], [w[1, 0]], [0], [w[3, 0]]])
    got = Tensor.zeros(2, 3, device=device).scatter_add(1, Tensor([[0, 1]], device=device) * 3,
                                                         Tensor([[1.0, 2.0]], device=device)).numpy()
    np.testing.assert_array_equal(got, [[1, 0, 0], [0, 0, 0]])


def test_lazy_out_of_range_in_two_dims_does_not_alias(device: str) -> None:
    """(0, 5) in a (3, 3) tensor must not read flat element 5 = (1, 2)."""
    x = Tensor(np.arange(9, dtype=np.float32).reshape(3, 3), device=device)
    got = x[Tensor([0, 1], device=device) + 0, Tensor([5, 1], device=device) + 0].numpy()
    np.testing.assert_array_equal(got, [0, 4])


def test_cross_entropy_lazy_bad_label_is_nan(device: str) -> None:
    logits = _tensor(rand(3, 4), device)
    labels = Tensor([0, 2, 1], device=device) * 2  # [0, 4, 2]: 4 is out of range
    losses = logits.cross_entropy(labels, reduction="none").numpy()
    assert np.isnan(losses[1]) and np.isfinite(losses[[0, 2]]).all()
    assert np.isnan(logits.cross_entropy(labels).item())
    ignored = logits.cross_entropy(Tensor([0, -100, 1], device=device) + 0, reduction="none").numpy()
    assert ignored[1] == 0 and np.isfinite(ignored).all()


# ---------------------------------------------------------------------------------------------------
# cost: O(indices), independent of the indexed axis (operation counts, deterministic)


def _ops(fn) -> tuple[int, int]:
    GlobalCounters.reset()
    fn()
    return GlobalCounters.global_ops, GlobalCounters.kernel_count


def _embedding_costs(vocab: int) -> tuple:
    emb = nn.Embedding(vocab, 8, device="CPU")
    emb.weight.requires_grad = True
    emb.weight.realize()
    idx = Tensor(np.arange(128) % 64, device="CPU").realize()

    def backward():
        emb.weight.grad = None
        emb(idx).sum().backward()
        emb.weight.grad.realize()
    return _ops(lambda: emb(idx).realize()), _ops(backward)


def test_embedding_cost_does_not_grow_with_vocab() -> None:
    """Forward and backward of Embedding(vocab, 8) on 128 tokens: the same kernels and operations for
    a vocabulary of 64 and of 50257 (the one-hot form cost 128 x vocab x 8 compare-and-adds)."""
    (fwd_ops, fwd_kernels), (bwd_ops, bwd_kernels) = _embedding_costs(50257)
    assert ((fwd_ops, fwd_kernels), (bwd_ops, bwd_kernels)) == _embedding_costs(64)
    assert fwd_kernels == 1 and fwd_ops <= 128 * 8 * 8  # a few compares and selects per element
    assert bwd_kernels == 2  # zero-fill of the gradient, then one scatter-add of the 128 rows
    assert bwd_ops <= 128 * 8 * 8


def test_gather_and_fancy_index_cost() -> None:
    x = Tensor.ones(4, 100000, device="CPU").contiguous().realize()
    idx = Tensor([[5], [99999], [0], [7]], device="CPU").realize()
    ops, kernels = _ops(lambda: x.gather(1, idx).realize())
    assert kernels == 1 and ops <= 4 * 8
    ops, kernels = _ops(lambda: x[:, Tensor([3, 1], device="CPU")].realize())
    assert kernels == 1 and ops <= 8 * 8


# ---------------------------------------------------------------------------------------------------
# the accumulating STORE in the kernel IR


def _accumulate_kernel(op: Ops):
    def fxn(out, idx, val):
        i = UOp.range(out.ctx, val.numel(), 0)
        st = UOp(Ops.STORE, None, (out[idx[i].load()], val[i].load()), op)
        return st.end(i).sink(arg=KernelInfo(name="acc"))
    return fxn


@pytest.mark.parametrize("op", [Ops.ADD, Ops.MUL, Ops.MAX])
def test_accumulating_store_folds_every_duplicate(op: Ops, device: str) -> None:
    idx = np.array([2, 0, 2, 2, 1, 0], np.int32)
    val = np.array([1.5, -2.0, 3.0, 0.5, 4.0, 8.0], np.float32)
    start = np.array([1.0, 2.0, -3.0], np.float32)
    out = Tensor(start.copy(), device=device)
    res = out.custom_kernel(Tensor(idx, device=device), Tensor(val, device=device), fxn=_accumulate_kernel(op))[0]
    want = start.copy()
    {Ops.ADD: np.add, Ops.MUL: np.multiply, Ops.MAX: np.maximum}[op].at(want, idx, val)
    np.testing.assert_array_equal(res.numpy(), want)


def test_accumulating_store_kernels_get_no_opts_and_stay_scalar() -> None:
    from polygrad.codegen.lower import lower
    from polygrad.device import Device
    from polygrad.renderer.linearize import L, linearize
    from polygrad.uop.ops import AxisKind
    out = UOp.placeholder((64,), dtypes.float32, 0)
    idx = UOp.placeholder((4096,), dtypes.int32, 1)
    i = UOp.range(None, 4096, 0, AxisKind.GLOBAL)
    st = UOp(Ops.STORE, None, (out[idx[i].load()], UOp.const(dtypes.float32, 1.0)), Ops.ADD)
    spec = lower(st.end(i).sink(arg=KernelInfo(name="acc", opts=("generated",))), Device["CPU"].capabilities)
    assert spec.opts == () and spec.threads == 1
    prog = linearize(spec, vector_width=8)
    assert all(x.lanes == 1 for x in prog.insts)
    ops = [x.op for x in prog.insts]
    assert ops.count(L.LOAD) == 2 and ops.count(L.STORE) == 1  # the index, then read-modify-write


def test_accumulating_store_serializes_and_validates() -> None:
    from polygrad.uop import serialize
    from polygrad.uop.validate import check_kernel
    out = UOp.placeholder((8,), dtypes.float32, 0)
    idx = UOp.placeholder((5,), dtypes.int32, 1)
    i = UOp.range(None, 5, 0)
    raw = idx[i].load()
    gate = (UOp.const(dtypes.int32, -1) < raw) & (raw < UOp.const(dtypes.int32, 8))
    index = UOp(Ops.INDEX, dtypes.float32, (out, raw, gate))
    ast = UOp(Ops.STORE, None, (index, UOp.const(dtypes.float32, 1.0)), Ops.MAX).end(i).sink(
        arg=KernelInfo(name="acc"))
    assert serialize.loads(serialize.dumps(ast)) is ast
    check_kernel(ast, [8, 5], [dtypes.float32, dtypes.int32])
    with pytest.raises(Exception, match="STORE"):
        check_kernel(ast.replace(src=(ast.src[0].replace(src=(ast.src[0].src[0].replace(arg=Ops.FDIV),
                                                               *ast.src[0].src[1:])),)), [8, 5],
                     [dtypes.float32, dtypes.int32])
