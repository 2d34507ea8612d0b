#!/usr/bin/env node
'use strict'
/**
 * GPT-2 small in Node (issue 31 section 3): a 32-token prompt (ms, warm) and greedy decode (tokens/s) after it,
 * polygrad-js on 1 and 2 threads. The prompt is timed twice: `prefill` (what generation runs: the KV cache filled,
 * the logits of the last position only; a bundle without that entrypoint runs `forward` there) and `forward`
 * (the logits of all 32 positions, which is what onnxruntime-node's graph computes, so its two columns are one
 * figure). Beside them onnxruntime-node (same weights, torch-exported ONNX with a KV cache, intraOpNumThreads 1
 * and 2; at each thread count its rounds alternate with polygrad-js's) and Python polygrad on the same bundle. Checks that the greedy tokens and the
 * logits' first 64 values (of the last position, from prefill and from forward) agree with transformers' (bench/gpt2_ref.json, 1e-4 relative to the largest).
 *
 *   python polygrad-js/bench/make_gpt2.py     # writes bench/gpt2s.pgb, gpt2s.onnx, gpt2_ref.json (once)
 *   (cd polygrad-js/bench && npm install --ignore-scripts)   # onnxruntime-node (bench/package.json; optional)
 *   node polygrad-js/bench/gpt2.js [--rounds N] [--tokens N] [--threads 1,2] [--python PY] [--no-ort] [--lib DIR]
 *                                  [--profile decode|prefill|forward] [--base DIR] [--quant f32,q8_0] [--memory]
 *
 * --ignore-scripts: onnxruntime-node's install script fetches its CUDA provider from api.nuget.org; its CPU
 * binary is in the npm package itself. --python PY runs bench/gpt2_py.py with interpreter PY for the Python
 * column. --lib DIR times another polygrad-js checkout; --base DIR times a second one in the same process,
 * its rounds alternating with --lib's (an A/B against a baseline, under the same load). --profile times every
 * kernel call of one decode step (or of the prompt's prefill or forward) on one thread and prints them with the bytes each reads
 * from parameters and that rate in GB/s. --quant f32,q8_0,q4_0 times those bundles, their rounds alternating:
 * f32 the float32 one, FMT bench/gpt2s_<fmt>.pgb (make_gpt2.py --quant FMT) checked against Python polygrad's
 * logits and greedy tokens from that bundle (gpt2s_<fmt>_py.json; all --tokens of them); --profile takes the
 * first. --memory prints each bundle's (and the ONNX session's) load time and resident memory instead, each in
 * a fresh process.
 *
 * Timings on a shared machine are noisy: each figure is the median of the rounds; read them beside the load
 * average printed first. The CPU columns are this process's CPU time per prompt and per token (all its
 * threads): on a loaded machine they leave out the time spent waiting for a core, so at one thread they are
 * the steadier figure.
 */

const fs = require('fs')
const os = require('os')
const path = require('path')
const { execFileSync } = require('child_process')
const arg = (name, dflt) => (process.argv.includes(name) ? process.argv[process.argv.indexOf(name) + 1] : dflt)
const LIB = path.resolve(arg('--lib', path.join(__dirname, '..'))) // the polygrad-js checkout to time
const { Model } = require(LIB)
const { toposort } = require(path.join(LIB, 'src', 'ir'))
// --base DIR: a second checkout timed in the same process, its rounds alternating with LIB's (an A/B)
const BASE = process.argv.includes('--base') ? path.resolve(arg('--base')) : null
const ROUNDS = Number(arg('--rounds', 5))
const TOKENS = Number(arg('--tokens', 16))
const THREADS = arg('--threads', '1,2').split(',').map(Number)
// --quant f32,q8_0,q4_0: the bundles timed, their rounds alternating: f32 is bench/gpt2s.pgb (checked against
// transformers), FMT bench/gpt2s_<fmt>.pgb (make_gpt2.py --quant FMT; checked against Python polygrad's logits
// and greedy tokens from that bundle, gpt2s_<fmt>_py.json); onnxruntime-node's row stays float32
const QUANTS = arg('--quant', 'f32').split(',')
const REF = JSON.parse(fs.readFileSync(path.join(__dirname, 'gpt2_ref.json'), 'utf8'))
const bundleOf = (q) => path.join(__dirname, q === 'f32' ? 'gpt2s.pgb' : `gpt2s_${q}.pgb`)
const refOf = (q) => (q === 'f32' ? REF : JSON.parse(fs.readFileSync(path.join(__dirname, `gpt2s_${q}_py.json`), 'utf8')))
const PROMPT = Int32Array.from(REF.prompt)
const VOCAB = 50257
// untimed rounds first: the first runs every kernel once (polygrad-js reads its weights unpacked
// there); the second makes the packed copies (runtime.js ready), a one-time cost left out
const WARM = 2

