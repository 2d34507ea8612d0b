"""CUDA on a real GPU (its tests skip cleanly where `Device.cuda_available()` is False, as in CI here).

Values against NumPy: elementwise and transcendental kernels, grouped reductions (softmax, log_softmax,
layernorm and row sums/maxima by a warp per row on odd lengths), float4 paths, fp32
matmuls (shared-memory tiles on odd sizes 1, 17, 1000, 4097; batches, transposes), convolutions forward and
backward (implicit GEMMs on the same tiles; against torch), fp16 and bf16
matmuls (tensor cores; on sm_90 also on warpgroup tensor cores with POLY_CUDA_WGMMA=1, in a child process
that opens the device so) and fp32 ones with TF32 opted in (POLY_ALLOW_TF32=1), scatter-add (atomicAdd
over the grid), copies between devices and ordinals, symbolic sizes; a training step (linear
regression by SGD against the NumPy closed loop, an MLP step against the same step on the host
backend) and the bundle round trip (Model.save on the host -> Model.load on CUDA, same outputs); one
Adam step of the 784-512-512-10 MLP and of a GPT-2-small block against torch in float64 and against
the host backend, whose host-device cases run without a GPU too.
scripts/cuda_check.sh runs this file with the op suite.
"""
from __future__ import annotations

import contextlib
import os
import shutil

import numpy as np
import pytest

from polygrad import Context, Device, Model, Tensor, Variable, dtypes, nn

gpu = pytest.mark.skipif(not Device.cuda_available(), reason="no usable CUDA device (see Device.cuda_available)")
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


@gpu
def test_elementwise_and_transcendentals():
    x = randn(1000, 37)
    t = Tensor(x, device="CUDA")
    got = ((t * 2 + 1).exp().log() - t.sin() * t.sigmoid()).numpy()
    want = np.log(np.exp(x * 2 + 1)) - np.sin(x) * (1 / (1 + np.exp(-x)))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    v = randn(4096)  # float4 loads and stores
    np.testing.assert_allclose((Tensor(v, device="CUDA") * 3 - 1).numpy(), v * 3 - 1, rtol=1e-6)


@gpu
def test_grouped_reductions():
    x = randn(1 << 20)
    np.testing.assert_allclose(Tensor(x, device="CUDA").sum().numpy(), x.sum(dtype=np.float64), rtol=1e-4)
    m = randn(16, 8192)
    t = Tensor(m, device="CUDA")
    np.testing.assert_allclose(t.max(1).numpy(), m.max(1))
    e = np.exp(m - m.max(1, keepdims=True))
    np.testing.assert_allclose(t.softmax(1).numpy(), e / e.sum(1, keepdims=True), rtol=1e-4, atol=1e-7)
    np.testing.assert_allclose(t.mean().numpy(), m.mean(dtype=np.float64), rtol=1e-4, atol=1e-6)


@gpu
@pytest.mark.parametrize("n,rows", [(1, 5), (17, 3), (100, 300), (767, 2), (768, 4096), (1000, 7), (4097, 33),
                                    (512, 8 * 12 * 64)])
