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

module.exports = { buildModule, importObject, simdSupported, relaxedSimdSupported }
