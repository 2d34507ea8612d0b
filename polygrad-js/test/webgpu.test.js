'use strict'
// The webgpu backend in Node (Dawn from the optional `webgpu` package; without a GPU, on the CPU through
// SwiftShader: tools/test.js sets the environment): every golden kernel, the fixtures' forwards and a
// fine-tune match wasm within 1e-5 relative; the API rules of an asynchronous backend; auto selection.
const test = require('node:test')
const assert = require('node:assert')
const fs = require('fs')
const path = require('path')
const api = require('..')
const ir = require('../src/ir')
const { lowerKernel } = require('../src/compile')
const { buildModule, importObject, relaxedSimdSupported } = require('../src/wasm/module')
const { emitWGSL, WORKGROUP } = require('../src/webgpu/emit')
const { sizeValue } = require('../src/lower')
const { PART, PARTS } = require('../src/linearize')
const { f16BitsToF32, bf16BitsToF32 } = require('../src/dtypes')
const { fixture, reference, maxRel, REPO, goldenLayout } = require('./helpers')

const { Model, ModelError } = api
const gpu = api._internals.webgpu
const ref = reference()

let found = null
async function adapter () {
  if (!found) found = await gpu.adapterInfo()
  return found
}

/** Skip (with the reason) when no adapter can be created here. */
async function needGPU (t) {
  const f = await adapter()
  if (!f.adapter) t.skip(`no WebGPU adapter: ${f.reason}`)
  return !!f.adapter
}

const loadGPU = (name, opts = {}) => Model.fromBytes(fixture(name), Object.assign({ backend: 'webgpu' }, opts))
const loadWasm = (name) => Model.fromBytesSync(fixture(name), { threads: 1 })

/** max relative difference, a NaN matching a NaN */
function rel (a, b) {
  let m = 0
  for (let i = 0; i < b.length; i++) {
    const x = Number(a[i])
    const y = Number(b[i])
    if (x !== x && y !== y) continue // eslint-disable-line no-self-compare
    if (x === y) continue
    m = Math.max(m, Math.abs(x - y) / Math.max(Math.abs(y), 1e-6))
  }
  return m
}

// ---- golden kernels (tests/golden/*.json): one kernel on the GPU, as the runtime dispatches it
const GOLDEN = path.join(REPO, 'tests', 'golden')
const goldens = fs.existsSync(GOLDEN) ? fs.readdirSync(GOLDEN).filter((f) => f.endsWith('.json')).sort() : []


const floats = (a, name) => (name === 'float16' ? Float64Array.from(a, f16BitsToF32) : name === 'bfloat16' ? Float64Array.from(a, bf16BitsToF32) : a)

function goldenWasm (obj) {
  const g = new ir.Graph()
  const [k] = ir.decode(obj.kernel, g)
  const { layout, bytes } = goldenLayout(obj)
  const memory = new WebAssembly.Memory({ initial: Math.ceil(bytes.length / 65536) + 1 })
  new Uint8Array(memory.buffer).set(bytes)
  const prog = lowerKernel(g, k, { width: 4 })
  new WebAssembly.Instance(new WebAssembly.Module(buildModule([{ prog, layout }], memory.buffer.byteLength / 65536)), importObject(memory)).exports.k0()
  return new Uint8Array(memory.buffer)
}

async function goldenGPU (obj, device) {
  const g = new ir.Graph()
  const [k] = ir.decode(obj.kernel, g)
  const { layout, bytes } = goldenLayout(obj)
  const prog = lowerKernel(g, k, { width: 1, opts: [], threaded: true })
  const mem = device.createBuffer({ size: bytes.length, usage: 0x80 | 0x04 | 0x08 })
  device.queue.writeBuffer(mem, 0, bytes)
  const enc = device.createCommandEncoder()
  const phases = prog.phases ? prog.phases.map((ph, i) => [ph, k.src[i].src[1]]) : [[prog, null]]
  const extra = []
  for (const [ph, trip] of phases) {
    const shader = emitWGSL(ph, layout)
    const pipeline = await device.createComputePipelineAsync({ layout: 'auto', compute: { module: device.createShaderModule({ code: shader.code }), entryPoint: 'main' } })
    const entries = [{ binding: 0, resource: { buffer: mem } }]
    const n = trip ? sizeValue(trip.src[0], new Map()) : 1
    if (shader.params) {
      const P = device.createBuffer({ size: 256, usage: 0x80 | 0x08 })
      device.queue.writeBuffer(P, 0, Int32Array.from(ph.vars, (v) => (v === PARTS ? n : 0)))
      entries.push({ binding: 1, resource: { buffer: P } })
      extra.push(P)
    }
    const pass = enc.beginComputePass()
    pass.setPipeline(pipeline)
    pass.setBindGroup(0, device.createBindGroup({ layout: pipeline.getBindGroupLayout(0), entries }))
    pass.dispatchWorkgroups(ph.vars[0] === PART ? Math.ceil(n / WORKGROUP) : 1)
    pass.end()
  }
  const staging = device.createBuffer({ size: bytes.length, usage: 0x01 | 0x08 })
  enc.copyBufferToBuffer(mem, 0, staging, 0, bytes.length)
  device.queue.submit([enc.finish()])
  await staging.mapAsync(1)
  const out = new Uint8Array(staging.getMappedRange()).slice()
  staging.unmap()
  for (const b of [mem, staging, ...extra]) b.destroy()
  return out
}

