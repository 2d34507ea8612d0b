"""Transcendentals as plain IR arithmetic: EXP2, LOG2 and SIN rewritten into polynomials.

Stage: lowering (pass `decompose_transcendentals`, run by `codegen/lower.lower`). Input: kernel IR
that may hold EXP2/LOG2/SIN. Output: the same kernel with those ops replaced by ADD/MUL/FDIV/TRUNC/
WHERE/CAST/BITCAST/SHL/SHR/AND/OR on IEEE values, so every backend (C, NumPy, machine code,
JavaScript) computes the same bits from the IR alone instead of from its own libm.

Accuracy (measured by tests/test_transcendental.py against NumPy's float64 results):
- exp2: range reduction to [-0.5, 0.5] and a Taylor polynomial of 2**f, scaled by two exact powers
  of two (so subnormal results round once); within 2 ulp in float32 and float64.
- log2: mantissa in [sqrt(1/2), sqrt(2)), then 2*atanh((m-1)/(m+1)) as an odd series; within 2 ulp.
- sin (float32 and half types): the argument times 2/pi is reduced modulo 4 in float64 with 2/pi split
  into 24-bit pieces (every product exact, as in Payne-Hanek), so even sin(1e30) is accurate; the
  polynomial runs in float64. sin (float64): three-part Cody-Waite reduction, accurate for |x| < 1e8
  and degrading beyond (documented in docs/kernel-ir.md).
"""
from __future__ import annotations

import math

from polygrad.dtype import DType, dtypes
from polygrad.uop.ops import Ops, UOp
from polygrad.uop.rewrite import PatternMatcher, UPat, graph_rewrite


