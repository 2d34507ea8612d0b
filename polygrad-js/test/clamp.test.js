'use strict'
// Float32 lane selects on a comparison of their own two values (wasm/emit.js clampSelects): `a < b ? a : b` and
// `a < b ? b : a`, the exp2 decomposition's range clamps (GPT-2's tanh GELU holds four an element, its softmax's
// exp one), emitted as f32x4.pmin and f32x4.pmax instead of a comparison and a bit select, with the same bits
// as the select (NaNs and signed zeros included) against a plain JavaScript reference.
const test = require('node:test')
const assert = require('node:assert')
const { Graph } = require('../src/ir')
const { DTYPES } = require('../src/dtypes')
const { chooseOpts } = require('../src/lower')
const { lowerKernel, prepareKernel } = require('../src/compile')
const { buildModule, importObject } = require('../src/wasm/module')
const { KernelEmitter } = require('../src/wasm/emit')

const f32 = DTYPES.float32
const i32 = DTYPES.int32
const N = 16

/** out[i] = x[i] < y[i] ? pick(x, y) : pick(y, x) as `order` says: 'min' (x < y ? x : y), 'max' (x < y ? y : x),
 * or 'other' (x < y ? x : 2y: no clamp, a plain select) */
function kernel (order) {
  const g = new Graph()
  const buf = (slot) => g.node('DEFINE_GLOBAL', f32, [], [slot, [N]])
  const i = g.node('RANGE', i32, [g.const(i32, N)], [0, 'global'])
  const ld = (slot) => g.node('LOAD', f32, [g.node('INDEX', f32, [buf(slot), i])])
  const x = ld(1)
  const y = ld(2)
  const lt = g.alu('CMPLT', x, y)
  const v = order === 'min' ? g.alu('WHERE', lt, x, y) : order === 'max' ? g.alu('WHERE', lt, y, x) : g.alu('WHERE', lt, x, g.alu('ADD', y, y))
  const st = g.node('STORE', null, [g.node('INDEX', f32, [buf(0), i]), v])
  const ast = g.node('SINK', null, [g.node('END', null, [st, i])])
  const prepared = prepareKernel(g, ast)
  return lowerKernel(g, ast, { width: 4, prepared, opts: chooseOpts(prepared.ast, 4), verify: true })
}

const X = Float32Array.of(1, -1, 0, -0, 0, -0, NaN, 2, NaN, Infinity, -Infinity, 3.5, -2.25, 1e-40, 7, -0)
const Y = Float32Array.of(2, -2, -0, 0, 0, -0, 1, NaN, NaN, 5, -Infinity, 3.5, 8, -1e-40, -7, 0)

function run (prog) {
  const layout = new Map([0, 1, 2].map((s) => [s, { base: 64 + s * 128, size: N }]))
  const memory = new WebAssembly.Memory({ initial: 1 })
  const inst = new WebAssembly.Instance(new WebAssembly.Module(buildModule([{ prog, layout }], 1)), importObject(memory))
  const view = new Float32Array(memory.buffer)
  view.set(X, layout.get(1).base / 4)
  view.set(Y, layout.get(2).base / 4)
  inst.exports.k0()
  const stats = new KernelEmitter(prog, layout, {}, {}).emit().stats
  return { out: view.slice(layout.get(0).base / 4, layout.get(0).base / 4 + N), stats }
}

// the bits of a float32 (NaN's payload aside: wasm leaves it to the engine)
const bits = (v) => (Number.isNaN(v) ? 'NaN' : Object.is(v, -0) ? '-0' : String(v))

test('a < b ? a : b and a < b ? b : a take one pmin / pmax a vector, bits as the select', () => {
  const ref = { min: (a, b) => (a < b ? a : b), max: (a, b) => (a < b ? b : a), other: (a, b) => (a < b ? a : Math.fround(b + b)) }
  for (const order of ['min', 'max', 'other']) {
    const prog = kernel(order)
    assert.ok(prog.vectorized, `${order}: in lanes`)
    const { out, stats } = run(prog)
    if (order === 'other') assert.strictEqual(stats.clampSelects, 0, 'a select of other values stays a select')
    else assert.ok(stats.clampSelects >= 1, `${order}: ${stats.clampSelects} pmin/pmax`)
    for (let i = 0; i < N; i++) {
      assert.strictEqual(bits(out[i]), bits(Math.fround(ref[order](X[i], Y[i]))), `${order}: x=${bits(X[i])} y=${bits(Y[i])}`)
    }
  }
})
