"""Operation counts against analytic FLOPs: no work is recomputed inside a reduction (issue 17, item 2).

`GlobalCounters.global_ops` counts each kernel's operations per point of its ranges, leaving out index
arithmetic (addresses, validity gates). Work fused into a consumer that reads it many times (through an
expand) would be counted once per read, so these counts guard the scheduler's recompute rule without
timing anything. Values are checked against NumPy/PyTorch as well.
"""
from __future__ import annotations

import os
import sys

import numpy as np
import pytest

from polygrad import GlobalCounters, Tensor

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))
import workloads  # noqa: E402

RNG = np.random.default_rng(17)


def _t(*shape: int, device: str = "CPU", scale: float = 1.0) -> Tensor:
    return Tensor((RNG.standard_normal(shape) * scale).astype(np.float32), device=device).realize()


def counted(fn) -> tuple[int, int, object]:
    """(operations, kernels, result) of one run of fn after a warm-up run."""
    fn()
    GlobalCounters.reset()
    out = fn()
    return GlobalCounters.global_ops, GlobalCounters.kernel_count, out


# ---- the minimal case: (h @ W1 + c1).act() @ W2 -------------------------------------------
ACTS = {"plain": (lambda t: t, lambda a: a), "relu": (lambda t: t.relu(), lambda a: np.maximum(a, 0)),
        "gelu": (lambda t: t.gelu(), None)}


@pytest.mark.parametrize("act", ACTS)
def test_elementwise_between_matmuls_is_computed_once(act):
    import torch
    h, w1, c1, w2 = _t(128, 768), _t(768, 3072, scale=0.03), _t(3072), _t(3072, 768, scale=0.02)
    f, _ = ACTS[act]
    ops, kernels, out = counted(lambda: (f(h @ w1 + c1) @ w2).realize())
    analytic = 2 * 2 * 128 * 768 * 3072
    assert kernels == 2
    assert ops <= 1.1 * analytic, f"{act}: {ops / analytic:.2f}x the analytic FLOPs"
    th, tw1, tc1, tw2 = (torch.tensor(t.numpy()) for t in (h, w1, c1, w2))
    ref = {"plain": lambda z: z, "relu": torch.relu, "gelu": torch.nn.functional.gelu}[act](th @ tw1 + tc1) @ tw2
    np.testing.assert_allclose(out.numpy(), ref.numpy(), rtol=2e-4, atol=2e-4)


def test_transformer_block_counts_its_flops_once():
    import torch
    p = workloads.block_params()
    x = _t(128, 768)
    ops, kernels, out = counted(lambda: workloads.block(x, p).realize())
    ratio = ops / workloads.block_flops()
    assert ratio <= 1.2, f"transformer block counts {ratio:.2f}x its analytic FLOPs ({kernels} kernels)"
    tp = {k: torch.tensor(v.numpy()) for k, v in p.items()}
    ref = workloads.block_torch(torch.tensor(x.numpy()), tp)
    np.testing.assert_allclose(out.numpy(), ref.numpy(), rtol=1e-3, atol=1e-3)


def test_mlp_adam_step_counts_its_flops_once():
    step, _ = workloads.mlp_adam_step()
    step()
    ops, _, loss = counted(step)
    ratio = ops / workloads.mlp_flops()
    assert ratio <= 1.2, f"MLP Adam step counts {ratio:.2f}x its analytic FLOPs"
    assert np.isfinite(loss.item())


