"""Tensor.erf in float32 (tensor_math.py: two fitted polynomials and one exp) against float64 erf (SciPy).

The error is measured in float32 ulps of the float64 value over a dense grid of the whole line that matters
(|x| up to 4.5: erf rounds to 1 from about 3.83), tiny and huge arguments, and the special values (signed
zeros, infinities, NaN); the graph is checked to hold no division and one exp, which is what makes it cheap
(the series and continued fraction it replaced took 14 divisions and 2 exps per element).
"""
from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.special import erf as erf64

from polygrad import Tensor
from polygrad.uop.ops import Ops

from conftest import DEVICES


def ulps(got: np.ndarray, x: np.ndarray) -> np.ndarray:
    """|got - erf(x)| in units of the float32 spacing at erf(x) rounded to float32 (x as float64)."""
    exact = erf64(x.astype(np.float64))
    return np.abs(got.astype(np.float64) - exact) / np.spacing(np.abs(exact).astype(np.float32)).astype(np.float64)


def test_erf_float32_is_within_two_ulps_of_float64_erf():
    rng = np.random.default_rng(0)
    x = np.concatenate([np.linspace(-4.5, 4.5, 1 << 17, dtype=np.float32),
                        rng.uniform(-4.2, 4.2, 1 << 15).astype(np.float32),
                        np.geomspace(1e-37, 0.7, 4000, dtype=np.float32),
                        -np.geomspace(1e-37, 0.7, 4000, dtype=np.float32),
                        np.nextafter(np.float32([0.6, -0.6, 4.0]), np.float32(0)),
                        np.float32([0.6, -0.6, 3.8325, 4.0, 5.0, 10.0, 1e10, 3e38, -3e38])])
    got = Tensor(x).erf().numpy()
    err = ulps(got, x)
    worst = int(np.argmax(err))
    want = erf64(float(x[worst]))
    assert err[worst] <= 2.0, f"erf({x[worst]!r}) = {got[worst]!r}: {err[worst]:.2f} ulp from {want!r}"


@pytest.mark.parametrize("device", DEVICES)
def test_erf_special_values(device):
    x = np.float32([0.0, -0.0, math.inf, -math.inf, math.nan, 1e-30, -1e-30, 1e30, -4.0, 0.6])
    got = Tensor(x, device=device).erf().numpy()
    assert np.signbit(got[1]) and got[1] == 0 and not np.signbit(got[0]) and got[0] == 0, "erf keeps the zero's sign"
    assert got[2] == 1 and got[3] == -1 and got[7] == 1 and got[8] == -1
    assert np.isnan(got[4])
    assert np.all(ulps(got[[5, 6, 9]], x[[5, 6, 9]]) <= 1.0)


def test_erf_float32_graph_has_no_division_and_one_exp():
    ops = [u.op for u in Tensor(np.float32([0.5])).erf().uop.toposort()]
    assert ops.count(Ops.EXP2) == 1
    assert not {Ops.FDIV, Ops.RECIPROCAL, Ops.IDIV} & set(ops)


def test_erf_gradient_matches_its_derivative():
    x = np.float32([-3.0, -1.2, -0.6, -0.3, 0.0, 1e-3, 0.3, 0.59, 0.61, 1.0, 2.0, 3.9, 5.0])
    t = Tensor(x, requires_grad=True)
    t.erf().sum().backward()
    want = 2 / math.sqrt(math.pi) * np.exp(-x.astype(np.float64) ** 2)
    np.testing.assert_allclose(t.grad.numpy(), want, rtol=2e-5, atol=2e-7)
