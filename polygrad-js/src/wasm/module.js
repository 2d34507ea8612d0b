'use strict'
/**
 * One WebAssembly module for a set of kernel call sites: the helpers, one function per call site, the
 * imported memory. `buildModule(sites) -> {bytes, imports(memory)}`; compile and instantiate it with
 * WebAssembly.Module/Instance (synchronous, Node) or WebAssembly.compile (async, browsers).
 */

const { moduleBytes, T } = require('./encode')
const { helperFuncs, IMPORTS } = require('./helpers')
const { KernelEmitter } = require('./emit')

/** sites: [{prog, layout: Map slot -> {base, size}}]. Exports k0, k1, ... in the same order. A module over a
 * shared memory (threads) imports it as shared with `maxPages`. `fma`: a reduction's multiply-add may use
 * relaxed SIMD's f32x4.relaxed_madd (only where relaxedSimdSupported()). */
function buildModule (sites, memoryPages, maxPages, { fma = false } = {}) {
  const types = []
  const typeIndex = (params, results) => {
    const key = params.join(',') + '>' + results.join(',')
    let i = types.findIndex((t) => t.key === key)
    if (i < 0) {
      i = types.length
      types.push({ key, params, results })
    }
    return i
  }
  const imports = [{ module: 'pg', name: 'memory', kind: 'memory', min: memoryPages, max: maxPages }]
  const impIdx = {}
  IMPORTS.forEach((im, i) => {
    imports.push({ module: 'pg', name: im.name, kind: 'func', type: typeIndex(im.params, im.results) })
    impIdx[im.name] = i
  })
  const { funcs: helpers, idx } = helperFuncs(IMPORTS.length)
  const funcs = helpers.map((h) => ({ type: typeIndex(h.params, h.results), locals: h.locals, body: h.body }))
  const exports = []
  sites.forEach((site, k) => {
    const f = new KernelEmitter(site.prog, site.layout, idx, impIdx, { fma }).emit()
    exports.push({ name: `k${k}`, func: funcs.length })
    funcs.push({ type: typeIndex(f.params, []), locals: f.locals, body: f.body })
  })
  return moduleBytes({ types, imports, funcs, exports })
}

/** The import object for a module over `memory` (a WebAssembly.Memory). */
function importObject (memory) {
  const pg = { memory }
  for (const im of IMPORTS) pg[im.name] = im.fn
  return { pg }
}

let simd = null
/** Whether this engine validates 128-bit SIMD (a tiny module with one v128 op). */
function simdSupported () {
  if (simd !== null) return simd
  try {
    // (func (result v128) v128.const i32x4 0 0 0 0)
    const bytes = new Uint8Array([0, 97, 115, 109, 1, 0, 0, 0, 1, 5, 1, 96, 0, 1, T.v128, 3, 2, 1, 0, 10, 22, 1, 20, 0,
      0xfd, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 11])
    simd = typeof WebAssembly === 'object' && WebAssembly.validate(bytes)
  } catch (e) {
    simd = false
  }
  return simd
}

let relaxed = null
/** Whether this engine validates relaxed SIMD's f32x4.relaxed_madd (Chrome 114+, Firefox 145+, Node 22+; Node 20
 * only behind --experimental-wasm-relaxed-simd). */
function relaxedSimdSupported () {
  if (relaxed !== null) return relaxed
  try {
    // (func (param v128 v128 v128) (result v128) local.get 0 local.get 1 local.get 2 f32x4.relaxed_madd)
    const bytes = new Uint8Array([0, 97, 115, 109, 1, 0, 0, 0, 1, 8, 1, 96, 3, T.v128, T.v128, T.v128, 1, T.v128, 3, 2, 1, 0,
      10, 13, 1, 11, 0, 0x20, 0, 0x20, 1, 0x20, 2, 0xfd, 0x85, 0x02, 11])
    relaxed = typeof WebAssembly === 'object' && WebAssembly.validate(bytes)
  } catch (e) {
    relaxed = false
  }
  return relaxed
}

let relaxedDot = null
/**
 * Whether this engine's i32x4.relaxed_dot_i8x16_i7x16_add_s (an int8 dot product) computes what the standard
 * says: run on a probe, not only validated. Node 20 validates it behind --experimental-wasm-relaxed-simd but
 * returns another result (twice the products, without the addend: V8 11.3's draft of the proposal), so it
 * stays on the plain path there. Chromium 114+ (the proposal's standard form) passes.
 */
function relaxedDotSupported () {
  if (relaxedDot !== null) return relaxedDot
  relaxedDot = false
  try {
    if (typeof WebAssembly !== 'object' || !relaxedSimdSupported()) return relaxedDot
    const a = Int8Array.from({ length: 16 }, (_, i) => (i * 37) % 256 - 128) // -128 among them
    const b = Int8Array.from({ length: 16 }, (_, i) => (i * 53 + 127) % 128) // 127 among them
    const acc = Int32Array.of(5, -6, 7, -8)
    const want = Int32Array.from(acc, (v, j) => v + [0, 1, 2, 3].reduce((s, k) => s + a[4 * j + k] * b[4 * j + k], 0))
    const bytesOf = (t) => Array.from(new Uint8Array(t.buffer))
    // (func (result i32) (i32x4.all_true (i32x4.eq (relaxed_dot_add a b acc) want)))
    const code = [0xfd, 0x0c, ...bytesOf(a), 0xfd, 0x0c, ...bytesOf(b), 0xfd, 0x0c, ...bytesOf(acc), 0xfd, 0x93, 0x02,
      0xfd, 0x0c, ...bytesOf(want), 0xfd, 0x37, 0xfd, 0xa3, 0x01, 11]
    const bytes = new Uint8Array([0, 97, 115, 109, 1, 0, 0, 0, 1, 5, 1, 96, 0, 1, T.i32, 3, 2, 1, 0, 7, 5, 1, 1, 102, 0, 0,
      10, code.length + 3, 1, code.length + 1, 0, ...code])
    relaxedDot = new WebAssembly.Instance(new WebAssembly.Module(bytes)).exports.f() === 1
  } catch (e) {
    relaxedDot = false
  }
  return relaxedDot
}

module.exports = { buildModule, importObject, simdSupported, relaxedSimdSupported, relaxedDotSupported }
