#!/usr/bin/env node
'use strict'
/**
 * polygrad-js beside onnxruntime-web (wasm) and TensorFlow.js (tfjs-backend-wasm), in one Node process,
 * one thread each unless --threads says otherwise, on the same MLP 784-512-512-10 weights (the bundle's,
 * exported to ONNX for ort-web), and onnxruntime-node (native code) where bench/node_modules has it.
 *
 *   python polygrad-js/bench/make_mlp.py      # writes bench/mlp784.pgb (once)
 *   (cd polygrad-js/bench && npm install)     # the comparison libraries (bench/package.json)
 *   node polygrad-js/bench/bench.js [--quick] [--threads N|default]
 *
 * --threads N runs every library on N threads (polygrad-js `threads`, ort `numThreads`/`intraOpNumThreads`,
 * tfjs `setThreadsCount`); --threads default leaves each at its own default (polygrad-js: the cores, at most 8),
 * which is how issue 31 states the multi-thread targets; the table then prints the thread count each used.
 *
 * Rows: forward at batch 128 and batch 1 (best of N, after warm-up), a training step at batch 128 (Adam),
 * time from require to the first result in a fresh process, and the package's minified size. Prints the
 * times, our ratio to each library and to the issue's targets. Timings on a shared machine are noisy:
 * every row is a best-of-N.
 *
 * One thread each (the default): polygrad-js (threads: 1), ort (numThreads = 1) and tfjs (setThreadsCount(1))
 * run their kernels on the main thread. Their CPU time can still exceed their wall time: Node's V8 helper threads sweep the
 * ArrayBuffers a call allocates and tier up the libraries' large wasm modules in the background (measured
 * with perf on Linux; the table prints that helper-thread CPU time). `node --single-threaded bench.js` keeps
 * that work on the main thread too.
 */

const path = require('path')
const fs = require('fs')
const { execFileSync } = require('child_process')

const ROOT = path.join(__dirname, '..')
const LIBS = path.join(__dirname, 'node_modules') // the comparison libraries: bench/package.json
const BUNDLE = path.join(__dirname, 'mlp784.pgb')
const QUICK = process.argv.includes('--quick')
const ROUNDS = QUICK ? 5 : 40
// --threads N | default: how many threads each library computes on (default 1; 'default': each library's own)
const THREADS_ARG = process.argv.includes('--threads') ? process.argv[process.argv.indexOf('--threads') + 1] : '1'
const THREADS = THREADS_ARG === 'default' ? null : Number(THREADS_ARG)
if (THREADS !== null && !(Number.isInteger(THREADS) && THREADS >= 1)) throw new Error(`--threads takes a count or 'default', not ${THREADS_ARG}`)
const POLY_OPTS = THREADS === null ? {} : { threads: THREADS }

// Each measurement returns {wall: best-of-n wall time per call, cpu: this process's CPU time per call over
// all n*inner calls, other: the part of that CPU time spent on threads other than the main one}. On a loaded
// machine the CPU time is the steadier figure (time spent waiting for a core is not counted). Every library
// computes on the main thread (ort numThreads = 1, tfjs setThreadsCount(1)); `other` is Node's own helper
// threads (V8's concurrent garbage collection of the objects a call allocates), which is why a library's CPU
// time can exceed its wall time.
const TICK_MS = 10 // /proc/<pid>/task/<tid>/stat counts CPU time in clock ticks of 10 ms (USER_HZ 100)

function otherThreadsMs () {
  // CPU time of every thread but the main one, from /proc (Linux); null elsewhere
  const dir = '/proc/self/task'
  if (!fs.existsSync(dir)) return null
  let ticks = 0
  for (const t of fs.readdirSync(dir)) {
    if (Number(t) === process.pid) continue
    try {
      const st = fs.readFileSync(`${dir}/${t}/stat`, 'utf8')
      const f = st.slice(st.lastIndexOf(')') + 2).split(' ')
      ticks += Number(f[11]) + Number(f[12])
    } catch (e) {} // the thread ended
  }
  return ticks * TICK_MS
}

function measured (b, c, o0, calls) {
  const o1 = otherThreadsMs()
  return { wall: b, cpu: (c.user + c.system) / 1000 / calls, other: o0 === null || o1 === null ? null : (o1 - o0) / calls }
}