def test_grouped_row_reductions(n, rows):
    """Softmax, log_softmax, layernorm and row sums/maxima with rows reduced by a warp (or up to 256
    threads; gpu_opts.row_group_opts, __shfl_xor_sync) on odd row lengths, few and many rows, and sibling
    reductions (sum + max of the same rows in one kernel), against NumPy in float64."""
    x = randn(rows, n) * 3
    x64 = x.astype(np.float64)
    t = Tensor(x, device="CUDA")
    e = np.exp(x64 - x64.max(1, keepdims=True))
    np.testing.assert_allclose(t.softmax(1).numpy(), e / e.sum(1, keepdims=True), rtol=2e-5, atol=1e-7)
    log_softmax = x64 - x64.max(1, keepdims=True) - np.log(e.sum(1, keepdims=True))
    np.testing.assert_allclose(t.log_softmax(1).numpy(), log_softmax, rtol=2e-5, atol=2e-5)
    mu = x64.mean(1, keepdims=True)
    want = (x64 - mu) / np.sqrt(((x64 - mu) ** 2).mean(1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(t.layernorm(eps=1e-5).numpy(), want, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(t.sum(1).numpy(), x64.sum(1), rtol=1e-5, atol=1e-4)
    np.testing.assert_array_equal(t.max(1).numpy(), x.max(1))
    np.testing.assert_allclose((t.sum(1) + t.max(1)).numpy(), x64.sum(1) + x.max(1), rtol=1e-5, atol=1e-4)
    xi = rng.integers(-1000, 1000, (rows, n)).astype(np.int32)
    np.testing.assert_array_equal(Tensor(xi, device="CUDA").sum(1).numpy(), xi.sum(1))
    cols = Variable("cols", 1, 8192)  # a symbolic row length: the group's last pass padded at run time
    got = t.reshape(rows, cols.bind(n)).softmax(1).numpy()
    np.testing.assert_allclose(got, e / e.sum(1, keepdims=True), rtol=2e-5, atol=1e-7)


@gpu
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


WGMMA_CHILD = r"""
import sys
import numpy as np
from polygrad import Device, Tensor, dtypes
from polygrad.codegen.lower import lower
from polygrad.engine import programs
asts = []
real = programs.get_program
programs.get_program = lambda ast, device: asts.append(ast) or real(ast, device)
rng = np.random.default_rng(0)
caps = Device["CUDA"].capabilities
assert "wgmma_f16" in caps.tensor_cores, caps.tensor_cores
for m, k, n, dt, layout in [(17, 17, 17, "f16", "rows"), (1000, 1000, 1000, "f16", "rows"),
                            (1000, 1000, 1000, "bf16", "cols"), (4097, 4097, 4097, "f16", "cols"),
                            (4097, 33, 17, "bf16", "rows"), (64, 200, 136, "f16", "batch")]:
    a = rng.standard_normal((3, m, k) if layout == "batch" else (m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    to = dtypes.float16 if dt == "f16" else dtypes.bfloat16
    ta = Tensor(a, device="CUDA").cast(to).realize()
    tb = (Tensor(b.T.copy(), device="CUDA").cast(to).realize().T if layout == "cols"
          else Tensor(b, device="CUDA").cast(to).realize())
    a64, b64 = ta.cast(dtypes.float32).numpy().astype(np.float64), tb.cast(dtypes.float32).numpy().astype(np.float64)
    del asts[:]
    got = (ta @ tb).cast(dtypes.float32).numpy().astype(np.float64)
    opts = [o.amount for ast in asts for o in lower(ast, caps).opts if o.kind.value == "TC"]
    assert opts == [64], (m, k, n, dt, layout, opts)  # the matmul ran on the wgmma kernel
    want = a64 @ b64
    tol = 2 ** -10 if dt == "f16" else 2 ** -7  # the output rounded to 16 bits, sums of exact products in float32
    err = np.abs(got - want).max() / max(np.abs(want).max(), 1e-30)
    print(m, k, n, dt, layout, "rel err", err)
    assert err < tol, err
print("WGMMA OK")
"""


@gpu
def test_wgmma_matmuls_odd_sizes_against_numpy():
    """sm_90 only: float16 and bfloat16 matmuls on warpgroup tensor cores (POLY_CUDA_WGMMA=1 when the device
    opens, so in a child process) on odd sizes, B row major and transposed, batched, against NumPy in float64
    of the same 16-bit operands; the child also checks every matmul was lowered for wgmma (TC:64)."""
    import subprocess
    import sys
    arch = Device["CUDA"].capabilities.arch or ""
    if int("".join(c for c in arch if c.isdigit()) or 0) < 90:
        pytest.skip(f"{arch} has no wgmma (sm_90 and newer)")
    proc = subprocess.run([sys.executable, "-c", WGMMA_CHILD], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "POLY_CUDA_WGMMA": "1"})
    assert proc.returncode == 0 and "WGMMA OK" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-4000:]


def tf32_round(x: np.ndarray) -> np.ndarray:
    """cvt.rna.tf32.f32 in NumPy (10 mantissa bits, to nearest, ties away from zero), as float64."""
    m, e = np.frexp(np.abs(x.astype(np.float64)))
    return np.sign(x) * np.floor(m * 2.0**11 + 0.5) * 2.0 ** (e - 11)


@gpu
def test_tf32_opt_in_and_bfloat16_tensor_cores():
    """POLY_ALLOW_TF32=1: the product of TF32-rounded operands (on sm_80+), the exact one again when it is
    off (another program, not the cached TF32 one); bfloat16 matmuls on tensor cores."""
    a, b = randn(256, 512), randn(512, 128)
    ta, tb = Tensor(a, device="CUDA"), Tensor(b, device="CUDA")
    exact = a.astype(np.float64) @ b
    with Context(POLY_ALLOW_TF32=1):
        tf32 = (ta @ tb).numpy()
    if "mma_tf32" in Device["CUDA"].capabilities.tensor_cores:
        np.testing.assert_allclose(tf32, tf32_round(a) @ tf32_round(b), rtol=1e-4, atol=1e-3)
        assert np.abs(tf32 - exact).max() > 1e-3
    np.testing.assert_allclose((ta @ tb).numpy(), exact, rtol=1e-4, atol=1e-3)
    ab, bb = ta.cast(dtypes.bfloat16), tb.cast(dtypes.bfloat16)
    want = ab.numpy().astype(np.float64) @ bb.numpy().astype(np.float64)
    np.testing.assert_allclose((ab @ bb).cast(dtypes.float32).numpy(), want, rtol=1e-2, atol=1e-1)


@gpu
@pytest.mark.parametrize("m,k,n", [(1, 17, 1), (17, 17, 17), (1000, 1000, 1000), (4097, 4097, 4097),
                                   (1, 4097, 1000), (4097, 33, 17)])
def test_tiled_fp32_matmul_odd_sizes(m, k, n):
    """Shared-memory tiles (Opt(TILE)) wherever both sides are 16 or more, against NumPy in float64."""
    a, b = randn(m, k), randn(k, n)
    got = (Tensor(a, device="CUDA") @ Tensor(b, device="CUDA")).numpy()
    want = a.astype(np.float64) @ b.astype(np.float64)
    err = np.abs(got - want).max() / (np.abs(a).astype(np.float64) @ np.abs(b)).max()
    assert err < 1e-5, (m, k, n, err)


@gpu
def test_tiled_fp32_matmul_batches_and_transposes():
    a, b, c = randn(3, 100, 65), randn(65, 70), randn(3, 65, 70)
    ta, tb, tc = (Tensor(x, device="CUDA") for x in (a, b, c))
    np.testing.assert_allclose((ta @ tb).numpy(), a @ b, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose((ta @ tc).numpy(), a @ c, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose((tb.T @ ta[1].T).numpy(), b.T @ a[1].T, rtol=1e-4, atol=1e-4)


@gpu
@pytest.mark.parametrize("shape", [(8, 64, 56, 56, 64, 3, 1, 1), (8, 64, 56, 56, 64, 3, 2, 1),
                                   (8, 64, 56, 56, 128, 1, 2, 0), (8, 256, 14, 14, 256, 3, 1, 1),
                                   (3, 17, 9, 31, 19, 5, 1, 2)])
def test_tiled_conv_forward_and_gradients_against_torch(shape):
    """Convolutions as implicit GEMMs through shared-memory tiles (gpu_opts.implicit_gemm: forward, input
    gradient, and weight gradient): y, dx and dw of sum(relu(conv(x, w) + b) * g)
    against torch in float64 on the host; ResNet widths, stride 2, 1x1, and odd sizes that cross the tile edges."""
    torch = pytest.importorskip("torch")
    n, c, h, w, o, k, stride, pad = shape
    x, wt, b = randn(n, c, h, w), randn(o, c, k, k) / np.sqrt(c * k * k), randn(o)
    xt, wtt, bt = (torch.tensor(v, dtype=torch.float64, requires_grad=True) for v in (x, wt, b))
    yt = torch.nn.functional.conv2d(xt, wtt, bt, stride=stride, padding=pad).relu()
    g = randn(*yt.shape)
    (yt * torch.tensor(g, dtype=torch.float64)).sum().backward()
    tx, tw, tb = (Tensor(v, device="CUDA", requires_grad=True) for v in (x, wt, b))
    with Context(TRAINING=1):
        y = tx.conv2d(tw, tb, stride=stride, padding=pad).relu()
        (y * Tensor(g, device="CUDA")).sum().backward()
    for got, want in ((y, yt), (tx.grad, xt.grad), (tw.grad, wtt.grad)):
        want = want.detach().numpy()
        err = np.abs(got.numpy() - want).max() / np.abs(want).max()
        assert err < 1e-4, (shape, err)


@gpu
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


@gpu
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


@gpu
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


@gpu
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


@gpu
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


# ---- issue 35's training steps: the 784-512-512-10 MLP and a GPT-2-small block, one Adam step each.
# Their bodies run on the host device too (here and in CI); every device is checked against torch in
# float64, and CUDA also against the host backend within 1e-4 relative, as the issue asks.

DEVICES = [HOST, pytest.param("CUDA", marks=gpu)]
LR = 1e-3
GPT2_WIDTH, GPT2_HEADS = 768, 12


def _mlp_weights():
    g = np.random.default_rng(5)
    sizes = (784, 512, 512, 10)
    weights = []
    for fan_in, fan_out in zip(sizes, sizes[1:]):
        bound = 1 / np.sqrt(fan_in)
        weights += [g.uniform(-bound, bound, (fan_in, fan_out)).astype(np.float32),
                    g.uniform(-bound, bound, fan_out).astype(np.float32)]
    x = g.standard_normal((128, 784)).astype(np.float32)
    return weights, (x, g.integers(0, 10, 128).astype(np.int32))


def _mlp_loss(xp, params, data):
    """Mean cross-entropy of the ReLU MLP; xp: polygrad (Tensors) or torch."""
    x, y = data
    for i in range(0, len(params), 2):
        x = x @ params[i] + params[i + 1]
        x = x.relu() if i + 2 < len(params) else x
    if xp == "torch":
        import torch
        return torch.nn.functional.cross_entropy(x, y.long())
    return x.sparse_categorical_crossentropy(y)


def _block_weights():
    """A GPT-2-small block (768 wide, 12 heads, MLP 3072): ln_1, qkv, proj, ln_2, fc, fc_proj (in, out)."""
    g = np.random.default_rng(6)
    E = GPT2_WIDTH

    def normal(*dims, std=0.02):
        return (g.standard_normal(dims) * std).astype(np.float32)
    weights = [1 + normal(E, std=0.1), normal(E), normal(E, 3 * E), normal(3 * E), normal(E, E), normal(E),
               1 + normal(E, std=0.1), normal(E), normal(E, 4 * E), normal(4 * E), normal(4 * E, E), normal(E)]
    x = g.standard_normal((2, 64, E)).astype(np.float32)
    return weights, (x, g.standard_normal((2, 64, E)).astype(np.float32))


def _block_loss(xp, w, data):
    """Mean squared error of a pre-norm GPT-2 block's output (causal attention, tanh GELU)."""
    x, target = data
    (B, T, E), H = x.shape, GPT2_HEADS
    if xp == "torch":
        import torch
        F = torch.nn.functional
        norm = lambda t, i: F.layer_norm(t, (E,), w[i], w[i + 1], 1e-5)  # noqa: E731
        attend = lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)  # noqa: E731
        gelu = lambda t: F.gelu(t, approximate="tanh")  # noqa: E731
    else:
        norm = lambda t, i: t.layernorm(eps=1e-5) * w[i] + w[i + 1]  # noqa: E731
        attend = lambda q, k, v: q.scaled_dot_product_attention(k, v, is_causal=True)  # noqa: E731
        gelu = lambda t: t.gelu(approximate="tanh")  # noqa: E731
    qkv = norm(x, 0) @ w[2] + w[3]
    q, k, v = (qkv[:, :, j * E:(j + 1) * E].reshape(B, T, H, E // H).transpose(1, 2) for j in range(3))
    x = x + attend(q, k, v).transpose(1, 2).reshape(B, T, E) @ w[4] + w[5]
    x = x + gelu(norm(x, 6) @ w[8] + w[9]) @ w[10] + w[11]
    return ((x - target) ** 2).mean()


def _polygrad_step(device, loss_fn, weights, data):
    """(loss, gradients, weights after one Adam step) of polygrad on `device`."""
    params = [Tensor(w, device=device, requires_grad=True) for w in weights]
    inputs = tuple(Tensor(d, device=device) for d in data)
    adam = nn.optim.Adam(params, lr=LR)
    with Context(TRAINING=1):
        adam.zero_grad()
        loss = loss_fn("polygrad", params, inputs)
        loss.backward()
        grads = [p.grad.numpy() for p in params]
        adam.step(loss)
    return float(loss.numpy()), grads, [p.numpy() for p in params]


def _torch_step(loss_fn, weights, data):
    """The same step in torch, float64, on the CPU."""
    torch = pytest.importorskip("torch")
    params = [torch.tensor(w, dtype=torch.float64, requires_grad=True) for w in weights]
    inputs = tuple(torch.tensor(d, dtype=torch.float64 if d.dtype.kind == "f" else None) for d in data)
    adam = torch.optim.Adam(params, lr=LR)
    loss = loss_fn("torch", params, inputs)
    loss.backward()
    grads = [p.grad.numpy().copy() for p in params]
    adam.step()
    return float(loss.detach()), grads, [p.detach().numpy() for p in params]


def _assert_same_step(got, want, rtol=1e-4):
    """Loss and every gradient within rtol of the largest value; the weights after Adam's first step
    (w - lr * g / (|g| + eps)) within rtol * lr where the reference gradient is well above eps: below,
    a gradient within rounding of 0 may move its weight anywhere in [-lr, lr], and must stay there."""
    loss, grads, weights = got
    want_loss, want_grads, want_weights = want
    assert abs(loss - want_loss) <= rtol * abs(want_loss), (loss, want_loss)
    for i, (g, w) in enumerate(zip(grads, want_grads)):
        err = np.abs(g - w).max() / np.abs(w).max()
        assert err <= rtol, f"gradient {i}: relative error {err:.2e}"
    for i, (p, w, g) in enumerate(zip(weights, want_weights, want_grads)):
        steady = np.abs(g) > 1e-6
        np.testing.assert_allclose(p[steady], w[steady], rtol=0, atol=rtol * LR, err_msg=f"weight {i}")
        np.testing.assert_array_less(np.abs(p - w), 2 * LR * (1 + rtol), err_msg=f"weight {i}")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("model", ["mlp_784_512_512_10", "gpt2_small_block"])
def test_training_step_against_torch_and_host(device, model):
    loss_fn, (weights, data) = {"mlp_784_512_512_10": (_mlp_loss, _mlp_weights()),
                                "gpt2_small_block": (_block_loss, _block_weights())}[model]
    got = _polygrad_step(device, loss_fn, weights, data)
    _assert_same_step(got, _torch_step(loss_fn, weights, data))
    if device != HOST:
        _assert_same_step(got, _polygrad_step(HOST, loss_fn, weights, data))


def _graph_launches(monkeypatch) -> list[int]:
    """Kernels per GraphPlan call (graph.py), recorded from now on."""
    from polygrad_backend_cuda.graph import GraphPlan
    calls: list[int] = []
    direct = GraphPlan.__call__
    monkeypatch.setattr(GraphPlan, "__call__", lambda self: calls.append(self.n) or direct(self))
    return calls


@gpu
@pytest.mark.parametrize("graphs", ["1", "0"])
def test_jit_replay_and_model_calls_as_cuda_graphs(graphs, monkeypatch):
    """A 40-kernel JIT replay with a copy to the host and back, and a Model over a Variable batch: with
    POLY_CUDA_GRAPH=1 the kernels between copies run as CUDA graphs (rebinding inputs, fresh outputs and
    new batch sizes set on the graph), with 0 one launch each; values against NumPy either way."""
    from polygrad import jit
    monkeypatch.setenv("POLY_CUDA_GRAPH", graphs)
    launched = _graph_launches(monkeypatch)

    @jit
    def chain(x):
        for _ in range(20):
            x = (x * 1.01 + 0.25).sin().realize()
        y = (x.to(HOST) * 2).to("CUDA")
        for _ in range(20):
            y = (y * 0.99 - 0.125).cos().realize()
        return y

    def want_chain(x):
        x = x.astype(np.float64)
        for _ in range(20):
            x = np.sin(x * 1.01 + 0.25)
        x = x * 2
        for _ in range(20):
            x = np.cos(x * 0.99 - 0.125)
        return x

    inputs = [randn(4096) for _ in range(3)]
    for i in (0, 1, 2, 2, 0):
        got = chain(Tensor(inputs[i], device="CUDA").realize()).numpy()
        np.testing.assert_allclose(got, want_chain(inputs[i]), rtol=1e-5, atol=1e-5)
    assert launched == ([20, 20] * 3 if graphs == "1" else []), launched

    launched.clear()

    class Net:
        def __init__(self):
            self.l1, self.l2 = nn.Linear(16, 64), nn.Linear(64, 8)

        def __call__(self, x):
            return {"y": self.l2(self.l1(x).relu())}

    with default_device("CUDA"):
        Tensor.manual_seed(3)
        model = Model(Net(), inputs={"x": Tensor.empty(Variable("batch", 1, 64), 16)})
    try:
        assert model.device.startswith("CUDA"), model.device
        p = {k: v.numpy().astype(np.float64) for k, v in model.parameters().items()}
        for rows in (3, 64, 1, 17, 17):
            x = randn(rows, 16)
            got = model.forward(x=x)["y"].numpy()
            h = np.maximum(x @ p["l1.weight"].T + p["l1.bias"], 0)
            np.testing.assert_allclose(got, h @ p["l2.weight"].T + p["l2.bias"], rtol=1e-4, atol=1e-4)
    finally:
        model.dispose()
    assert launched == ([launched[0]] * 5 if graphs == "1" else []), launched


@gpu
def test_beam_search_on_cuda(monkeypatch, tmp_path):
    """BEAM=1 times the GPU candidates (codegen/gpu_search.py) on the device: a matmul and a row reduction
    keep NumPy's values, and the winners are cached per architecture."""
    from polygrad.codegen import search
    from polygrad.engine import programs
    monkeypatch.setenv("POLY_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(programs, "program_cache", {})
    monkeypatch.setattr(search, "beam_cache", {})
    a, b, r = randn(256, 192), randn(192, 320), randn(64, 3072)
    with Context(BEAM=1):
        mm = (Tensor(a, device="CUDA") @ Tensor(b, device="CUDA")).numpy()
        rows = Tensor(r, device="CUDA").sum(1).numpy()
    np.testing.assert_allclose(mm, a.astype(np.float64) @ b, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(rows, r.astype(np.float64).sum(1), rtol=1e-4, atol=1e-4)
    assert len(list((tmp_path / "beam" / "CUDA").glob("*.opts"))) >= 2