def test_convnet_step_counts_its_flops_once():
    import torch
    step, params = workloads.convnet_step()
    before = [p.numpy() for p in params]
    ops, _, loss = counted(step)
    ratio = ops / workloads.conv_flops()
    assert ratio <= 1.2, f"conv net forward+backward counts {ratio:.2f}x its analytic FLOPs"
    # the same step in torch from the same weights and data
    tw = [torch.tensor(a, requires_grad=True) for a in before]
    rng = np.random.default_rng(0)
    x = torch.tensor(rng.standard_normal((workloads.CONV_BATCH, 3, 16, 16)).astype(np.float32))
    y = torch.tensor(rng.integers(0, 10, workloads.CONV_BATCH).astype(np.int64))
    F = torch.nn.functional
    h = F.relu(F.conv2d(F.relu(F.conv2d(x, tw[0], tw[1], padding=1)), tw[2], tw[3], padding=1))
    ref = F.cross_entropy(F.max_pool2d(h, 2).flatten(1) @ tw[4].T + tw[5], y)
    ref.backward()
    np.testing.assert_allclose(loss.item(), ref.item(), rtol=1e-4)
    for p, t in zip(params, tw):
        np.testing.assert_allclose(p.grad.numpy(), t.grad.numpy(), rtol=1e-3, atol=1e-4)


# ---- the rules one by one, on small graphs (every backend) ----------------------------------------
def test_gates_are_not_counted(device):
    """A padded 3x3 convolution counts one multiply and one add per multiply-accumulate (plus the bias),
    not the comparisons and selects of its padding."""
    x, w, b = _t(2, 4, 8, 8, device=device), _t(6, 4, 3, 3, device=device), _t(6, device=device)
    ops, kernels, out = counted(lambda: x.conv2d(w, b, padding=1).realize())
    macs = 2 * 6 * 8 * 8 * 4 * 9
    assert kernels == 1 and ops == 2 * macs + 2 * 6 * 8 * 8
    import torch
    ref = torch.nn.functional.conv2d(*(torch.tensor(t.numpy()) for t in (x, w, b)), padding=1)
    np.testing.assert_allclose(out.numpy(), ref.numpy(), rtol=1e-4, atol=1e-5)


def test_expensive_expression_read_through_an_expand_gets_a_buffer(device):
    """exp() of a row vector added to every row of a matrix: computed once per element, not per row."""
    x, v = _t(256, 256, device=device), _t(256, device=device)
    ops, kernels, out = counted(lambda: (x + v.exp()).realize())
    assert kernels == 2 and ops <= 256 * 256 + 2 * 256
    np.testing.assert_allclose(out.numpy(), x.numpy() + np.exp(v.numpy()), rtol=1e-5, atol=1e-6)


def test_cheap_or_small_expressions_fuse(device):
    """One op per read (no dearer than a load), a loop-invariant scalar, or a small total stays fused."""
    x, v, s = _t(256, 256, device=device), _t(256, device=device), _t(1, device=device)
    _, kernels, out = counted(lambda: (x + v * 2).realize())
    assert kernels == 1
    np.testing.assert_allclose(out.numpy(), x.numpy() + v.numpy() * 2, rtol=1e-6)
    _, kernels, out = counted(lambda: (x * (s * 2 + 1).exp()).realize())
    assert kernels == 1
    np.testing.assert_allclose(out.numpy(), x.numpy() * np.exp(s.numpy() * 2 + 1), rtol=1e-5, atol=1e-6)
    small = _t(8, device=device)
    _, kernels, _ = counted(lambda: (_t(4, 8, device=device) + small.exp()).realize())
    assert kernels == 1


def test_reduction_read_through_a_pad_gets_a_buffer(device):
    """A row sum padded to twice as many rows is computed for its own rows only (kernels gate loads, not
    loops), so it is not also run at the padded points."""
    x = _t(64, 512, device=device)
    ops, kernels, out = counted(lambda: (x.sum(1).pad(((32, 32),)) + 1).realize())
    assert kernels == 2 and ops <= 1.05 * 64 * 512  # not 2x: the padded rows run no reduction
    np.testing.assert_allclose(out.numpy(), np.pad(x.numpy().sum(1), (32, 32)) + 1, rtol=1e-4, atol=1e-4)


