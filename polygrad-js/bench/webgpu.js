#!/usr/bin/env node
'use strict'
/**
 * The webgpu backend beside onnxruntime-web's WebGPU execution provider, in Node (Dawn, the optional `webgpu`
 * package), on the bench MLP 784-512-512-10 (bench/mlp784.pgb from make_mlp.py; without it, the test fixture
 * mlp_wide.pgb). For a machine with a GPU: on a fallback (software) adapter, such as SwiftShader on a machine
 * without one, it runs and says that its numbers mean nothing.
 *
 *   python polygrad-js/bench/make_mlp.py && (cd polygrad-js/bench && npm install)   # once
 *   node polygrad-js/bench/webgpu.js [--quick]
 *   # no GPU: LD_LIBRARY_PATH=/usr/lib/chromium VK_ICD_FILENAMES=/usr/lib/chromium/vk_swiftshader_icd.json
 *
 * Rows (best of N wall times, after warm-up; each includes the readback of the result): forward at batch 128
 * and batch 1, and for polygrad a training step at batch 128 (Adam; onnxruntime-web has no training API),
 * beside polygrad's wasm backend on this machine's threads.
 */

const path = require('path')
const fs = require('fs')

const ROOT = path.join(__dirname, '..')
const LIBS = path.join(__dirname, 'node_modules')
const QUICK = process.argv.includes('--quick')
const ROUNDS = QUICK ? 3 : 20
const BENCH = path.join(__dirname, 'mlp784.pgb')
const BUNDLE = fs.existsSync(BENCH) ? BENCH : path.join(ROOT, 'test', 'fixtures', 'mlp_wide.pgb')

async function best (fn, n = ROUNDS) {
  let t = Infinity
  for (let i = 0; i < n; i++) {
    const t0 = performance.now()
    await fn()
    t = Math.min(t, performance.now() - t0)
  }
  return t
}

function data (m, n) {
  const [inputs, outputs] = [m.signature.inputs[0].shape[1], m.signature.outputs[0].shape[1]]
  const x = new Float32Array(n * inputs)
  for (let i = 0; i < x.length; i++) x[i] = Math.sin(i * 0.37)
  const y = Int32Array.from({ length: n }, (_, i) => i % outputs)
  return { x, y }
}

async function polygrad (rows, backend) {
  const { Model } = require(ROOT)
  const m = await Model.loadAsync(BUNDLE, { backend })
  const d128 = data(m, Math.min(128, ...Object.values(m.variables).map((v) => v.max))) // the fixture allows 8
  const d1 = data(m, 1)
  for (let i = 0; i < 3; i++) await m.forwardAsync({ x: d128.x })
  rows.fwd128[backend] = await best(() => m.forwardAsync({ x: d128.x }))
  rows.fwd1[backend] = await best(() => m.forwardAsync({ x: d1.x }))
  if (m.entrypoints.includes('loss')) {
    await m.trainStepAsync({ x: d128.x, y: d128.y }, { optimizer: 'adam', lr: 1e-3 })
    rows.train128[backend] = await best(() => m.trainStepAsync({ x: d128.x, y: d128.y }), Math.max(3, ROUNDS / 2))
  }
  const info = m.backendInfo
  const layers = m.entrypoints.includes('forward') ? await weights(m) : null
  m.dispose()
  return { info, layers }
}

/** The MLP's layers from its parameters (l1..l3 of make_mlp.py, or the fixture's), for the ONNX export. */
async function weights (m) {
  const p = await m.parametersAsync()
  const names = Object.keys(p).filter((k) => k.endsWith('.weight'))
  return names.map((w) => ({ weight: p[w].data, bias: p[w.replace(/weight$/, 'bias')].data, out: p[w].shape[0], in: p[w].shape[1] }))
}

async function ort (rows, layers, gpu) {
  let ortw
  try {
    ortw = require(path.join(LIBS, 'onnxruntime-web', 'dist', 'ort.webgpu.min.js'))
  } catch (e) {
    return `onnxruntime-web is not installed (cd bench && npm install): ${e.message.split('\n')[0]}`
  }
  if (!globalThis.navigator || !globalThis.navigator.gpu) globalThis.navigator = Object.assign(globalThis.navigator || {}, { gpu })
  ortw.env.wasm.wasmPaths = path.join(LIBS, 'onnxruntime-web', 'dist') + '/'
  const { mlpOnnx } = require('./onnx')
  let session
  try {
    session = await ortw.InferenceSession.create(mlpOnnx(layers), { executionProviders: ['webgpu'] })
  } catch (e) {
    return `onnxruntime-web's WebGPU provider did not start here: ${e.message.split('\n')[0]}`
  }
  const n = layers[0].in
  const run = async (x, b) => (await session.run({ x: new ortw.Tensor('float32', x, [b, n]) })).logits.data
  const x128 = Float32Array.from({ length: 128 * n }, (_, i) => Math.sin(i * 0.37))
  for (let i = 0; i < 3; i++) await run(x128, 128)
  rows.fwd128.ort = await best(() => run(x128, 128))
  rows.fwd1.ort = await best(() => run(x128.subarray(0, n), 1))
  return null
}

async function main () {
  const { _internals } = require(ROOT)
  const found = await _internals.webgpu.adapterInfo()
  if (!found.adapter) {
    console.log(`no WebGPU adapter: ${found.reason}`)
    return
  }
  const info = found.adapter.info || {}
  console.log(`bundle ${path.relative(process.cwd(), BUNDLE)}; adapter: ${info.vendor || '?'} ${info.architecture || ''} ${info.description || ''}`)
  if (found.fallback) console.warn('WARNING: a fallback (software) adapter: these numbers mean nothing about a GPU; run this on a machine with one')
  const rows = { fwd128: {}, fwd1: {}, train128: {} }
  const gpuRun = await polygrad(rows, 'webgpu')
  await polygrad(rows, 'wasm')
  const why = gpuRun.layers ? await ort(rows, gpuRun.layers, found.adapter && (await import('webgpu')).create([])) : 'no layers'
  if (why) console.log(`onnxruntime-web webgpu: skipped (${why})`)
  const fmt = (v) => (v === undefined ? '-' : `${v.toFixed(3)} ms`)
  console.log(['', 'polygrad webgpu', 'polygrad wasm', 'ort-web webgpu'].map((s, i) => s.padEnd(i ? 18 : 22)).join(''))
  for (const [name, r] of Object.entries({ 'forward, batch 128': rows.fwd128, 'forward, batch 1': rows.fwd1, 'train step, 128': rows.train128 })) {
    console.log([name, fmt(r.webgpu), fmt(r.wasm), fmt(r.ort)].map((s, i) => s.padEnd(i ? 18 : 22)).join(''))
  }
}

main().then(() => process.exit(0), (e) => {
  console.error(e)
  process.exit(1)
})