function best (fn, n = ROUNDS, inner = 1) {
  let b = Infinity
  const o0 = otherThreadsMs()
  const c0 = process.cpuUsage()
  for (let i = 0; i < n; i++) {
    const t = performance.now()
    for (let j = 0; j < inner; j++) fn()
    b = Math.min(b, (performance.now() - t) / inner)
  }
  return measured(b, process.cpuUsage(c0), o0, n * inner)
}

async function bestAsync (fn, n = ROUNDS, inner = 1) {
  let b = Infinity
  const o0 = otherThreadsMs()
  const c0 = process.cpuUsage()
  for (let i = 0; i < n; i++) {
    const t = performance.now()
    for (let j = 0; j < inner; j++) await fn()
    b = Math.min(b, (performance.now() - t) / inner)
  }
  return measured(b, process.cpuUsage(c0), o0, n * inner)
}

function data (batch) {
  const x = new Float32Array(batch * 784)
  for (let i = 0; i < x.length; i++) x[i] = Math.sin(i * 0.37) * 0.5
  const y = new Int32Array(batch)
  for (let i = 0; i < batch; i++) y[i] = (i * 7) % 10
  return { x, y }
}

function weights () {
  const { Model } = require(ROOT)
  const m = Model.load(BUNDLE, { threads: 1 })
  const p = m.parameters()
  m.dispose()
  return [1, 2, 3].map((i) => ({ weight: p[`l${i}.weight`].data, bias: p[`l${i}.bias`].data, out: p[`l${i}.weight`].shape[0], in: p[`l${i}.weight`].shape[1] }))
}

async function ours (rows) {
  const { Model } = require(ROOT)
  const m = Model.load(BUNDLE, POLY_OPTS)
  rows.threads.polygrad = m.backendInfo.threads
  const d128 = data(128)
  const d1 = data(1)
  for (let i = 0; i < 30; i++) m.forward({ x: d128.x })
  rows.fwd128.polygrad = best(() => m.forward({ x: d128.x }))
  for (let i = 0; i < 300; i++) m.forward({ x: d1.x })
  rows.fwd1.polygrad = best(() => m.forward({ x: d1.x }), ROUNDS, 50)
  m.trainStep({ x: d128.x, y: d128.y }, { optimizer: 'adam', lr: 1e-3 })
  for (let i = 0; i < 10; i++) m.trainStep({ x: d128.x, y: d128.y })
  rows.train128.polygrad = best(() => m.trainStep({ x: d128.x, y: d128.y }), Math.max(5, ROUNDS / 2))
  m.dispose()
}

async function ort (rows, layers) {
  const ortw = require(path.join(LIBS, 'onnxruntime-web'))
  if (THREADS !== null) ortw.env.wasm.numThreads = THREADS
  ortw.env.wasm.wasmPaths = path.join(LIBS, 'onnxruntime-web', 'dist') + '/'
  const { mlpOnnx } = require('./onnx')
  const session = await ortw.InferenceSession.create(mlpOnnx(layers), { executionProviders: ['wasm'], graphOptimizationLevel: 'all' })
  rows.threads.ort = ortw.env.wasm.numThreads // ort-web fills in its default when the first session is made
  await timeSession(rows, 'ort', ortw.Tensor, session)
  rows.train128.ort = null // onnxruntime-web has no training API any more
}

/** An onnxruntime session's forward rows (batch 128 and 1, after warm-up) into rows[...][key]. */
async function timeSession (rows, key, Tensor, session) {
  const run = async (d, n) => (await session.run({ x: new Tensor('float32', d.x, [n, 784]) })).logits.data
  const d128 = data(128)
  const d1 = data(1)
  rows.check[key] = await run(d128, 128)
  for (let i = 0; i < 30; i++) await run(d128, 128)
  rows.fwd128[key] = await bestAsync(() => run(d128, 128))
  for (let i = 0; i < 300; i++) await run(d1, 1)
  rows.fwd1[key] = await bestAsync(() => run(d1, 1), ROUNDS, 50)
}