const median = (xs) => [...xs].sort((a, b) => a - b)[xs.length >> 1]
const ms = (t0) => Number(process.hrtime.bigint() - t0) / 1e6
const cpuMs = (c0) => { const c = process.cpuUsage(c0); return (c.user + c.system) / 1000 }

function argmax (a, off = 0, n = a.length - off) {
  let best = off
  for (let i = off; i < off + n; i++) if (a[i] > a[best]) best = i
  return best - off
}

/** The largest difference of the first 64 logits from transformers', relative to the largest magnitude. */
function relError (logits, want) {
  const scale = Math.max(...want.map(Math.abs))
  return Math.max(...want.map((w, i) => Math.abs(logits[i] - w))) / scale
}

/** Each [prompt, step, ref, forward] run's figures: prompt (prefill) and forward ms, decode tok/s (medians),
 * and the check against ref; the runs' rounds alternate (round r of each, then round r + 1), so a load change
 * hits them alike. forward null: the prompt is the forward (its figures are the prompt's). The functions may
 * return a promise (onnxruntime-node's): each call is awaited, one promise turn for every runtime alike. */
async function timedAll (runs) {
  const figures = runs.map(([prompt, step, ref, forward]) => ({ prompt, step, ref, forward, promptMs: [], tokS: [], promptCpu: [], tokCpu: [], fwdMs: [], fwdCpu: [], check: null }))
  for (let r = 0; r < ROUNDS + WARM; r++) for (const f of figures) await oneRound(f, r)
  return figures.map((f) => ({
    prompt: median(f.promptMs), tokS: median(f.tokS), promptCpu: median(f.promptCpu), tokCpu: median(f.tokCpu),
    forward: f.forward ? median(f.fwdMs) : median(f.promptMs), forwardCpu: f.forward ? median(f.fwdCpu) : median(f.promptCpu), check: f.check
  }))
}

/** Round r of a run: its forward (when apart from the prompt), its prompt, then TOKENS greedy steps (the first
 * WARM rounds only check the tokens and both prompts' last logits). */
async function oneRound (f, r) {
  const { prompt, step, ref, forward, promptMs, tokS, promptCpu, tokCpu, fwdMs, fwdCpu } = f
  const errs = []
  let c0 = process.cpuUsage()
  let t0 = process.hrtime.bigint()
  if (forward) {
    const last = await forward()
    fwdMs.push(ms(t0))
    fwdCpu.push(cpuMs(c0))
    errs.push(relError(last, ref.logits[0]))
    c0 = process.cpuUsage()
    t0 = process.hrtime.bigint()
  }
  let logits = await prompt()
  const p = ms(t0)
  const pc = cpuMs(c0)
  const tokens = []
  errs.push(relError(logits, ref.logits[0]))
  c0 = process.cpuUsage()
  t0 = process.hrtime.bigint()
  for (let i = 0; i < TOKENS; i++) {
    tokens.push(argmax(logits))
    logits = await step(tokens[i], PROMPT.length + i)
    if (i < 3) errs.push(relError(logits, ref.logits[i + 1]))
  }
  const d = ms(t0)
  if (r < WARM) {
    const n = Math.min(tokens.length, ref.tokens.length)
    if (r === 0) f.check = { tokens: tokens.slice(0, n).join(' ') === ref.tokens.slice(0, n).join(' '), err: Math.max(...errs), all: tokens }
    return
  }
  promptMs.push(p)
  tokS.push(TOKENS / d * 1000)
  promptCpu.push(pc)
  tokCpu.push(cpuMs(c0) / TOKENS)
}