def _pi_digits(bits: int) -> int:
    """floor(pi * 2**bits), by Machin's formula in integers."""
    guard = bits + 32
    one = 1 << guard

    def arctan_inv(n: int) -> int:
        total, term, k, sign = 0, one // n, 1, 1
        while term:
            total += sign * (term // k)
            term //= n * n
            k += 2
            sign = -sign
        return total

    return (16 * arctan_inv(5) - 4 * arctan_inv(239)) >> 32


def _two_over_pi_chunks(n: int = 9, width: int = 24) -> list[float]:
    """2/pi as a sum of n float64 values of `width` significant bits each (exact products with float32)."""
    total = n * width
    # floor(2/pi * 2**total) = floor(2**(total+1+guard) / (pi * 2**guard))
    guard = total + 64  # pi needs as many correct bits as the quotient
    value = (1 << (total + 1 + guard)) // _pi_digits(guard)
    out = []
    for i in range(n):
        piece = (value >> (total - width * (i + 1))) & ((1 << width) - 1)
        out.append(math.ldexp(piece, -width * (i + 1)))
    return out


TWO_OVER_PI_CHUNKS = _two_over_pi_chunks()
# float64 arguments: 26-bit pieces times 26/27-bit halves of x, enough for |x| < 2**64
TWO_OVER_PI_CHUNKS_26 = _two_over_pi_chunks(n=7, width=26)


# ---- small builders with explicit dtypes
def _const(dt: DType, v) -> UOp:
    return UOp.const(dt, v)


def _op(op: Ops, *srcs: UOp) -> UOp:
    dt = dtypes.bool if op in (Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ) else srcs[0].dtype
    return UOp(op, dt, tuple(srcs))


def _add(a: UOp, b: UOp) -> UOp:
    return _op(Ops.ADD, a, b)


def _sub(a: UOp, b: UOp) -> UOp:
    return _op(Ops.ADD, a, _op(Ops.NEG, b))


def _mul(a: UOp, b: UOp) -> UOp:
    return _op(Ops.MUL, a, b)


def _where(c: UOp, a: UOp, b: UOp) -> UOp:
    return UOp(Ops.WHERE, a.dtype, (c, a, b))


def _lt(a: UOp, b: UOp) -> UOp:
    return _op(Ops.CMPLT, a, b)


def _isnan(x: UOp) -> UOp:
    return _op(Ops.CMPNE, x, x)


def _floor(x: UOp) -> UOp:
    t = UOp(Ops.TRUNC, x.dtype, (x,))
    return _where(_lt(x, t), _sub(t, _const(x.dtype, 1.0)), t)


def _horner(x: UOp, coeffs: list[float]) -> UOp:
    """coeffs[0] + coeffs[1]*x + ... evaluated by Horner's rule."""
    acc = _const(x.dtype, coeffs[-1])
    for c in reversed(coeffs[:-1]):
        acc = _add(_mul(acc, x), _const(x.dtype, c))
    return acc


def _layout(dt: DType) -> tuple[DType, int, int]:
    """(integer type of the same width, mantissa bits, exponent bias)."""
    return (dtypes.int64, 52, 1023) if dt is dtypes.float64 else (dtypes.int32, 23, 127)


def _pow2(k: UOp, dt: DType) -> UOp:
    """2**k as a float of dtype dt, for an integer k within the normal exponent range."""
    it, mant, bias = _layout(dt)
    biased = _add(k, _const(it, bias))
    return UOp(Ops.BITCAST, dt, (_op(Ops.SHL, biased, _const(it, mant)),))


# ---- exp2
def exp2(x: UOp) -> UOp:
    dt = x.dtype
    it, _, _ = _layout(dt)
    hi, lo, degree = (1030.0, -1100.0, 13) if dt is dtypes.float64 else (130.0, -160.0, 7)
    safe = _where(_isnan(x), _const(dt, 0.0), x)
    safe = _where(_lt(safe, _const(dt, hi)), safe, _const(dt, hi))
    safe = _where(_lt(safe, _const(dt, lo)), _const(dt, lo), safe)
    n = _floor(_add(safe, _const(dt, 0.5)))
    f = _sub(safe, n)
    ln2 = math.log(2)
    poly = _horner(f, [ln2 ** k / math.factorial(k) for k in range(degree + 1)])
    ni = UOp(Ops.CAST, it, (n,))
    n1 = _op(Ops.SHR, ni, _const(it, 1))  # arithmetic shift: floor(n/2), vectorises unlike a division
    n2 = _sub(ni, n1)
    out = _mul(_mul(poly, _pow2(n1, dt)), _pow2(n2, dt))
    return _where(_isnan(x), x, out)


# ---- log2
def log2(x: UOp) -> UOp:
    dt = x.dtype
    it, mant, bias = _layout(dt)
    tiny = 2.0 ** (-1022 if dt is dtypes.float64 else -126)
    shift = 64 if dt is not dtypes.float64 else 128
    sub = _lt(x, _const(dt, tiny))
    xn = _where(sub, _mul(x, _const(dt, 2.0 ** shift)), x)
    eadj = _where(sub, _const(it, shift), _const(it, 0))
    bits = UOp(Ops.BITCAST, it, (xn,))
    exp_mask = (1 << (63 - mant if dt is dtypes.float64 else 31 - mant)) - 1
    e = _sub(_op(Ops.AND, _op(Ops.SHR, bits, _const(it, mant)), _const(it, exp_mask)), _const(it, bias))
    m_bits = _op(Ops.OR, _op(Ops.AND, bits, _const(it, (1 << mant) - 1)), _const(it, bias << mant))
    m = UOp(Ops.BITCAST, dt, (m_bits,))
    big = _lt(_const(dt, math.sqrt(2.0)), m)
    m = _where(big, _mul(m, _const(dt, 0.5)), m)
    e = _add(_sub(e, eadj), _where(big, _const(it, 1), _const(it, 0)))
    s = _op(Ops.FDIV, _sub(m, _const(dt, 1.0)), _add(m, _const(dt, 1.0)))
    terms = 12 if dt is dtypes.float64 else 6
    series = _horner(_mul(s, s), [2.0 / (math.log(2) * (2 * k + 1)) for k in range(terms)])
    out = _add(UOp(Ops.CAST, dt, (e,)), _mul(s, series))
    out = _where(_op(Ops.CMPEQ, x, _const(dt, math.inf)), x, out)
    out = _where(_op(Ops.CMPEQ, x, _const(dt, 0.0)), _const(dt, -math.inf), out)
    out = _where(_lt(x, _const(dt, 0.0)), _const(dt, math.nan), out)
    return _where(_isnan(x), x, out)


# ---- sin
def _centered_mod4(t: UOp) -> UOp:
    """t - 4*round(t/4): exact in floating point, result in [-2, 2]."""
    return _sub(t, _mul(_const(t.dtype, 4.0), _floor(_add(_mul(t, _const(t.dtype, 0.25)), _const(t.dtype, 0.5)))))


def _pio2_parts() -> tuple[float, float, float]:
    """pi/2 as three float64 pieces of 33, 33 and 53 bits (k * piece exact for |k| < 2**20)."""
    bits = 200
    pio2 = _pi_digits(bits)  # pi * 2**bits; pi/2 = pio2 / 2**(bits+1)
    p1 = pio2 >> (bits + 1 - 32)
    rest = pio2 - (p1 << (bits + 1 - 32))
    p2 = rest >> (bits + 1 - 65)
    rest = rest - (p2 << (bits + 1 - 65))
    return math.ldexp(p1, -32), math.ldexp(p2, -65), math.ldexp(rest, -(bits + 1))


PIO2_PARTS = _pio2_parts()


def _sin_quadrant(r: UOp, k: UOp) -> UOp:
    """sin(r + k*pi/2) for float64 r in [-pi/4, pi/4] and integral k."""
    f64 = dtypes.float64
    r2 = _mul(r, r)
    sin_r = _mul(r, _horner(r2, [(-1) ** i / math.factorial(2 * i + 1) for i in range(9)]))
    cos_r = _horner(r2, [(-1) ** i / math.factorial(2 * i) for i in range(10)])
    q = _sub(k, _mul(_const(f64, 4.0), _floor(_mul(k, _const(f64, 0.25)))))
    neg_sin, neg_cos = _op(Ops.NEG, sin_r), _op(Ops.NEG, cos_r)
    one, two, three = (_const(f64, v) for v in (1.0, 2.0, 3.0))
    return _where(_op(Ops.CMPEQ, q, one), cos_r,
                  _where(_op(Ops.CMPEQ, q, two), neg_sin, _where(_op(Ops.CMPEQ, q, three), neg_cos, sin_r)))


def _reduce_quarter_turns(parts: list[UOp], chunks: list[float]) -> UOp:
    """x * 2/pi modulo 4, in [-2, 2], for x = sum(parts); every product is exact in float64."""
    f64 = dtypes.float64
    t = _const(f64, 0.0)
    for c in chunks:
        for p in parts:
            t = _centered_mod4(_add(t, _centered_mod4(_mul(p, _const(f64, c)))))
    return t


def _sin_f64(x: UOp) -> UOp:
    f64 = dtypes.float64
    # small arguments: three-part Cody-Waite reduction (k * part exact for |k| < 2**20)
    k = _floor(_add(_mul(x, _const(f64, 2 / math.pi)), _const(f64, 0.5)))
    r = x
    for part in PIO2_PARTS:
        r = _sub(r, _mul(k, _const(f64, part)))
    small = _sin_quadrant(r, k)
    # large arguments: split x into two halves (Veltkamp) and reduce with 2/pi in 26-bit pieces
    big_limit = 2.0 ** 64
    absx = _where(_lt(x, _const(f64, 0.0)), _op(Ops.NEG, x), x)
    is_small = _lt(absx, _const(f64, 2.0 ** 19))
    xs = _where(_lt(absx, _const(f64, big_limit)), x, _const(f64, 0.0))
    c = _mul(xs, _const(f64, 134217729.0))
    hi = _sub(c, _sub(c, xs))
    lo = _sub(xs, hi)
    t = _reduce_quarter_turns([hi, lo], TWO_OVER_PI_CHUNKS_26)
    kb = _floor(_add(t, _const(f64, 0.5)))
    large = _sin_quadrant(_mul(_sub(t, kb), _const(f64, math.pi / 2)), kb)
    out = _where(is_small, small, large)
    # |x| >= 2**64 is outside the table: NaN for infinities, else the value for x reduced as a float32
    huge = _sin_f32_path(UOp(Ops.CAST, dtypes.float32, (x,)))
    return _where(_lt(absx, _const(f64, big_limit)), out, _where(_isnan(_sub(x, x)), _sub(x, x), huge))


def _sin_f32_path(x: UOp) -> UOp:
    f64 = dtypes.float64
    t = _reduce_quarter_turns([UOp(Ops.CAST, f64, (x,))], TWO_OVER_PI_CHUNKS)
    k = _floor(_add(t, _const(f64, 0.5)))
    return _sin_quadrant(_mul(_sub(t, k), _const(f64, math.pi / 2)), k)


def sin(x: UOp) -> UOp:
    out = _sin_f64(x) if x.dtype is dtypes.float64 else UOp(Ops.CAST, x.dtype, (_sin_f32_path(x),))
    return _where(_op(Ops.CMPEQ, x, _const(x.dtype, 0.0)), x, out)  # sin(-0.0) is -0.0


def _decompose(fn, x: UOp) -> UOp | None:
    if x.dtype is None or not x.dtype.is_float:
        return None
    if x.dtype in (dtypes.float32, dtypes.float64) or fn is sin:
        return fn(x)
    # float16/bfloat16 and friends: compute in float32, round once at the end
    return UOp(Ops.CAST, x.dtype, (fn(UOp(Ops.CAST, dtypes.float32, (x,))),))


transcendental_rules = PatternMatcher([
    (UPat(Ops.EXP2, src=(UPat.var("x"),)), lambda x: _decompose(exp2, x)),
    (UPat(Ops.LOG2, src=(UPat.var("x"),)), lambda x: _decompose(log2, x)),
    (UPat(Ops.SIN, src=(UPat.var("x"),)), lambda x: _decompose(sin, x)),
], name="transcendental_rules")


def decompose_transcendentals(ast: UOp) -> UOp:
    """Replace EXP2/LOG2/SIN by IR arithmetic, so results follow from the IR alone."""
    if not any(n.op in (Ops.EXP2, Ops.LOG2, Ops.SIN) for n in ast.toposort()):
        return ast
    return graph_rewrite(ast, transcendental_rules, name="decompose_transcendentals")
