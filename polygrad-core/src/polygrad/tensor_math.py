"""Elementwise math on Tensor (a mixin of Tensor); activations live in tensor_activation.py.

Stage: graph construction. Input: tensors. Output: tensor graphs made only of the primitive ALU ops
(EXP2 LOG2 SIN SQRT RECIPROCAL TRUNC ADD MUL MAX MOD IDIV FDIV CMP* WHERE ...), so every function is
differentiable through `polygrad.gradient`. Transcendental functions without a primitive (erf, atan,
expm1, log1p, ...) use series, continued fractions or fitted polynomials (float32 erf) whose derivatives are
accurate too.

Two habits keep gradients finite: a `where` whose unused branch could overflow gets a safe input
("double where"), and half/bfloat16 inputs are computed in float32 and rounded once, as torch does.
"""
from __future__ import annotations

import functools
import math
from typing import Any, Callable

from polygrad.errors import InvalidArgumentError
from polygrad.tensor_common import _check_operand
from polygrad.dtype import dtypes, least_upper_float
from polygrad.uop.ops import Ops, UOp

HALF_TYPES = (dtypes.float16, dtypes.bfloat16)


def float_math(fn: Callable) -> Callable:
    """Run fn on the input cast to its float type; half types run in float32 and round at the end."""
    @functools.wraps(fn)
    def wrapper(self, *args: Any, **kw: Any):
        dt = least_upper_float(self.dtype)
        work = dtypes.float32 if dt in HALF_TYPES else dt
        return fn(self.cast(work), *args, **kw).cast(dt)
    return wrapper


def horner(x, coeffs: list[float]):
    """coeffs[0] + coeffs[1]*x + coeffs[2]*x**2 + ... evaluated with Horner's rule."""
    acc = x.full_like(coeffs[-1])
    for c in reversed(coeffs[:-1]):
        acc = acc * x + c
    return acc


def _is_f64(x) -> bool:
    return x.dtype is dtypes.float64


# float32 erf (Tensor.erf): two polynomials fitted (Lawson's weighted minimax) to float64 erf, then rounded to
# float32; about 1 ulp evaluated in float32 (tests/test_erf.py), with one exp and no division, where the series and
# continued fraction took 14 divisions and 2 exps per element (BERT's GELU).
# Below |x| = ERF_SPLIT: erf(x) = x + x Q(x^2), relative error 1e-8 (the leading x is exact, so Q's rounding
# moves the result by an eighth of what it would as x * (1 + Q)).
ERF_SPLIT = 0.6
ERF_SMALL = [2 / math.sqrt(math.pi) - 1, -0.37612545, 0.11281315, -0.026659044, 0.004527298]
# Above: log(erfc(|x|)) = P(|x| - ERF_SPLIT), fitted with weight erfc(|x|) (erf's absolute error) up to
# ERF_CLAMP = 4, past which erfc < 2^-25 and erf rounds to 1 in float32.
ERF_LOG_ERFC = [-0.92597777, -1.9872656, -0.7822611, -0.061024096, 0.014462966, -0.002479355, 0.0002209917]
ERF_CLAMP = 4.0


def _erf_series(x):
    """erf to float64 accuracy: a series with positive terms below |x| = 2.5, erfc's continued fraction above."""
    ax = x.abs()
    near = ax < 2.5
    xs = near.where(x, 0)
    x2 = xs * xs
    series = 1.0 + x2 * 0
    for n in range(36, 0, -1):
        series = 1 + (2 / (2 * n + 1)) * x2 * series
    series = (2 / math.sqrt(math.pi)) * (-x2).exp() * xs * series
    xf = near.where(2.5, ax)
    frac = xf
    for k in range(26, 0, -1):
        frac = xf + (k / 2) / frac
    tail = 1 - (-(xf * xf)).exp() / (math.sqrt(math.pi) * frac)
    tail = (x < 0).where(-tail, tail)
    return x.isnan().where(x, near.where(series, tail))


