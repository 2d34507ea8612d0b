"""Shared-memory tiled float32 matmuls on CUDA (Opt(TILE), tiled_matmul.py) without a GPU: the opt is
chosen from Capabilities, every tile kernel compiles with NVRTC for sm_75, sm_80 and sm_90, and its
values on the CPU check (polygrad_backend_cuda.cpu_check) match NumPy on odd sizes (1, 17, 100,
scaled-down 1000 and 4097: one past a multiple of the tile), batches, broadcast and transposed operands.
"""
from __future__ import annotations

import shutil

import numpy as np
import pytest

from polygrad import dtypes
from polygrad.codegen import gpu_opts
from polygrad.codegen.gpu_opts import MATMUL_TILES, matmul_with_epilogue
from polygrad.codegen.lower import lower
from polygrad.codegen.opts import Opt, OptKind

cuda = pytest.importorskip("polygrad_backend_cuda")
from polygrad_backend_cuda import capabilities  # noqa: E402
from polygrad_backend_cuda.compile_check import compile_all  # noqa: E402
from polygrad_backend_cuda.launch import launch_of  # noqa: E402
from polygrad_backend_cuda.renderer import CUDARenderer  # noqa: E402
from conftest import kernels_of  # noqa: E402
from tests.test_cuda_compile import _compiler  # noqa: E402
from tests.test_cuda_cpu_check import on_interp, run  # noqa: E402

rng = np.random.default_rng(0)
needs_cxx = pytest.mark.skipif(not (shutil.which("clang++") or shutil.which("g++")), reason="no C++ compiler")


def matmul_ast(fn):
    return kernels_of(fn)[-1]


def tiled(ast, tile=None, arch="sm_90"):
    """(spec, source, launch) lowered with the heuristics, or with Opt(TILE) of block rows `tile`."""
    opts = None
    if tile is not None:
        opts = [Opt(OptKind.TILE, matmul_with_epilogue(ast)[2].arg[0], tile)]
    spec = lower(ast, capabilities(arch), opts)
    return spec, CUDARenderer(arch).render(spec), launch_of(spec)


def randn(*shape):
    return rng.standard_normal(shape).astype(np.float32)


# (A, B, how the kernel reads them): odd sizes, a batch with B broadcast, transposed operands
CASES = {
    "2x3x2": lambda: (randn(2, 3), randn(3, 2), lambda a, b: a @ b),
    "17": lambda: (randn(17, 17), randn(17, 17), lambda a, b: a @ b),
    "100x37x70": lambda: (randn(100, 37), randn(37, 70), lambda a, b: a @ b),
    "k1000": lambda: (randn(20, 1000), randn(1000, 24), lambda a, b: a @ b),
    "129_past_tile": lambda: (randn(129, 65), randn(65, 131), lambda a, b: a @ b),
    "batch_broadcast": lambda: (randn(3, 20, 33), randn(33, 18), lambda a, b: a @ b),
    "batch_both": lambda: (randn(2, 17, 16), randn(2, 16, 19), lambda a, b: a @ b),
    "a_transposed": lambda: (randn(40, 50), randn(40, 36), lambda a, b: a.T @ b),
    "b_transposed": lambda: (randn(50, 40), randn(36, 40), lambda a, b: a @ b.T),
}


def _check(name, tile):
    a, b, f = CASES[name]()
    kernel = tiled(matmul_ast(lambda: f(on_interp(a), on_interp(b)).realize()), tile)
    assert any(o.kind is OptKind.TILE for o in kernel[0].opts)
    (got,) = run(kernel, a, b)
    want = f(a.astype(np.float64), b.astype(np.float64))
    np.testing.assert_allclose(got.reshape(want.shape), want, rtol=1e-5, atol=1e-5 * np.sqrt(a.shape[-1]))
    return kernel


@needs_cxx
@pytest.mark.parametrize("name", list(CASES))
def test_tiled_matmul_matches_numpy_on_the_cpu(name):
    _check(name, 64)


@needs_cxx
@pytest.mark.parametrize("shapes", [((1, 40), (40, 17)), ((17, 40), (40, 1))])
def test_a_side_of_one_is_no_tile_kernel_and_still_right(shapes):
    """A row or column of 1 leaves no (i, j) pair of ranges: the matrix-vector kernel of the usual opts."""
    a, b = randn(*shapes[0]), randn(*shapes[1])
    kernel = tiled(matmul_ast(lambda: (on_interp(a) @ on_interp(b)).realize()))
    assert not any(o.kind is OptKind.TILE for o in kernel[0].opts)
    (got,) = run(kernel, a, b)
    np.testing.assert_allclose(got.reshape(a.shape[0], b.shape[1]), a @ b, rtol=1e-5, atol=1e-5)


def _relu_mask(h, g, w):
    return np.where(h == 0, 0, g @ w)


# (inputs in the kernel's slot order, the tensor expression, the NumPy one): what follows the sum
EPILOGUES = {
    "linear_relu": ((randn(20, 33), randn(40, 33), randn(40)), lambda x, w, b: (x @ w.T + b).relu(),
                    lambda x, w, b: np.maximum(x @ w.T + b, 0)),
    "relu_mask_grad": ((np.maximum(randn(24, 30), 0), randn(24, 10), randn(10, 30)),
                       lambda h, g, w: (h == 0).where(0, g @ w), _relu_mask),
    "exp_then_half": ((randn(17, 19) / 4, randn(19, 21) / 4), lambda a, b: (a @ b).exp().cast(dtypes.float16),
                      lambda a, b: np.exp(a @ b)),
}