async function tfjs (rows, layers) {
  const tf = require(path.join(LIBS, '@tensorflow', 'tfjs'))
  const wasm = require(path.join(LIBS, '@tensorflow', 'tfjs-backend-wasm'))
  wasm.setWasmPaths(path.join(LIBS, '@tensorflow', 'tfjs-backend-wasm', 'dist') + '/')
  if (THREADS !== null) wasm.setThreadsCount(THREADS)
  await tf.setBackend('wasm')
  await tf.ready()
  rows.threads.tfjs = wasm.getThreadsCount()
  // the same weights in the layout tfjs-wasm is fastest with ([in, out]: its transposed-B matmul is
  // several times slower), one fused matmul + bias + ReLU per layer
  const vars = layers.map((l) => ({ w: tf.variable(tf.tidy(() => tf.transpose(tf.tensor2d(l.weight, [l.out, l.in])))), b: tf.variable(tf.tensor1d(l.bias)) }))
  const net = (x) => {
    let h = x
    vars.forEach((v, i) => {
      h = tf.fused.matMul({ a: h, b: v.w, bias: v.b, activation: i < vars.length - 1 ? 'relu' : 'linear' })
    })
    return h
  }
  const d128 = data(128)
  const d1 = data(1)
  const fwd = (d, n) => tf.tidy(() => net(tf.tensor2d(d.x, [n, 784]))).dataSync()
  rows.check.tfjs = fwd(d128, 128)
  for (let i = 0; i < 30; i++) fwd(d128, 128)
  rows.fwd128.tfjs = best(() => fwd(d128, 128))
  for (let i = 0; i < 300; i++) fwd(d1, 1)
  rows.fwd1.tfjs = best(() => fwd(d1, 1), ROUNDS, 50)
  const opt = tf.train.adam(1e-3)
  const x = tf.tensor2d(d128.x, [128, 784])
  const y = tf.oneHot(tf.tensor1d(d128.y, 'int32'), 10)
  const step = () => opt.minimize(() => tf.losses.softmaxCrossEntropy(y, net(x)), true).dataSync()
  for (let i = 0; i < 3; i++) step()
  rows.train128.tfjs = best(step, Math.max(3, ROUNDS / 4))
}

async function ortNode (rows, layers) {
  let ortn
  try {
    ortn = require(path.join(LIBS, 'onnxruntime-node'))
  } catch (e) {
    return // not installed: the column stays empty
  }
  const { mlpOnnx } = require('./onnx')
  const opts = { graphOptimizationLevel: 'all', interOpNumThreads: 1 }
  if (THREADS !== null) opts.intraOpNumThreads = THREADS
  const session = await ortn.InferenceSession.create(Buffer.from(mlpOnnx(layers)), opts)
  rows.threads.native = THREADS === null ? 'default' : THREADS
  await timeSession(rows, 'native', ortn.Tensor, session)
  await session.release()
}

function naive (rows, layers) {
  const fwd = (x, n) => {
    let h = x
    layers.forEach((l, i) => {
      const o = new Float32Array(n * l.out)
      for (let r = 0; r < n; r++) {
        for (let j = 0; j < l.out; j++) {
          let s = l.bias[j]
          for (let k = 0; k < l.in; k++) s += h[r * l.in + k] * l.weight[j * l.in + k]
          o[r * l.out + j] = i < layers.length - 1 ? Math.max(s, 0) : s
        }
      }
      h = o
    })
    return h
  }
  rows.fwd128.naive = best(() => fwd(data(128).x, 128), 3)
  rows.fwd1.naive = best(() => fwd(data(1).x, 1), 10)
}

