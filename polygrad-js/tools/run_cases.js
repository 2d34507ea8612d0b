#!/usr/bin/env node
'use strict'
/**
 * Run a plan of cases against the package and write the results: the Node half of the cross-language
 * tests (tests/test_js.py). Usage: node tools/run_cases.js plan.json results.json
 *
 * plan.json: {"cases": [{"name", "bundle" (path), "backend"?, "threads"?, "repeat"?: n, "before"?: {input: Array}, "forward"?:
 *   {input: Array}, "fit"?: {
 *   "data": {name: Array}, "options": {...}}, "calls"?: [{"entry", "inputs": {name: Array}, "args"?: {Variable:
 *   int}}], "greedy"?: {"prompt": Array, "steps": n}, "save"?: path, "plan"?: true}]}; arrays are {dtype, shape, data
 * (base64, little-endian)}. Steps run in that order on one model (before: a forward before the fit, fit,
 * forward, calls, greedy, save); the forward steps run `repeat` times each.
 * results.json: {name: {"before": {name: array}, "outputs": {name: array}, "losses": [...], "calls": [{name: array}], "tokens": [...],
 * "plan"?: (kernelPlan below), "stats": the executor's counters, "error"?}}. `greedy` continues a [1, length] prompt of input_ids as polygrad_hf.generate does with top_k=1:
 * forward over the prompt, then decode(input_ids, pos) one token at a time, each the argmax of the last logits.
 */

const fs = require('fs')
const path = require('path')
const { Model } = require(path.join(__dirname, '..'))
const { DTYPES } = require('../src/dtypes')

function decode (a) {
  const raw = Buffer.from(a.data, 'base64')
  const ab = new ArrayBuffer(raw.length)
  new Uint8Array(ab).set(raw)
  const T = DTYPES[a.dtype].store
  return { data: new T(ab), shape: a.shape }
}

function encode (arr) {
  const dtype = arr instanceof Float32Array ? 'float32' : arr instanceof Int32Array ? 'int32' : arr instanceof Float64Array ? 'float64'
    : arr instanceof BigInt64Array ? 'int64' : arr instanceof Uint8Array ? 'uint8' : arr instanceof Uint32Array ? 'uint32' : 'float32'
  return { dtype, shape: arr.shape, data: Buffer.from(arr.buffer, arr.byteOffset, arr.byteLength).toString('base64') }
}

function argmaxLast (logits) {
  const vocab = logits.shape[logits.shape.length - 1]
  const last = logits.subarray(logits.length - vocab)
  let best = 0
  for (let i = 1; i < vocab; i++) if (last[i] > last[best]) best = i
  return best
}

function greedy (m, prompt, steps) {
  const t = prompt.shape[1]
  const out = Array.from(prompt.data)
  let logits = m.forward({ input_ids: prompt }).logits
  for (let s = 0; s < steps; s++) {
    const next = argmaxLast(logits)
    out.push(next)
    if (s === steps - 1) break
    logits = m.call('decode', { input_ids: { data: Int32Array.of(next), shape: [1, 1] }, pos: t + s }).logits
  }
  return out
}

/**
 * Per entrypoint, per kernel call (copies left out): {name, opts: ["KIND:amount", ...] (lower.chooseOpts),
 * params: [{name, shape}] of the parameters the kernel loads, blocks: the names of the uint8 state buffers
 * it loads (quantized weights' blocks), packs: the packed copies the call reads when it
 * runs its constant-size variant (runtime.js packedMain), 0 without one}. Only the entrypoints compiled so far.
 */
function kernelPlan (m) {
  const { chooseOpts } = require('../src/lower')
  const { toposort } = require('../src/ir')
  const x = m._x
  const out = {}
  for (const [name, steps] of Object.entries(x.entries)) {
    const calls = m._p.entries[name].calls
    out[name] = steps.map((st, i) => {
      if (st.copy) return null
      const c = calls[i]
      const ast = m._p.kernels[c.kernel]
      const loaded = new Set(toposort(ast).filter((n) => n.op === 'LOAD').map((n) => n.src[0].src[0].arg[0]))
      const params = [...loaded].map((j) => c.args[j]).filter((s) => s && s.role === 'parameter').map((s) => ({ name: s.name, shape: s.shape }))
      const blocks = [...loaded].map((j) => c.args[j]).filter((s) => s && s.role === 'state' && s.dtype.name === 'uint8').map((s) => s.name)
      const opts = chooseOpts(x.prepare1(ast).ast, x.width).map((o) => `${o.kind}:${o.amount}`)
      const lowered = x.lowered.get(ast)
      return { name: st.name, opts, params, blocks, packs: st.packedMain ? st.mainPacks.length : 0, vectorized: !!(lowered && lowered.vectorized) }
    }).filter(Boolean)
  }
  return out
}

function main () {
  const plan = JSON.parse(fs.readFileSync(process.argv[2], 'utf8'))
  const out = {}
  for (const c of plan.cases) {
    const r = out[c.name] = {}
    let m
    try {
      const t0 = performance.now()
      m = Model.load(c.bundle, Object.assign({ verify: true }, c.backend ? { backend: c.backend } : {}, c.threads ? { threads: c.threads } : {}))
      r.load_ms = performance.now() - t0
      const inputs = (src) => Object.fromEntries(Object.entries(src).map(([k, v]) => [k, decode(v)]))
      const encodeAll = (o) => Object.fromEntries(Object.entries(o).map(([k, v]) => [k, encode(v)]))
      const repeat = c.repeat || 1 // forward steps run this many times (the last one's outputs are kept)
      const forward = (x) => { let o; for (let i = 0; i < repeat; i++) o = m.forward(inputs(x)); return encodeAll(o) }
      if (c.before) r.before = forward(c.before)
      if (c.fit) r.losses = m.fit(inputs(c.fit.data), c.fit.options || {})
      if (c.forward) r.outputs = forward(c.forward)
      if (c.calls) r.calls = c.calls.map((k) => encodeAll(m.call(k.entry, Object.assign(inputs(k.inputs), k.args || {}))))
      if (c.greedy) r.tokens = greedy(m, decode(c.greedy.prompt), c.greedy.steps)
      if (c.save) fs.writeFileSync(c.save, m.save())
      if (c.plan) r.plan = kernelPlan(m)
      r.summary = m.summary()
      r.stats = m._x.stats
    } catch (e) {
      r.error = `${e.constructor.name}: ${e.message}`
    } finally {
      if (m) m.dispose()
    }
  }
  fs.writeFileSync(process.argv[3], JSON.stringify(out))
}

main()
