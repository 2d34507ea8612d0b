'use strict'
/**
 * The kernel IR's scalar semantics in plain JavaScript (docs/kernel-ir.md, "Semantics an implementation
 * must reproduce"): one function per op and dtype class, used by the JavaScript executor (jsexec.js) and
 * imported by WebAssembly modules for the few ops wasm lacks (float MOD, POW, float64 FMA).
 *
 * Value representation: float dtypes are JS numbers already rounded to their format (float16/bfloat16
 * hold float32 values rounded to 16 bits); 8-32 bit integers and bool are numbers (bool 0/1); int64 and
 * uint64 are BigInts.
 */

const { roundFloat, f32ToF16Bits, f16BitsToF32, f32ToBf16Bits, bf16BitsToF32, wrapInt } = require('./dtypes')

const buf8 = new ArrayBuffer(8)
const dv = new DataView(buf8)

function nextToward (s, dir) {
  // the double next to s in the direction of dir's sign (s finite)
  dv.setFloat64(0, s)
  let bits = dv.getBigUint64(0)
  if (s === 0) {
    bits = 1n
    dv.setBigUint64(0, bits)
    return dir > 0 ? dv.getFloat64(0) : -dv.getFloat64(0)
  }
  const away = (s > 0) === (dir > 0)
  bits = away ? bits + 1n : bits - 1n
  dv.setBigUint64(0, bits)
  return dv.getFloat64(0)
}

/** a*b+c rounded once to float32 (round-to-odd in float64, then to float32). */
function fma32 (a, b, c) {
  const p = a * b
  let s = p + c
  const bb = s - p
  const e = (p - (s - bb)) + (c - bb)
  if (Number.isFinite(s) && Number.isFinite(e) && e !== 0) {
    dv.setFloat64(0, s)
    if ((dv.getUint32(4) & 1) === 0) s = nextToward(s, e)
  }
  return Math.fround(s)
}

function decompose (x) {
  // x finite: [m (BigInt), e] with x = m * 2**e
  dv.setFloat64(0, x)
  const hi = dv.getUint32(0)
  const lo = dv.getUint32(4)
  const exp = (hi >>> 20) & 0x7ff
  let m = (BigInt(hi & 0xfffff) << 32n) | BigInt(lo)
  let e
  if (exp === 0) e = -1074
  else {
    m |= 1n << 52n
    e = exp - 1075
  }
  return [hi >>> 31 ? -m : m, e]
}

function dyadicToDouble (m, e) {
  // m * 2**e rounded to the nearest double (ties to even)
  if (m === 0n) return 0
  const neg = m < 0n
  let a = neg ? -m : m
  let bits = a.toString(2).length
  // keep 53 significant bits (fewer in the subnormal range)
  let shift = bits - 53
  const minExp = -1074
  if (e + shift < minExp) shift = minExp - e
  let r
  if (shift > 0) {
    const q = a >> BigInt(shift)
    const rem = a - (q << BigInt(shift))
    const half = 1n << BigInt(shift - 1)
    r = q
    if (rem > half || (rem === half && (q & 1n) === 1n)) r = q + 1n
    e += shift
  } else {
    r = a
  }
  bits = r.toString(2).length
  let v = Number(r) * 2 ** e
  if (!Number.isFinite(v) || Number(r) === 0) v = Number(r) === 0 ? 0 : Infinity
  if (e < -1022 && Number.isFinite(v)) {
    // Number(r) is exact (r < 2**53); scale in two steps so no intermediate underflow rounds twice
    v = Number(r) * 2 ** (e + 600) * 2 ** -600
  }
  return neg ? -v : v
}

