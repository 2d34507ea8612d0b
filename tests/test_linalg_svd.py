"""Tensor.svd (polygrad/linalg_svd.py, issue 28 item 15): values against NumPy, gradients against PyTorch.

Singular vectors are unique up to sign (and rotations within repeated singular values), so U and V are
compared column by column up to sign where the singular values are distinct, and otherwise through
U diag(S) Vh = A and orthonormality. Few shapes on purpose: every shape compiles its own kernels.
"""
from __future__ import annotations

import numpy as np
import pytest

from polygrad import Tensor, dtypes
from polygrad.errors import LinAlgError

torch = pytest.importorskip("torch")

from conftest import DEVICES  # noqa: E402  (every usable backend: CPU, INTERP, X86, ...)
RNG = np.random.default_rng(28)
TOL = {"float32": 1e-5, "float64": 1e-12}
GRID = [(d, shape) for d in DEVICES for shape in ((4, 3), (3, 5), (2, 3, 4), (6, 6))
        if d == "INTERP" or shape in ((4, 3), (2, 3, 4))]


def _check(a: np.ndarray, u: np.ndarray, s: np.ndarray, vh: np.ndarray, full: bool, tol: float) -> None:
    """Shapes as torch.linalg.svd, S as NumPy's, U diag(S) Vh = A, orthonormal U and Vh."""
    m, n = a.shape[-2:]
    k = min(m, n)
    assert u.shape == a.shape[:-2] + ((m, m) if full else (m, k))
    assert s.shape == a.shape[:-2] + (k,) and vh.shape == a.shape[:-2] + ((n, n) if full else (k, n))
    scale = max(np.abs(a).max(), 1.0)
    np.testing.assert_allclose(s, np.linalg.svd(a.astype(np.float64), compute_uv=False), rtol=tol, atol=tol * scale)
    assert np.all(np.diff(s, axis=-1) <= 0)
    np.testing.assert_allclose((u[..., :, :k] * s[..., None, :]) @ vh[..., :k, :], a, atol=10 * tol * scale)
    for q in (np.swapaxes(u, -1, -2) @ u, vh @ np.swapaxes(vh, -1, -2)):
        np.testing.assert_allclose(q, np.broadcast_to(np.eye(q.shape[-1]), q.shape), atol=10 * tol)


@pytest.mark.parametrize("device,shape", GRID)
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_svd_matches_numpy(device: str, shape: tuple, dtype: str) -> None:
    a = RNG.standard_normal(shape).astype(dtype)
    nu, _, nvh = np.linalg.svd(a.astype(np.float64), full_matrices=False)
    k = min(shape[-2:])
    for full in (True, False):
        u, s, vh = (t.numpy() for t in Tensor(a, device=device).svd(full_matrices=full))
        assert u.dtype == s.dtype == vh.dtype == np.dtype(dtype)
        _check(a, u, s, vh, full, TOL[dtype])
        # distinct singular values: each singular vector is NumPy's up to its sign
        cos_u = np.abs((u[..., :, :k] * nu).sum(-2))
        cos_v = np.abs((vh[..., :k, :] * nvh).sum(-1))
        np.testing.assert_allclose(cos_u, 1.0, atol=100 * TOL[dtype])
        np.testing.assert_allclose(cos_v, 1.0, atol=100 * TOL[dtype])


@pytest.mark.parametrize("name", ["rank_2", "zeros", "identity", "scalar", "column", "row", "ill_conditioned"])
def test_svd_special_matrices(name: str) -> None:
    """Zero and repeated singular values: U is completed to an orthonormal basis; A is reconstructed."""
    u0, _ = np.linalg.qr(RNG.standard_normal((5, 5)))
    a = {"rank_2": RNG.standard_normal((5, 2)) @ RNG.standard_normal((2, 4)), "zeros": np.zeros((3, 2)),
         "identity": np.eye(3), "scalar": np.array([[-2.5]]), "column": RNG.standard_normal((3, 1)),
         "row": RNG.standard_normal((1, 4)), "ill_conditioned": (u0 * np.logspace(0, -12, 5)) @ u0.T}[name]
    for full in (True, False):
        u, s, vh = (t.numpy() for t in Tensor(a).svd(full_matrices=full))
        _check(a, u, s, vh, full, TOL["float64"])


def _losses(u, s, vh, w, k):
    """Gauge-invariant functions of the factors (their gradients do not depend on the signs chosen)."""
    ar = (torch.arange if isinstance(s, torch.Tensor) else Tensor.arange)(1, s.shape[-1] + 1)
    return {"values": (s * ar).sum(),
            "reconstruction": (((u[..., :, :k] * s.unsqueeze(-2)) @ vh[..., :k, :]) * w).sum(),
            "left_projector": (u[..., :, :2] @ u[..., :, :2].transpose(-1, -2)).sum(-1).square().sum(),
            "right_projector": (vh[..., :2, :].transpose(-1, -2) @ vh[..., :2, :]).sum(-1).square().sum()}


@pytest.mark.parametrize("shape", [(5, 3), (3, 5), (2, 4, 4)])
def test_svd_gradients_match_torch(shape: tuple) -> None:
    a, w = RNG.standard_normal(shape), RNG.standard_normal(shape)
    k = min(shape[-2:])
    for full in (False, True):
        ta = torch.tensor(a, requires_grad=True)
        want = _losses(*torch.linalg.svd(ta, full_matrices=full), torch.tensor(w), k)
        x = Tensor(a, requires_grad=True)
        got = _losses(*x.svd(full_matrices=full), Tensor(w), k)
        for name, loss in got.items():
            grad, = loss.gradient(x)
            ref, = torch.autograd.grad(want[name], ta, retain_graph=True)
            np.testing.assert_allclose(loss.item(), want[name].item(), rtol=1e-10)
            np.testing.assert_allclose(grad.numpy(), ref.numpy(), rtol=1e-8, atol=1e-10, err_msg=f"{name} {full}")


def test_svd_gradient_stays_finite_at_repeated_singular_values() -> None:
    """The identity has one singular value three times: the value gradient is torch's; the U/V terms
    that torch makes inf or NaN are left out, so the values (and the gradient) stay finite."""
    x = Tensor(np.eye(3), requires_grad=True)
    u, s, vh = x.svd()
    assert np.isfinite(u.numpy()).all() and s.tolist() == [1.0, 1.0, 1.0]
    grad, = s.sum().gradient(x)
    ta = torch.eye(3, dtype=torch.float64, requires_grad=True)
    torch.linalg.svdvals(ta).sum().backward()
    np.testing.assert_allclose(grad.numpy(), ta.grad.numpy(), atol=1e-12)
    grad, = (u.sum() + vh.sum()).gradient(x)
    assert np.isfinite(grad.numpy()).all()


def test_svd_errors_and_dtypes() -> None:
    with pytest.raises(LinAlgError, match="matrix"):
        Tensor([1.0, 2.0]).svd()
    with pytest.raises(RuntimeError):
        torch.linalg.svd(torch.tensor([1.0, 2.0]))
    with pytest.raises(LinAlgError, match="inf or NaN"):
        Tensor([[1.0, float("nan")], [0.0, 1.0]]).svd()
    with pytest.raises(LinAlgError, match="non-empty"):
        Tensor.ones(0, 3).svd()
    u, s, vh = Tensor([[3, 0], [0, -2]]).svd()  # integers are factored as float32
    assert s.dtype is dtypes.float32 and s.tolist() == [3.0, 2.0]
    np.testing.assert_allclose((u * s.unsqueeze(-2) @ vh).numpy(), [[3, 0], [0, -2]], atol=1e-6)