def odd_split(x, half: Callable):
    """half(|x|) with the sign of x, for an odd function whose formula is only good for z >= 0.

    One evaluation of half, on |x| as x times its sign (+1 at x = 0, so the gradient there is half'(0), and
    a constant: the gradient is half'(|x|) on both sides); NaN propagates. The same values as half(x >= 0 part)
    minus half(x < 0 part) with half(0) = 0, at half the work.
    """
    sign = (x >= 0).where(1.0, -1.0).detach()
    return x.isnan().where(x, half(x * sign) * sign)


def _half_exp_pair(a, sign: int):
    """(exp(a) + sign * exp(-a)) / 2 for a >= 1: exp(a)/2 as h * (h/2) with h = exp(a/2), finite wherever the result
    is; the small term as exp(-a - ln 2), which underflows to 0 (and so does its gradient) instead of 1/inf."""
    h = (a * 0.5).exp()
    return h * (h * 0.5) + sign * (-a - math.log(2)).exp()


def _check_bitwise(x, name: str) -> None:
    if x.dtype.is_float:
        raise TypeError(f"{name} is defined for integer and bool tensors, not {x.dtype}; cast with .int() first")


class MathMixin:
    """Elementwise functions built from primitive ops."""

    __slots__ = ()

    # ---- helpers
    def _float(self):
        return self.cast(least_upper_float(self.dtype))

    def _tensor_like(self, x: Any):
        return x if isinstance(x, type(self)) else type(self)(x, device=self.device, _runtime=self._runtime)

    # ---- arithmetic
    def __mod__(self, x: Any):
        return self.mod(x)

    def __rmod__(self, x: Any):
        a, b = self._broadcasted(x, reverse=True)
        return a.mod(b)

    def mod(self, x: Any, reverse: bool = False):
        """Python/torch remainder: the result has the sign of the divisor."""
        a, b = self._broadcasted(x, reverse)
        r = a.fmod(b)
        wrong_sign = r.ne(0) & ((r < 0).ne(b < 0))
        return wrong_sign.where(r + b, r)

    remainder = mod

    def fmod(self, x: Any):
        """C fmod: the result has the sign of the dividend."""
        a, b = self._broadcasted(x)
        if a.dtype is dtypes.bool:
            a, b = a.cast(dtypes.default_int), b.cast(dtypes.default_int)
        if not a.dtype.is_float:
            b = b.eq(0).where(1, b)  # integer % 0 would trap; torch raises, we return a % 1 = 0
        return a._alu(Ops.MOD, b)

    def __floordiv__(self, x: Any):
        return self.div(x, rounding_mode="floor")

    def __rfloordiv__(self, x: Any):
        a, b = self._broadcasted(x, reverse=True)
        return a.div(b, rounding_mode="floor")

    def pow(self, x: Any, reverse: bool = False):
        """self ** x with torch's promotion; integer powers of integers are exact; reverse=True is x ** self."""
        if reverse:
            a, b = self._broadcasted(x, reverse=True)
            return a.pow(b)
        if not isinstance(x, type(self)) and not isinstance(x, bool) and isinstance(x, (int, float)):
            if x == 2 and (self.dtype.is_float or isinstance(x, int) and self.dtype is not dtypes.bool):
                return self * self  # an int tensor ** 2.0 is float, bool ** 2 is int (torch): the general path
            if x == 0.5 and self.dtype.is_float:
                return self.sqrt()
            if isinstance(x, int) and not self.dtype.is_float and self.dtype is not dtypes.bool:
                return self._int_pow(x)
        a, b = self._broadcasted(x)
        if a.dtype is dtypes.bool:
            a, b = a.cast(dtypes.default_int), b.cast(dtypes.default_int)
        if not a.dtype.is_float:
            return a.cast(dtypes.float64)._alu(Ops.POW, b.cast(dtypes.float64)).round().cast(a.dtype)
        if a.dtype in HALF_TYPES:
            return a.float()._alu(Ops.POW, b.float()).cast(a.dtype)
        return a._alu(Ops.POW, b)

    def _int_pow(self, n: int):
        if n < 0:
            raise InvalidArgumentError("integers to negative integer powers are not allowed; cast to float first")
        out = self.full_like(1)
        base = self
        while n:
            if n & 1:
                out = out * base
            base = base * base
            n >>= 1
        return out

    def __pow__(self, x: Any):
        return self.pow(x)

    def __rpow__(self, x: Any):
        a, b = self._broadcasted(x, reverse=True)
        return a.pow(b)

    def square(self):
        return self * self

    def abs(self):
        if self.dtype is dtypes.bool:
            return self
        if self.dtype.is_unsigned:
            return self
        if self.dtype.is_float:
            # NaN-propagating, and the gradient at 0 is 0 like torch; + 0.0 turns the -0.0 that
            # maximum(0.0, -0.0) gives into +0.0 (x + 0.0 is never folded for floats)
            return self.maximum(-self) + 0.0
        return (self < 0).where(-self, self)

    absolute = abs

    def sign(self):
        """-1, 0 or 1 (NaN stays NaN for floats)."""
        if self.dtype is dtypes.bool:
            return self
        pos = (self > 0).cast(self.dtype)
        if self.dtype.is_unsigned:
            return pos
        return pos - (self < 0).cast(self.dtype)  # NaN gives 0, like torch

    sgn = sign

    def copysign(self, other: Any):
        """|self| with the sign bit of other (so -0.0 counts as negative)."""
        a, b = self._float()._broadcasted(other)
        a, b = a._float(), b.cast(least_upper_float(b.dtype))
        mag = a.abs()
        return b.signbit().where(-mag, mag)

    def signbit(self):
        """True where the sign bit is set (so for -0.0 and negative NaNs too)."""
        if not self.dtype.is_float:
            return self < 0 if not self.dtype.is_unsigned and self.dtype is not dtypes.bool else \
                self.full_like(False, dtype=dtypes.bool)
        int_of = {2: dtypes.int16, 4: dtypes.int32, 8: dtypes.int64}[self.dtype.itemsize]
        return self.bitcast(int_of) < 0

    def lerp(self, end: Any, weight: Any):
        """self + weight * (end - self), in torch's two-sided form (exact at weight = 1)."""
        a, b = self._broadcasted(end)
        diff = b - a
        if not hasattr(weight, "uop"):
            return a + diff * weight if abs(weight) < 0.5 else b - diff * (1 - weight)
        w = weight.cast(a.dtype)
        return (w.abs() < 0.5).where(a + diff * w, b - diff * (1 - w))

    def clamp(self, min: Any = None, max: Any = None, min_: Any = None, max_: Any = None):  # noqa: A002
        """Clip into [min, max] (torch's keywords; tinygrad's min_/max_ too); either bound may be left out, not
        both. NaN stays NaN and the gradient passes where min <= x <= max (torch)."""
        min = min_ if min is None else min  # noqa: A001
        max = max_ if max is None else max  # noqa: A001
        if min is None and max is None:
            raise InvalidArgumentError("clamp() needs at least one of min or max")
        x = self
        if min is not None:
            x = (x < min).where(min, x)
        if max is not None:
            x = (x > max).where(max, x)
        return x

    clip = clamp

    def minimum(self, x: Any):
        a, b = self._broadcasted(x)
        if a.dtype.is_float:
            return -((-a).maximum(-b))
        return (a < b).where(a, b)

    # ---- exponentials and logarithms
    @float_math
    def exp(self):
        return (self * (1 / math.log(2))).exp2()

    @float_math
    def log(self):
        return self.log2() * math.log(2)

    @float_math
    def expm1(self):
        """exp(x) - 1, accurate near 0 (a Taylor series below |x| = 0.1)."""
        near = self.abs() < 0.1
        small = near.where(self, 0)
        series = small * horner(small, [1 / math.factorial(k + 1) for k in range(10)])
        big = near.where(0, self)
        return near.where(series, big.exp() - 1)

    @float_math
    def log1p(self):
        """log(1 + x), accurate near 0 (2*atanh(x / (2 + x)) series below |x| = 0.1)."""
        near = self.abs() < 0.1
        small = near.where(self, 0)
        z = small / (small + 2)
        z2 = z * z
        series = 2 * z * horner(z2, [1 / (2 * k + 1) for k in range(9)])
        big = near.where(0, self)
        return near.where(series, (big + 1).log())

    @float_math
    def log10(self):
        return self.log2() * math.log10(2)

    def logaddexp(self, other: Any):
        """log(exp(a) + exp(b)) without overflow; equal infinities give that infinity."""
        a, b = self._float()._broadcasted(other)
        a, b = a._float(), b._float()
        m = a.maximum(b)
        d = a.eq(b).where(0, a - b)
        return m + (-(d.abs())).exp().log1p()

    # ---- trigonometric and hyperbolic
    def cos(self):
        """1 - 2 sin^2(x/2): exact halving keeps libm's argument reduction (sin(pi/2 - x) loses it),
        computed in float64 for narrower types so the cancellation near cos = 0 stays below their ulp."""
        dt = least_upper_float(self.dtype)
        x = self.cast(dtypes.float64)
        s = (x * 0.5).sin()
        return (1 - 2 * s * s).cast(dt)

    @float_math
    def tan(self):
        return self.sin() / self.cos()

    @float_math
    def atan(self):
        """Reduce |x| > 1 with atan(x) = pi/2 - atan(1/x), halve twice, then a Taylor series."""
        big = self.abs() > 1
        inv = 1 / big.where(self, 1)
        t = big.where(inv, self)
        for _ in range(2):  # atan(t) = 2 atan(t / (1 + sqrt(1 + t^2))), |t| <= tan(pi/16) after two
            t = t / (1 + (1 + t * t).sqrt())
        t2 = t * t
        terms = 12 if _is_f64(self) else 6
        core = 4 * t * horner(t2, [(-1) ** k / (2 * k + 1) for k in range(terms)])
        half_pi = (self > 0).where(self.full_like(math.pi / 2), -math.pi / 2)
        return big.where(half_pi - core, core)

    arctan = atan

    def atan2(self, other: Any):
        """The angle of (other, self) in (-pi, pi]."""
        y, x = self._float()._broadcasted(other)
        y, x = y._float(), x._float()
        safe_x = x.eq(0).where(1, x)
        base = (y / safe_x).atan()
        axis_angle = (y > 0).where(y.full_like(math.pi / 2), (y < 0).where(y.full_like(-math.pi / 2), 0.0))
        base = x.eq(0).where(axis_angle, base)
        shift = (x < 0).where(y.signbit().where(y.full_like(-math.pi), math.pi), 0.0)
        return base + shift

    @float_math
    def asin(self):
        return (self / ((1 - self) * (1 + self)).sqrt()).atan()

    arcsin = asin

    @float_math
    def acos(self):
        return 2 * ((1 - self) / (1 + self)).sqrt().atan()

    arccos = acos

    @float_math
    def sinh(self):
        """expm1 differences up to |x| = 1; beyond, h*h/2 - 1/(2 h*h) with h = exp(|x|/2) (the exact halving keeps
        exp accurate), which stays finite until sinh itself overflows (exp(x) overflows first)."""
        big = self.abs() > 1
        small = big.where(0, self)
        near = (small.expm1() - (-small).expm1()) * 0.5
        far = _half_exp_pair(big.where(self.abs(), 1), -1)
        return big.where((self < 0).where(-far, far), near)

    @float_math
    def cosh(self):
        """1 + 2 sinh(x/2)^2 up to |x| = 1 (so the gradient near 0 is sinh(x), not 0), then the overflow-safe pair."""
        big = self.abs() > 1
        h = big.where(0, self) * 0.5
        sh = (h.expm1() - (-h).expm1()) * 0.5
        return big.where(_half_exp_pair(big.where(self.abs(), 1), 1), 1 + 2 * sh * sh)

    @float_math
    def tanh(self):
        """Odd-split so that both halves use expm1 of a non-positive argument (no overflow)."""
        def half(z):
            t = (z * -2).expm1()
            return -t / (t + 2)
        return odd_split(self, half)

    @float_math
    def asinh(self):
        def half(z):
            small = z < 1
            zs = small.where(z, 0)
            zb = small.where(1, z)
            inner = small.where(zs * zs / (1 + (1 + zs * zs).sqrt()), zb / (1 / zb + (1 / (zb * zb) + 1).sqrt()))
            return (z + inner).log1p()
        return odd_split(self, half)

    arcsinh = asinh

    @float_math
    def acosh(self):
        """log1p(t + sqrt(t (t + 2))), t = |x| - 1, with the sign of x and NaN below 1: the value is torch's,
        and so is the gradient 1/sqrt(x^2 - 1), finite for x <= -1 too (where the value is NaN)."""
        t = self.abs() - 1
        core = (t + t.sqrt() * (t + 2).sqrt()).log1p()
        return (self < 1).where(math.nan, 0.0) + self.sign().detach() * core

    arccosh = acosh

    @float_math
    def atanh(self):
        """(log1p(x) - log1p(-x)) / 2: accurate near 0 and near +-1, with the gradient 1/(1-x^2) (inf at +-1)."""
        return 0.5 * (self.log1p() - (-self).log1p())

    arctanh = atanh

    @float_math
    def erf(self):
        """float32: x + x Q(x^2) below |x| = 0.6, else sign(x) (1 - exp(P(|x| - 0.6))) with |x| clamped to 4
        (where erf rounds to 1); float64: the series below |x| = 2.5, erfc's continued fraction above."""
        if _is_f64(self):
            return _erf_series(self)
        near = self.abs() < ERF_SPLIT
        xs = near.where(self, 0)  # the unused branch gets a safe input (x^2 overflows): no NaN gradient
        small = xs + xs * horner(xs * xs, ERF_SMALL)
        ax = self.abs()
        xl = near.where(ERF_SPLIT, (ax < ERF_CLAMP).where(ax, ERF_CLAMP))
        tail = 1 - horner(xl - ERF_SPLIT, ERF_LOG_ERFC).exp()
        tail = (self < 0).where(-tail, tail)
        return self.isnan().where(self, near.where(small, tail))

    def erfc(self):
        return 1 - self.erf()

    # ---- rounding
    def trunc(self):
        return self._alu(Ops.TRUNC) if self.dtype.is_float else self

    def floor(self):
        if not self.dtype.is_float:
            return self
        t = self.trunc()
        return (self < t).where(t - 1, t)

    def ceil(self):
        if not self.dtype.is_float:
            return self
        t = self.trunc()
        return (self > t).where(t + 1, t)

    def round(self, decimals: int = 0):
        """Round half to even, like torch (and NumPy)."""
        if not self.dtype.is_float:
            return self
        if decimals:
            scale = 10.0 ** decimals
            return (self * scale).round() / scale
        f = self.floor()
        frac = self - f
        f_even = (f * 0.5).floor() * 2 == f
        up = (frac > 0.5) | (frac.eq(0.5) & f_even.logical_not())
        return up.where(f + 1, f)

    def frac(self):
        return self - self.trunc()

    # ---- tests
    def isnan(self):
        return self.ne(self) if self.dtype.is_float else self.full_like(False, dtype=dtypes.bool)

    def isinf(self, detect_positive: bool = True, detect_negative: bool = True):
        """True at +inf (detect_positive) and -inf (detect_negative)."""
        if not self.dtype.is_float or not (detect_positive or detect_negative):
            return self.full_like(False, dtype=dtypes.bool)
        if not detect_negative:
            return self.eq(math.inf)
        return self.eq(math.inf) | self.eq(-math.inf) if detect_positive else self.eq(-math.inf)

    def isposinf(self):
        return self.eq(math.inf) if self.dtype.is_float else self.full_like(False, dtype=dtypes.bool)

    def isneginf(self):
        return self.eq(-math.inf) if self.dtype.is_float else self.full_like(False, dtype=dtypes.bool)

    def isfinite(self):
        if not self.dtype.is_float:
            return self.full_like(True, dtype=dtypes.bool)
        return (self.isinf() | self.isnan()).logical_not()

    def isclose(self, other: Any, rtol: float = 1e-05, atol: float = 1e-08, equal_nan: bool = False):
        a, b = self._broadcasted(other)
        if not a.dtype.is_float:
            a, b = a.cast(dtypes.default_float), b.cast(dtypes.default_float)
        close = (a - b).abs() <= atol + rtol * b.abs()
        close = close & a.isfinite() & b.isfinite() | a.eq(b)
        return close | (a.isnan() & b.isnan()) if equal_nan else close

    def allclose(self, other: Any, rtol: float = 1e-05, atol: float = 1e-08, equal_nan: bool = False) -> bool:
        return bool(self.isclose(other, rtol, atol, equal_nan).all().item())

    def masked_fill(self, mask: Any, value: Any):
        """self where mask is False, value where it is True (value keeps self's dtype)."""
        mask = self._tensor_like(mask)
        fill = value.cast(self.dtype) if hasattr(value, "uop") else self._const_tensor(value)
        return mask.where(fill, self)

    def _const_tensor(self, value: Any):
        _check_operand(value)
        return type(self)(UOp.const(self.dtype, value, self.device), _runtime=self._runtime)

    # ---- comparisons
    def lt(self, x: Any):
        return self < x

    def gt(self, x: Any):
        return self > x

    def le(self, x: Any):
        return self <= x

    def ge(self, x: Any):
        return self >= x

    def __le__(self, x: Any):
        a, b = self._broadcasted(x)
        return (a < b) | a.eq(b) if a.dtype.is_float else (b < a).logical_not()

    def __ge__(self, x: Any):
        a, b = self._broadcasted(x)
        return (b < a) | a.eq(b) if a.dtype.is_float else (a < b).logical_not()

    def logical_and(self, x: Any):
        return self.bool() & self._tensor_like(x).bool()

    def logical_or(self, x: Any):
        return self.bool() | self._tensor_like(x).bool()

    def logical_xor(self, x: Any):
        return self.bool() ^ self._tensor_like(x).bool()

    # ---- bitwise
    def bitwise_and(self, x: Any, reverse: bool = False):
        _check_bitwise(self, "bitwise_and")
        return self & x

    def bitwise_or(self, x: Any, reverse: bool = False):
        _check_bitwise(self, "bitwise_or")
        return self | x

    def bitwise_xor(self, x: Any, reverse: bool = False):
        _check_bitwise(self, "bitwise_xor")
        return self ^ x

    def bitwise_not(self):
        _check_bitwise(self, "bitwise_not")
        return ~self

    def __invert__(self):
        _check_bitwise(self, "~ (bitwise_not)")
        if self.dtype is dtypes.bool:
            return self.logical_not()
        return self ^ self._const_tensor(dtypes.max(self.dtype) if self.dtype.is_unsigned else -1)

    def __rand__(self, x: Any):
        return self & x

    def __ror__(self, x: Any):
        return self | x

    def __rxor__(self, x: Any):
        return self ^ x
