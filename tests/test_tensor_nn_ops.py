"""Convolution, pooling, interpolation, normalisation, attention, einsum and matmul (issue 3, part B)
against torch.nn.functional on CPU: values and input gradients, on every backend."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from polygrad import Context, Tensor
from polygrad.uop.shape import ShapeError
from test_tensor_nn_util import compare, rand

CONV = {
    "stride_pad": ((1, 2, 7, 6), (3, 2, 3, 2), dict(stride=2, padding=1)),
    "dilation_tuple_pad": ((1, 2, 7, 7), (2, 2, 3, 3), dict(dilation=2, padding=(1, 2))),
    "groups": ((2, 4, 5, 5), (6, 2, 3, 3), dict(groups=2, stride=(1, 2))),
    "same": ((1, 2, 5, 6), (2, 2, 3, 4), dict(padding="same")),
    "conv1d": ((2, 3, 9), (4, 3, 3), dict(stride=2, padding=1)),
    "conv3d": ((1, 2, 4, 4, 3), (2, 2, 2, 2, 2), dict(padding=1)),
    "batch_zero": ((0, 2, 4, 4), (3, 2, 3, 3), {}),
}
_TORCH_CONV = {3: F.conv1d, 4: F.conv2d, 5: F.conv3d}


@pytest.mark.parametrize("name", list(CONV))
def test_conv_matches_torch(name: str, device: str) -> None:
    xs, ws, kw = CONV[name]
    tconv = _TORCH_CONV[len(xs)]
    compare(lambda x, w, b: x.conv2d(w, b, **kw), lambda x, w, b: tconv(x, w, b, **kw),
            [rand(*xs), rand(*ws, seed=1), rand(ws[0], seed=2)], device, atol=1e-4)


def test_conv_gradient_reaches_its_inner_views(device: str) -> None:
    """conv2d's own gradient rule (a transposed convolution) steps over its window view; a gradient asked
    of a node inside that view (the padded input, hash-consed with the conv's own) takes the chain rule."""
    x, w = rand(1, 2, 5, 5), rand(3, 2, 3, 3, seed=1)
    px = Tensor(x, device=device, requires_grad=True)
    out = px.conv2d(Tensor(w, device=device), padding=1)
    padded = px.pad((1, 1, 1, 1))
    got_p, got_x = (out * out).sum().gradient(padded, px)
    tp = F.pad(torch.tensor(x), (1, 1, 1, 1)).requires_grad_(True)
    tx = torch.tensor(x, requires_grad=True)
    (F.conv2d(tp, torch.tensor(w)) ** 2).sum().backward()
    (F.conv2d(tx, torch.tensor(w), padding=1) ** 2).sum().backward()
    np.testing.assert_allclose(got_p.numpy(), tp.grad.numpy(), atol=1e-4)
    np.testing.assert_allclose(got_x.numpy(), tx.grad.numpy(), atol=1e-4)


def test_conv_flat_torch_order_padding(device: str) -> None:
    # a 4-entry padding is flat torch order (left, right, top, bottom), like F.pad
    x, w = rand(1, 1, 4, 5), rand(1, 1, 3, 3, seed=1)
    got = Tensor(x, device=device).conv2d(Tensor(w, device=device), padding=(1, 0, 2, 1)).numpy()
    want = F.conv2d(F.pad(torch.tensor(x), (1, 0, 2, 1)), torch.tensor(w)).numpy()
    np.testing.assert_allclose(got, want, atol=1e-5)


CONV_T = {
    "plain": ((1, 2, 4, 3), (2, 3, 3, 3), {}),
    "stride": ((2, 2, 3, 3), (2, 2, 3, 2), dict(stride=2)),
    "stride_pad_outpad": ((1, 2, 3, 4), (2, 1, 3, 3), dict(stride=2, padding=1, output_padding=1)),
    "groups_dilation": ((1, 4, 3, 3), (4, 1, 2, 2), dict(groups=2, dilation=2)),
    "conv_transpose1d": ((1, 2, 5), (2, 3, 3), dict(stride=3, padding=1)),
}
_TORCH_CONV_T = {3: F.conv_transpose1d, 4: F.conv_transpose2d}


@pytest.mark.parametrize("name", list(CONV_T))
def test_conv_transpose_matches_torch(name: str, device: str) -> None:
    xs, ws, kw = CONV_T[name]
    cout = ws[1] * kw.get("groups", 1)
    tconv = _TORCH_CONV_T[len(xs)]
    compare(lambda x, w, b: x.conv_transpose2d(w, b, **kw), lambda x, w, b: tconv(x, w, b, **kw),
            [rand(*xs), rand(*ws, seed=1), rand(cout, seed=2)], device, atol=1e-4)


POOL = {
    "k2": dict(kernel_size=2),
    "k3_s2_ceil": dict(kernel_size=3, stride=2, ceil_mode=True),
    "k2_s1_dil2": dict(kernel_size=(2, 3), stride=1, dilation=2),
    "k3_s2_p1_ceil": dict(kernel_size=3, stride=2, padding=1, ceil_mode=True),
}


@pytest.mark.parametrize("name", list(POOL))
def test_max_pool_matches_torch(name: str, device: str) -> None:
    kw = POOL[name]
    compare(lambda x: x.max_pool2d(**kw), lambda x: F.max_pool2d(x, **kw), [rand(2, 2, 7, 8)], device)


@pytest.mark.parametrize("name", [n for n in POOL if "dil" not in n])
@pytest.mark.parametrize("include_pad", [True, False])
def test_avg_pool_matches_torch(name: str, include_pad: bool, device: str) -> None:
    kw = dict(POOL[name], count_include_pad=include_pad)
    compare(lambda x: x.avg_pool2d(**kw), lambda x: F.avg_pool2d(x, **kw), [rand(1, 2, 7, 8)], device)


def test_pool_1d_and_3d(device: str) -> None:
    compare(lambda x: x.max_pool2d((3,), stride=2), lambda x: F.max_pool1d(x, 3, 2), [rand(2, 3, 9)], device)
    compare(lambda x: x.avg_pool2d((2, 2, 2)), lambda x: F.avg_pool3d(x, 2), [rand(1, 1, 4, 4, 2)], device)


@pytest.mark.parametrize("kw", [dict(kernel_size=2), dict(kernel_size=3, stride=2, padding=1)])
def test_max_pool_indices_and_unpool(kw: dict, device: str) -> None:
    x = rand(2, 2, 6, 5)
    x[0, 0, 0, :2] = 3.0  # a tie: PyTorch reports the first index
    out, idx = Tensor(x, device=device).max_pool2d(**kw, return_indices=True)
    tout, tidx = F.max_pool2d(torch.tensor(x), **kw, return_indices=True)
    np.testing.assert_array_equal(idx.numpy(), tidx.numpy())
    assert idx.dtype.name == "int"  # int32, as tinygrad (and every other index polygrad returns); torch: int64
    size = x.shape[2:]
    # overlapping windows repeat an index: PyTorch's gradient then reaches every repeat, ours splits it
    overlap = kw.get("stride", kw["kernel_size"]) < kw["kernel_size"]
    compare(lambda v: v.max_unpool2d(Tensor(tidx.numpy(), device=device), **kw, output_size=size),
            lambda v: F.max_unpool2d(v, tidx, **kw, output_size=size), [tout.numpy()], device, grad=not overlap)


INTERP = {
    "nearest_up": dict(size=(7, 5), mode="nearest"),
    "nearest_exact": dict(size=(7, 3), mode="nearest-exact"),
    "bilinear": dict(size=(7, 5), mode="bilinear", align_corners=False),
    "bilinear_down": dict(size=(2, 3), mode="bilinear", align_corners=False),
    "bilinear_corners": dict(size=(7, 5), mode="bilinear", align_corners=True),
    "scale_factor": dict(scale_factor=2, mode="nearest"),
}


@pytest.mark.parametrize("name", list(INTERP))
def test_interpolate_matches_torch(name: str, device: str) -> None:
    kw = INTERP[name]
    compare(lambda x: x.interpolate(**kw), lambda x: F.interpolate(x, **kw), [rand(1, 2, 4, 4)], device)


def test_interpolate_linear_1d(device: str) -> None:
    compare(lambda x: x.interpolate(size=(6,), mode="linear"),
            lambda x: F.interpolate(x, size=6, mode="linear"), [rand(2, 3, 4)], device)


def test_linear_layernorm_batchnorm(device: str) -> None:
    compare(lambda x, w, b: x.linear(w.T, b), lambda x, w, b: F.linear(x, w, b),
            [rand(2, 3, 4), rand(5, 4, seed=1), rand(5, seed=2)], device)
    compare(lambda x, w: x.linear(w), lambda x, w: x * w, [rand(3, 4), rand(4, seed=1)], device)
    compare(lambda x: x.layernorm(), lambda x: F.layer_norm(x, (5,)), [rand(3, 5)], device)
    compare(lambda x: x.layernorm((1, 2)), lambda x: F.layer_norm(x, (3, 4)), [rand(2, 3, 4)], device, atol=1e-4)
    mean, var = rand(3, seed=3), np.abs(rand(3, seed=4)) + 0.5

    def ours(x, w, b):
        m, inv = Tensor(mean, device=device), (Tensor(var, device=device) + 1e-5).rsqrt()
        return x.batchnorm(w, b, m, inv)

    def theirs(x, w, b):
        return F.batch_norm(x, torch.tensor(mean), torch.tensor(var), w, b, training=False, eps=1e-5)
    compare(ours, theirs, [rand(2, 3, 4, 2), rand(3, seed=1), rand(3, seed=2)], device, atol=1e-4)


def test_dropout(device: str) -> None:
    x = Tensor.ones(200, 100, device=device)
    assert x.dropout(0.5) is x  # eval mode is the identity
    with Context(TRAINING=1):
        y = x.dropout(0.25).numpy()
    kept = (y != 0).mean()
    assert 0.7 < kept < 0.8
    np.testing.assert_allclose(np.unique(y), [0.0, 1 / 0.75], rtol=1e-6)
    Tensor.training = True
    try:
        assert (x.dropout(1.0).numpy() == 0).all()
        w = Tensor(rand(4, 5), device=device, requires_grad=True)
        y = w.dropout(0.5)
        y.sum().backward()
        np.testing.assert_allclose(w.grad.numpy(), (y.numpy() != 0) * 2.0)
    finally:
        Tensor.training = False
    with pytest.raises(ValueError, match="probability"):
        x.dropout(1.5)


SDPA = {
    "plain": ((2, 3, 4, 8), (2, 3, 5, 8), {}),
    "causal_square": ((1, 2, 5, 4), (1, 2, 5, 4), dict(is_causal=True)),
    "causal_rect_scale": ((1, 3, 4), (1, 5, 4), dict(is_causal=True, scale=0.3)),
}


@pytest.mark.parametrize("name", list(SDPA))
def test_sdpa_matches_torch(name: str, device: str) -> None:
    qs, ks, kw = SDPA[name]
    compare(lambda q, k, v: q.scaled_dot_product_attention(k, v, **kw),
            lambda q, k, v: F.scaled_dot_product_attention(q, k, v, **kw),
            [rand(*qs), rand(*ks, seed=1), rand(*ks, seed=2)], device, atol=1e-4)


@pytest.mark.parametrize("kind", ["bool", "float"])
def test_sdpa_masks(kind: str, device: str) -> None:
    mask = np.random.default_rng(3).random((4, 5)) > 0.3
    mask[:, 0] = True
    m = mask if kind == "bool" else np.where(mask, 0.0, -2.0).astype(np.float32)
    compare(lambda q, k, v: q.scaled_dot_product_attention(k, v, attn_mask=Tensor(m, device=device)),
            lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=torch.tensor(m)),
            [rand(2, 4, 3), rand(2, 5, 3, seed=1), rand(2, 5, 3, seed=2)], device, atol=1e-4)