/** polygrad-js's runs at `threads`, per --quant bundle, for LIB (and BASE when given): {labels, runs, models}
 * for timedAll. */
function polygrad (threads) {
  const libs = BASE ? [LIB, BASE] : [LIB]
  const specs = QUANTS.flatMap((q) => libs.map((lib, i) => ({ q, lib: i ? 'base' : 'lib', bytes: fs.readFileSync(bundleOf(q)) })))
  const models = specs.map((r) => require(r.lib === 'base' ? BASE : LIB).Model.fromBytesSync(r.bytes, { threads }))
  const last = (out) => out.logits.subarray(out.logits.length - VOCAB)
  // the prompt a generating user runs: prefill (the last position's logits) where the bundle has it
  const runs = models.map((m, i) => [() => last(m.call(promptEntry(m), { input_ids: PROMPT })),
    (tok, pos) => last(m.call('decode', { input_ids: Int32Array.of(tok), pos })), refOf(specs[i].q),
    promptEntry(m) === 'forward' ? null : () => last(m.call('forward', { input_ids: PROMPT }))])
  const labels = specs.map((r) => `polygrad-js ${r.q}${libs.length > 1 ? ` ${r.lib}` : ''}`)
  return { labels, runs, models }
}

/** The entrypoint a generating user runs over the prompt: `prefill` where the bundle has it, else `forward`. */
const promptEntry = (m) => (m.entrypoints.includes('prefill') ? 'prefill' : 'forward')

/** onnxruntime-node's run at `threads` for timedAll (its graph returns every position's logits: its prompt is
 * a forward), or {error}. */
async function ort (threads) {
  let ortn
  try {
    ortn = require(path.join(__dirname, 'node_modules', 'onnxruntime-node'))
  } catch (e) {
    return { error: `onnxruntime-node is not installed (cd polygrad-js/bench && npm install): ${e.message.split('\n')[0]}` }
  }
  const file = path.join(__dirname, 'gpt2s.onnx')
  if (!fs.existsSync(file)) return { error: 'bench/gpt2s.onnx is missing: run make_gpt2.py without --no-onnx' }
  const { InferenceSession, Tensor } = ortn
  // onnxruntime-node's API is asynchronous; the session runs synchronously inside, so awaiting in a loop
  // times its work plus one promise turn per call
  const s = await InferenceSession.create(file, { intraOpNumThreads: threads, interOpNumThreads: 1, graphOptimizationLevel: 'all' })
  const layers = 12
  const empty = () => new Tensor('float32', new Float32Array(0), [1, 12, 0, 64])
  let past = null
  const run = async (ids, start) => {
    const feeds = { input_ids: new Tensor('int64', BigInt64Array.from(ids, BigInt), [1, ids.length]), position_ids: new Tensor('int64', BigInt64Array.from(ids, (_, i) => BigInt(start + i)), [1, ids.length]) }
    for (let i = 0; i < layers; i++) {
      feeds[`past_key_${i}`] = past ? past[`present_key_${i}`] : empty()
      feeds[`past_value_${i}`] = past ? past[`present_value_${i}`] : empty()
    }
    const out = await s.run(feeds)
    past = out
    return out.logits.data.subarray(out.logits.data.length - VOCAB)
  }
  const prompt = () => { past = null; return run([...PROMPT], 0) }
  return { run: [prompt, (tok, pos) => run([tok], pos), REF, null], release: () => s.release() }
}

