"""Forward values of polygrad.linalg against NumPy and PyTorch, on CPU and INTERP.

Sizes are few on purpose (every new shape compiles kernels): 1, 3 and 37 (several panels plus the
identity padding), a batch, and 256 once. Accuracy is checked with relative residuals, which do not
depend on the conditioning, and with forward errors scaled by the condition number.
"""
from __future__ import annotations

import numpy as np
import pytest

from polygrad import Tensor
from polygrad.errors import LinAlgError

torch = pytest.importorskip("torch")

from conftest import DEVICES  # noqa: E402  (every usable backend: CPU, INTERP, X86, ...)
DTYPES = ["float32", "float64"]
# every (shape, dtype) compiles a few dozen kernels on CPU (~0.3 s each with a cold cache), so CPU
# runs a subset of the size x dtype grid; INTERP (no compiler) runs all of it
GRID = [(d, dt, n) for d in DEVICES for dt in DTYPES for n in (1, 3, 37)
        if d == "INTERP" or (dt, n) in {("float32", 1), ("float32", 3), ("float64", 37)}]
EPS = {"float32": np.finfo(np.float32).eps, "float64": np.finfo(np.float64).eps}
RNG = np.random.default_rng(7)


def _random(shape, dtype):
    return RNG.standard_normal(shape).astype(dtype)


def _ill_conditioned(n, cond, dtype):
    """A matrix with singular values spread from 1 to 1/cond."""
    u, _ = np.linalg.qr(RNG.standard_normal((n, n)))
    v, _ = np.linalg.qr(RNG.standard_normal((n, n)))
    return ((u * np.logspace(0, -np.log10(cond), n)) @ v.T).astype(dtype)


def _spd(shape, dtype):
    a = RNG.standard_normal(shape)
    n = shape[-1]
    return (a @ np.swapaxes(a, -1, -2) + n * np.eye(n)).astype(dtype)


def _residual(a, x, b):
    """max over the batch of ||A x - b|| / (||A|| ||x|| + ||b||), in float64."""
    a, x, b = (np.asarray(t, dtype=np.float64) for t in (a, x, b))
    if x.ndim == a.ndim - 1:
        x, b = x[..., None], b[..., None]
    r = np.linalg.norm(a @ x - b, axis=(-2, -1))
    scale = np.linalg.norm(a, axis=(-2, -1)) * np.linalg.norm(x, axis=(-2, -1)) + np.linalg.norm(b, axis=(-2, -1))
    return float(np.max(r / scale))


# --------------------------------------------------------------------------------------------------
# solve


@pytest.mark.parametrize("device,dtype,n", GRID)
def test_solve_matches_numpy(device, dtype, n):
    a, b = _random((2, n, n), dtype), _random((2, n, 1), dtype)
    x = Tensor(a, device=device).solve(Tensor(b, device=device))
    assert x.shape == (2, n, 1) and x.dtype.np == np.dtype(dtype)
    out = x.numpy()
    ref = np.linalg.solve(a.astype(np.float64), b.astype(np.float64))
    cond = np.linalg.cond(a.astype(np.float64)).max()
    assert _residual(a, out, b) < 20 * EPS[dtype]
    assert np.abs(out - ref).max() <= 50 * cond * EPS[dtype] * max(1.0, np.abs(ref).max())