/** a*b+c rounded once to float64. */
function fma64 (a, b, c) {
  if (!(Number.isFinite(a) && Number.isFinite(b) && Number.isFinite(c))) return a * b + c
  const [ma, ea] = decompose(a)
  const [mb, eb] = decompose(b)
  const [mc, ec] = decompose(c)
  let mp = ma * mb
  let ep = ea + eb
  let m, e
  if (ep <= ec) {
    m = mp + (mc << BigInt(ec - ep))
    e = ep
  } else {
    m = (mp << BigInt(ep - ec)) + mc
    e = ec
  }
  if (m === 0n) return a * b + c // the sign of an exact zero follows IEEE addition
  mp = null
  return dyadicToDouble(m, e)
}

function toStore (v, d) {
  if (d.name === 'float16') return f32ToF16Bits(v)
  if (d.name === 'bfloat16') return f32ToBf16Bits(v)
  if (d.isBool) return v ? 1 : 0
  return v
}

function fromStore (v, d) {
  if (d.name === 'float16') return f16BitsToF32(v)
  if (d.name === 'bfloat16') return bf16BitsToF32(v)
  if (d.isBool) return v ? 1 : 0
  return v
}

/** A value of dtype `from` converted to dtype `to` (CAST). */
function cast (x, from, to) {
  if (to.isBool) return (typeof x === 'bigint' ? x !== 0n : x !== 0) ? 1 : 0
  if (to.isFloat) {
    if (from.isBool) return x
    if (from.isFloat && from.name !== 'float64') return roundFloat(x, to)
    if (typeof x === 'bigint') return roundFloat(Number(x), to)
    if (to.half) return roundFloat(Math.fround(x), to) // C: (float)(x) first, then rounded to 16 bits
    return roundFloat(x, to)
  }
  // to an integer
  let v = x
  if (from.isFloat) {
    if (!Number.isFinite(v)) v = 0 // undefined in C; any value is allowed
    v = Math.trunc(v)
    if (to.bits === 64) return wrap64(BigInt(v), to)
    if (Math.abs(v) >= 2 ** 63) v = 0
    return wrapInt(v, to)
  }
  if (to.bits === 64) return wrap64(typeof v === 'bigint' ? v : BigInt(v), to)
  return wrapInt(typeof v === 'bigint' ? BigInt.asIntN(64, v) : v, to)
}

function wrap64 (v, d) {
  return d.isUnsigned ? BigInt.asUintN(64, v) : BigInt.asIntN(64, v)
}

function bitcast (x, from, to) {
  if (from.bits === 16 && from.isFloat) x = toStore(x, from)
  if (from.isFloat && from.bits === 32) dv.setFloat32(0, x, true)
  else if (from.isFloat && from.bits === 64) dv.setFloat64(0, x, true)
  else if (from.bits === 64) dv.setBigUint64(0, BigInt.asUintN(64, x), true)
  else if (from.bits === 32) dv.setUint32(0, x >>> 0, true)
  else if (from.bits === 16) dv.setUint16(0, x & 0xffff, true)
  else dv.setUint8(0, x & 0xff)
  let out
  if (to.isFloat && to.bits === 32) out = dv.getFloat32(0, true)
  else if (to.isFloat && to.bits === 64) out = dv.getFloat64(0, true)
  else if (to.isFloat && to.bits === 16) out = fromStore(dv.getUint16(0, true), to)
  else if (to.bits === 64) out = to.isUnsigned ? dv.getBigUint64(0, true) : dv.getBigInt64(0, true)
  else if (to.bits === 32) out = to.isUnsigned ? dv.getUint32(0, true) : dv.getInt32(0, true)
  else if (to.bits === 16) out = to.isUnsigned ? dv.getUint16(0, true) : dv.getInt16(0, true)
  else out = to.isUnsigned ? dv.getUint8(0) : to.isBool ? (dv.getUint8(0) ? 1 : 0) : dv.getInt8(0)
  return out
}

