"""CUDA on a real GPU (skipped cleanly where `Device.cuda_available()` is False, as in CI here).

Values against NumPy: elementwise and transcendental kernels, grouped reductions, float4 paths, fp32
matmuls (shared-memory tiles on odd sizes 1, 17, 1000, 4097; batches, transposes) and fp16 matmuls
(tensor cores), scatter-add (atomicAdd over the grid), copies between devices and ordinals,
symbolic sizes; a training step (linear regression by SGD against the NumPy closed loop, an MLP step
against the same step on the host backend) and the bundle round trip (Model.save on the host ->
Model.load on CUDA, same outputs). scripts/cuda_check.sh runs this file with the op suite.
"""
from __future__ import annotations

import contextlib
import os
import shutil

import numpy as np
import pytest

from polygrad import Context, Device, Model, Tensor, Variable, dtypes, nn

pytestmark = pytest.mark.skipif(not Device.cuda_available(), reason="no usable CUDA device (see Device.cuda_available)")
HOST = "CPU" if shutil.which("clang") or shutil.which("gcc") or shutil.which("cc") else "INTERP"
rng = np.random.default_rng(0)


@contextlib.contextmanager
def default_device(device: str):
    saved = os.environ.get("DEV")
    os.environ["DEV"] = device
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("DEV", None)
        else:
            os.environ["DEV"] = saved


def randn(*shape):
    return rng.standard_normal(shape).astype(np.float32)


def test_elementwise_and_transcendentals():
    x = randn(1000, 37)
    t = Tensor(x, device="CUDA")
    got = ((t * 2 + 1).exp().log() - t.sin() * t.sigmoid()).numpy()
    want = np.log(np.exp(x * 2 + 1)) - np.sin(x) * (1 / (1 + np.exp(-x)))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    v = randn(4096)  # float4 loads and stores
    np.testing.assert_allclose((Tensor(v, device="CUDA") * 3 - 1).numpy(), v * 3 - 1, rtol=1e-6)


def test_grouped_reductions():
    x = randn(1 << 20)
    np.testing.assert_allclose(Tensor(x, device="CUDA").sum().numpy(), x.sum(dtype=np.float64), rtol=1e-4)
    m = randn(16, 8192)
    t = Tensor(m, device="CUDA")
    np.testing.assert_allclose(t.max(1).numpy(), m.max(1))
    e = np.exp(m - m.max(1, keepdims=True))
    np.testing.assert_allclose(t.softmax(1).numpy(), e / e.sum(1, keepdims=True), rtol=1e-4, atol=1e-7)
    np.testing.assert_allclose(t.mean().numpy(), m.mean(dtype=np.float64), rtol=1e-4, atol=1e-6)


def test_matmul_fp32_and_fp16_tensor_cores():
    a, b = randn(256, 512), randn(512, 128)
    got = (Tensor(a, device="CUDA") @ Tensor(b, device="CUDA")).numpy()
    np.testing.assert_allclose(got, a @ b, rtol=1e-4, atol=1e-3)
    ah, bh = a[:, :256].astype(np.float16), b[:256].astype(np.float16)
    th = Tensor(ah, device="CUDA") @ Tensor(bh, device="CUDA")
    want = ah.astype(np.float32) @ bh.astype(np.float32)
    np.testing.assert_allclose(th.numpy().astype(np.float32), want, rtol=2e-2, atol=5e-2)
    batched = (Tensor(ah.reshape(2, 128, 256), device="CUDA") @ Tensor(bh, device="CUDA")).numpy()
    np.testing.assert_allclose(batched.astype(np.float32).reshape(256, 128), want, rtol=2e-2, atol=5e-2)


@pytest.mark.parametrize("m,k,n", [(1, 17, 1), (17, 17, 17), (1000, 1000, 1000), (4097, 4097, 4097),
                                   (1, 4097, 1000), (4097, 33, 17)])
def test_tiled_fp32_matmul_odd_sizes(m, k, n):
    """Shared-memory tiles (Opt(TILE)) wherever both sides are 16 or more, against NumPy in float64."""
    a, b = randn(m, k), randn(k, n)
    got = (Tensor(a, device="CUDA") @ Tensor(b, device="CUDA")).numpy()
    want = a.astype(np.float64) @ b.astype(np.float64)
    err = np.abs(got - want).max() / (np.abs(a).astype(np.float64) @ np.abs(b)).max()
    assert err < 1e-5, (m, k, n, err)