function firstResult (which) {
  const scripts = {
    polygrad: `const t0 = performance.now(); const c0 = process.cpuUsage(); const { Model } = require(${JSON.stringify(ROOT)}); const m = Model.load(${JSON.stringify(BUNDLE)}, ${JSON.stringify(POLY_OPTS)});
      m.forward({ x: new Float32Array(784) }); const c = process.cpuUsage(c0); console.log(performance.now() - t0, (c.user + c.system) / 1000)`,
    ort: `(async () => { const t0 = performance.now(); const c0 = process.cpuUsage(); const ort = require(${JSON.stringify(path.join(LIBS, 'onnxruntime-web'))}); ${THREADS === null ? '' : `ort.env.wasm.numThreads = ${THREADS};`}
      ort.env.wasm.wasmPaths = ${JSON.stringify(path.join(LIBS, 'onnxruntime-web', 'dist') + '/')};
      const s = await ort.InferenceSession.create(require('fs').readFileSync(${JSON.stringify(path.join(__dirname, 'mlp784.onnx'))}), { executionProviders: ['wasm'] });
      await s.run({ x: new ort.Tensor('float32', new Float32Array(784), [1, 784]) }); const c = process.cpuUsage(c0); console.log(performance.now() - t0, (c.user + c.system) / 1000) })()`,
    tfjs: `(async () => { const t0 = performance.now(); const c0 = process.cpuUsage(); const tf = require(${JSON.stringify(path.join(LIBS, '@tensorflow', 'tfjs'))}); const w = require(${JSON.stringify(path.join(LIBS, '@tensorflow', 'tfjs-backend-wasm'))});
      w.setWasmPaths(${JSON.stringify(path.join(LIBS, '@tensorflow', 'tfjs-backend-wasm', 'dist') + '/')}); ${THREADS === null ? '' : `w.setThreadsCount(${THREADS});`}
      await tf.setBackend('wasm'); const ws = require('fs').readFileSync(${JSON.stringify(path.join(__dirname, 'mlp784.f32'))});
      const f = new Float32Array(ws.buffer, ws.byteOffset, ws.byteLength / 4); let o = 0; const take = (n) => f.subarray(o, o += n);
      let h = tf.zeros([1, 784]); for (const [i, n] of [[784, 512], [512, 512], [512, 10]]) { const W = tf.transpose(tf.tensor2d(take(i * n), [n, i])); const b = tf.tensor1d(take(n));
      h = tf.fused.matMul({ a: h, b: W, bias: b, activation: 'relu' }) } h.dataSync(); const c = process.cpuUsage(c0); console.log(performance.now() - t0, (c.user + c.system) / 1000) })()`
  }
  let wall = Infinity
  let cpu = Infinity
  for (let i = 0; i < (QUICK ? 2 : 5); i++) {
    const [w, c] = execFileSync(process.execPath, ['-e', scripts[which]], { cwd: ROOT, encoding: 'utf8' }).trim().split('\n').pop().split(' ').map(Number)
    wall = Math.min(wall, w)
    cpu = Math.min(cpu, c) // from just before require to the first result (Node's own start-up excluded)
  }
  return { wall, cpu }
}

function packageSize () {
  execFileSync(process.execPath, [path.join(ROOT, 'tools', 'build.js')], { cwd: ROOT })
  const min = path.join(ROOT, 'dist', 'polygrad.browser.min.mjs')
  return fs.existsSync(min) ? fs.statSync(min).size : null
}

