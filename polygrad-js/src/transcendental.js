'use strict'
/**
 * EXP2, LOG2 and SIN as plain IR arithmetic: a port of polygrad-core's uop/transcendental.py, node for
 * node, with its float64 constants copied bit for bit (generated/constants.js), so JavaScript computes the same
 * bits as the C and NumPy backends (docs/kernel-ir.md, "Transcendentals").
 *
 * Stage: import (compile.js prepareKernel), for older bundles only. Input: kernel IR that may hold
 * EXP2/LOG2/SIN. Output: the same kernel with ADD/MUL/FDIV/TRUNC/WHERE/CAST/BITCAST/SHL/SHR/AND/OR in their
 * place. polygrad-core stores kernels already decomposed (docs/bundle-format.md 2.4), so only bundles saved
 * before that reach this module, and their kernels get the form a save stores today. Frozen: new lowering for
 * new targets happens in Python at save time or in the target's own lowering, never here
 * (docs/architecture.md, "Where lowering lives").
 */

const { DTYPES } = require('./dtypes')
const { hexFloat, toposort } = require('./ir')
const { graphRewrite } = require('./simplify')
const C = require('./generated/constants')

const F = (list) => list.map(hexFloat)
const K = {
  exp2_f32: F(C.exp2_f32),
  exp2_f64: F(C.exp2_f64),
  log2_f32: F(C.log2_f32),
  log2_f64: F(C.log2_f64),
  sin: F(C.sin_poly),
  cos: F(C.cos_poly),
  chunks24: F(C.two_over_pi_24),
  chunks26: F(C.two_over_pi_26),
  pio2: F(C.pio2_parts),
  twoOverPi: hexFloat(C.misc[0]),
  piOver2: hexFloat(C.misc[1]),
  sqrt2: hexFloat(C.misc[2])
}
const { float32: f32, float64: f64, int32, int64 } = DTYPES

