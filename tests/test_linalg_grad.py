"""Gradients of polygrad.linalg against PyTorch autograd, on CPU and INTERP.

Each case applies the same function in both libraries, contracts the output with fixed random
weights, calls backward() and compares the gradients of every input.
"""
from __future__ import annotations

import numpy as np
import pytest

from polygrad import Tensor

torch = pytest.importorskip("torch")

from conftest import DEVICES  # noqa: E402  (every usable backend: CPU, INTERP, X86, ...)
RNG = np.random.default_rng(3)


def _general(*shape):
    n = shape[-1]
    return RNG.standard_normal(shape) + 2 * np.eye(n)


def _spd(*shape):
    a = RNG.standard_normal(shape)
    return a @ np.swapaxes(a, -1, -2) + shape[-1] * np.eye(shape[-1])


def _tall(*shape):
    return RNG.standard_normal(shape)


def _upper(*shape):
    return np.triu(RNG.standard_normal(shape)) + 3 * np.eye(shape[-1])


def _lower(*shape):
    return np.swapaxes(_upper(*shape), -1, -2)


def _rhs(*shape):
    return RNG.standard_normal(shape)


# name -> (polygrad function, torch function, input makers with shapes)
CASES = {
    "solve_vector": (lambda a, b: a.solve(b), torch.linalg.solve, [(_general, (4, 4)), (_rhs, (4,))]),
    "solve_batched_matrix": (lambda a, b: a.solve(b), torch.linalg.solve,
                             [(_general, (2, 3, 3)), (_rhs, (2, 3, 2))]),
    "inv": (lambda a: a.inv(), torch.linalg.inv, [(_general, (2, 4, 4))]),
    "det": (lambda a: a.det(), torch.linalg.det, [(_general, (2, 3, 3))]),
    "det_negative": (lambda a: a.det(), torch.linalg.det, [(lambda *s: -_general(*s), (3, 3))]),
    "slogdet_logabs": (lambda a: a.slogdet()[1], lambda a: torch.linalg.slogdet(a)[1], [(_general, (3, 3))]),
    "cholesky": (lambda a: a.cholesky(), torch.linalg.cholesky, [(_spd, (2, 4, 4))]),
    "cholesky_upper": (lambda a: a.cholesky(upper=True), lambda a: torch.linalg.cholesky(a, upper=True),
                       [(_spd, (3, 3))]),
    "solve_triangular_upper": (lambda a, b: a.solve_triangular(b, upper=True),
                               lambda a, b: torch.linalg.solve_triangular(a, b, upper=True),
                               [(_upper, (4, 4)), (_rhs, (4, 2))]),
    "solve_triangular_lower_unit_right": (
        lambda a, b: a.solve_triangular(b, upper=False, left=False, unitriangular=True),
        lambda a, b: torch.linalg.solve_triangular(a, b, upper=False, left=False, unitriangular=True),
        [(_lower, (3, 3)), (_rhs, (2, 3))]),
    "cholesky_solve": (lambda b, f: b.cholesky_solve(f), lambda b, f: torch.cholesky_solve(b, f),
                       [(_rhs, (3, 2)), (lambda *s: np.linalg.cholesky(_spd(*s)), (3, 3))]),
    "lstsq": (lambda a, b: a.lstsq(b), lambda a, b: torch.linalg.lstsq(a, b).solution,
              [(_tall, (6, 3)), (_rhs, (6, 2))]),
}


# CPU compiles every backward graph (slow with a cold kernel cache): it runs the four PyTorch
# requires (solve, inv, det, cholesky) plus lstsq; INTERP runs every case
CPU_CASES = {"solve_vector", "solve_batched_matrix", "inv", "det", "cholesky", "lstsq"}


@pytest.mark.parametrize("device,name", [(d, n) for d in DEVICES for n in CASES if d == "INTERP" or n in CPU_CASES])
def test_gradient_matches_torch(device, name):
    ours, theirs, makers = CASES[name]
    arrays = [make(*shape) for make, shape in makers]
    pg = [Tensor(a, device=device, requires_grad=True) for a in arrays]
    th = [torch.tensor(a, requires_grad=True) for a in arrays]
    out_th = theirs(*th)
    weights = RNG.standard_normal(tuple(out_th.shape))
    (out_th * torch.tensor(weights)).sum().backward()
    out_pg = ours(*pg)
    np.testing.assert_allclose(out_pg.numpy(), out_th.detach().numpy(), rtol=1e-9, atol=1e-9)
    (out_pg * Tensor(weights, device=device)).sum().backward()
    for p, t in zip(pg, th):
        np.testing.assert_allclose(p.grad.numpy(), t.grad.numpy(), rtol=1e-7, atol=1e-9)


@pytest.mark.parametrize("device", DEVICES)
def test_solve_gradient_float32(device):
    a, b = _general(3, 3).astype(np.float32), _rhs(3).astype(np.float32)
    pa, pb = Tensor(a, device=device, requires_grad=True), Tensor(b, device=device, requires_grad=True)
    ta, tb = torch.tensor(a, requires_grad=True), torch.tensor(b, requires_grad=True)
    torch.linalg.solve(ta, tb).square().sum().backward()
    pa.solve(pb).square().sum().backward()
    np.testing.assert_allclose(pa.grad.numpy(), ta.grad.numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(pb.grad.numpy(), tb.grad.numpy(), rtol=1e-4, atol=1e-5)