/** Whether a golden kernel computes in a 64-bit type once lowered (SIN's argument reduction is float64). */
function hasWide (obj) {
  const g = new ir.Graph()
  const [k] = ir.decode(obj.kernel, g)
  const prog = lowerKernel(g, k, { width: 1, opts: [] })
  const walk = (insts) => insts.some((x) => (x.dtype && x.dtype.bits === 64) || (x.pre && walk(x.pre)) || (x.body && walk(x.body)))
  return walk(prog.head) || walk(prog.body)
}

for (const f of goldens) {
  const obj = JSON.parse(fs.readFileSync(path.join(GOLDEN, f), 'utf8'))
  const wide = hasWide(obj)
  test(`golden ${obj.name} on webgpu: the stored results, and wasm's within 1e-5${wide ? ' (64-bit: refused, naming wasm)' : ''}`, async (t) => {
    if (!await needGPU(t)) return
    const device = await gpu.device()
    if (wide) {
      // WebGPU has no 64-bit types: such a kernel is a KernelError that says to use wasm
      return assert.rejects(goldenGPU(obj, device), (e) => e.name === 'KernelError' && /WebGPU has no (float|u?int)64.*backend: 'wasm'/.test(e.message))
    }
    const got = await goldenGPU(obj, device)
    const want = goldenWasm(obj)
    const { layout } = goldenLayout(obj)
    for (const e of obj.expected) {
      const L = layout.get(e.slot)
      const view = (u8) => floats(new L.d.store(u8.buffer, u8.byteOffset + L.base, L.size), e.dtype)
      const raw = Buffer.from(e.data, 'base64')
      const stored = floats(new L.d.store(raw.buffer.slice(raw.byteOffset, raw.byteOffset + raw.length)), e.dtype)
      const a = view(got)
      const tol = e.compare === 'exact' ? 0 : e.rtol
      for (let i = 0; i < stored.length; i++) {
        const x = Number(a[i])
        const y = Number(stored[i])
        const ok = (x !== x && y !== y) || x === y || Math.abs(x - y) <= (e.atol || 0) + tol * Math.abs(y) // eslint-disable-line no-self-compare
        assert.ok(ok, `${obj.name} slot ${e.slot} element ${i}: ${x} vs stored ${y}`)
      }
      assert.ok(rel(a, view(want)) <= 1e-5, `${obj.name} slot ${e.slot}: webgpu and wasm differ by ${rel(a, view(want))}`)
    }
  })
}

// ---- the fixtures zoo: forwards (every entrypoint they have) against wasm and Python's references
const forwards = [
  ['linear.pgb', async (m, a) => [await m[a]('forward', { x: ref.linear.x })]],
  ['mlp_untrained.pgb', async (m, a) => [await m[a]('forward', { x: ref.mlp.x })]],
  ['mlp_wide.pgb', async (m, a) => {
    const out = []
    for (const n of [1, 3, 8]) out.push(await m[a]('forward', { x: ref.wide.x.slice(0, n) }))
    return out
  }],
  ['embedding_sgd.pgb', async (m, a) => [await m[a]('forward', { ids: ref.embedding.ids })]],
  ['decoder.pgb', async (m, a) => {
    const cols = (p, q) => ref.decoder.ids.map((r) => r.slice(p, q))
    const out = [await m[a]('forward', { ids: cols(0, 3) })]
    for (let p = 3; p < 5; p++) out.push(await m[a]('decode', { ids: cols(p, p + 1), pos: p }))
    return out
  }]
]

for (const [name, run] of forwards) {
  test(`${name} forward on webgpu matches wasm within 1e-5`, async (t) => {
    if (!await needGPU(t)) return
    const m = await loadGPU(name)
    const w = loadWasm(name)
    try {
      assert.deepStrictEqual(m.backendInfo, { name: 'webgpu', threads: 1, reason: null, fma: false })
      const got = await run(m, 'callAsync')
      const want = await run(w, 'call')
      got.forEach((o, i) => {
        for (const k of Object.keys(want[i])) {
          assert.deepStrictEqual(o[k].shape, want[i][k].shape)
          assert.ok(rel(o[k], want[i][k]) <= 1e-5, `${name} call ${i} ${k}: ${rel(o[k], want[i][k])}`)
        }
      })
    } finally {
      m.dispose()
      w.dispose()
    }
  })
}

test('linear.pgb on webgpu gives Python\'s prediction', async (t) => {
  if (!await needGPU(t)) return
  const m = await loadGPU('linear.pgb')
  assert.ok(maxRel((await m.forwardAsync({ x: ref.linear.x })).prediction, ref.linear.prediction) < 1e-6)
  m.dispose()
})