@needs_cxx
@pytest.mark.parametrize("name", list(EPILOGUES))
def test_epilogue_after_the_tiled_sum(name):
    inputs, tensor_fn, numpy_fn = EPILOGUES[name]
    kernel = tiled(matmul_ast(lambda: tensor_fn(*(on_interp(x) for x in inputs)).realize()))
    assert [o.kind for o in kernel[0].opts] == [OptKind.TILE]
    order = {"linear_relu": (0, 1, 2), "relu_mask_grad": (0, 1, 2), "exp_then_half": (0, 1)}[name]
    reads = [g for g in kernel[0].globals if not g.written]
    by_size = sorted(range(len(inputs)), key=lambda n: [g.size for g in reads].index(inputs[n].size))
    assert tuple(by_size) == order, "the kernel reads its buffers in another order than the test assumes"
    (got,) = run(kernel, *inputs)
    want = numpy_fn(*(x.astype(np.float64) for x in inputs))
    tol = 2e-3 if name == "exp_then_half" else 1e-5
    np.testing.assert_allclose(got.astype(np.float64).reshape(want.shape), want, rtol=tol, atol=tol)


@needs_cxx
def test_big_tile_and_float4_paths():
    for name in ("129_past_tile", "a_transposed", "b_transposed"):
        spec, src, launch = _check(name, 128)
        assert launch.block == (MATMUL_TILES[128].threads, 1, 1) and "pg_vload<float, 4>" in src


def test_heuristic_choice_follows_capabilities(monkeypatch):
    ast = matmul_ast(lambda: (on_interp(randn(100, 37)) @ on_interp(randn(37, 70))).realize())
    spec, src, launch = tiled(ast)
    assert [o.kind for o in spec.opts] == [OptKind.TILE] and launch.grid == (2, 2, 1)
    assert "__shared__ float As[2][16][68]" in src and src.count("__syncthreads();") == 2
    big = matmul_ast(lambda: (on_interp(randn(1024, 8)) @ on_interp(randn(8, 1024))).realize())
    assert tiled(big)[0].opts[0].amount == 64  # 128 x 128 tiles would leave 64 blocks
    monkeypatch.setattr(gpu_opts, "TILE_MIN_BLOCKS", 64)
    assert tiled(big)[0].opts[0].amount == 128
    small_memory = lower(ast, capabilities("sm_90", shared_memory=8 * 1024))
    assert not any(o.kind is OptKind.TILE for o in small_memory.opts)
    matvec = matmul_ast(lambda: (on_interp(randn(1, 64)) @ on_interp(randn(64, 64))).realize())
    assert not any(o.kind is OptKind.TILE for o in tiled(matvec)[0].opts)
    a16, b16 = (on_interp(randn(64, 64)).cast(dtypes.float16).realize() for _ in range(2))
    half = matmul_ast(lambda: (a16 @ b16).realize())
    assert [o.kind for o in tiled(half)[0].opts] == [OptKind.TC]
    assert not any(o.kind is OptKind.TILE for o in tiled(half, arch="sm_75")[0].opts)
    # float32 loads rounded to float16 before the product: not a plain float32 matmul
    rounded = matmul_ast(lambda: (on_interp(randn(64, 64)).cast(dtypes.float16) @
                                  on_interp(randn(64, 64)).cast(dtypes.float16)).realize())
    assert not any(o.kind is OptKind.TILE for o in tiled(rounded, arch="sm_75")[0].opts)


# every path of the template once: both tiles, A and B along their rows or transposed, a batch, epilogues
COMPILED = (("100x37x70", 64), ("batch_broadcast", 128), ("a_transposed", 64), ("b_transposed", 128))


@pytest.mark.parametrize("arch", ["sm_75", "sm_80", "sm_90"])
def test_tiled_kernels_compile_with_nvrtc(arch):
    compile_fn = _compiler()
    sources = []
    for name, tile in COMPILED:
        a, b, f = CASES[name]()
        sources.append(tiled(matmul_ast(lambda: f(on_interp(a), on_interp(b)).realize()), tile, arch)[1])
    for name in ("linear_relu", "exp_then_half"):  # epilogues: a bias and relu; exp decomposed, a half store
        inputs, tensor_fn, _ = EPILOGUES[name]
        sources.append(tiled(matmul_ast(lambda: tensor_fn(*(on_interp(x) for x in inputs)).realize()), 64, arch)[1])
    assert compile_all(sources, arch, compile_fn) >= 1


def test_tile_ptx_has_vector_loads_shared_reads_and_fma():
    """What NVRTC made of the 64 x 64 tile (sm_90 PTX): 16-byte global and shared accesses, one
    barrier a stage, the k loop unrolled into fused multiply-adds (Capabilities.fma), none split."""
    from polygrad_backend_cuda import libs
    from polygrad_backend_cuda.compiler import nvrtc_compile
    try:
        libs.nvrtc()
    except libs.LibraryMissing:
        pytest.skip("libnvrtc is not installed")
    a, b = randn(128, 64), randn(64, 128)
    src = tiled(matmul_ast(lambda: (on_interp(a) @ on_interp(b)).realize()), 64)[1]
    ptx = nvrtc_compile(src, "sm_90", ptx=True).decode()
    assert "ld.global.nc.v4.f32" in ptx and "ld.shared.v4.f32" in ptx and "st.shared.v4.f32" in ptx
    assert ptx.count("bar.sync") == 2
    assert ptx.count("fma.rn.f32") == 16 * 16 and "mul.rn.f32" not in ptx  # bk x (4 x 4) per thread
