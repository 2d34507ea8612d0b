'use strict'
// The kernel-IR golden files of the Python suite (tests/golden/*.json), run by both JavaScript backends:
// results must match exactly ("exact" files, any NaN matching any NaN) or within the stored rtol/atol.
const test = require('node:test')
const assert = require('node:assert')
const fs = require('fs')
const path = require('path')
const ir = require('../src/ir')
const { lowerKernel } = require('../src/compile')
const { JSKernel } = require('../src/jsexec')
const { buildModule, importObject } = require('../src/wasm/module')
const { DTYPES, f16BitsToF32, bf16BitsToF32 } = require('../src/dtypes')
const { checkKernel } = require('../src/validate')
const { REPO, goldenLayout } = require('./helpers')

const DIR = path.join(REPO, 'tests', 'golden')
const files = fs.existsSync(DIR) ? fs.readdirSync(DIR).filter((f) => f.endsWith('.json')).sort() : []

function array (item) {
  const raw = Buffer.from(item.data, 'base64')
  const ab = new ArrayBuffer(raw.length)
  new Uint8Array(ab).set(raw)
  return new DTYPES[item.dtype].store(ab)
}

const asFloat = (a, name) => (name === 'float16' ? Float64Array.from(a, f16BitsToF32) : name === 'bfloat16' ? Float64Array.from(a, bf16BitsToF32) : a)

function compare (got, e, where) {
  const ref = array(e)
  const g = asFloat(got, e.dtype)
  const r = asFloat(ref, e.dtype)
  let bad = 0
  let first = -1
  for (let i = 0; i < r.length; i++) {
    const a = g[i]
    const b = r[i]
    const nan = a !== a && b !== b // eslint-disable-line no-self-compare
    const ok = e.compare === 'exact'
      ? nan || (a === b && (typeof a === 'bigint' || a !== 0 || Object.is(a, b)))
      : nan || a === b || Math.abs(a - b) <= e.atol + e.rtol * Math.abs(b)
    if (!ok && bad++ === 0) first = i
  }
  assert.strictEqual(bad, 0, `${where}: ${bad} elements differ, first at ${first}: ${g[first]} vs ${r[first]}`)
}

/** Run a golden kernel; with `parts`, its threaded form (phases, compile.js), each phase's slices run one at a
 * time from the last to the first (slices are independent, so any order gives the same bits). */
function run (obj, backend, parts = 0) {
  const g = new ir.Graph()
  const [k] = ir.decode(obj.kernel, g)
  checkKernel(k, obj.name)
  const prog = lowerKernel(g, k, { width: backend === 'wasm' ? 4 : 1, threaded: parts > 0 })
  const { layout, bytes } = goldenLayout(obj)
  const memory = new WebAssembly.Memory({ initial: Math.ceil(bytes.length / 65536) + 1 })
  new Uint8Array(memory.buffer).set(bytes)
  if (parts) {
    const bytes = buildModule(prog.phases.map((phase) => ({ prog: phase, layout })), memory.buffer.byteLength / 65536)
    const fns = new WebAssembly.Instance(new WebAssembly.Module(bytes), importObject(memory)).exports
    prog.phases.forEach((_, i) => { for (let p = parts - 1; p >= 0; p--) fns[`k${i}`](p, parts) })
  } else if (backend === 'wasm') {
    const bytes = buildModule([{ prog, layout }], memory.buffer.byteLength / 65536)
    new WebAssembly.Instance(new WebAssembly.Module(bytes), importObject(memory)).exports.k0()
  } else {
    const bufs = {}
    for (const [slot, L] of layout) bufs[slot] = { view: new L.d.store(memory.buffer), start: L.base / L.d.size, size: L.size }
    new JSKernel(prog).run(bufs, {})
  }
  const out = {}
  for (const [slot, L] of layout) out[slot] = new L.d.store(memory.buffer, L.base, L.size)
  return out
}

test('golden files are present', { skip: files.length ? false : 'no tests/golden (installed package)' }, () => {
  assert.ok(files.length >= 5)
})

for (const f of files) {
  const obj = JSON.parse(fs.readFileSync(path.join(DIR, f), 'utf8'))
  for (const backend of ['wasm', 'js']) {
    test(`golden ${obj.name} (${backend})`, () => {
      const out = run(obj, backend)
      for (const e of obj.expected) compare(out[e.slot], e, `${obj.name} slot ${e.slot}`)
    })
  }
  test(`golden ${obj.name}: split into slices of its outer loop (threads), bit for bit one call`, (t) => {
    const g = new ir.Graph()
    const [k] = ir.decode(obj.kernel, g)
    if (lowerKernel(g, k, { width: 4, threaded: true }).phases === null) return t.skip('not threadable (an accumulating store)')
    const whole = run(obj, 'wasm')
    for (const parts of [1, 2, 3, 7]) {
      const split = run(obj, 'wasm', parts)
      // bit for bit, a NaN matching any NaN (WebAssembly leaves a NaN's sign and payload to the engine: V8
      // folding a constant and the CPU computing it give different ones)
      for (const e of obj.expected) compare(split[e.slot], Object.assign({}, e, { data: Buffer.from(whole[e.slot].buffer, whole[e.slot].byteOffset, whole[e.slot].byteLength).toString('base64'), compare: 'exact' }), `${obj.name} in ${parts} parts, slot ${e.slot}`)
    }
  })
  if (!obj.kernel.nodes.some((n) => n[0] === 'REDUCE')) {
    test(`golden ${obj.name}: wasm and js agree bit for bit`, () => {
      const a = run(obj, 'wasm')
      const b = run(obj, 'js')
      for (const e of obj.expected) assert.deepStrictEqual(Buffer.from(a[e.slot].buffer, a[e.slot].byteOffset, a[e.slot].byteLength), Buffer.from(b[e.slot].buffer, b[e.slot].byteOffset, b[e.slot].byteLength))
    })
  }
}