// ---- training
test('a fine-tune on webgpu follows wasm: the bundle\'s Adam resumed (fitAsync), weights and save', async (t) => {
  if (!await needGPU(t)) return
  const m = await loadGPU('mlp_adam.pgb')
  const w = loadWasm('mlp_adam.pgb')
  const x = Float32Array.from(ref.mlp.x.flat())
  const data = { x, y: ref.mlp.y }
  const got = await m.fitAsync(data, { epochs: 2, batchSize: 4 })
  const want = w.fit(data, { epochs: 2, batchSize: 4 })
  assert.ok(rel(got, want) <= 1e-5, `losses ${got} vs ${want}`)
  assert.ok(maxRel(got, ref.mlp.adam_resume) < 1e-5)
  const pg = await m.parametersAsync()
  const pw = w.parameters()
  for (const k of Object.keys(pw)) assert.ok(rel(pg[k].data, pw[k].data) <= 1e-5, `parameter ${k}`)
  // the saved bundle holds the trained weights: wasm runs it as the GPU does
  const back = Model.fromBytesSync(await m.saveAsync(), { threads: 1 })
  assert.ok(rel(back.forward({ x: ref.mlp.x }).logits, (await m.forwardAsync({ x: ref.mlp.x })).logits) <= 1e-5)
  for (const o of [m, w, back]) o.dispose()
})

test('trainStepAsync on webgpu: a JS-built Adam, a new learning rate, then an embedding scatter-add (SGD)', async (t) => {
  if (!await needGPU(t)) return
  const m = await loadGPU('mlp_untrained.pgb')
  const w = loadWasm('mlp_untrained.pgb')
  const x = Float32Array.from(ref.mlp.x.flat())
  const got = []
  const want = []
  for (let i = 0; i < 5; i++) {
    const b = i % 3
    const batch = { x: x.subarray(b * 16, b * 16 + 16), y: ref.mlp.y.slice(b * 4, b * 4 + 4) }
    const opts = i < 3 ? { optimizer: 'adam', lr: 0.01 } : { optimizer: 'adam', lr: 0.05 } // the new lr is uploaded
    got.push(await m.trainStepAsync(batch, opts))
    want.push(w.trainStep(batch, opts))
  }
  assert.ok(rel(got, want) <= 1e-5, `${got} vs ${want}`)
  assert.ok(maxRel(got.slice(0, 3), ref.mlp.adam_first) < 1e-5)
  m.dispose()
  w.dispose()
  const e = await loadGPU('embedding_sgd.pgb')
  const losses = await e.fitAsync({ ids: ref.embedding.ids, y: ref.embedding.y }, { epochs: 3, batchSize: 4, optimizer: 'sgd', lr: 0.5 })
  assert.ok(maxRel(losses, ref.embedding.sgd) < 1e-5, `${losses} vs ${ref.embedding.sgd}`)
  e.dispose()
})

// ---- the rules of an asynchronous backend
test('a webgpu model refuses synchronous calls, naming the async twin; synchronous loads refuse webgpu', async (t) => {
  if (!await needGPU(t)) return
  const m = await loadGPU('mlp_adam.pgb')
  const refused = (fn, twin) => assert.throws(fn, (e) => e instanceof ModelError && e.message.includes(twin))
  refused(() => m.forward({ x: ref.mlp.x }), 'forwardAsync')
  refused(() => m.call('loss', { x: ref.mlp.x, y: ref.mlp.y }), 'callAsync')
  refused(() => m.trainStep({ x: ref.mlp.x, y: ref.mlp.y }), 'trainStepAsync')
  refused(() => m.fit({ x: ref.mlp.x, y: ref.mlp.y }), 'fitAsync')
  refused(() => m.save(), 'saveAsync')
  refused(() => m.parameters(), 'parametersAsync')
  m.dispose()
  assert.throws(() => Model.fromBytesSync(fixture('linear.pgb'), { backend: 'webgpu' }), (e) => e instanceof ModelError && /asynchronous.*Model\.fromBytes/.test(e.message))
})

test('async auto: a fallback (software) adapter is not taken, and backendInfo says so; sync loads and loads without a backend keep wasm', async (t) => {
  const f = await adapter()
  const d = await Model.fromBytes(fixture('linear.pgb'), { threads: 1 }) // no backend: never webgpu, no probe
  assert.deepStrictEqual(d.backendInfo, { name: 'wasm', threads: 1, reason: 'threads: 1 was asked', fma: relaxedSimdSupported() })
  d.dispose()
  const m = await Model.fromBytes(fixture('linear.pgb'), { backend: 'auto', threads: 1 })
  if (f.adapter && !f.fallback) {
    assert.strictEqual(m.backendInfo.name, 'webgpu')
  } else {
    assert.strictEqual(m.backendInfo.name, 'wasm')
    assert.match(m.backendInfo.reason, f.adapter ? /only a fallback \(software\) adapter.*backend: 'webgpu'/ : /WebGPU/)
  }
  m.dispose()
  const s = Model.fromBytesSync(fixture('linear.pgb'))
  assert.strictEqual(s.backend, 'wasm')
  s.dispose()
})
