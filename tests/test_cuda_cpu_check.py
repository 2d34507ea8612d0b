"""Rendered CUDA kernels run on the CPU (polygrad_backend_cuda.cpu_check: clang++ and a shim, no GPU)
against NumPy: today's GPU lowering (float4 elementwise kernels, grouped reductions through shared
memory and __syncthreads, the 4x4 register-tile matmul) and the float16/bfloat16 conversions that
replace the prelude's PTX. The check itself is shown to catch a wrong launch and a stuck barrier.
"""
from __future__ import annotations

import shutil

import numpy as np
import pytest

from polygrad import Tensor, dtypes
from polygrad.codegen.lower import lower

cuda = pytest.importorskip("polygrad_backend_cuda")
from polygrad_backend_cuda import capabilities, cpu_check  # noqa: E402
from polygrad_backend_cuda.launch import launch_of  # noqa: E402
from polygrad_backend_cuda.renderer import CUDARenderer  # noqa: E402
from conftest import kernels_of  # noqa: E402

pytestmark = pytest.mark.skipif(not (shutil.which("clang++") or shutil.which("g++")), reason="no C++ compiler")
rng = np.random.default_rng(0)
STORAGE = {dtypes.float32: np.float32, dtypes.float16: np.float16, dtypes.bfloat16: np.uint16,
           dtypes.int32: np.int32, dtypes.bool: np.bool_}


def cuda_kernels(fn, arch="sm_90", caps=None):
    """(spec, source, launch) of every kernel `fn` schedules, lowered and rendered for CUDA (for
    `caps`, default capabilities(arch)). `fn` is scheduled, not run: the values come from `run` below."""
    out = []
    for ast in kernels_of(fn, run=False):
        spec = lower(ast, caps or capabilities(arch))
        out.append((spec, CUDARenderer(arch).render(spec), launch_of(spec)))
    return out


def run(kernel, *inputs, out=None):
    """Run one kernel on the CPU with `inputs` in its read slots (in order, sizes checked); returns its
    written buffers, first filled with NaN / a sentinel so unwritten elements show (or a copy of
    `out`: what a scatter folds into)."""
    spec, src, launch = kernel
    reads = iter(inputs)
    buffers, outs = [], []
    for g in spec.globals:
        if g.written:
            b = np.zeros(spec.eval_int(g.size), STORAGE[g.dtype])
            b.view(np.uint8)[:] = 0xFF  # NaN in float words, -1 in ints
            if out is not None:
                b[:] = np.asarray(out).reshape(-1)

            outs.append(b)
        else:
            b = np.ascontiguousarray(next(reads)).reshape(-1)
            assert b.size == spec.eval_int(g.size) and b.dtype == STORAGE[g.dtype], (g, b.size, b.dtype)
        buffers.append(b)
    cpu_check.run_on_cpu(spec, src, launch, buffers)
    return outs


def on_interp(x):
    return Tensor(x, device="INTERP").realize()


def test_elementwise_float4_lanes():
    x = rng.standard_normal((64, 512)).astype(np.float32)
    (k,) = cuda_kernels(lambda: (on_interp(x) * 2 + 1).realize())
    assert "pg_vload<float, 4>" in k[1] and k[2].grid != (1, 1, 1)
    (got,) = run(k, x)
    np.testing.assert_array_equal(got.reshape(64, 512), x * np.float32(2) + np.float32(1))


def test_grouped_reductions_through_shared_memory():
    x = rng.standard_normal(16384).astype(np.float32)
    (k,) = cuda_kernels(lambda: on_interp(x).sum().realize())
    assert "__syncthreads();" in k[1] and k[2].block == (256, 1, 1)
    (got,) = run(k, x)
    np.testing.assert_allclose(got[0], x.sum(dtype=np.float64), rtol=1e-5)
    m = rng.standard_normal((4, 4096)).astype(np.float32)
    (k,) = cuda_kernels(lambda: on_interp(m).max(1).realize())
    assert "__shared__" in k[1]
    np.testing.assert_array_equal(run(k, m)[0], m.max(1))


