"""Convolutions through the shared-memory tiles on CUDA (Opt(TILE) on an implicit GEMM: gpu_opts.implicit_gemm,
tiled_matmul._gather_loads) without a GPU: the forward, input-gradient and weight-gradient kernels of
Tensor.conv2d take the tile at 16 or more rows and columns, the padding gate is evaluated when a tile is
loaded (never in the inner loop), every tiled conv kernel compiles with NVRTC for sm_75, sm_80 and sm_90,
and their values on the CPU check (polygrad_backend_cuda.cpu_check) match torch in float64 on 3x3 / 1x1 /
5x5 windows, strides 1 and 2, padding, and odd channel and pixel counts (edges of the tile).
"""
from __future__ import annotations

import shutil

import numpy as np
import pytest

from polygrad import Context, Tensor
from polygrad.codegen.gpu_opts import implicit_gemm
from polygrad.codegen.lower import kernel_for_opts
from polygrad.codegen.opts import OptKind

cuda = pytest.importorskip("polygrad_backend_cuda")
torch = pytest.importorskip("torch")
from polygrad_backend_cuda.compile_check import compile_all  # noqa: E402
from conftest import kernels_of  # noqa: E402
from tests.test_cuda_compile import _compiler  # noqa: E402
from tests.test_cuda_cpu_check import cuda_kernels, run  # noqa: E402

needs_cxx = pytest.mark.skipif(not (shutil.which("clang++") or shutil.which("g++")), reason="no C++ compiler")


def conv_step(n, c, h, w, o, k, stride, pad, bias=False, data=None):
    """A function scheduling conv2d forward (+ bias and relu with `bias`) and its backward on INTERP, with
    an upstream gradient g (so the backward kernels multiply two loads); `data` (x, w, b, g) or empty tensors."""
    if data is None:
        x = Tensor.empty(n, c, h, w, device="INTERP", requires_grad=True)
        wt = Tensor.empty(o, c, k, k, device="INTERP", requires_grad=True)
        b = Tensor.empty(o, device="INTERP", requires_grad=True)
    else:
        x, wt, b = (Tensor(v, device="INTERP", requires_grad=True) for v in data[:3])

    def step():
        with Context(TRAINING=1):
            y = x.conv2d(wt, b if bias else None, stride=stride, padding=pad)
            if bias:
                y = y.relu()
            y.realize()
            g = (Tensor.empty(*y.shape, device="INTERP") if data is None else Tensor(data[3], device="INTERP"))
            (y * g.realize()).sum().backward()
            x.grad.realize()
            wt.grad.realize()
    return step


def tiled_names(shape, arch="sm_90"):
    """[(kernel name, tiled?)] of the step's reduce kernels (products and sums) in schedule order."""
    return [(spec.name, any(o.kind is OptKind.TILE for o in spec.opts))
            for spec, _, _ in cuda_kernels(conv_step(*shape), arch) if spec.name.startswith("r_")]


def test_conv_forward_and_backward_take_the_tile():
    """At ResNet widths (batch 8, 56x56, 64 -> 64 channels): forward, input gradient and weight gradient are
    tiled for 3x3 (stride 1 and 2, padding 1) and 1x1 windows. (Without the tile the weight gradient runs one
    thread a block, 576 blocks each looping over 64 output channels and 25088 points.)"""
    assert tiled_names((8, 64, 56, 56, 64, 3, 1, 1)) == [("r_8_64_56_56", True)] * 2 + [("r_64_64_3_3", True)]
    # stride 2: the input gradient is a GEMM into the window's points, then a sum of them (no product)
    assert tiled_names((8, 64, 56, 56, 64, 3, 2, 1)) == [
        ("r_8_64_28_28", True), ("r_8_1_64_1_28_28_3_3", True), ("r_8_64_56_56", False), ("r_64_64_3_3", True)]
    assert tiled_names((8, 64, 56, 56, 64, 1, 1, 0)) == [("r_8_64_56_56", True)] * 2 + [("r_64_64_1_1", True)]
    assert tiled_names((8, 256, 14, 14, 256, 3, 1, 1)) == [("r_8_256_14_14", True)] * 2 + [("r_256_256_3_3", True)]