async function main () {
  if (!fs.existsSync(BUNDLE)) throw new Error(`${BUNDLE} is missing: run python polygrad-js/bench/make_mlp.py`)
  const rows = { fwd128: {}, fwd1: {}, train128: {}, first: {}, check: {}, threads: {} }
  const layers = weights()
  fs.writeFileSync(path.join(__dirname, 'mlp784.onnx'), require('./onnx').mlpOnnx(layers))
  fs.writeFileSync(path.join(__dirname, 'mlp784.f32'), Buffer.concat(layers.flatMap((l) => [Buffer.from(l.weight.buffer, l.weight.byteOffset, l.weight.byteLength), Buffer.from(l.bias.buffer, l.bias.byteOffset, l.bias.byteLength)])))
  await ours(rows)
  await ort(rows, layers)
  await tfjs(rows, layers)
  await ortNode(rows, layers)
  if (!QUICK) naive(rows, layers)
  for (const w of ['polygrad', 'ort', 'tfjs']) rows.first[w] = firstResult(w)
  const size = packageSize()
  // the same weights give the same logits in all three
  const { Model } = require(ROOT)
  const m = Model.load(BUNDLE, { threads: 1 })
  const mine = m.forward({ x: data(128).x }).logits
  m.dispose()
  const diff = (a) => Math.max(...Array.from(a, (v, i) => Math.abs(v - mine[i])))
  const f = (v) => (v === null || v === undefined ? '       -' : v.toFixed(3).padStart(8))
  const ratio = (a, b) => (a && b ? (a / b).toFixed(2).padStart(9) : '        -')
  const each = THREADS === null ? 'each library at its default threads' : `${THREADS} thread${THREADS > 1 ? 's' : ''} each`
  console.log(`polygrad-js benchmark, node ${process.version}, ${each}, times in ms (wall: best of ${ROUNDS}; cpu: mean process CPU time per call)`)
  console.log(`threads: polygrad ${rows.threads.polygrad}, ort (onnxruntime-web wasm) ${rows.threads.ort}, tfjs (tfjs-backend-wasm) ${rows.threads.tfjs}, native (onnxruntime-node) ${rows.threads.native === undefined ? 'not installed' : rows.threads.native}`)
  for (const kind of ['wall', 'cpu']) {
    console.log(`\n[${kind}] row                 polygrad      ort     tfjs   native    naive   ours/ort ours/tfjs ours/native`)
    for (const [k, label] of [['fwd128', 'forward, batch 128'], ['fwd1', 'forward, batch 1'], ['train128', 'train step, batch 128'], ['first', 'require to first result']]) {
      const r = rows[k]
      const v = (w) => (r[w] ? r[w][kind] : null)
      console.log(`${label.padEnd(26)} ${f(v('polygrad'))} ${f(v('ort'))} ${f(v('tfjs'))} ${f(v('native'))} ${f(v('naive'))} ${ratio(v('polygrad'), v('ort'))} ${ratio(v('polygrad'), v('tfjs'))} ${ratio(v('polygrad'), v('native'))}`)
    }
  }
  const threads = (w) => ['fwd128', 'fwd1'].map((k) => rows[k][w] && rows[k][w].other !== null ? `${k} ${rows[k][w].other.toFixed(3)} ms` : null).filter(Boolean).join(', ')
  console.log(`\nCPU time per call on threads other than the main one (Node's GC helpers, and the libraries' worker threads when they use more than one): ${['polygrad', 'ort', 'tfjs'].map((w) => `${w}: ${threads(w) || '-'}`).join('; ')}`)
  const g1 = (w) => (rows.fwd128[w] ? rows.fwd128[w].wall : null)
  const flops = 2 * 128 * (784 * 512 + 512 * 512 + 512 * 10)
  console.log(`\nforward batch 128: ${(flops / rows.fwd128.polygrad.wall / 1e6).toFixed(1)} GFLOP/s (wall), ${(flops / rows.fwd128.polygrad.cpu / 1e6).toFixed(1)} GFLOP/s (cpu), ${rows.threads.polygrad} thread(s)`)
  console.log(`package: ${size === null ? '?' : (size / 1024).toFixed(1)} KB of minified JS, no wasm files`)
  console.log(`max |logits - ort| = ${diff(rows.check.ort).toExponential(2)}, max |logits - tfjs| = ${diff(rows.check.tfjs).toExponential(2)}` +
    (rows.check.native ? `, max |logits - native| = ${diff(rows.check.native).toExponential(2)}` : ''))
  if (THREADS !== 1) {
    // issue 31's multi-thread targets (wall): faster than the wasm runtimes by 1.5x, within 1.5x of native code
    const g = (w) => (rows.fwd128[w] ? rows.fwd128[w].wall : null)
    const ok = (c) => (c ? 'met' : 'NOT met')
    console.log(`targets (wall, ${each}): fwd128 >= 1.5x faster than ort and tfjs: ${ok(g('polygrad') * 1.5 <= Math.min(g('ort'), g('tfjs')))}` +
      (g('native') ? `; fwd128 <= 1.5x native: ${ok(g('polygrad') <= 1.5 * g('native'))}` : ''))
    return
  }
  if (g1('native')) console.log(`target (wall): fwd128 <= 1.5x native: ${g1('polygrad') <= 1.5 * g1('native') ? 'met' : 'NOT met'}`)
  for (const kind of ['wall', 'cpu']) {
    const g = (k, w) => rows[k][w][kind]
    const faster = Math.min(g('fwd1', 'ort'), g('fwd1', 'tfjs'))
    console.log(`targets (${kind}): fwd128 <= 0.67x tfjs: ` + (g('fwd128', 'polygrad') <= 0.67 * g('fwd128', 'tfjs') ? 'met' : 'NOT met') +
      '; fwd1 <= 0.8x the faster: ' + (g('fwd1', 'polygrad') <= 0.8 * faster ? 'met' : 'NOT met') +
      '; train <= 25 ms: ' + (g('train128', 'polygrad') <= 25 ? 'met' : 'NOT met') +
      '; first result <= 100 ms: ' + (g('first', 'polygrad') <= 100 ? 'met' : 'NOT met') +
      '; size <= 300 KB: ' + (size !== null && size <= 300 * 1024 ? 'met' : 'NOT met'))
  }
}

main().catch((e) => {
  console.error(e)
  process.exit(1)
})
