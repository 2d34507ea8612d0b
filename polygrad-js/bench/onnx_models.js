#!/usr/bin/env node
'use strict'
/**
 * Imported ONNX models in Node: polygrad-js (Model.load of the .pgb saved from polygrad.onnx.load) against
 * onnxruntime-web (wasm) on the same .onnx, the same threads each, alternating rounds in one process.
 *
 *   python benchmarks/bench_onnx.py --keep DIR          # exports the models, saves the .pgb, runs this too
 *   (cd polygrad-js/bench && npm install)               # onnxruntime-web (bench/package.json)
 *   node polygrad-js/bench/onnx_models.js DIR/manifest.json [--rounds 6] [--threads 2] [--json] [--only NAME]
 *                                        [--base DIR] [--profile [--reps 5]]
 *
 * The manifest (written by bench_onnx.py) lists each model's .onnx, .pgb and inputs (raw little-endian files
 * with their shape and dtype). Per model: load time to the first result (polygrad-js: Model.load, which
 * compiles every kernel to wasm, then forward; ort-web: InferenceSession.create then run), the output of
 * both compared (relative max error), then `rounds` alternating rounds of the same number of calls (about
 * ROUND_S of the slower library each); a figure is the median
 * call. --json prints one JSON line per model (bench_onnx.py reads them), else a table. --only NAME runs one model.
 * --base DIR times a second polygrad-js checkout (a baseline) in the same rounds, alternating with this one and
 * ort-web (an A/B under the same load); an entry's `basePgb` (a bundle the baseline's Python saved, where the
 * graph changed) is what --base loads, else its `pgb`. --profile times every kernel call of one forward on one thread
 * (polygrad-js, and --base's in calls alternating with it), the fastest of --reps calls each, grouped by kernel, with its work
 * (lower.kernelWork: points, about the multiply-adds) per second and the opts lower.js chose.
 */

const fs = require('fs')
const os = require('os')
const path = require('path')

const LIBS = path.join(__dirname, 'node_modules')
const arg = (name, dflt) => (process.argv.includes(name) ? Number(process.argv[process.argv.indexOf(name) + 1]) : dflt)
const ROUNDS = arg('--rounds', 6)
const THREADS = arg('--threads', 2)
const JSON_OUT = process.argv.includes('--json')
const strArg = (name, dflt) => (process.argv.includes(name) ? process.argv[process.argv.indexOf(name) + 1] : dflt)
const LIB = path.join(__dirname, '..')
const BASE = strArg('--base', null) && path.resolve(strArg('--base'), fs.existsSync(path.join(strArg('--base'), 'polygrad-js')) ? 'polygrad-js' : '.')
const ONLY = strArg('--only', null)

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

function polygradRunner (entry, inputs, lib = LIB, pgb = entry.pgb) {
  const { Model } = require(lib)
  const t0 = performance.now()
  // maxWork: the default bound (2**16 node evaluations per byte of the file) refuses ResNet-18 at batch 16
  const m = Model.load(pgb, { threads: THREADS, maxWork: 2 ** 50 })
  const feeds = {}
  for (const [name, v] of Object.entries(inputs)) feeds[name] = v.data
  const out = Object.keys(m.forward(feeds))[0]
  const run = async () => m.forward(feeds)[out]
  return run().then((first) => ({ run, first, load: (performance.now() - t0) / 1000, threads: m.backendInfo.threads, close: () => m.dispose() }))
}

// A round of one library lasts about this long (at least 1 call, at most 50), as in bench_onnx.py: the calls right
// after the other library's round can run slower for a while on a small VM, and rounds of 1 or 2 calls measured that
const ROUND_S = 0.25