def test_register_tile_matmul():
    """The 4x4 UPCAST matmul (a device whose shared memory holds no tile: no Opt(TILE))."""
    a = rng.standard_normal((128, 64)).astype(np.float32)
    b = rng.standard_normal((64, 192)).astype(np.float32)
    small = capabilities("sm_90", shared_memory=8 * 1024)
    (k,) = cuda_kernels(lambda: (on_interp(a) @ on_interp(b)).realize(), caps=small)
    assert [o.kind.value for o in k[0].opts].count("UPCAST") == 2
    (got,) = run(k, a, b)
    np.testing.assert_allclose(got.reshape(128, 192), a @ b, rtol=1e-5, atol=1e-5)


def test_half_and_bfloat16_conversions_match_numpy():
    words = np.arange(65536, dtype=np.uint16).view(np.float16)
    (k,) = cuda_kernels(lambda: on_interp(words).cast(dtypes.float32).realize())
    (got,) = run(k, words)
    want = words.astype(np.float32)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(got[~np.isnan(want)], want[~np.isnan(want)])
    x = np.concatenate([rng.standard_normal(4000) * 10.0 ** rng.integers(-9, 6, 4000),
                        [65504, 65519.99, 65520, 1e9, -1e9, 2.0 ** -24, 2.0 ** -25, 3 * 2.0 ** -26, 0.0, -0.0]])
    x = x.astype(np.float32)
    (k,) = cuda_kernels(lambda: (on_interp(x).cast(dtypes.float16) * 3).realize())
    (got,) = run(k, x)
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(got, x.astype(np.float16) * np.float16(3))
    (k,) = cuda_kernels(lambda: on_interp(x).cast(dtypes.bfloat16).realize())
    (got,) = run(k, x)
    bits = x.view(np.uint32).astype(np.uint64)
    want = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)  # round to nearest even
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("dtype", [np.float32, np.int32])
def test_scatter_add_spreads_over_the_grid_with_atomics(dtype):
    base = (rng.standard_normal((50, 8)) * 10).astype(dtype)
    idx = rng.integers(0, 50, (300, 8)).astype(np.int32)  # about 6 points fold into each element
    src = (rng.standard_normal((300, 8)) * 10).astype(dtype)
    kernels = cuda_kernels(lambda: on_interp(base).scatter_add(0, on_interp(idx), on_interp(src)).realize())
    (k,) = [k for k in kernels if "atomicAdd" in k[1]]
    assert k[2].threads >= 32 and k[2].grid != (1, 1, 1)
    (got,) = run(k, idx, src, out=base)
    want = base.astype(np.float64)
    np.add.at(want, (idx, np.arange(8)[None, :].repeat(300, 0)), src)
    if dtype is np.int32:
        np.testing.assert_array_equal(got.reshape(50, 8), want.astype(np.int32))
    else:
        np.testing.assert_allclose(got.reshape(50, 8), want, rtol=1e-5, atol=1e-4)