function builders (g) {
  const c = (dt, v) => g.const(dt, v)
  const op = (o, ...s) => g.alu(o, ...s)
  const add = (a, b) => op('ADD', a, b)
  const neg = (a) => op('NEG', a)
  const sub = (a, b) => add(a, neg(b))
  const mul = (a, b) => op('MUL', a, b)
  const where = (x, a, b) => g.node('WHERE', a.dtype, [x, a, b])
  const lt = (a, b) => op('CMPLT', a, b)
  const isnan = (x) => op('CMPNE', x, x)
  const cast = (dt, x) => g.node('CAST', dt, [x])
  const bitcast = (dt, x) => g.node('BITCAST', dt, [x])
  const floor = (x) => {
    const t = g.node('TRUNC', x.dtype, [x])
    return where(lt(x, t), sub(t, c(x.dtype, 1.0)), t)
  }
  const horner = (x, coeffs) => {
    let acc = c(x.dtype, coeffs[coeffs.length - 1])
    for (let i = coeffs.length - 2; i >= 0; i--) acc = add(mul(acc, x), c(x.dtype, coeffs[i]))
    return acc
  }
  const layout = (dt) => (dt === f64 ? [int64, 52, 1023] : [int32, 23, 127])
  const pow2 = (k, dt) => {
    const [it, mant, bias] = layout(dt)
    return bitcast(dt, op('SHL', add(k, c(it, bias)), c(it, mant)))
  }

  function exp2 (x) {
    const dt = x.dtype
    const [it] = layout(dt)
    const [hi, lo] = dt === f64 ? [1030.0, -1100.0] : [130.0, -160.0]
    let safe = where(isnan(x), c(dt, 0.0), x)
    safe = where(lt(safe, c(dt, hi)), safe, c(dt, hi))
    safe = where(lt(safe, c(dt, lo)), c(dt, lo), safe)
    const n = floor(add(safe, c(dt, 0.5)))
    const f = sub(safe, n)
    const poly = horner(f, dt === f64 ? K.exp2_f64 : K.exp2_f32)
    const ni = cast(it, n)
    const n1 = op('SHR', ni, c(it, 1))
    const n2 = sub(ni, n1)
    const out = mul(mul(poly, pow2(n1, dt)), pow2(n2, dt))
    return where(isnan(x), x, out)
  }

  function log2 (x) {
    const dt = x.dtype
    const [it, mant, bias] = layout(dt)
    const wide = dt === f64
    const tiny = wide ? 2 ** -1022 : 2 ** -126
    const shift = wide ? 128 : 64
    const sub_ = lt(x, c(dt, tiny))
    const xn = where(sub_, mul(x, c(dt, 2 ** shift)), x)
    const eadj = where(sub_, c(it, shift), c(it, 0))
    const bits = bitcast(it, xn)
    const expMask = wide ? 2047 : 255
    let e = sub(op('AND', op('SHR', bits, c(it, mant)), c(it, expMask)), c(it, bias))
    const mBits = op('OR', op('AND', bits, c(it, wide ? (1n << 52n) - 1n : (1 << 23) - 1)),
      c(it, wide ? 1023n << 52n : 127 << 23))
    let m = bitcast(dt, mBits)
    const big = lt(c(dt, K.sqrt2), m)
    m = where(big, mul(m, c(dt, 0.5)), m)
    e = add(sub(e, eadj), where(big, c(it, 1), c(it, 0)))
    const s = op('FDIV', sub(m, c(dt, 1.0)), add(m, c(dt, 1.0)))
    const series = horner(mul(s, s), wide ? K.log2_f64 : K.log2_f32)
    let out = add(cast(dt, e), mul(s, series))
    out = where(op('CMPEQ', x, c(dt, Infinity)), x, out)
    out = where(op('CMPEQ', x, c(dt, 0.0)), c(dt, -Infinity), out)
    out = where(lt(x, c(dt, 0.0)), c(dt, NaN), out)
    return where(isnan(x), x, out)
  }

  const centeredMod4 = (t) => sub(t, mul(c(t.dtype, 4.0), floor(add(mul(t, c(t.dtype, 0.25)), c(t.dtype, 0.5)))))

  function sinQuadrant (r, k) {
    const r2 = mul(r, r)
    const sinR = mul(r, horner(r2, K.sin))
    const cosR = horner(r2, K.cos)
    const q = sub(k, mul(c(f64, 4.0), floor(mul(k, c(f64, 0.25)))))
    const [one, two, three] = [1.0, 2.0, 3.0].map((v) => c(f64, v))
    return where(op('CMPEQ', q, one), cosR,
      where(op('CMPEQ', q, two), neg(sinR), where(op('CMPEQ', q, three), neg(cosR), sinR)))
  }

  function reduceQuarterTurns (parts, chunks) {
    let t = c(f64, 0.0)
    for (const ch of chunks) for (const p of parts) t = centeredMod4(add(t, centeredMod4(mul(p, c(f64, ch)))))
    return t
  }

  function sinF32Path (x) {
    const t = reduceQuarterTurns([cast(f64, x)], K.chunks24)
    const k = floor(add(t, c(f64, 0.5)))
    return sinQuadrant(mul(sub(t, k), c(f64, K.piOver2)), k)
  }

  function sinF64 (x) {
    const k = floor(add(mul(x, c(f64, K.twoOverPi)), c(f64, 0.5)))
    let r = x
    for (const part of K.pio2) r = sub(r, mul(k, c(f64, part)))
    const small = sinQuadrant(r, k)
    const bigLimit = 2 ** 64
    const absx = where(lt(x, c(f64, 0.0)), neg(x), x)
    const isSmall = lt(absx, c(f64, 2 ** 19))
    const xs = where(lt(absx, c(f64, bigLimit)), x, c(f64, 0.0))
    const cc = mul(xs, c(f64, 134217729.0))
    const hi = sub(cc, sub(cc, xs))
    const lo = sub(xs, hi)
    const t = reduceQuarterTurns([hi, lo], K.chunks26)
    const kb = floor(add(t, c(f64, 0.5)))
    const large = sinQuadrant(mul(sub(t, kb), c(f64, K.piOver2)), kb)
    const out = where(isSmall, small, large)
    const huge = sinF32Path(cast(f32, x))
    return where(lt(absx, c(f64, bigLimit)), out, where(isnan(sub(x, x)), sub(x, x), huge))
  }

  function sin (x) {
    const out = x.dtype === f64 ? sinF64(x) : cast(x.dtype, sinF32Path(x))
    return where(op('CMPEQ', x, c(x.dtype, 0.0)), x, out)
  }

  function decompose (fn, x) {
    if (!x.dtype || !x.dtype.isFloat) return null
    if (x.dtype === f32 || x.dtype === f64 || fn === sin) return fn(x)
    return cast(x.dtype, fn(cast(f32, x)))
  }
  return { exp2, log2, sin, decompose }
}

/** Replace EXP2/LOG2/SIN by IR arithmetic (Python's decompose_transcendentals). */
function decomposeTranscendentals (g, ast) {
  if (!toposort(ast).some((n) => n.op === 'EXP2' || n.op === 'LOG2' || n.op === 'SIN')) return ast
  const b = builders(g)
  const fns = { EXP2: b.exp2, LOG2: b.log2, SIN: b.sin }
  return graphRewrite(g, ast, (gg, u) => (fns[u.op] ? b.decompose(fns[u.op], u.src[0]) : null))
}

module.exports = { decomposeTranscendentals }