async function bench (entry) {
  const inputs = readInputs(entry)
  const libs = { ort: await ortRunner(entry, inputs), polygrad: await polygradRunner(entry, inputs) }
  if (BASE) libs.base = await polygradRunner(entry, inputs, BASE, entry.basePgb || entry.pgb)
  const names = Object.keys(libs)
  const times = Object.fromEntries(names.map((k) => [k, []]))
  try {
    let probe = 0
    for (const lib of names) {
      const t = performance.now()
      await libs[lib].run()
      probe = Math.max(probe, (performance.now() - t) / 1000)
    }
    const calls = Math.min(50, Math.max(1, Math.ceil(ROUND_S / Math.max(probe, 1e-6))))
    for (let r = 0; r < ROUNDS; r++) {
      for (const lib of r % 2 === 0 ? names : [...names].reverse()) {
        for (let i = 0; i < calls; i++) {
          const t = performance.now()
          await libs[lib].run()
          times[lib].push((performance.now() - t) / 1000)
        }
      }
    }
  } finally {
    for (const k of names) libs[k].close()
  }
  return {
    name: entry.name,
    ort: median(times.ort),
    polygrad: median(times.polygrad),
    ...(BASE ? { base: median(times.base), baseErr: relErr(libs.base.first, libs.ort.first) } : {}),
    err: relErr(libs.polygrad.first, libs.ort.first),
    threads: { polygrad: libs.polygrad.threads, ort: THREADS },
    load: { polygrad: libs.polygrad.load, ort: libs.ort.load }
  }
}

/**
 * One forward's kernels on one thread, timed: {once() (one timed forward), result() -> {groups: Map name ->
 * {n, ms, work, opts}, whole}} for the checkout `lib`; each kernel call's time is the fastest of its calls.
 */
function kernelTimer (entry, lib) {
  const { Model } = require(lib)
  const { toposort } = require(path.join(lib, 'src', 'ir'))
  const { prepareKernel } = require(path.join(lib, 'src', 'compile'))
  const { chooseOpts, kernelWork } = require(path.join(lib, 'src', 'lower'))
  const inputs = readInputs(entry)
  const feeds = Object.fromEntries(Object.entries(inputs).map(([k, v]) => [k, v.data]))
  const m = Model.load(entry.pgb, { threads: 1, maxWork: 2 ** 50 })
  m.forward(feeds)
  m.forward(feeds) // the second call fills the packed copies
  const steps = m._x.entries.forward
  const calls = m._p.entries.forward.calls
  const times = steps.map(() => [])
  steps.forEach((st, i) => {
    for (const key of ['main', 'small', 'packed', 'packedMain']) {
      const run = st[key]
      if (!run || run.phases !== null) continue
      const fn = run.fn
      run.fn = (...a) => {
        const t0 = process.hrtime.bigint()
        fn(...a)
        times[i].push(Number(process.hrtime.bigint() - t0) / 1e6)
      }
    }
  })
  const whole = []
  const once = () => {
    const t0 = process.hrtime.bigint()
    m.forward(feeds)
    whole.push(Number(process.hrtime.bigint() - t0) / 1e6)
  }
  const result = () => {
    const groups = new Map()
    steps.forEach((st, i) => {
      if (st.copy || !times[i].length) return
      const ast = m._p.kernels[calls[i].kernel]
      const key = `${st.name}#${calls[i].kernel}`
      let g = groups.get(key)
      if (!g) {
        const { ast: k } = prepareKernel(m._p.graph, ast)
        const opts = chooseOpts(k, 4).map((o) => `${o.kind[0]}${o.amount}${o.clamp ? 'c' : ''}`).join(' ')
        const gated = toposort(k).some((n) => n.op === 'LOAD' && n.src[0].src.length > 2)
        g = { name: key, n: 0, ms: 0, work: kernelWork(k)(new Map()), opts: opts + (gated ? ' gated' : '') }
        groups.set(key, g)
      }
      g.n++
      g.ms += Math.min(...times[i])
    })
    m.dispose()
    return { groups, whole: Math.min(...whole) }
  }
  return { once, result }
}