def test_tiled_fp32_matmul_batches_and_transposes():
    a, b, c = randn(3, 100, 65), randn(65, 70), randn(3, 65, 70)
    ta, tb, tc = (Tensor(x, device="CUDA") for x in (a, b, c))
    np.testing.assert_allclose((ta @ tb).numpy(), a @ b, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose((ta @ tc).numpy(), a @ c, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose((tb.T @ ta[1].T).numpy(), b.T @ a[1].T, rtol=1e-4, atol=1e-4)


def test_scatter_add_with_atomics():
    base, src = randn(1000, 64), randn(20000, 64)
    idx = rng.integers(0, 1000, (20000, 64)).astype(np.int32)
    got = Tensor(base, device="CUDA").scatter_add(0, Tensor(idx, device="CUDA"), Tensor(src, device="CUDA")).numpy()
    want = base.astype(np.float64)
    np.add.at(want, (idx, np.arange(64)[None, :].repeat(20000, 0)), src)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    ints = rng.integers(-100, 100, (20000, 64)).astype(np.int32)
    got = Tensor(np.zeros((1000, 64), np.int32), device="CUDA").scatter_add(
        0, Tensor(idx, device="CUDA"), Tensor(ints, device="CUDA")).numpy()
    want = np.zeros((1000, 64), np.int64)
    np.add.at(want, (idx, np.arange(64)[None, :].repeat(20000, 0)), ints)
    np.testing.assert_array_equal(got, want)


def test_half_bfloat16_and_ints():
    x = randn(333)
    h = Tensor(x, device="CUDA").cast(dtypes.float16)
    np.testing.assert_array_equal((h * 3).numpy(), (x.astype(np.float16) * np.float16(3)))
    b = Tensor(x, device="CUDA").cast(dtypes.bfloat16)
    np.testing.assert_allclose(b.cast(dtypes.float32).numpy(), x, rtol=2 ** -8)
    ints = np.arange(-50, 50, dtype=np.int32)
    i = Tensor(ints, device="CUDA")
    np.testing.assert_array_equal((i * 3 + 1).numpy(), ints * 3 + 1)
    np.testing.assert_array_equal((i ^ 5).numpy(), ints ^ 5)
    assert int(i.max().numpy()) == 49


def test_copies_ordinals_and_symbolic_sizes():
    x = randn(100)
    c = Tensor(x).to("cuda")
    np.testing.assert_array_equal(c.numpy(), x)
    np.testing.assert_array_equal(c.to(HOST).numpy(), x)
    if _device_count() > 1:
        np.testing.assert_array_equal((c.to("cuda:1") + 1).numpy(), x + 1)
    n = Variable("n", 1, 64)
    w = Tensor(randn(8, 4), device="CUDA")
    for rows in (3, 17):
        data = randn(rows, 8)
        out = (Tensor(data, device="CUDA").reshape(n.bind(rows), 8) @ w).relu().numpy()
        np.testing.assert_allclose(out, np.maximum(data @ w.numpy(), 0), rtol=1e-5, atol=1e-5)


def _device_count() -> int:
    from polygrad_backend_cuda import libs
    count = libs.ffi.new("int *")
    libs.cuda().cuDeviceGetCount(count)
    return int(count[0])


def test_training_step_linear_sgd_and_mlp():
    xs, ys = np.array([-2, -1, 0, 1, 2], np.float32), np.array([-4, -1, 2, 5, 8], np.float32)
    a = Tensor([0.0], device="CUDA", requires_grad=True)
    b = Tensor([0.0], device="CUDA", requires_grad=True)
    opt = nn.optim.SGD([a, b], lr=0.05)
    x, y = Tensor(xs, device="CUDA"), Tensor(ys, device="CUDA")
    ra = rb = 0.0
    with Context(TRAINING=1):
        for _ in range(20):
            opt.zero_grad()
            ((a * x + b - y) ** 2).mean().backward()
            opt.step()
            err = ra * xs + rb - ys
            ra, rb = ra - 0.05 * float(np.mean(2 * err * xs)), rb - 0.05 * float(np.mean(2 * err))
    np.testing.assert_allclose([a.numpy()[0], b.numpy()[0]], [ra, rb], rtol=1e-5)

    def step(device):
        Tensor.manual_seed(3)
        with default_device(device):
            l1, l2 = nn.Linear(32, 64), nn.Linear(64, 10)
        params = nn.get_parameters([l1, l2])
        adam = nn.optim.Adam(params, lr=1e-2)
        xb = Tensor(randn(16, 32), device=device)
        yb = Tensor(np.arange(16, dtype=np.int32) % 10, device=device)
        with Context(TRAINING=1):
            for _ in range(3):
                adam.zero_grad()
                loss = l2(l1(xb).relu()).sparse_categorical_crossentropy(yb)
                loss.backward()
                adam.step()
        return [p.numpy() for p in params]

    state = rng.bit_generator.state
    want = step(HOST)
    rng.bit_generator.state = state
    got = step("CUDA")
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)


class _MLP:
    def __init__(self):
        self.l1, self.l2 = nn.Linear(4, 16), nn.Linear(16, 3)

    def __call__(self, x):
        return {"logits": self.l2(self.l1(x).relu())}


def test_bundle_saved_on_host_runs_on_cuda():
    Tensor.manual_seed(1)
    with default_device(HOST):
        model = Model(_MLP(), inputs={"x": Tensor.empty(8, 4)})
        x = randn(8, 4)
        want = model.forward(x=x)["logits"].numpy()
        blob = model.save()
        model.dispose()
    again = Model.load(blob, device="CUDA")
    try:
        got = again.forward(x=Tensor(x, device="CUDA"))["logits"].numpy()
    finally:
        again.dispose()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
