'use strict'
/**
 * Caller data in and results out: the input forms of docs/bundle-format.md section 3 for JavaScript.
 *
 * Stage: user API. An input is a typed array or a plain array read with the signature's shape, a nested
 * plain array of exactly that shape, or {data, shape}; any dimension may be a Variable's size (flat data:
 * one at most). `readInput(spec, value, variables)` -> {values (flat), dims (Variable -> size)};
 * `writeValues` puts them into a buffer; `readOutput` copies a result out as a typed array with `.shape`.
 */

const { ModelInputError } = require('./errors')
const { f32ToF16Bits, f16BitsToF32, f32ToBf16Bits, bf16BitsToF32 } = require('./dtypes')

const FLOAT_ARRAYS = [Float32Array, Float64Array]
const INT_ARRAYS = [Int8Array, Uint8Array, Uint8ClampedArray, Int16Array, Uint16Array, Int32Array, Uint32Array]
const BIG_ARRAYS = [BigInt64Array, BigUint64Array]

function kindOfArray (a) {
  if (FLOAT_ARRAYS.some((T) => a instanceof T)) return 'float'
  if (INT_ARRAYS.some((T) => a instanceof T)) return 'int'
  if (BIG_ARRAYS.some((T) => a instanceof T)) return 'bigint'
  return null
}

const shapeText = (sh) => '[' + sh.join(', ') + ']'

/** The shape of a nested plain array (rectangular), or throws. */
function nestedShape (v, what) {
  const shape = []
  let cur = v
  while (Array.isArray(cur)) {
    shape.push(cur.length)
    cur = cur[0]
  }
  const check = (x, depth) => {
    if (depth === shape.length) {
      if (Array.isArray(x)) throw new ModelInputError(`${what} is a ragged nested array; give equal-length rows`)
      return
    }
    if (!Array.isArray(x) || x.length !== shape[depth]) throw new ModelInputError(`${what} is a ragged nested array; give equal-length rows`)
    for (const y of x) check(y, depth + 1)
  }
  check(v, 0)
  return shape
}

function flatten (v, out = []) {
  if (Array.isArray(v)) for (const x of v) flatten(x, out)
  else out.push(v)
  return out
}

/** Checks that every value can be an element of dtype d; returns them (typed array or plain array). */
function checkValues (values, d, what) {
  const kind = kindOfArray(values)
  if (kind !== null) {
    if (kind === 'float' && !d.isFloat) throw new ModelInputError(`${what} is a ${values.constructor.name}; expected ${d.name} (integers: use an Int32Array or a plain array of integers)`)
    if (kind === 'bigint' && d.isFloat) return Array.from(values, Number)
    if (kind === 'bigint' && d.bits !== 64) return Array.from(values, Number)
    if (kind !== 'bigint' && d.bits === 64 && !d.isFloat) return Array.from(values, (x) => BigInt(x))
    return values
  }
  const out = new Array(values.length)
  for (let i = 0; i < values.length; i++) {
    let x = values[i]
    if (typeof x === 'boolean') x = x ? 1 : 0
    if (typeof x === 'bigint') {
      if (d.isFloat) x = Number(x)
    } else if (typeof x !== 'number') {
      throw new ModelInputError(`${what}: element ${i} is ${x === null ? 'null' : typeof x}; expected a number (${d.name})`)
    } else if (!d.isFloat && !Number.isInteger(x)) {
      throw new ModelInputError(`${what}: element ${i} is ${x}; ${d.name} needs integers`)
    }
    if (d.bits === 64 && !d.isFloat && typeof x === 'number') x = BigInt(x)
    out[i] = x
  }
  return out
}

/**
 * {values, dims, rows, perRow} of one input value for `spec`: `dims` maps each Variable named in the spec's
 * shape to the size the value gives it (within its bounds); `rows` is the leading size when `leading` (fit:
 * the value is read as samples, any number of them, the rest as the spec) and null otherwise; `perRow` is
 * the element count of one leading row. Flat data takes the spec's shape, with one Variable dim at most.
 */
function readInput (spec, value, variables, opts) {
  if (opts === undefined && ArrayBuffer.isView(value)) {
    const fast = flatTyped(spec, value, variables)
    if (fast !== null) return fast
  }
  return readAnyInput(spec, value, variables, opts)
}

// typed arrays that a buffer of the dtype takes as they are (checkValues returns them unchanged)
const AS_IS = new Set(['float32', 'float64', 'int8', 'uint8', 'int16', 'uint16', 'int32', 'uint32'])

/**
 * readInput's common case without its general machinery: flat data in the typed array of the spec's dtype,
 * at most one Variable dimension, every check passing. Null otherwise (readAnyInput then gives the answer or
 * the error).
 */
function flatTyped (spec, values, variables) {
  const d = spec.dtype
  if (values.constructor !== d.store || !AS_IS.has(d.name)) return null
  let fixed = 1
  let free = null
  let perRow = 1
  spec.shape.forEach((dim, i) => {
    if (typeof dim !== 'string') fixed *= dim
    else if (free === null) free = dim
    else free = false
    if (i > 0) perRow *= typeof dim === 'string' ? variables.get(dim)[1] : dim
  })
  if (free === false) return null
  if (free === null) return values.length === fixed ? { values, dims: new Map(), rows: null, perRow } : null
  if (fixed === 0 || values.length % fixed) return null
  const n = values.length / fixed
  const [lo, hi] = variables.get(free)
  if (n < lo || n > hi) return null
  return { values, dims: new Map([[free, n]]), rows: null, perRow }
}

