"""TF32 (opt-in: POLY_ALLOW_TF32=1) and bfloat16 tensor cores of the CUDA backend, checked without a GPU:
rendered for sm_80 / sm_90, run by cpu_check (mma.sync and cvt.rna.tf32 emulated) against NumPy models,
compiled by NVRTC; the default stays exact fp32 and the program cache keys on the setting.
"""
from __future__ import annotations

import numpy as np
import pytest

from polygrad import Context, Tensor, dtypes
from polygrad.codegen.lower import lower
from polygrad.codegen.opts import OptKind
from polygrad.engine import programs

cuda = pytest.importorskip("polygrad_backend_cuda")
from polygrad_backend_cuda import capabilities  # noqa: E402
from test_cuda_cpu_check import cuda_kernels, on_interp, run  # noqa: E402
from test_cuda_cpu_check import pytestmark as needs_cxx  # noqa: E402

rng = np.random.default_rng(35)


def tf32_model(x: np.ndarray) -> np.ndarray:
    """cvt.rna.tf32.f32 in NumPy, from frexp rather than bits: 11 significant bits (1 + 10), to nearest,
    ties away from zero (normal numbers)."""
    m, e = np.frexp(np.abs(x.astype(np.float64)))  # |x| = m * 2**e, 0.5 <= m < 1
    return (np.sign(x) * np.floor(m * 2.0**11 + 0.5) * 2.0 ** (e - 11)).astype(np.float64)


def _ties(shape: tuple[int, int]) -> np.ndarray:
    """Random float32 values, a quarter of them exactly halfway between two TF32 values (where ties
    away from zero and ties to even differ), of both signs."""
    x = rng.standard_normal(shape).astype(np.float32)
    bits = x.view(np.uint32)
    tie = rng.random(shape) < 0.25
    bits[tie] = (bits[tie] & 0xffffe000) | 0x1000  # the dropped 13 bits exactly one half
    return x


@needs_cxx
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_tf32_rounding_is_round_to_nearest_ties_away(arch):
    """A @ I and I @ B give the TF32-rounded operand itself (products by 1 and sums with 0 are exact):
    the emulated cvt.rna and the fragment layouts against the NumPy model, bit for bit."""
    x = _ties((32, 16))
    eye = np.eye(16, dtype=np.float32)
    with Context(POLY_ALLOW_TF32=1):
        for fn, a_in, b_in, want in [
                (lambda: (on_interp(x) @ on_interp(eye)).realize(), x, eye, tf32_model(x)),
                (lambda: (on_interp(eye[:, :16]) @ on_interp(x[:16])).realize(), eye, x[:16], tf32_model(x[:16]))]:
            (k,) = cuda_kernels(fn, arch)
            assert "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32" in k[1] and "cvt.rna.tf32.f32" in k[1]
            (got,) = run(k, a_in, b_in)
            np.testing.assert_array_equal(got.reshape(want.shape).astype(np.float64), want)
    assert (tf32_model(x) != x).any() and (tf32_model(x) != x.astype(np.float64)).mean() > 0.2


@needs_cxx
@pytest.mark.parametrize("depth", [48, 8])
def test_tf32_matmul_against_numpy_model(depth):
    """k = 48 (three 16-deep tiles) and k = 8 (one), plain and with B transposed (x @ W.T), batched: the
    sum of TF32 products in float32, against NumPy's float64 product of the rounded operands; the exact
    fp32 product is further away than that (the rounding happened)."""
    a = rng.standard_normal((64, depth)).astype(np.float32)
    b = rng.standard_normal((depth, 32)).astype(np.float32)
    want = tf32_model(a) @ tf32_model(b)
    exact = a.astype(np.float64) @ b.astype(np.float64)
    ta, tb, tb_t = on_interp(a), on_interp(b), on_interp(np.ascontiguousarray(b.T))
    cases = [(lambda: (ta @ tb).realize(), b), (lambda: (ta @ tb_t.T).realize(), b.T),
             (lambda: (ta.reshape(2, 32, depth) @ tb).realize(), b)]
    with Context(POLY_ALLOW_TF32=1):
        for fn, b_in in cases:
            (k,) = cuda_kernels(fn, "sm_80")
            assert any(o.kind is OptKind.TC and o.amount == 8 for o in k[0].opts)
            (got,) = run(k, a, np.ascontiguousarray(b_in))
            got = got.astype(np.float64).reshape(64, 32)
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
            assert np.abs(got - exact).max() > 10 * np.abs(got - want).max()


def test_fp32_matmuls_stay_exact_unless_opted_in():
    """Default (and POLY_ALLOW_TF32=0): the fp32 matmul keeps its shared-memory tiles, no tensor core,
    the same source as before; sm_75 never uses TF32 (no mma_tf32), even when opted in, nor does a
    matmul with an epilogue (bias, relu: the TC template stores the sum as it is)."""
    a = on_interp(rng.standard_normal((64, 32)).astype(np.float32))
    b = on_interp(rng.standard_normal((32, 64)).astype(np.float32))
    (off,) = cuda_kernels(lambda: (a @ b).realize(), "sm_90")
    with Context(POLY_ALLOW_TF32=0):
        (zero,) = cuda_kernels(lambda: (a @ b).realize(), "sm_90")
    assert [o.kind for o in off[0].opts] == [OptKind.TILE] and "mma" not in off[1] and "tf32" not in off[1]
    assert zero[1] == off[1]
    with Context(POLY_ALLOW_TF32=1):
        (on,) = cuda_kernels(lambda: (a @ b).realize(), "sm_90")
        (old,) = cuda_kernels(lambda: (a @ b).realize(), "sm_75")
        (fused,) = cuda_kernels(lambda: (a @ b + 1).relu().realize(), "sm_90")
    assert [o.kind for o in fused[0].opts] == [OptKind.TILE] and "tf32" not in fused[1]
    assert "tf32" in on[1] and old[1] == cuda_kernels(lambda: (a @ b).realize(), "sm_75")[0][1]
    assert "mma" not in old[1]