def test_sdpa_dropout_only_in_training(device: str) -> None:
    q = Tensor(rand(1, 3, 4), device=device)
    a = q.scaled_dot_product_attention(q, q, dropout_p=0.9).numpy()
    b = q.scaled_dot_product_attention(q, q).numpy()
    np.testing.assert_allclose(a, b)
    with pytest.raises(ValueError, match="not both"):
        q.scaled_dot_product_attention(q, q, attn_mask=Tensor.ones(3, 3), is_causal=True)


EINSUM = {
    "matmul": ("ij,jk->ik", [(3, 4), (4, 5)]),
    "batched": ("bij,bjk->bik", [(2, 3, 4), (2, 4, 2)]),
    "implicit_out": ("ij,jk", [(3, 4), (4, 5)]),
    "trace": ("ii->", [(4, 4)]),
    "diagonal": ("ii->i", [(3, 3)]),
    "outer": ("i,j->ij", [(3,), (4,)]),
    "sum_all": ("ijk->", [(2, 3, 4)]),
    "three_operands": ("ij,jk,kl->il", [(2, 3), (3, 4), (4, 2)]),
    "ellipsis": ("...ij,...jk->...ik", [(2, 3, 4), (2, 4, 5)]),
    "ellipsis_broadcast": ("...ij,jk->...ik", [(2, 1, 3, 4), (4, 2)]),
    "size_one_broadcast": ("bij,bjk->bik", [(1, 3, 4), (2, 4, 2)]),
    "attention_like": ("bhqd,bhkd->bhqk", [(1, 2, 3, 4), (1, 2, 5, 4)]),
}