function readAnyInput (spec, value, variables, { leading = false, what = `input '${spec.name}'` } = {}) {
  const free = spec.shape.map((d, i) => (leading && i === 0) || typeof d === 'string')
  const perRow = spec.shape.slice(1).reduce((a, b) => a * (typeof b === 'string' ? variables.get(b)[1] : b), 1)
  const want = () => (leading ? '[samples' + spec.shape.slice(1).map((d) => ', ' + d).join('') + ']' : shapeText(spec.shape)) // for messages
  let values, shape
  if (value !== null && typeof value === 'object' && !Array.isArray(value) && !ArrayBuffer.isView(value)) {
    if (!('data' in value) || !('shape' in value)) throw new ModelInputError(`${what} must be a typed array, an array, or {data, shape}`)
    shape = value.shape
    if (!Array.isArray(shape) || !shape.every((d) => Number.isInteger(d) && d >= 0)) throw new ModelInputError(`${what}.shape must be a list of non-negative integers`)
    values = ArrayBuffer.isView(value.data) ? value.data : Array.isArray(value.data) ? flatten(value.data) : null
    if (values === null) throw new ModelInputError(`${what}.data must be a typed array or an array`)
    const n = shape.reduce((a, b) => a * b, 1)
    if (values.length !== n) throw new ModelInputError(`${what} has ${values.length} values for shape ${shapeText(shape)}`)
  } else if (ArrayBuffer.isView(value) && !(value instanceof DataView)) {
    values = value
  } else if (Array.isArray(value)) {
    const sh = nestedShape(value, what)
    values = flatten(value)
    if (sh.length > 1 || (sh.length === 1 && spec.shape.length === 1)) shape = sh
  } else {
    throw new ModelInputError(`${what} must be a typed array, an array, or {data, shape}; got ${value === null ? 'null' : typeof value}`)
  }
  if (shape === undefined) {
    // flat data: the signature gives the shape, the one free dimension (if any) takes what is left
    const nFree = free.filter(Boolean).length
    if (nFree > 1) throw new ModelInputError(`${what} has ${nFree} Variable dimensions ${want()}; pass {data, shape} or a nested array of that shape, not flat data`)
    const fixed = spec.shape.reduce((a, d, i) => (free[i] ? a : a * d), 1)
    if (nFree === 1) {
      if (fixed === 0 ? values.length !== 0 : values.length % fixed) throw new ModelInputError(`${what} has ${values.length} values; expected a multiple of ${fixed} for shape ${want()}`)
      shape = spec.shape.map((d, i) => (free[i] ? (fixed ? values.length / fixed : 0) : d))
    } else {
      if (values.length !== fixed) throw new ModelInputError(`${what} has ${values.length} values; expected ${fixed} for shape ${want()}`)
      shape = spec.shape.slice()
    }
  }
  const fixedOk = shape.length === spec.shape.length && spec.shape.every((d, i) => free[i] || d === shape[i])
  if (!fixedOk) throw new ModelInputError(`${what} has shape ${shapeText(shape)}; expected ${want()}`)
  const dims = new Map()
  spec.shape.forEach((d, i) => {
    if (typeof d !== 'string' || (leading && i === 0)) return
    const [lo, hi] = variables.get(d)
    if (shape[i] < lo || shape[i] > hi) {
      throw new ModelInputError(`${what} has ${i === 0 ? `${shape[0]} rows` : `shape ${shapeText(shape)}`}; Variable '${d}' allows ${lo}..${hi}`)
    }
    if (dims.has(d) && dims.get(d) !== shape[i]) throw new ModelInputError(`${what} has shape ${shapeText(shape)}: the dimensions named '${d}' differ`)
    dims.set(d, shape[i])
  })
  return { values: checkValues(values, spec.dtype, what), dims, rows: leading ? shape[0] : null, perRow }
}

/** Write values (element `from` onwards, `count` of them) into a buffer of dtype d at element `start` of `view`. */
function writeValues (view, start, d, values, from = 0, count = values.length - from) {
  if (d.name === 'float16' || d.name === 'bfloat16') {
    const conv = d.name === 'float16' ? f32ToF16Bits : f32ToBf16Bits
    for (let i = 0; i < count; i++) view[start + i] = conv(Math.fround(Number(values[from + i])))
    return
  }
  if (ArrayBuffer.isView(values) && (from || count !== values.length)) values = values.subarray(from, from + count)
  else if (from || count !== values.length) values = values.slice(from, from + count)
  if (d.isBool) {
    for (let i = 0; i < count; i++) view[start + i] = values[i] ? 1 : 0
    return
  }
  view.set(values, start)
}

/** A copy of `count` elements of a buffer as a typed array (16-bit floats widened to float32), with `.shape`. */
function readOutput (view, start, d, count, shape) {
  let out
  if (d.name === 'float16' || d.name === 'bfloat16') {
    const conv = d.name === 'float16' ? f16BitsToF32 : bf16BitsToF32
    out = new Float32Array(count)
    for (let i = 0; i < count; i++) out[i] = conv(view[start + i])
  } else {
    out = view.slice(start, start + count)
  }
  Object.defineProperty(out, 'shape', { value: shape, enumerable: false })
  return out
}

module.exports = { readInput, writeValues, readOutput, shapeText }