def test_implicit_gemm_ranges_of_a_forward_conv():
    """rows: output channels; columns: batch x output pixels (the output's innermost range, so stores are
    contiguous); reduce: the window and the input channels; the input's load carries the padding gate."""
    (fwd,) = kernels_of(lambda: Tensor.empty(2, 16, 7, 7, device="INTERP").conv2d(
        Tensor.empty(24, 16, 3, 3, device="INTERP"), padding=1).realize())
    g = implicit_gemm(kernel_for_opts(fwd))
    sizes = lambda rs: [int(r.src[0].arg) for r in rs]  # noqa: E731
    assert (sizes(g.rows), sizes(g.cols), sorted(sizes(g.reduce)), g.batch) == ([24], [2, 7, 7], [3, 3, 16], ())
    assert len(g.b.src[0].src) == 3 and len(g.a.src[0].src) == 2  # x gated (padding), w not
    squares = kernels_of(lambda: (Tensor.empty(32, 32, device="INTERP") ** 2).sum(1).realize())[-1]
    assert implicit_gemm(kernel_for_opts(squares)) is None  # one operand: no rows or columns


def test_padding_gate_is_evaluated_when_a_tile_is_loaded():
    """The inner loop of every tiled kernel reads shared memory only; the forward's and the input gradient's
    gated operand (x, and g: the padding) is zero-filled in its tile loader. (The weight gradient reads the
    padded input, which this schedule materialises.)"""
    kernels = [(spec.name, src) for spec, src, _ in cuda_kernels(conv_step(8, 64, 56, 56, 64, 3, 1, 1))
               if any(o.kind is OptKind.TILE for o in spec.opts)]
    assert len(kernels) == 3
    for n, (name, src) in enumerate(kernels):
        body = src[src.index("for (int kk = 0"):src.index("if (step + 1 < steps) { st_a")]
        assert "data" not in body and "<8" not in body and "<57" not in body, body  # shared memory only
        if n < 2:
            loader = src[src.index("auto ld_b"):src.index("auto st_b")]
            assert "<57" in loader and "? data" in loader and ": 0.0f" in loader, (name, loader)


CASES = {  # n, c, h, w, o, window, stride, padding: odd channels and pixel counts cross the tile's edges
    "3x3_pad1": (2, 16, 7, 7, 24, 3, 1, 1),
    "3x3_stride2_pad1": (2, 16, 7, 7, 24, 3, 2, 1),
    "1x1_odd": (2, 17, 9, 6, 19, 1, 1, 0),
    "3x3_odd_nopad": (1, 17, 9, 6, 19, 3, 1, 0),
    "5x5_pad2": (1, 16, 6, 5, 17, 5, 1, 2),
}


@needs_cxx
@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("bias", [False, True])
def test_tiled_conv_matches_torch_on_the_cpu(name, bias):
    """Every kernel of the step runs on the CPU check, in order (the stride-2 input gradient's first kernel
    feeds the second), against torch's conv2d and autograd in float64; small shapes (the check runs a thread
    per CUDA thread)."""
    n, c, h, w, o, k, stride, pad = CASES[name]
    rng = np.random.default_rng(1)
    x, wt, b = rng.standard_normal((n, c, h, w)), rng.standard_normal((o, c, k, k)), rng.standard_normal(o)
    xt, wtt, bt = (torch.tensor(v, requires_grad=True) for v in (x, wt, b))
    yt = torch.nn.functional.conv2d(xt, wtt, bt if bias else None, stride=stride, padding=pad)
    yt = yt.relu() if bias else yt
    g = rng.standard_normal(tuple(yt.shape))
    (yt * torch.tensor(g)).sum().backward()
    data = [v.astype(np.float32) for v in (x, wt, b, g)]
    kernels = cuda_kernels(conv_step(n, c, h, w, o, k, stride, pad, bias, data))
    assert len({v.size for v in data}) == 4, "buffers are told apart by size"
    known = {v.size: v for v in data}
    want = {yt.numel(): yt.detach().numpy(), x.size: xt.grad.numpy(), wt.size: wtt.grad.numpy()}
    checked, tiled = set(), 0
    for kernel in kernels:
        spec = kernel[0]
        tiled += any(o.kind is OptKind.TILE for o in spec.opts)
        if bias and spec.name.startswith("E_"):  # relu's backward reads y and g (one size): NumPy's mask instead
            known[g.size] = np.where(want[g.size].reshape(-1) > 0, g.reshape(-1), 0).astype(np.float32)
            continue
        (got,) = run(kernel, *(known[gl.size] for gl in spec.globals if not gl.written))
        if got.size not in want:  # the stride-2 input gradient's window points, read by the next kernel
            known[got.size] = got
        else:  # y has g's size: only g is read after the forward
            ref = want[got.size]
            np.testing.assert_allclose(got.reshape(ref.shape), ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())
            checked.add(got.size)
    assert checked == set(want), "a conv output was not checked"
    assert tiled >= 3