function python (py, threads) {
  const env = Object.assign({}, process.env, { POLY_THREADS: String(threads) })
  const out = execFileSync(py, [path.join(__dirname, 'gpt2_py.py'), '--rounds', String(ROUNDS), '--tokens', String(TOKENS)], { encoding: 'utf8', env })
  return JSON.parse(out.trim().split('\n').pop())
}

/**
 * Per kernel of one call of `entry` ('decode': one token at position 32..; 'prefill' or 'forward': the 32-token
 * prompt) on
 * one thread: every variant's function wrapped with a timer, the call run `reps` times, the fastest time of
 * each kernel call kept (the steadiest figure on a loaded machine). MB: the parameter slots (and a quantized
 * weight's uint8 blocks) the call's kernel reads, whole (a gather, the token embedding, reads one row of its
 * table: its rate means nothing).
 */
function profile (bytes, entry, reps = 7) {
  const m = Model.fromBytesSync(bytes, { threads: 1 })
  let logits = m.call('forward', { input_ids: PROMPT }).logits
  let pos = PROMPT.length
  const next = () => m.call('decode', { input_ids: Int32Array.of(argmax(logits, logits.length - VOCAB, VOCAB)), pos: pos++ }).logits
  const once = () => {
    logits = entry === 'decode' ? next() : m.call(entry, { input_ids: PROMPT }).logits
  }
  once()
  once() // the second call fills the packed copies (runtime.js ready)
  const x = m._x
  const steps = x.entries[entry]
  const calls = m._p.entries[entry].calls
  const times = steps.map(() => [])
  steps.forEach((st, i) => {
    for (const key of ['main', 'small', 'packed', 'packedMain']) {
      const run = st[key]
      if (!run || run.phases !== null) continue
      const fn = run.fn
      run.fn = (...a) => {
        const t0 = process.hrtime.bigint()
        fn(...a)
        times[i].push(ms(t0))
      }
    }
  })
  const whole = []
  const repacks = x.stats.repacks
  for (let r = 0; r < reps; r++) {
    const t0 = process.hrtime.bigint()
    once()
    whole.push(ms(t0))
  }
  const rows = steps.map((st, i) => {
    if (st.copy) return null
    const c = calls[i]
    const ast = m._p.kernels[c.kernel]
    const read = new Set(toposort(ast).filter((n) => n.op === 'LOAD').map((n) => n.src[0].src[0].arg[0]))
    const paramBytes = [...read].map((j) => c.args[j]).filter((s) => s && (s.role === 'parameter' || (s.role === 'state' && s.dtype.name === 'uint8'))).reduce((a, s) => a + s.size * s.dtype.size, 0)
    return { i, name: `${st.name}#${c.kernel}`, ms: Math.min(...times[i].slice(1)), mb: paramBytes / 1e6 }
  }).filter(Boolean)
  m.dispose()
  const total = rows.reduce((a, r) => a + r.ms, 0)
  const groups = new Map()
  for (const r of rows) {
    const g = groups.get(r.name) || { name: r.name, n: 0, ms: 0, mb: 0 }
    g.n++
    g.ms += r.ms
    g.mb += r.mb
    groups.set(r.name, g)
  }
  console.log(`\n${entry} on one thread: ${rows.length} kernel calls, ${total.toFixed(2)} ms in kernels (fastest of ${reps - 1} each); the whole call ${Math.min(...whole.slice(1)).toFixed(2)} ms (fastest); ${x.stats.repacks - repacks} repacks`)
  console.log('kernel                                   | calls | ms total | ms/call | MB params | GB/s')
  for (const g of [...groups.values()].sort((a, b) => b.ms - a.ms)) {
    console.log(`${g.name.slice(0, 40).padEnd(40)} | ${String(g.n).padStart(5)} | ${g.ms.toFixed(3).padStart(8)} | ${(g.ms / g.n).toFixed(3).padStart(7)} | ${g.mb.toFixed(2).padStart(9)} | ${g.mb ? (g.mb / g.ms).toFixed(1).padStart(5) : '    -'}`)
  }
}