def test_scatter_multiply_and_max_stay_one_thread():
    base, idx = rng.standard_normal((10, 4)).astype(np.float32), rng.integers(0, 10, (30, 4)).astype(np.int32)
    src = rng.standard_normal((30, 4)).astype(np.float32)
    for reduce in ("prod", "amax"):
        kernels = cuda_kernels(lambda: on_interp(base).scatter_reduce(0, on_interp(idx), on_interp(src),
                                                                      reduce).realize())
        folding = [k for k in kernels if any(n.arg is not None for n in k[0].ast.toposort() if n.op.name == "STORE")]
        assert folding and all(k[2].threads == 1 and k[2].grid == (1, 1, 1) for k in folding)
        assert not any("atomic" in k[1] for k in folding)


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("depth", [96, 48, 16])
def test_tensor_core_kernels_with_emulated_mma(arch, depth):
    """tensor_core.py's fragment packing against NumPy (cpu_check emulates mma.sync from the PTX layouts),
    fragments read from shared tiles filled by cp.async, 32 deep (k = 96: three tiles, the pipeline
    full) or 16 deep (k = 48), or one tile (k = 16: fewer tiles than stages), with A or B read through
    a transpose's strides (copied element by element)."""
    a16 = rng.standard_normal((64, depth)).astype(np.float16)
    b16 = rng.standard_normal((depth, 48)).astype(np.float16)
    want = a16.astype(np.float64) @ b16.astype(np.float64)
    ta, tb = on_interp(a16), on_interp(b16)
    ta_t, tb_t = on_interp(np.ascontiguousarray(a16.T)), on_interp(np.ascontiguousarray(b16.T))
    cases = [(lambda: (ta @ tb).cast(dtypes.float32).realize(), a16, b16),
             (lambda: (ta_t.T @ tb).realize(), a16.T, b16),  # A read through its transpose's strides
             (lambda: (ta @ tb_t.T).realize(), a16, b16.T),  # B too: x @ W.T, as nn.Linear reads its weight
             (lambda: (ta.reshape(2, 32, depth) @ tb).cast(dtypes.float32).realize(), a16, b16)]  # a batch range
    for fn, a_in, b_in in cases:
        (k,) = cuda_kernels(fn, arch)
        assert "mma.sync" in k[1] and k[2].block[0] % 32 == 0
        assert "cp.async.cg.shared.global" in k[1]
        (got,) = run(k, np.ascontiguousarray(a_in), np.ascontiguousarray(b_in))
        np.testing.assert_allclose(got.astype(np.float64).reshape(64, 48), want, rtol=1e-2, atol=2e-2)


def test_staged_tensor_cores_copy_contiguous_chunks_with_cp_async(monkeypatch):
    """The 16-byte cp.async path is the one taken for row-major operands (the emulated copy counts)."""
    counting = cpu_check.CP_ASYNC_CPP.replace("{ memcpy(dst, src, 16); }",
                                              "{ __atomic_add_fetch(&pg_copies, 1, __ATOMIC_RELAXED); "
                                              "memcpy(dst, src, 16); }")
    counting = "int pg_copies = 0;\nextern \"C\" int pg_copy_count() { return pg_copies; }\n" + counting
    monkeypatch.setattr(cpu_check, "CP_ASYNC_CPP", counting)
    a16 = rng.standard_normal((64, 96)).astype(np.float16)
    b16 = rng.standard_normal((96, 48)).astype(np.float16)
    ta, tb = on_interp(a16), on_interp(b16)
    (k,) = cuda_kernels(lambda: (ta @ tb).realize(), "sm_80")
    (got,) = run(k, a16, b16)
    np.testing.assert_allclose(got.astype(np.float64).reshape(64, 48), a16.astype(np.float64) @ b16, rtol=1e-2,
                               atol=2e-2)
    # each block copies its rows of A and its columns of B, all 96 deep, in 8-half chunks: A once per
    # column of blocks, B once per row of blocks
    grid_x, grid_y = k[2].grid[0], k[2].grid[1]
    assert cpu_check.compile_cpu(k[0], k[1]).pg_copy_count() == grid_x * 64 * 96 // 8 + grid_y * 96 * 48 // 8


def test_check_catches_a_wrong_launch():
    x = rng.standard_normal((64, 512)).astype(np.float32)
    ((spec, src, launch),) = cuda_kernels(lambda: (on_interp(x) * 2).realize())
    half = type(launch)((max(1, launch.grid[0] // 2), *launch.grid[1:]), launch.block, launch.axes)
    if half.grid == launch.grid:
        half = type(launch)(launch.grid, (launch.block[0] // 2, *launch.block[1:]), launch.axes)
    (got,) = run((spec, src, half), x)
    assert np.isnan(got).any()  # the points of the missing blocks were never written


def test_barrier_that_not_every_thread_reaches_is_an_error(monkeypatch):
    monkeypatch.setattr(cpu_check, "BARRIER_TIMEOUT_S", 1)
    x = rng.standard_normal(16384).astype(np.float32)
    ((spec, src, launch),) = cuda_kernels(lambda: on_interp(x).sum().realize())
    line = "const int lidx_x = threadIdx.x;"
    broken = src.replace(line, line + "\n  if (lidx_x == 3) return;")
    assert broken != src
    with pytest.raises(cpu_check.CheckError, match="__syncthreads"):
        run((spec, broken, launch), x)
