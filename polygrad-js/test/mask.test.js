'use strict'
// A bool mask read along a row in lanes (issue 34, BERT's attention in Node): the scores plus a mask's
// -10000 where a (row, key) pair is masked, and the row sums of those, as the softmax kernels of an ONNX BERT
// read its bool attention masks. Their kernels took no lanes at all (a bool buffer) and ran scalar: about a
// tenth of BERT's forward. Checked: both get lanes, and their results match a float64 reference (the
// elementwise one exactly), at rows the tiles do not divide, with masks of both values in every lane.
const test = require('node:test')
const assert = require('node:assert')
const { Graph } = require('../src/ir')
const { DTYPES } = require('../src/dtypes')
const { lowerKernel } = require('../src/compile')
const { buildModule, importObject } = require('../src/wasm/module')

const f32 = DTYPES.float32
const i32 = DTYPES.int32
const bool = DTYPES.bool

/** out[i, j] = x[i, j] + (rowMask[i] & keyMask[j] ? 0 : -10000), or with `sum` its sum over j: out[i]. */
function masked (R, N, sum) {
  const g = new Graph()
  const c = (v) => g.const(i32, v)
  const buf = (slot, n, d = f32) => g.node('DEFINE_GLOBAL', d, [], [slot, [n]])
  const i = g.node('RANGE', i32, [c(R)], [0, 'global'])
  const j = g.node('RANGE', i32, [c(N)], [1, sum ? 'reduce' : 'global'])
  const load = (slot, n, idx, d = f32) => g.node('LOAD', d, [g.node('INDEX', d, [buf(slot, n, d), idx])])
  const x = load(1, R * N, g.alu('ADD', g.alu('MUL', i, c(N)), j))
  const keep = g.alu('AND', load(2, R, i, bool), load(3, N, j, bool))
  const v = g.alu('ADD', x, g.node('WHERE', f32, [keep, g.const(f32, 0), g.const(f32, -10000)]))
  const value = sum ? g.node('REDUCE', f32, [v, j], 'ADD') : v
  const out = sum ? i : g.alu('ADD', g.alu('MUL', i, c(N)), j)
  const st = g.node('STORE', null, [g.node('INDEX', f32, [buf(0, sum ? R : R * N), out]), value])
  return { g, ast: g.node('SINK', null, [g.node('END', null, sum ? [st, i] : [st, i, j])]) }
}

let seed = 99
const rand = () => {
  seed = (seed * 1103515245 + 12345) % 2147483648
  return seed / 1073741824 - 1
}

test('a bool mask along a row loads in lanes; masked scores and their row sums match float64', () => {
  for (const [R, N] of [[5, 12], [7, 32], [3, 20]]) {
    for (const sum of [false, true]) {
      const { g, ast } = masked(R, N, sum)
      const prog = lowerKernel(g, ast, { width: 4, verify: true })
      assert.ok(prog.vectorized, `R=${R} N=${N} ${sum ? 'sums' : 'scores'}: lanes`)
      const sizes = [sum ? R : R * N, R * N, R, N]
      const layout = new Map()
      let pos = 64
      sizes.forEach((n, slot) => {
        layout.set(slot, { base: pos, size: n })
        pos += Math.ceil(n * 4 / 64) * 64 + 64
      })
      const memory = new WebAssembly.Memory({ initial: 2 })
      const inst = new WebAssembly.Instance(new WebAssembly.Module(buildModule([{ prog, layout }], 2)), importObject(memory))
      const f = new Float32Array(memory.buffer)
      const u8 = new Uint8Array(memory.buffer)
      const X = Float32Array.from({ length: R * N }, rand)
      const rowMask = Uint8Array.from({ length: R }, (_, i) => (i % 3 === 2 ? 0 : 1))
      const keyMask = Uint8Array.from({ length: N }, (_, j) => ((j * 7) % 5 === 1 ? 0 : 1))
      f.set(X, layout.get(1).base / 4)
      u8.set(rowMask, layout.get(2).base)
      u8.set(keyMask, layout.get(3).base)
      f.fill(NaN, layout.get(0).base / 4, layout.get(0).base / 4 + sizes[0])
      inst.exports.k0()
      const out = f.subarray(layout.get(0).base / 4)
      for (let i = 0; i < R; i++) {
        let exact = 0
        let mag = 0
        for (let j = 0; j < N; j++) {
          const v = Math.fround(X[i * N + j] + (rowMask[i] && keyMask[j] ? 0 : -10000))
          if (!sum) assert.strictEqual(out[i * N + j], v, `R=${R} N=${N} (${i}, ${j})`)
          exact += v
          mag += Math.abs(v)
        }
        if (sum) assert.ok(Math.abs(out[i] - exact) <= (N + 1) * 2 ** -24 * mag, `R=${R} N=${N} row ${i}: ${out[i]} vs ${exact}`)
      }
    }
  }
})
