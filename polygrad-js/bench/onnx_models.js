#!/usr/bin/env node
'use strict'
/**
 * Imported ONNX models in Node: polygrad-js (Model.load of the .pgb saved from polygrad.onnx.load) against
 * onnxruntime-web (wasm) on the same .onnx, the same threads each, alternating rounds in one process.
 *
 *   python benchmarks/bench_onnx.py --keep DIR          # exports the models, saves the .pgb, runs this too
 *   (cd polygrad-js/bench && npm install)               # onnxruntime-web (bench/package.json)
 *   node polygrad-js/bench/onnx_models.js DIR/manifest.json [--rounds 6] [--threads 2] [--json]
 *
 * The manifest (written by bench_onnx.py) lists each model's .onnx, .pgb and inputs (raw little-endian files
 * with their shape and dtype). Per model: load time to the first result (polygrad-js: Model.load, which
 * compiles every kernel to wasm, then forward; ort-web: InferenceSession.create then run), the output of
 * both compared (relative max error), then `rounds` alternating rounds of calls; a figure is the median
 * call. --json prints one JSON line per model (bench_onnx.py reads them), else a table.
 */

const fs = require('fs')
const os = require('os')
const path = require('path')

const LIBS = path.join(__dirname, 'node_modules')
const arg = (name, dflt) => (process.argv.includes(name) ? Number(process.argv[process.argv.indexOf(name) + 1]) : dflt)
const ROUNDS = arg('--rounds', 6)
const THREADS = arg('--threads', 2)
const JSON_OUT = process.argv.includes('--json')

const ARRAYS = { float32: Float32Array, int64: BigInt64Array, int32: Int32Array }

function readInputs (entry) {
  const out = {}
  for (const [name, spec] of Object.entries(entry.inputs)) {
    const buf = fs.readFileSync(spec.file)
    const Type = ARRAYS[spec.dtype]
    if (!Type) throw new Error(`input ${name}: dtype ${spec.dtype} is not handled by this benchmark`)
    out[name] = { data: new Type(buf.buffer, buf.byteOffset, buf.byteLength / Type.BYTES_PER_ELEMENT), shape: spec.shape, dtype: spec.dtype }
  }
  return out
}

function relErr (a, ref) {
  let diff = 0
  let scale = 0
  for (let i = 0; i < ref.length; i++) {
    diff = Math.max(diff, Math.abs(a[i] - ref[i]))
    scale = Math.max(scale, Math.abs(ref[i]))
  }
  return a.length === ref.length ? diff / Math.max(scale, 1e-30) : Infinity
}

const median = (xs) => {
  const s = [...xs].sort((a, b) => a - b)
  return s.length % 2 ? s[(s.length - 1) / 2] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2
}

async function ortRunner (entry, inputs) {
  const ort = require(path.join(LIBS, 'onnxruntime-web'))
  ort.env.wasm.numThreads = THREADS
  ort.env.wasm.wasmPaths = path.join(LIBS, 'onnxruntime-web', 'dist') + '/'
  const t0 = performance.now()
  const session = await ort.InferenceSession.create(fs.readFileSync(entry.onnx), { executionProviders: ['wasm'], graphOptimizationLevel: 'all' })
  const feeds = {}
  for (const [name, v] of Object.entries(inputs)) feeds[name] = new ort.Tensor(v.dtype, v.data, v.shape)
  const run = async () => (await session.run(feeds))[session.outputNames[0]].data
  const first = await run()
  return { run, first, load: (performance.now() - t0) / 1000, close: () => session.release() }
}

function polygradRunner (entry, inputs) {
  const { Model } = require(path.join(__dirname, '..'))
  const t0 = performance.now()
  // maxWork: the default bound (2**16 node evaluations per byte of the file) refuses ResNet-18 at batch 16
  const m = Model.load(entry.pgb, { threads: THREADS, maxWork: 2 ** 50 })
  const feeds = {}
  for (const [name, v] of Object.entries(inputs)) feeds[name] = v.data
  const out = Object.keys(m.forward(feeds))[0]
  const run = async () => m.forward(feeds)[out]
  return run().then((first) => ({ run, first, load: (performance.now() - t0) / 1000, threads: m.backendInfo.threads, close: () => m.dispose() }))
}

async function bench (entry, calls) {
  const inputs = readInputs(entry)
  const libs = { ort: await ortRunner(entry, inputs), polygrad: await polygradRunner(entry, inputs) }
  const times = { ort: [], polygrad: [] }
  try {
    for (let r = 0; r < ROUNDS; r++) {
      for (const lib of r % 2 === 0 ? ['ort', 'polygrad'] : ['polygrad', 'ort']) {
        for (let i = 0; i < calls; i++) {
          const t = performance.now()
          await libs[lib].run()
          times[lib].push((performance.now() - t) / 1000)
        }
      }
    }
  } finally {
    libs.ort.close()
    libs.polygrad.close()
  }
  return {
    name: entry.name,
    ort: median(times.ort),
    polygrad: median(times.polygrad),
    err: relErr(libs.polygrad.first, libs.ort.first),
    threads: { polygrad: libs.polygrad.threads, ort: THREADS },
    load: { polygrad: libs.polygrad.load, ort: libs.ort.load }
  }
}

async function main () {
  const manifestPath = process.argv[2]
  if (!manifestPath || !fs.existsSync(manifestPath)) throw new Error('usage: node onnx_models.js DIR/manifest.json (written by python benchmarks/bench_onnx.py --keep DIR)')
  const manifest = JSON.parse(fs.readFileSync(manifestPath, 'utf8'))
  const rows = []
  for (const entry of manifest) {
    let r
    try {
      r = await bench(entry, ['resnet18_b16', 'bert_s128'].includes(entry.name) ? 1 : 2)
    } catch (e) { // one model's failure (a load refused, say) is reported in its row; the others still run
      r = { name: entry.name, error: String(e.message || e).split('\n')[0] }
    }
    rows.push(r)
    if (JSON_OUT) console.log(JSON.stringify(r))
  }
  if (JSON_OUT) return
  console.log(`node ${process.version}, ${os.cpus()[0].model}, ${os.cpus().length} cores, load average ${os.loadavg().map((v) => v.toFixed(2)).join(' ')}; ${THREADS} threads each; median ms of ${ROUNDS} alternating rounds`)
  console.log('model             polygrad-js  ort-web  js/web  rel err   load s (pg-js, ort-web)')
  for (const r of rows) {
    if (r.error) {
      console.log(`${r.name.padEnd(18)}failed: ${r.error}`)
      continue
    }
    console.log(`${r.name.padEnd(18)}${(r.polygrad * 1e3).toFixed(1).padStart(11)}${(r.ort * 1e3).toFixed(1).padStart(9)}${(r.polygrad / r.ort).toFixed(2).padStart(8)}${r.err.toExponential(1).padStart(9)}   ${r.load.polygrad.toFixed(2)}, ${r.load.ort.toFixed(2)}`)
  }
}

main().catch((e) => {
  console.error(e)
  process.exit(1)
})