/**
 * --memory: load time and resident memory of each bundle (float32 and every gpt2s_<fmt>.pgb present) and of
 * onnxruntime-node's session, each in a fresh Node process (a child running this file with --load-child),
 * the processes alternating over --rounds: load s (Model.load(path) of --lib's checkout, or creating the
 * session), RSS after it, and RSS after a first prompt and decode step (kernels compiled). Medians.
 */
async function memory () {
  const files = ['gpt2s.pgb', 'gpt2s_q8_0.pgb', 'gpt2s_q4_0.pgb'].filter((f) => fs.existsSync(path.join(__dirname, f)))
  const runs = [...files, ...(process.argv.includes('--no-ort') ? [] : ['gpt2s.onnx'])]
  const got = new Map(runs.map((f) => [f, []]))
  for (let r = 0; r < ROUNDS; r++) {
    for (const f of runs) {
      const out = execFileSync(process.execPath, [__filename, '--load-child', f, '--lib', LIB], { encoding: 'utf8' })
      got.get(f).push(JSON.parse(out.trim().split('\n').pop()))
    }
  }
  console.log(`load and resident memory, each in a fresh process, medians of ${ROUNDS} (alternating)`)
  console.log('file                | MB on disk | load s | RSS MB after load | RSS MB after a prompt + a step')
  for (const f of runs) {
    const m = (k) => median(got.get(f).map((x) => x[k]))
    console.log(`${f.padEnd(19)} | ${(fs.statSync(path.join(__dirname, f)).size / 1e6).toFixed(1).padStart(10)} | ${m('load').toFixed(2).padStart(6)} | ${m('rssLoad').toFixed(0).padStart(17)} | ${m('rssRun').toFixed(0).padStart(30)}`)
  }
}

/** One --memory measurement in this (fresh) process; prints {load, rssLoad, rssRun} as JSON. */
async function loadChild (file) {
  const rss = () => process.memoryUsage().rss / 1e6
  const t0 = process.hrtime.bigint()
  let run
  if (file.endsWith('.onnx')) {
    const ortn = require(path.join(__dirname, 'node_modules', 'onnxruntime-node'))
    const s = await ortn.InferenceSession.create(path.join(__dirname, file), { intraOpNumThreads: 1, interOpNumThreads: 1, graphOptimizationLevel: 'all' })
    const load = ms(t0) / 1000
    const rssLoad = rss()
    const feeds = { input_ids: new ortn.Tensor('int64', BigInt64Array.from(PROMPT, BigInt), [1, PROMPT.length]), position_ids: new ortn.Tensor('int64', BigInt64Array.from(PROMPT, (_, i) => BigInt(i)), [1, PROMPT.length]) }
    for (let i = 0; i < 12; i++) for (const kind of ['key', 'value']) feeds[`past_${kind}_${i}`] = new ortn.Tensor('float32', new Float32Array(0), [1, 12, 0, 64])
    run = await s.run(feeds)
    console.log(JSON.stringify({ load, rssLoad, rssRun: rss() }))
    return
  }
  const m = Model.load(path.join(__dirname, file), { threads: 1 })
  const load = ms(t0) / 1000
  const rssLoad = rss()
  run = m.call('forward', { input_ids: PROMPT })
  m.call('decode', { input_ids: Int32Array.of(argmax(run.logits, run.logits.length - VOCAB, VOCAB)), pos: PROMPT.length })
  console.log(JSON.stringify({ load, rssLoad, rssRun: rss() }))
}

