'use strict'
/**
 * Element types of the kernel IR (docs/kernel-ir.md), by their width-explicit serialised names (the table of
 * polygrad/definitions/dtypes.py, generated/dtypes.js), and the 16-bit float conversions. float16/bfloat16
 * are stored as 16-bit words and computed in float32; every result is rounded to the 16-bit format (nearest
 * even, NaN kept quiet), bit for bit as the C renderer's pg_f2h/pg_h2f/pg_f2b/pg_b2f helpers do.
 */

const { DTYPES: TABLE } = require('./generated/dtypes')

const f32 = new Float32Array(1)
const u32 = new Uint32Array(f32.buffer)

// what JavaScript adds to each dtype of the table: wasm, the value type a register of this dtype has; store,
// the typed array over its storage; half, a 16-bit float computed in float32
const HOST = {
  bool: { wasm: 'i32', store: Uint8Array },
  int8: { wasm: 'i32', store: Int8Array },
  uint8: { wasm: 'i32', store: Uint8Array },
  int16: { wasm: 'i32', store: Int16Array },
  uint16: { wasm: 'i32', store: Uint16Array },
  int32: { wasm: 'i32', store: Int32Array },
  uint32: { wasm: 'i32', store: Uint32Array },
  int64: { wasm: 'i64', store: BigInt64Array },
  uint64: { wasm: 'i64', store: BigUint64Array },
  float16: { wasm: 'f32', store: Uint16Array, half: true },
  bfloat16: { wasm: 'f32', store: Uint16Array, half: true },
  float32: { wasm: 'f32', store: Float32Array },
  float64: { wasm: 'f64', store: Float64Array }
}

function dt ({ name, itemsize, kind, min, max }) {
  if (!HOST[name]) throw new Error(`internal: dtype ${name} has no JavaScript storage (src/dtypes.js HOST)`)
  return Object.freeze(Object.assign({
    name, size: itemsize, bits: 8 * itemsize, kind, isFloat: kind === 'float', isInt: kind === 'int' || kind === 'uint',
    isUnsigned: kind === 'uint', isBool: kind === 'bool', range: min === null ? null : Object.freeze([min, max])
  }, HOST[name]))
}

const DTYPES = Object.fromEntries(TABLE.map((row) => [row.name, dt(row)]))
const NAMES = Object.keys(DTYPES)

/** The inclusive integer range of an int/bool dtype, as BigInts (a fresh pair). */
function intRange (d) {
  if (d.range === null) throw new Error(`internal: ${d.name} has no integer range`)
  return [d.range[0], d.range[1]]
}

/** An integer (Number or BigInt) wrapped to dtype d (two's complement); Number when it is safe. */
function wrapInt (v, d) {
  if (d.isBool) return v ? 1 : 0
  if (typeof v === 'number' && d.bits === 32) return d.isUnsigned ? v >>> 0 : v | 0
  const b = typeof v === 'bigint' ? v : BigInt(v)
  const w = d.isUnsigned ? BigInt.asUintN(d.bits, b) : BigInt.asIntN(d.bits, b)
  return (w >= -9007199254740991n && w <= 9007199254740991n) ? Number(w) : w
}

// ---- 16-bit floats (ports of the C renderer's helpers; x is a float32 value)
function f32ToF16Bits (x) {
  f32[0] = x
  let u = u32[0]
  const sign = u & 0x80000000
  u = (u ^ sign) >>> 0
  let o
  if (u >= (143 << 23)) {
    o = u > (255 << 23) ? 0x7e00 : 0x7c00
  } else if (u < (113 << 23)) {
    u32[0] = u
    f32[0] = f32[0] + 0.5 // magic 126 << 23 is 0.5; a float32 addition rounds the subnormal
    o = (u32[0] - (126 << 23)) & 0xffff
  } else {
    const odd = (u >>> 13) & 1
    o = (((u + 0xc8000fff + odd) >>> 0) >>> 13) & 0xffff
  }
  return (o | (sign >>> 16)) & 0xffff
}

function f16BitsToF32 (h) {
  let o = ((h & 0x7fff) << 13) >>> 0
  const e = o & (0x7c00 << 13)
  o = (o + ((127 - 15) << 23)) >>> 0
  if (e === (0x7c00 << 13)) {
    o = (o + ((128 - 16) << 23)) >>> 0
  } else if (e === 0) {
    u32[0] = (o + (1 << 23)) >>> 0
    f32[0] = f32[0] - 6.103515625e-05 // magic 113 << 23
    o = u32[0]
  }
  u32[0] = (o | ((h & 0x8000) << 16)) >>> 0
  return f32[0]
}

function f32ToBf16Bits (x) {
  f32[0] = x
  const u = u32[0]
  if ((u & 0x7fffffff) > 0x7f800000) return ((u >>> 16) | 0x40) & 0xffff
  return (((u + 0x7fff + ((u >>> 16) & 1)) >>> 0) >>> 16) & 0xffff
}

function bf16BitsToF32 (h) {
  u32[0] = (h << 16) >>> 0
  return f32[0]
}

const roundF16 = (x) => f16BitsToF32(f32ToF16Bits(x))
const roundBf16 = (x) => bf16BitsToF32(f32ToBf16Bits(x))

/** x (a JS number) rounded to what a register of dtype d holds (float32, or the 16-bit formats in float32). */
function roundFloat (x, d) {
  if (d.name === 'float64') return x
  const y = Math.fround(x)
  if (d.name === 'float16') return roundF16(y)
  if (d.name === 'bfloat16') return roundBf16(y)
  return y
}

module.exports = {
  DTYPES, NAMES, intRange, wrapInt, f32ToF16Bits, f16BitsToF32, f32ToBf16Bits, bf16BitsToF32, roundF16, roundBf16,
  roundFloat
}