def test_program_cache_keys_on_tf32(monkeypatch):
    """Flipping POLY_ALLOW_TF32 lowers the kernel again (never the other setting's program); flipping
    back reuses the first program."""
    lowered = []
    real = programs.lower_and_render
    monkeypatch.setattr(programs, "lower_and_render",
                        lambda ast, dev, impl: lowered.append(ast) or real(ast, dev, impl))
    x = rng.standard_normal((16, 16)).astype(np.float32)
    a, b = Tensor(x, device="INTERP").realize(), Tensor(x.T.copy(), device="INTERP").realize()
    ((a @ b) + 0.25).numpy()
    first = len(lowered)
    with Context(POLY_ALLOW_TF32=1):
        ((a @ b) + 0.25).numpy()
        assert len(lowered) > first
    second = len(lowered)
    np.testing.assert_allclose(((a @ b) + 0.25).numpy(), x @ x.T + 0.25, rtol=1e-5, atol=1e-5)
    assert len(lowered) == second


@needs_cxx
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_bfloat16_tensor_cores(arch):
    """bfloat16 matmuls (k = 96, 48; plain, B transposed, batched) on m16n8k16 .bf16: products of
    bfloat16 are exact in float32 and the sum is rounded to bfloat16 once (the matmul's output dtype),
    so nearly every element is NumPy's float64 product of the same bfloat16 values, rounded to
    bfloat16 (the rest one bfloat16 step off, where float32 summation crosses a rounding boundary)."""
    for depth in (96, 48):
        a = rng.standard_normal((64, depth)).astype(np.float32)
        b = rng.standard_normal((depth, 32)).astype(np.float32)
        ta = on_interp(a).cast(dtypes.bfloat16).realize()
        tb = on_interp(b).cast(dtypes.bfloat16).realize()
        tb_t = on_interp(np.ascontiguousarray(b.T)).cast(dtypes.bfloat16).realize()
        a16, b16 = ta.numpy().astype(np.float64), tb.numpy().astype(np.float64)
        words = lambda t: np.ascontiguousarray(t.bitcast(dtypes.uint16).numpy())  # noqa: E731
        want = bf16_round(a16 @ b16)
        cases = [lambda: (ta @ tb).cast(dtypes.float32).realize(), lambda: (ta @ tb).realize(),
                 lambda: (ta.reshape(2, 32, depth) @ tb).realize()]
        for fn in cases:
            (k,) = cuda_kernels(fn, arch)
            assert "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32" in k[1]
            (got,) = run(k, words(ta), words(tb))
            if got.dtype == np.uint16:
                got = (got.astype(np.uint32) << 16).view(np.float32)
            got = got.astype(np.float64).reshape(64, 32)
            np.testing.assert_allclose(got, want, rtol=8e-3, atol=1e-2)
            assert (got == want).mean() > 0.95
        (k,) = cuda_kernels(lambda: (ta @ tb_t.T).realize(), arch)  # B through a transpose's strides
        (got,) = run(k, words(ta), words(tb_t))
        got = (got.astype(np.uint32) << 16).view(np.float32).astype(np.float64).reshape(64, 32)
        assert "bf16.bf16" in k[1] and (got == want).mean() > 0.95


def bf16_round(x: np.ndarray) -> np.ndarray:
    """float64 -> the nearest bfloat16 (ties to even), as float64; through float32 (the values here are
    far from float32 ties)."""
    bits = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7fff + ((bits >> 16) & 1)) >> 16 << 16).astype(np.uint32)
    return rounded.view(np.float32).astype(np.float64)


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_tf32_and_bfloat16_kernels_compile_with_nvrtc(arch):
    """The TF32 (plain, transposed B, 8 deep) and bfloat16 tensor-core kernels compile for sm_80 and sm_90."""
    from test_cuda_compile import _compiler

    from polygrad_backend_cuda.compile_check import compile_all
    from polygrad_backend_cuda.renderer import CUDARenderer
    compile_fn = _compiler()
    a = on_interp(rng.standard_normal((64, 48)).astype(np.float32))
    b = on_interp(rng.standard_normal((48, 32)).astype(np.float32))
    asts = []
    orig = programs.get_program
    programs.get_program = lambda ast, device: asts.append(ast) or orig(ast, device)
    try:
        with Context(POLY_ALLOW_TF32=1):
            (a @ b).realize()
            (a[:, :8] @ b.T.contiguous().T[:8]).realize()
            ab, bb = a.cast(dtypes.bfloat16).realize(), b.cast(dtypes.bfloat16).realize()
            (ab @ bb).realize()
            (ab @ bb.T.contiguous().T).cast(dtypes.float32).realize()
    finally:
        programs.get_program = orig
    with Context(POLY_ALLOW_TF32=1):
        specs = [lower(ast, capabilities(arch)) for ast in asts]
    sources = [CUDARenderer(arch).render(s) for s in specs if any(o.kind is OptKind.TC for o in s.opts)]
    assert sum("tf32.tf32" in s for s in sources) == 2 and sum("bf16.bf16" in s for s in sources) == 2
    compile_all(sources, arch, compile_fn)