@pytest.mark.parametrize("device", DEVICES)
def test_solve_vector_and_broadcast_batches_like_torch(device):
    a, b = _random((3, 4, 4), "float64"), _random((3, 4), "float64")
    x = Tensor(a, device=device).solve(Tensor(b, device=device))
    ref = torch.linalg.solve(torch.tensor(a), torch.tensor(b)).numpy()
    assert x.shape == (3, 4)
    np.testing.assert_allclose(x.numpy(), ref, rtol=1e-10, atol=1e-10)
    single, many = _random((4, 4), "float64"), _random((5, 4, 2), "float64")
    x = Tensor(single, device=device).solve(Tensor(many, device=device))
    np.testing.assert_allclose(x.numpy(), np.linalg.solve(single, many), rtol=1e-10, atol=1e-10)
    vec = _random(4, "float64")
    np.testing.assert_allclose(Tensor(single, device=device).solve(vec.tolist()).numpy(),
                               np.linalg.solve(single, vec.astype(np.float32)), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype,cond", [("float32", 1e3), ("float64", 1e8)])
def test_solve_ill_conditioned_is_backward_stable(device, dtype, cond):
    a, b = _ill_conditioned(12, cond, dtype), _random((12, 1), dtype)
    out = Tensor(a, device=device).solve(Tensor(b, device=device)).numpy()
    ref = np.linalg.solve(a.astype(np.float64), b.astype(np.float64))
    assert _residual(a, out, b) < 20 * EPS[dtype]
    assert np.abs(out - ref).max() / np.abs(ref).max() < 50 * cond * EPS[dtype]


def test_solve_needs_pivoting():
    a = np.array([[0.0, 1.0], [1.0, 1.0]])
    np.testing.assert_allclose(Tensor(a).solve(Tensor([2.0, 3.0])).numpy(), [1.0, 2.0], atol=1e-12)
    tiny = np.array([[1e-20, 1.0], [1.0, 1.0]])
    np.testing.assert_allclose(Tensor(tiny).solve(Tensor([1.0, 2.0])).numpy(), np.linalg.solve(tiny, [1.0, 2.0]))


def test_solve_256_float64_cpu():
    a, b = _random((256, 256), "float64"), _random(256, "float64")
    out = Tensor(a, device="CPU").solve(Tensor(b, device="CPU")).numpy()
    assert _residual(a, out, b) < 20 * EPS["float64"]
    np.testing.assert_allclose(out, np.linalg.solve(a, b), rtol=1e-8, atol=1e-9)


@pytest.mark.parametrize("device", DEVICES)
def test_solve_errors(device):
    with pytest.raises(LinAlgError, match="square"):
        Tensor(_random((3, 4), "float32"), device=device).solve(Tensor(_random(3, "float32"), device=device))
    with pytest.raises(LinAlgError, match="singular"):
        Tensor([[1.0, 2.0], [2.0, 4.0]], device=device).solve(Tensor([1.0, 1.0], device=device))
    with pytest.raises(LinAlgError, match="rows"):
        Tensor(_random((3, 3), "float32"), device=device).solve(Tensor(_random(4, "float32"), device=device))
    with pytest.raises(ValueError):  # LinAlgError is a ValueError
        Tensor([[0.0]], device=device).solve(Tensor([1.0], device=device))


# --------------------------------------------------------------------------------------------------
# inv, det, slogdet


@pytest.mark.parametrize("device,dtype,n", GRID)
def test_inv_det_slogdet_match_numpy(device, dtype, n):
    a = _random((2, n, n), dtype)
    a64 = a.astype(np.float64)
    t = Tensor(a, device=device)
    tol = 100 * EPS[dtype] * np.linalg.cond(a64).max()
    z = t.inv().numpy()
    np.testing.assert_allclose(z, np.linalg.inv(a64), rtol=tol, atol=tol * np.abs(np.linalg.inv(a64)).max())
    assert np.abs(a64 @ z - np.eye(n)).max() < tol
    np.testing.assert_allclose(t.det().numpy(), np.linalg.det(a64), rtol=tol)
    sign, logabs = t.slogdet()
    ref_sign, ref_log = np.linalg.slogdet(a64)
    np.testing.assert_array_equal(sign.numpy(), ref_sign)
    np.testing.assert_allclose(logabs.numpy(), ref_log, atol=tol)


@pytest.mark.parametrize("device", DEVICES)
def test_det_of_permutations_and_singular(device):
    perm = np.eye(4)[[2, 0, 3, 1]]  # a 3-cycle times ... sign from numpy
    assert Tensor(perm, device=device).det().item() == pytest.approx(np.linalg.det(perm))
    singular = np.array([[1.0, 2.0], [2.0, 4.0]])
    assert Tensor(singular, device=device).det().item() == 0.0
    sign, logabs = Tensor(singular, device=device).slogdet()
    assert sign.item() == 0.0 and logabs.item() == float("-inf")
    with pytest.raises(LinAlgError, match="singular"):
        Tensor(singular, device=device).inv()
    with pytest.raises(LinAlgError, match="square"):
        Tensor(_random((2, 3), "float64"), device=device).det()


# --------------------------------------------------------------------------------------------------
# triangular systems


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("upper", [True, False])
@pytest.mark.parametrize("left", [True, False])
@pytest.mark.parametrize("unitriangular", [True, False])
def test_solve_triangular_matches_torch(device, upper, left, unitriangular):
    a = _random((2, 5, 5), "float64") + 4 * np.eye(5)
    b = _random((2, 5, 3) if left else (2, 3, 5), "float64")
    out = Tensor(a, device=device).solve_triangular(Tensor(b, device=device), upper=upper, left=left,
                                                    unitriangular=unitriangular)
    ref = torch.linalg.solve_triangular(torch.tensor(a), torch.tensor(b), upper=upper, left=left,
                                        unitriangular=unitriangular)
    np.testing.assert_allclose(out.numpy(), ref.numpy(), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("transpose", [True, False])
def test_triangular_solve_matches_torch(device, transpose):
    a, b = _random((4, 4), "float32") + 3 * np.eye(4, dtype=np.float32), _random((4, 2), "float32")
    x, coeff = Tensor(b, device=device).triangular_solve(Tensor(a, device=device), upper=False, transpose=transpose)
    ref, ref_coeff = torch.triangular_solve(torch.tensor(b), torch.tensor(a), upper=False, transpose=transpose)
    np.testing.assert_allclose(x.numpy(), ref.numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(coeff.numpy(), ref_coeff.numpy())


def test_solve_triangular_zero_diagonal_raises():
    with pytest.raises(LinAlgError, match="singular"):
        Tensor([[1.0, 0.0], [5.0, 0.0]]).solve_triangular(Tensor([[1.0], [1.0]]), upper=False)


# --------------------------------------------------------------------------------------------------
# cholesky, cholesky_solve


@pytest.mark.parametrize("device,dtype,n", GRID)
def test_cholesky_matches_numpy(device, dtype, n):
    a = _spd((2, n, n), dtype)
    low = Tensor(a, device=device).cholesky().numpy()
    ref = np.linalg.cholesky(a.astype(np.float64))
    np.testing.assert_allclose(low, ref, rtol=200 * EPS[dtype], atol=200 * EPS[dtype] * np.abs(ref).max())
    up = Tensor(a, device=device).cholesky(upper=True).numpy()
    np.testing.assert_allclose(up, np.swapaxes(low, -1, -2), rtol=1e-6)


@pytest.mark.parametrize("device", DEVICES)
def test_cholesky_reads_lower_triangle_and_rejects_non_pd(device):
    a = _spd((4, 4), "float64")
    junk = a + np.triu(np.full((4, 4), 9.0), 1)
    np.testing.assert_allclose(Tensor(junk, device=device).cholesky().numpy(),
                               torch.linalg.cholesky(torch.tensor(junk)).numpy(), rtol=1e-12)
    with pytest.raises(LinAlgError, match="positive definite"):
        Tensor([[1.0, 2.0], [2.0, 1.0]], device=device).cholesky()
    with pytest.raises(LinAlgError, match="positive definite"):
        Tensor([[-1.0]], device=device).cholesky()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("upper", [True, False])
def test_cholesky_solve_matches_torch(device, upper):
    a, b = torch.tensor(_spd((2, 5, 5), "float64")), torch.tensor(_random((2, 5, 3), "float64"))
    factor = torch.linalg.cholesky(a, upper=upper)
    ref = torch.cholesky_solve(b, factor, upper=upper)
    out = Tensor(b.numpy(), device=device).cholesky_solve(Tensor(factor.numpy(), device=device), upper=upper)
    np.testing.assert_allclose(out.numpy(), ref.numpy(), rtol=1e-10, atol=1e-10)


# --------------------------------------------------------------------------------------------------
# qr, lstsq


@pytest.mark.parametrize("device,dtype,shape", [
    (d, dt, s) for d in DEVICES for dt in DTYPES for s in [(1, 1), (6, 4), (2, 37, 37), (3, 5)]
    if d == "INTERP" or (dt, s) in {("float32", (6, 4)), ("float64", (3, 5))}])
def test_qr_reduced(device, dtype, shape):
    a = _random(shape, dtype)
    q, r = Tensor(a, device=device).qr()
    k = min(shape[-2:])
    assert q.shape == shape[:-1] + (k,) and r.shape == shape[:-2] + (k, shape[-1])
    q, r = q.numpy().astype(np.float64), r.numpy().astype(np.float64)
    tol = 50 * EPS[dtype] * max(shape)
    assert np.abs(q @ r - a).max() < tol * np.abs(a).max()
    assert np.abs(np.swapaxes(q, -1, -2) @ q - np.eye(k)).max() < tol
    assert np.abs(np.tril(r, -1)).max() == 0.0
    _, ref_r = np.linalg.qr(a.astype(np.float64))
    np.testing.assert_allclose(np.abs(r), np.abs(ref_r), atol=tol * np.abs(ref_r).max())


def test_qr_ill_conditioned_stays_orthogonal():
    a = _ill_conditioned(10, 1e12, "float64")[:, :8]
    q, r = Tensor(a).qr()
    q = q.numpy()
    assert np.abs(q.T @ q - np.eye(8)).max() < 1e-12
    assert np.abs(q @ r.numpy() - a).max() < 1e-13


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_lstsq_matches_numpy(device, dtype):
    a, b = _random((2, 9, 4), dtype), _random((2, 9, 2), dtype)
    out = Tensor(a, device=device).lstsq(Tensor(b, device=device)).numpy()
    ref = np.stack([np.linalg.lstsq(a[i].astype(np.float64), b[i].astype(np.float64), rcond=None)[0] for i in range(2)])
    np.testing.assert_allclose(out, ref, rtol=500 * EPS[dtype], atol=500 * EPS[dtype])
    vec = _random(9, dtype)
    out = Tensor(a[0], device=device).lstsq(Tensor(vec, device=device)).numpy()
    ref = np.linalg.lstsq(a[0].astype(np.float64), vec.astype(np.float64), rcond=None)[0]
    np.testing.assert_allclose(out, ref, rtol=500 * EPS[dtype], atol=500 * EPS[dtype])


def test_lstsq_square_and_errors():
    a, b = _random((5, 5), "float64"), _random(5, "float64")
    np.testing.assert_allclose(Tensor(a).lstsq(Tensor(b)).numpy(), np.linalg.solve(a, b), rtol=1e-9, atol=1e-10)
    with pytest.raises(LinAlgError, match="tall or square"):
        Tensor(_random((3, 5), "float64")).lstsq(Tensor(_random(3, "float64")))
    with pytest.raises(LinAlgError, match="rank-deficient"):
        Tensor(np.ones((4, 2))).lstsq(Tensor(np.ones(4)))


# --------------------------------------------------------------------------------------------------
# regression: a kernel whose only load of a buffer simplifies away keeps that buffer as a parameter


def test_kernel_keeps_parameters_whose_loads_simplify_away():
    # cholesky of a 1x1 matrix compiles a step kernel in which the step index is never read after
    # simplification; lower() once dropped it from the parameter list and the launch failed
    assert Tensor([[4.0]], device="CPU").cholesky().numpy().tolist() == [[2.0]]


def test_solve_replays_under_tinyjit():
    from polygrad import TinyJit

    @TinyJit
    def solve(a, b):
        return a.solve(b).realize()

    for _ in range(4):  # run, capture, then two replays with new input data
        a, b = _random((2, 3, 3), "float32"), _random((2, 3, 1), "float32")
        out = solve(Tensor(a, device="CPU"), Tensor(b, device="CPU")).numpy()
        np.testing.assert_allclose(out, np.linalg.solve(a, b), rtol=1e-4, atol=1e-5)


def test_collect_releases_replayed_steps():
    from polygrad import linalg, runtime

    a = Tensor([[4.0, 2.0], [2.0, 5.0]], device="CPU")
    a.solve(Tensor([1.0, 3.0], device="CPU")).realize()
    assert linalg._replays
    runtime.collect()
    assert not linalg._replays
    np.testing.assert_allclose(a.solve(Tensor([1.0, 3.0], device="CPU")).numpy(), [-0.0625, 0.625], atol=1e-6)