async function main () {
  if (process.argv.includes('--load-child')) return loadChild(arg('--load-child'))
  if (process.argv.includes('--memory')) return memory()
  console.log(`CPU: ${os.cpus()[0].model}, ${os.cpus().length} cores; load average ${os.loadavg().map((v) => v.toFixed(2)).join(' ')}; Node ${process.version}`)
  if (process.argv.includes('--profile')) {
    const entry = arg('--profile', 'decode')
    if (!['decode', 'prefill', 'forward'].includes(entry)) throw new Error(`--profile takes decode, prefill or forward, not ${JSON.stringify(entry)}`)
    profile(fs.readFileSync(bundleOf(QUANTS[0])), entry)
    return
  }
  const rows = []
  for (const t of THREADS) { // every runtime at t threads in one timedAll: their rounds alternate
    const { labels, runs, models } = polygrad(t)
    const o = process.argv.includes('--no-ort') ? null : await ort(t)
    const res = await timedAll(o && o.run ? [...runs, o.run] : runs)
    res.forEach((r, i) => { r.threads = i < models.length ? models[i].backendInfo.threads : t })
    for (const m of models) m.dispose()
    labels.forEach((name, i) => rows.push([name, t, res[i]]))
    if (o && o.run) {
      await o.release()
      rows.push(['onnxruntime-node', t, res[runs.length]])
    } else if (o) rows.push(['onnxruntime-node', t, o])
  }
  const py = arg('--python', null)
  if (py) for (const t of [1, 2].filter((n) => THREADS.includes(n))) rows.push(['python polygrad (CPU backend)', t, python(py, t)])
  console.log(`GPT-2 small (random weights), ${PROMPT.length}-token prompt then ${TOKENS} greedy tokens; medians of ${ROUNDS} after ${WARM} untimed rounds`)
  const pyRow = rows.find(([name, , r]) => name.startsWith('python') && !r.error)
  const sameAsPy = (r) => (pyRow && r.check && !rows.some(([name, , x]) => x === r && name.startsWith('python')) ? ` (${r.check.all.join(' ') === pyRow[2].check.all.join(' ') ? 'all' : 'NOT all'} ${TOKENS} = Python's)` : '')
  console.log(`polygrad-js from ${LIB}${BASE ? ` (lib), rounds alternating with ${BASE} (base)` : ''}; a quantized bundle checked against Python polygrad on it, float32 and onnxruntime-node against transformers`)
  console.log('prefill: the prompt as generation runs it (KV cache filled, the last position\'s logits; polygrad-js\'s `prefill`');
  console.log(`entrypoint). forward: the same prompt with the logits of all ${PROMPT.length} positions (polygrad-js's \`forward\`; onnxruntime-node's`)
  console.log('graph returns all positions, so its two columns are one run). CPU ms: this process\'s CPU time over all its threads.')
  console.log('runtime                        | threads | prefill ms | forward ms | decode tok/s | prefill CPU ms | forward CPU ms | CPU ms/token | greedy = reference     | max rel err')
  for (const [name, t, r] of rows) {
    if (r.error) {
      console.log(`${name.padEnd(30)} | ${String(t).padStart(7)} | ${r.error}`)
      continue
    }
    const cpu = (v) => (v === undefined ? '-' : v.toFixed(1))
    const fwd = (v) => (v === undefined ? '-' : v.toFixed(1))
    console.log(`${name.padEnd(30)} | ${String(r.threads || t).padStart(7)} | ${r.prompt.toFixed(1).padStart(10)} | ${fwd(r.forward).padStart(10)} | ${r.tokS.toFixed(2).padStart(12)} | ${cpu(r.promptCpu).padStart(14)} | ${cpu(r.forwardCpu).padStart(14)} | ${cpu(r.tokCpu).padStart(12)} | ${String(r.check.tokens).padStart(21)} | ${r.check.err.toExponential(1)}${sameAsPy(r)}`)
  }
}

main().catch((e) => {
  console.error(e)
  process.exit(1)
})