/** fn(...operands) -> result of `op` with result dtype d and operand dtype s (a closure per op and dtype). */
function aluFn (op, d, s) {
  if (op === 'CAST') return (x) => cast(x, s, d)
  if (op === 'BITCAST') return (x) => bitcast(x, s, d)
  if (op === 'WHERE') return (c, a, b) => (c ? a : b)
  if (op === 'CMPLT') return (a, b) => (a < b ? 1 : 0)
  if (op === 'CMPLE') return (a, b) => (a <= b ? 1 : 0) // internal: the linearizer's fusion of CMPLT | CMPEQ
  if (op === 'CMPNE') return (a, b) => (a !== b ? 1 : 0)
  if (op === 'CMPEQ') return (a, b) => (a === b ? 1 : 0)
  if (d.isBool) {
    switch (op) {
      case 'ADD': case 'OR': case 'MAX': return (a, b) => a | b
      case 'MUL': case 'AND': return (a, b) => a & b
      case 'XOR': return (a, b) => a ^ b
      case 'NEG': return (a) => 1 - a
      case 'TRUNC': return (a) => a
    }
  } else if (d.isFloat) {
    const r = d.name === 'float64' ? (x) => x : d.name === 'float32' ? Math.fround : (x) => roundFloat(x, d)
    switch (op) {
      case 'ADD': return (a, b) => r(a + b)
      case 'MUL': return (a, b) => r(a * b)
      case 'NEG': return (a) => -a
      case 'FDIV': return (a, b) => r(a / b)
      case 'MOD': return (a, b) => r(a % b)
      case 'MAX': return (a, b) => (a !== a || a > b ? a : b)
      case 'RECIPROCAL': return (a) => r(1 / a)
      case 'SQRT': return (a) => r(Math.sqrt(a))
      case 'TRUNC': return (a) => r(Math.trunc(a))
      case 'POW': return (a, b) => r(Math.pow(a, b))
      case 'FMA': return d.name === 'float64' ? fma64 : (a, b, c) => r(fma32(a, b, c))
    }
  } else if (d.bits === 64) {
    const w = d.isUnsigned ? (x) => BigInt.asUintN(64, x) : (x) => BigInt.asIntN(64, x)
    switch (op) {
      case 'ADD': return (a, b) => w(a + b)
      case 'MUL': return (a, b) => w(a * b)
      case 'NEG': return (a) => w(-a)
      case 'IDIV': return (a, b) => w(a / (b === 0n ? 1n : b))
      case 'MOD': return (a, b) => w(a % (b === 0n ? 1n : b))
      case 'MAX': return (a, b) => (a > b ? a : b)
      case 'AND': return (a, b) => w(a & b)
      case 'OR': return (a, b) => w(a | b)
      case 'XOR': return (a, b) => w(a ^ b)
      case 'SHL': return (a, b) => w(a << BigInt(b))
      case 'SHR': return (a, b) => w(a >> BigInt(b))
      case 'TRUNC': return (a) => a
      case 'FMA': return (a, b, c) => w(a * b + c)
    }
  } else {
    const w = d.bits === 32 ? (d.isUnsigned ? (x) => x >>> 0 : (x) => x | 0) : (x) => wrapInt(x, d)
    switch (op) {
      case 'ADD': return (a, b) => w(a + b)
      case 'MUL': return (a, b) => w(Math.imul(a, b))
      case 'NEG': return (a) => w(-a)
      case 'IDIV': return (a, b) => w(Math.trunc(a / (b === 0 ? 1 : b)))
      case 'MOD': return (a, b) => w(a % (b === 0 ? 1 : b))
      case 'MAX': return (a, b) => (a > b ? a : b)
      case 'AND': return (a, b) => w(a & b)
      case 'OR': return (a, b) => w(a | b)
      case 'XOR': return (a, b) => w(a ^ b)
      case 'SHL': return (a, b) => w(a << b)
      case 'SHR': return d.isUnsigned ? (a, b) => w(a >>> b) : (a, b) => w(a >> b)
      case 'TRUNC': return (a) => a
      case 'FMA': return (a, b, c) => w(Math.imul(a, b) + c)
    }
  }
  return null
}

module.exports = { aluFn, cast, bitcast, toStore, fromStore, fma32, fma64 }