function profile (entry) {
  const reps = arg('--reps', 5)
  const timers = [kernelTimer(entry, LIB), ...(BASE ? [kernelTimer(Object.assign({}, entry, { pgb: entry.basePgb || entry.pgb }), BASE)] : [])]
  for (let r = 0; r < reps; r++) for (const t of r % 2 ? [...timers].reverse() : timers) t.once() // alternating
  const [mine, base] = timers.map((t) => t.result())
  const total = [...mine.groups.values()].reduce((a, g) => a + g.ms, 0)
  const baseTotal = base ? [...base.groups.values()].reduce((a, g) => a + g.ms, 0) : 0
  console.log(`\n${entry.name} on one thread: ${total.toFixed(2)} ms in kernels (fastest of ${reps} alternating calls each${base ? `; --base ${baseTotal.toFixed(2)} ms` : ''}), the whole call ${mine.whole.toFixed(2)} ms${base ? ` (--base ${base.whole.toFixed(2)} ms)` : ''}`)
  console.log(`kernel                         | calls | ms total | Gpt/s | ${base ? 'base ms | ' : ''}opts`)
  for (const g of [...mine.groups.values()].sort((a, b) => b.ms - a.ms).slice(0, 30)) {
    const b = base && base.groups.get(g.name)
    console.log(`${g.name.slice(0, 30).padEnd(30)} | ${String(g.n).padStart(5)} | ${g.ms.toFixed(3).padStart(8)} | ${(g.work * g.n / g.ms / 1e6).toFixed(1).padStart(5)} | ${base ? (b ? b.ms.toFixed(3) : '-').padStart(7) + ' | ' : ''}${g.opts}`)
  }
}

async function main () {
  const manifestPath = process.argv[2]
  if (!manifestPath || !fs.existsSync(manifestPath)) throw new Error('usage: node onnx_models.js DIR/manifest.json (written by python benchmarks/bench_onnx.py --keep DIR)')
  const manifest = JSON.parse(fs.readFileSync(manifestPath, 'utf8'))
  const rows = []
  for (const entry of manifest.filter((e) => !ONLY || e.name === ONLY)) {
    if (process.argv.includes('--profile')) {
      profile(entry)
      continue
    }
    let r
    try {
      r = await bench(entry)
    } catch (e) { // one model's failure (a load refused, say) is reported in its row; the others still run
      r = { name: entry.name, error: String(e.message || e).split('\n')[0] }
    }
    rows.push(r)
    if (JSON_OUT) console.log(JSON.stringify(r))
  }
  if (JSON_OUT || process.argv.includes('--profile')) return
  console.log(`node ${process.version}, ${os.cpus()[0].model}, ${os.cpus().length} cores, load average ${os.loadavg().map((v) => v.toFixed(2)).join(' ')}; ${THREADS} threads each; median ms of ${ROUNDS} alternating rounds`)
  console.log('model             polygrad-js  ort-web  js/web  rel err   load s (pg-js, ort-web)')
  for (const r of rows) {
    if (r.error) {
      console.log(`${r.name.padEnd(18)}failed: ${r.error}`)
      continue
    }
    console.log(`${r.name.padEnd(18)}${(r.polygrad * 1e3).toFixed(1).padStart(11)}${(r.ort * 1e3).toFixed(1).padStart(9)}${(r.polygrad / r.ort).toFixed(2).padStart(8)}${r.err.toExponential(1).padStart(9)}   ${r.load.polygrad.toFixed(2)}, ${r.load.ort.toFixed(2)}`)
    if (BASE) console.log(`${'  --base'.padEnd(18)}${(r.base * 1e3).toFixed(1).padStart(11)}${''.padStart(9)}${(r.base / r.ort).toFixed(2).padStart(8)}${r.baseErr.toExponential(1).padStart(9)}   this/base ${(r.polygrad / r.base).toFixed(3)}`)
  }
}

main().catch((e) => {
  console.error(e)
  process.exit(1)
})