def test_conv_backward_kernels_count_exactly_their_macs():
    """The benchmark's conv2d forward and backward (compare.py's conv2d_fwd_bwd at a small size): each of
    its three kernels counts two operations per multiply-accumulate. The input gradient reads the upstream
    gradient through a padded view times the sum's ones: `g * 1.0` folds to g and the select of a gated
    load by its own gate against 0 folds to the load (symbolic_rules), where they used to add 50%."""
    import torch
    rng = np.random.default_rng(3)
    x_np = rng.standard_normal((2, 8, 10, 10)).astype(np.float32)
    w_np = (rng.standard_normal((8, 8, 3, 3)) * 0.1).astype(np.float32)
    g_np = rng.standard_normal((2, 8, 10, 10)).astype(np.float32)
    x, w = Tensor(x_np, requires_grad=True).realize(), Tensor(w_np, requires_grad=True).realize()
    g = Tensor(g_np).realize()

    def step():
        out = x.conv2d(w, padding=1)
        x.grad = w.grad = None
        (out * g).sum().backward()
        out.realize(x.grad, w.grad)
        return out
    ops, kernels, out = counted(step)
    macs = 2 * 8 * 10 * 10 * 8 * 9
    assert kernels == 3 and ops == 3 * 2 * macs, (kernels, ops / (2 * macs))
    tx, tw = torch.tensor(x_np, requires_grad=True), torch.tensor(w_np, requires_grad=True)
    ref = torch.nn.functional.conv2d(tx, tw, padding=1)
    ref.backward(torch.tensor(g_np))
    np.testing.assert_allclose(out.numpy(), ref.detach().numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(w.grad.numpy(), tw.grad.numpy(), rtol=1e-4, atol=1e-4)


def test_identity_rules_are_exact():
    from polygrad import dtypes
    from polygrad.uop.ops import Ops, UOp
    from polygrad.uop.rewrite import graph_rewrite
    from polygrad.uop.symbolic import symbolic_rules
    buf = UOp(Ops.DEFINE_GLOBAL, dtypes.float32, (), (0, (16,)))
    i = UOp(Ops.DEFINE_VAR, dtypes.int32, (), ("i", 0, 15))
    gate = UOp(Ops.CMPLT, dtypes.bool, (i, UOp.const(dtypes.int32, 8)))
    other = UOp(Ops.CMPLT, dtypes.bool, (i, UOp.const(dtypes.int32, 4)))
    ld = UOp(Ops.LOAD, dtypes.float32, (UOp(Ops.INDEX, dtypes.float32, (buf, i, gate)),))
    plain = UOp(Ops.LOAD, dtypes.float32, (UOp(Ops.INDEX, dtypes.float32, (buf, i)),))
    zero, one = UOp.const(dtypes.float32, 0.0), UOp.const(dtypes.float32, 1.0)
    assert graph_rewrite(UOp(Ops.MUL, dtypes.float32, (ld, one)), symbolic_rules) is ld
    assert graph_rewrite(UOp(Ops.WHERE, dtypes.float32, (gate, ld, zero)), symbolic_rules) is ld
    for kept in (UOp(Ops.WHERE, dtypes.float32, (other, ld, zero)),  # another gate: the select stays
                 UOp(Ops.WHERE, dtypes.float32, (gate, plain, zero)),  # an ungated load reads everywhere
                 UOp(Ops.WHERE, dtypes.float32, (gate, ld, one)),
                 UOp(Ops.WHERE, dtypes.float32, (gate, ld, UOp.const(dtypes.float32, -0.0))),  # -0 is not what it gives
                 UOp(Ops.MUL, dtypes.float32, (ld, UOp.const(dtypes.float32, 1.0000001)))):
        assert graph_rewrite(kept, symbolic_rules) is kept
    # IEEE: multiplying by 1 keeps -0.0, infinities and NaN (what the fold relies on)
    v = np.array([-0.0, np.inf, -np.inf, np.nan, 1e-45], np.float32)
    np.testing.assert_array_equal(np.signbit(v * np.float32(1)), np.signbit(v))
    np.testing.assert_array_equal(v * np.float32(1), v)
    t = Tensor(v)
    np.testing.assert_array_equal((t * 1.0).numpy(), v)