@needs_cxx
def test_grouped_conv_runs_its_groups_on_grid_z():
    """groups=2: the group's range is read by both operands (a batch range: grid z), the bias load is the
    epilogue; against torch in float64."""
    rng = np.random.default_rng(2)
    x, w, b = rng.standard_normal((2, 32, 7, 5)), rng.standard_normal((40, 16, 3, 3)), rng.standard_normal(40)
    (kernel,) = cuda_kernels(lambda: Tensor(x.astype(np.float32), device="INTERP").conv2d(
        Tensor(w.astype(np.float32), device="INTERP"), Tensor(b.astype(np.float32), device="INTERP"),
        groups=2, padding=1).realize())
    spec, _, launch = kernel
    assert [o.kind for o in spec.opts] == [OptKind.TILE] and launch.grid == (2, 1, 2)
    by_size = {v.size: v.astype(np.float32) for v in (x, w, b)}
    (got,) = run(kernel, *(by_size[g.size] for g in spec.globals if not g.written))
    want = torch.nn.functional.conv2d(*(torch.tensor(v) for v in (x, w, b)), groups=2, padding=1).numpy()
    np.testing.assert_allclose(got.reshape(want.shape), want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


@pytest.mark.parametrize("arch", ["sm_75", "sm_80", "sm_90"])
def test_tiled_conv_kernels_compile_with_nvrtc(arch):
    compile_fn = _compiler()
    sources = []
    for shape, bias in (((8, 64, 56, 56, 64, 3, 1, 1), True), ((8, 64, 56, 56, 64, 3, 2, 1), False),
                        ((8, 64, 56, 56, 128, 1, 2, 0), False), ((8, 256, 14, 14, 256, 3, 1, 1), False),
                        ((3, 17, 9, 31, 19, 5, 1, 2), False)):
        for spec, src, _ in cuda_kernels(conv_step(*shape, bias=bias), arch):
            if any(o.kind is OptKind.TILE for o in spec.opts):
                sources.append(src)
    assert len(sources) >= 9
    assert compile_all(sources, arch, compile_fn) >= 1


def test_conv_tile_ptx_reads_shared_memory_and_fuses():
    """What NVRTC made of the 3x3 forward's 64 x 64 tile (sm_90 PTX): 16-byte shared reads in the inner loop,
    one barrier a stage plus the first, the k loop unrolled into bk x (4 x 4) fused multiply-adds, none split."""
    from polygrad_backend_cuda import libs
    from polygrad_backend_cuda.compiler import nvrtc_compile
    try:
        libs.nvrtc()
    except libs.LibraryMissing:
        pytest.skip("libnvrtc is not installed")
    spec, src, _ = cuda_kernels(conv_step(8, 64, 56, 56, 64, 3, 1, 1))[0]
    assert [o.kind for o in spec.opts] == [OptKind.TILE]
    ptx = nvrtc_compile(src, "sm_90", ptx=True).decode()
    assert "ld.shared.v4.f32" in ptx and ptx.count("bar.sync") == 2
    assert ptx.count("fma.rn.f32") == 16 * 16 and "mul.rn.f32" not in ptx