@pytest.mark.parametrize("name", list(EINSUM))
def test_einsum_matches_torch(name: str, device: str) -> None:
    formula, shapes = EINSUM[name]
    compare(lambda *xs: Tensor.einsum(formula, *xs), lambda *xs: torch.einsum(formula, *xs),
            [rand(*s, seed=i) for i, s in enumerate(shapes)], device, atol=1e-4)


MATMUL = {
    "vec_vec": [(4,), (4,)],
    "mat_vec": [(3, 4), (4,)],
    "vec_mat": [(4,), (4, 2)],
    "batch_broadcast": [(2, 1, 3, 4), (5, 4, 2)],
    "batch_vec": [(2, 3, 4), (4,)],
    "empty_inner": [(3, 0), (0, 2)],
}


@pytest.mark.parametrize("name", list(MATMUL))
def test_matmul_matches_torch(name: str, device: str) -> None:
    compare(lambda a, b: a @ b, lambda a, b: a @ b, [rand(*s, seed=i) for i, s in enumerate(MATMUL[name])],
            device, atol=1e-4)
    if name == "mat_vec":
        compare(lambda a, b: a.dot(b), lambda a, b: a.matmul(b), [rand(3, 4), rand(4, seed=1)], device)


NN_ERRORS = [
    (lambda: Tensor.ones(1, 3, 4, 4).conv2d(Tensor.ones(2, 2, 3, 3)), ShapeError, "groups"),
    (lambda: Tensor.ones(1, 3, 4).conv2d(Tensor.ones(2, 3, 3, 3)), ShapeError, "needs 4 dims"),
    (lambda: Tensor.ones(1, 1, 2, 2).conv2d(Tensor.ones(1, 1, 3, 3)), ShapeError, "larger than the input"),
    (lambda: Tensor.ones(1, 1, 4, 4).conv2d(Tensor.ones(1, 1, 3, 3), padding="full"), ValueError, "same"),
    (lambda: Tensor.ones(1, 1, 4, 4).conv2d(Tensor.ones(1, 1, 3, 3), padding="same", stride=2), ValueError,
     "stride 1"),
    (lambda: Tensor.ones(1, 1, 4, 4).conv2d(Tensor.ones(1, 1, 3, 3), stride=(1, 2, 3)), ValueError, "entries"),
    (lambda: Tensor.ones(1, 1, 4, 4).conv_transpose2d(Tensor.ones(1, 1, 3, 3), stride=2, output_padding=2),
     ValueError, "output_padding"),
    (lambda: Tensor.ones(1, 1, 4, 4).max_pool2d(2, padding=2), ValueError, "half the kernel"),
    (lambda: Tensor.ones(1, 1, 4, 4).interpolate((2, 2), mode="cubic"), ValueError, "mode"),
    (lambda: Tensor.ones(1, 1, 4, 4).interpolate((2, 2), mode="nearest", align_corners=True), ValueError,
     "align_corners"),
    (lambda: Tensor.einsum("ij,jk->ik", Tensor.ones(2, 3)), ValueError, "operands"),
    (lambda: Tensor.einsum("ij,jk->ik", Tensor.ones(2, 3), Tensor.ones(4, 2)), ShapeError, "sizes"),
    (lambda: Tensor.einsum("ij->iz", Tensor.ones(2, 3)), ValueError, "output letter"),
    (lambda: Tensor.einsum("ijk->i", Tensor.ones(2, 3)), ShapeError, "do not match"),
    (lambda: Tensor.ones(3, 4) @ Tensor.ones(3, 4), ShapeError, "do not align"),
]


@pytest.mark.parametrize("i", range(len(NN_ERRORS)))
def test_nn_errors(i: int) -> None:
    fn, exc, text = NN_ERRORS[i]
    with pytest.raises(exc, match=text):
        fn()


def test_window_index_mod_simplifies() -> None:
    """Regression: conv windows index with (r*(i+1) + g) % i; bounds let the simplifier drop the MOD."""
    from polygrad.dtype import dtypes
    from polygrad.uop.ops import Ops, UOp
    from polygrad.uop.rewrite import graph_rewrite
    from polygrad.uop.symbolic import symbolic_rules
    r = UOp.range(None, 3, 0, "reduce")
    g = UOp.range(None, 16, 1)
    simple = graph_rewrite((r * 19 + g) % 18, symbolic_rules)
    assert Ops.MOD not in {u.op for u in simple.toposort()}
    assert simple.op is Ops.ADD and set(simple.src) == {r, g}
    # a sum that can reach the modulus keeps it
    kept = graph_rewrite((r * 19 + g + UOp.const(dtypes.int32, 5)) % 18, symbolic_rules)
    assert kept.op is Ops.MOD
