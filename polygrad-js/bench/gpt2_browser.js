#!/usr/bin/env node
'use strict'
/**
 * GPT-2 small in the browser (issue 31 section 3's browser target): headless Chromium (Debian's `chromium`
 * through playwright-core) on a cross-origin isolated page runs polygrad-js (dist/polygrad.browser.mjs, the
 * async API a page uses) and onnxruntime-web's wasm backend (the engine transformers.js runs on in a browser)
 * on the same weights, their rounds alternating, at each --threads count: a 32-token prompt (ms, warm; polygrad-js's
 * `prefill` where the bundle has it, what generation runs, as bench/gpt2.js times it: the KV cache filled and the
 * last position's logits; onnxruntime-web's graph returns every position's, its one way to fill the cache) and
 * greedy decode after it (tokens/s). Greedy tokens and the first logits are checked against transformers'
 * (bench/gpt2_ref.json), as gpt2.js does in Node.
 *
 *   python polygrad-js/bench/make_gpt2.py        # bench/gpt2s.pgb, gpt2s.onnx, gpt2_ref.json (once)
 *   (cd polygrad-js/bench && npm install)        # onnxruntime-web (bench/package.json)
 *   node polygrad-js/bench/gpt2_browser.js [--threads 1,2] [--rounds N] [--tokens N] [--warm N] [--base DIR]
 *                                          [--quant q8_0_i8,q4_0_i8] [--pages N]
 *
 * Both libraries run their kernels on the page's thread at 1 thread (ort-web numThreads 1; polygrad-js threads
 * 1) and with that many workers beside it otherwise. Timings on a shared machine are noisy: each figure is the
 * median of the rounds; read them beside the load average printed first. The CPU columns are the renderer
 * process's CPU time (all its threads, from /proc/<pid>/task/<tid>/schedstat; Linux) per prompt and per token:
 * on a loaded machine they leave out the time spent waiting for a core, so at one thread they are the steadier
 * figure. --base DIR times a second polygrad-js checkout (its dist/ built) in the same page, its rounds
 * alternating with this one's (an A/B under the same load). A model keeps its own speed for a page's life (the
 * same build loaded twice read 0.86x and 1.16x itself in CPU a token, page by page): --pages N repeats each page,
 * loading the base first in every other one, and prints the medians over pages and each page's ratio.
 *
 * --quant FMT[,FMT] times 8-bit models instead, the way transformers.js runs GPT-2 in a browser by default:
 * polygrad-js on bench/gpt2s_<FMT>.pgb (make_gpt2.py --quant q8_0,q4_0 [--int8-dot]: FMT q8_0 or q4_0 the
 * float-activation kernels, q8_0_i8 or q4_0_i8 the int8 route, 8-bit activations and int32 block sums) and
 * onnxruntime-web on bench/gpt2s_int8.onnx (make_gpt2.py --int8-onnx: onnxruntime's dynamic quantization of
 * the same weights, MatMulInteger). Every row's greedy tokens are compared with the float model's
 * (transformers', gpt2_ref.json: "tokens ok" when the first 3 agree; rounding to 8 bits may flip a near tie) and
 * each polygrad-js bundle's all --tokens of them with Python polygrad's from that bundle (gpt2s_<FMT>_py.json,
 * "own ref"); "max rel err" is the logits' distance from the float model's (the prompt's, and each step's while
 * the tokens so far are the float model's).
 */

const fs = require('fs')
const os = require('os')
const path = require('path')
const { serveIsolated } = require('./serve')

const ROOT = path.join(__dirname, '..')
const ORT_DIST = path.join(__dirname, 'node_modules', 'onnxruntime-web', 'dist')
const arg = (name, dflt) => (process.argv.includes(name) ? process.argv[process.argv.indexOf(name) + 1] : dflt)
const THREADS = arg('--threads', '1,2').split(',').map(Number)
const ROUNDS = Number(arg('--rounds', 3))
const TOKENS = Number(arg('--tokens', 16))
// untimed rounds first: Chromium compiles a wasm function with its baseline compiler and tiers it up once it is
// hot, so a page's first rounds run slower (polygrad-js's 32-token prompt took about 8x its settled time in the
// first round and settled by the fourth)
const WARM = Number(arg('--warm', 4))
// --base DIR: a second polygrad-js checkout (its dist/ built) timed in the same page, rounds alternating (an A/B)
const BASE = process.argv.includes('--base') ? path.resolve(arg('--base')) : null
// --pages N: each thread count's page N times, a fresh browser each, the base build's model loaded first in every
// other page: each model keeps its own speed for the page's life (up to about 10% apart for one build loaded
// twice, bench/gpt2_decode_browser.js), so one page's A/B cannot tell builds apart by less than that
const PAGES = Number(arg('--pages', 1))
// --quant FMT[,FMT]: polygrad-js's bench/gpt2s_<FMT>.pgb beside onnxruntime-web's bench/gpt2s_int8.onnx
const QUANTS = process.argv.includes('--quant') ? arg('--quant').split(',') : null
const BUNDLES = QUANTS ? QUANTS.map((q) => `gpt2s_${q}`) : ['gpt2s']
const ONNX = QUANTS ? 'gpt2s_int8' : 'gpt2s'

// the page: the libraries on the same prompt, rounds alternating; results in window.__result
const PAGE = `<!doctype html><meta charset="utf-8"><body><script type="module">
import { Model } from '/dist/polygrad.browser.mjs'
import * as ort from '/ort/ort.wasm.min.mjs'
const q = new URLSearchParams(location.search)
const threads = Number(q.get('threads')), rounds = Number(q.get('rounds')), tokens = Number(q.get('tokens'))
const bundles = q.get('bundles').split(','), quant = q.get('quant') === '1'
const Base = q.get('base') ? (await import('/base/dist/polygrad.browser.mjs')).Model : null
// the renderer's CPU time in ms (the bench's exposed function; null where /proc is missing)
const cpu = async () => window.__cpuMs ? window.__cpuMs() : null
const VOCAB = 50257, WARM = Number(q.get('warm'))
try {
  const ref = await (await fetch('/gpt2_ref.json')).json()
  const prompt = Int32Array.from(ref.prompt)
  const argmax = (a) => { let b = 0; for (let i = 1; i < a.length; i++) if (a[i] > a[b]) b = i; return b }
  const relError = (l, want) => Math.max(...want.map((w, i) => Math.abs(l[i] - w))) / Math.max(...want.map(Math.abs))
  const median = (xs) => [...xs].sort((a, b) => a - b)[xs.length >> 1]
  const bytes = async (url) => new Uint8Array(await (await fetch(url)).arrayBuffer())

  const load = {}
  const last = (out) => out.logits.subarray(out.logits.length - VOCAB)
  const models = []
  const polygrad = async (M, name, file) => {
    const t0 = performance.now()
    const model = await M.fromBytes(await bytes('/b/' + file + '.pgb'), { threads })
    load[name] = performance.now() - t0
    models.push(model)
    return {
      model,
      own: quant ? await (await fetch('/b/' + file + '_py.json')).json() : null,
      // the prompt a generating user runs: prefill where the bundle has it (as bench/gpt2.js)
      prompt: async () => last(await model.callAsync(model.entrypoints.includes('prefill') ? 'prefill' : 'forward', { input_ids: prompt })),
      step: async (tok, pos) => last(await model.callAsync('decode', { input_ids: Int32Array.of(tok), pos }))
    }
  }
  // row names: 'polygrad-js' (and 'polygrad-js base') for the float32 bundle, with the format after it for --quant
  const libs = {}
  for (const file of bundles) {
    const fmt = file.replace(/^gpt2s_?/, '')
    const name = 'polygrad-js' + (fmt ? ' ' + fmt : '')
    const baseName = fmt ? 'base ' + fmt : 'polygrad-js base'
    // baseFirst: the base build's model loaded (and its rounds run) first (--pages alternates it)
    if (Base && q.get('baseFirst') === '1') libs[baseName] = await polygrad(Base, baseName, file)
    libs[name] = await polygrad(Model, name, file)
    if (Base && q.get('baseFirst') !== '1') libs[baseName] = await polygrad(Base, baseName, file)
  }
  const pg = libs[Object.keys(libs).find((k) => !k.includes('base'))]

  ort.env.wasm.numThreads = threads
  ort.env.wasm.wasmPaths = '/ort/'
  const t0 = performance.now()
  const ortName = quant ? 'onnxruntime-web int8' : 'onnxruntime-web'
  const session = await ort.InferenceSession.create(await bytes('/b/' + q.get('onnx') + '.onnx'), { executionProviders: ['wasm'], graphOptimizationLevel: 'all' })
  load[ortName] = performance.now() - t0
  let past = null
  const empty = () => new ort.Tensor('float32', new Float32Array(0), [1, 12, 0, 64])
  const ortRun = async (ids, start) => {
    const feeds = {
      input_ids: new ort.Tensor('int64', BigInt64Array.from(ids, BigInt), [1, ids.length]),
      position_ids: new ort.Tensor('int64', BigInt64Array.from(ids, (_, i) => BigInt(start + i)), [1, ids.length])
    }
    for (let i = 0; i < 12; i++) {
      feeds['past_key_' + i] = past ? past['present_key_' + i] : empty()
      feeds['past_value_' + i] = past ? past['present_value_' + i] : empty()
    }
    const out = await session.run(feeds)
    past = out
    return out.logits.data.subarray(out.logits.data.length - VOCAB)
  }
  const ortLib = { prompt: async () => { past = null; return ortRun([...prompt], 0) }, step: (tok, pos) => ortRun([tok], pos) }

  libs[ortName] = ortLib
  const figs = Object.fromEntries(Object.keys(libs).map((k) => [k, { promptMs: [], tokS: [], promptCpu: [], tokCpu: [], tokens: null, own: null, err: 0 }]))
  for (let r = 0; r < rounds + WARM; r++) {
    // the order reversed every other round: no library always runs right after another (whose threads may
    // still spin, or whose data just left the caches)
    const order = r % 2 ? Object.entries(libs).reverse() : Object.entries(libs)
    for (const [name, lib] of order) {
      const f = figs[name]
      let c = await cpu()
      let t = performance.now()
      let logits = await lib.prompt()
      const p = performance.now() - t
      const pc = c === null ? null : (await cpu()) - c
      const errs = [relError(logits, ref.logits[0])]
      const toks = []
      c = await cpu()
      t = performance.now()
      for (let i = 0; i < tokens; i++) {
        toks.push(argmax(logits))
        logits = await lib.step(toks[i], prompt.length + i)
        // a step's logits are comparable only while the tokens so far are the reference's
        if (i < ref.logits.length - 1 && toks.every((x, j) => x === ref.tokens[j])) errs.push(relError(logits, ref.logits[i + 1]))
      }
      const d = performance.now() - t
      const dc = c === null ? null : (await cpu()) - c
      if (r === 0) {
        const n = Math.min(toks.length, ref.tokens.length)
        f.tokens = toks.slice(0, n).join(' ') === ref.tokens.slice(0, n).join(' ')
        f.err = Math.max(...errs)
        if (lib.own) f.own = toks.join(' ') === lib.own.tokens.slice(0, toks.length).join(' ')
      }
      if (r >= WARM) {
        f.promptMs.push(p)
        f.tokS.push(tokens / d * 1000)
        if (dc !== null) { f.promptCpu.push(pc); f.tokCpu.push(dc / tokens) }
      }
    }
  }
  const backend = pg.model.backendInfo
  for (const m of models) m.dispose()
  await session.release()
  window.__result = {
    isolated: crossOriginIsolated, backend, load,
    rows: Object.fromEntries(Object.entries(figs).map(([k, f]) => [k, {
      prompt: median(f.promptMs), tokS: median(f.tokS), tokens: f.tokens, own: f.own, err: f.err,
      promptCpu: f.promptCpu.length ? median(f.promptCpu) : null, tokCpu: f.tokCpu.length ? median(f.tokCpu) : null
    }]))
  }
} catch (e) {
  window.__result = { error: String(e && e.stack || e) }
}
</script>`

/** Serve the page, the browser build, onnxruntime-web's files and the model files, cross-origin isolated. */
function serve () {
  const files = {
    '/': ['text/html', () => PAGE],
    '/dist/polygrad.browser.mjs': ['text/javascript', () => fs.readFileSync(path.join(ROOT, 'dist', 'polygrad.browser.mjs'))],
    '/base/dist/polygrad.browser.mjs': ['text/javascript', () => fs.readFileSync(path.join(BASE || ROOT, 'dist', 'polygrad.browser.mjs'))],
    '/gpt2_ref.json': ['application/json', () => fs.readFileSync(path.join(__dirname, 'gpt2_ref.json'))]
  }
  for (const b of BUNDLES) {
    files[`/b/${b}.pgb`] = ['application/octet-stream', () => fs.readFileSync(path.join(__dirname, `${b}.pgb`))]
    files[`/b/${b}_py.json`] = ['application/json', () => fs.readFileSync(path.join(__dirname, `${b}_py.json`))]
  }
  files[`/b/${ONNX}.onnx`] = ['application/octet-stream', () => fs.readFileSync(path.join(__dirname, `${ONNX}.onnx`))]
  return serveIsolated(files, (url) => { // onnxruntime-web's own files, by name
    if (!url.startsWith('/ort/') || !/^[\w.-]+$/.test(url.slice(5))) return undefined
    const f = path.join(ORT_DIST, url.slice(5))
    if (fs.existsSync(f)) return [f.endsWith('.wasm') ? 'application/wasm' : 'text/javascript', () => fs.readFileSync(f)]
  })
}

/** CPU time in ms of every renderer process of the browser (the page's and its workers' threads; a renderer
 * with no page is idle), read from each thread's schedstat (nanoseconds on a CPU). */
async function rendererCpuMs (cdp) {
  const { processInfo } = await cdp.send('SystemInfo.getProcessInfo')
  let ns = 0
  for (const p of processInfo.filter((x) => x.type === 'renderer')) {
    let tids = []
    try {
      tids = fs.readdirSync(`/proc/${p.id}/task`)
    } catch (e) {
      continue // the process ended
    }
    for (const t of tids) {
      try {
        ns += Number(fs.readFileSync(`/proc/${p.id}/task/${t}/schedstat`, 'utf8').split(' ')[0])
      } catch (e) {} // the thread ended
    }
  }
  return ns / 1e6
}

async function runPage (port, threads, baseFirst = false) {
  const { chromium } = require('playwright-core')
  const profile = fs.mkdtempSync(path.join(os.tmpdir(), 'polygrad-chromium-'))
  const context = await chromium.launchPersistentContext(profile, {
    executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
    headless: true,
    args: ['--headless', '--no-sandbox', '--disable-gpu', '--no-first-run', '--disable-background-networking',
      '--disable-component-update', '--disable-sync']
  })
  try {
    const page = context.pages()[0] || await context.newPage()
    const cdp = await context.browser().newBrowserCDPSession()
    if (fs.existsSync('/proc/self/task')) await page.exposeFunction('__cpuMs', async () => rendererCpuMs(cdp))
    await page.goto(`http://127.0.0.1:${port}/?threads=${threads}&rounds=${ROUNDS}&tokens=${TOKENS}&warm=${WARM}${BASE ? '&base=1' : ''}` +
      `&bundles=${BUNDLES.join(',')}&onnx=${ONNX}&quant=${QUANTS ? 1 : 0}&baseFirst=${baseFirst ? 1 : 0}`)
    await page.waitForFunction('window.__result !== undefined', null, { timeout: 30 * 60 * 1000 })
    return await page.evaluate('window.__result')
  } finally {
    await context.close()
    fs.rmSync(profile, { recursive: true, force: true })
  }
}

async function main () {
  for (const f of ['gpt2s.pgb', 'gpt2s.onnx', 'gpt2_ref.json']) {
    if (!fs.existsSync(path.join(__dirname, f))) throw new Error(`bench/${f} is missing: run python polygrad-js/bench/make_gpt2.py`)
  }
  for (const q of QUANTS || []) {
    const how = q.endsWith('_i8') ? `--quant ${q.slice(0, -3)} --int8-dot` : `--quant ${q}`
    for (const f of [`gpt2s_${q}.pgb`, `gpt2s_${q}_py.json`]) {
      if (!fs.existsSync(path.join(__dirname, f))) throw new Error(`bench/${f} is missing: run python polygrad-js/bench/make_gpt2.py --only-quant ${how}`)
    }
  }
  if (QUANTS && !fs.existsSync(path.join(__dirname, 'gpt2s_int8.onnx'))) throw new Error('bench/gpt2s_int8.onnx is missing: run python polygrad-js/bench/make_gpt2.py --only-quant --int8-onnx')
  if (!fs.existsSync(ORT_DIST)) throw new Error('onnxruntime-web is not installed: cd polygrad-js/bench && npm install')
  if (BASE && !fs.existsSync(path.join(BASE, 'dist', 'polygrad.browser.mjs'))) throw new Error(`--base ${BASE} has no dist/polygrad.browser.mjs: run node tools/build.js there`)
  const server = await serve()
  console.log(`CPU: ${os.cpus()[0].model.trim()}, ${os.cpus().length} cores; load average ${os.loadavg().map((l) => l.toFixed(2)).join(' ')}; Chromium headless`)
  console.log(`GPT-2 small${QUANTS ? ` quantized (${QUANTS.join(', ')}; onnxruntime-web: gpt2s_int8.onnx)` : ''}, ${TOKENS} greedy tokens after a 32-token prompt, medians of ${ROUNDS} alternating rounds after ${WARM} untimed`)
  if (BASE) console.log(`polygrad-js from ${ROOT}, rounds alternating with ${BASE} (base)`)
  console.log('library                | threads | prompt ms | decode tok/s | prompt CPU ms | CPU ms/token | tokens ok | own ref | max rel err | load s')
  try {
    for (const t of THREADS) {
      const pages = []
      for (let pg = 0; pg < PAGES; pg++) {
        const r = await runPage(server.address().port, t, BASE !== null && pg % 2 === 1)
        if (r.error) throw new Error(`the page failed at ${t} threads: ${r.error}`)
        if (t > 1 && !r.isolated) throw new Error('the page is not cross-origin isolated: no threads')
        pages.push(r)
        if (PAGES > 1) console.log(`page ${pg + 1} of ${PAGES}${BASE ? (pg % 2 ? ', base loaded first' : ', base loaded second') : ''}:`)
        for (const [name, f] of Object.entries(r.rows)) {
          const cpuCol = (v, w) => (v === null ? '-' : v.toFixed(1)).padStart(w)
          console.log(`${name.padEnd(22)} | ${String(t).padStart(7)} | ${f.prompt.toFixed(1).padStart(9)} | ${f.tokS.toFixed(2).padStart(12)} | ${cpuCol(f.promptCpu, 13)} | ${cpuCol(f.tokCpu, 12)} | ${String(f.tokens).padStart(9)} | ${String(f.own === null ? '-' : f.own).padStart(7)} | ${f.err.toExponential(1).padStart(11)} | ${(r.load[name] / 1000).toFixed(2)}`)
        }
        const ortName = Object.keys(r.rows).find((k) => k.startsWith('onnxruntime-web'))
        const ort = r.rows[ortName]
        for (const [name, row] of Object.entries(r.rows)) {
          if (name === ortName) continue
          console.log(`  at ${t} thread(s): ${name} decode ${(row.tokS / ort.tokS).toFixed(2)}x ${ortName}'s tokens/s (target 2x), prompt ${(row.prompt / ort.prompt).toFixed(2)}x its time`)
        }
        console.log(`  polygrad-js backend ${JSON.stringify(r.backend)}`)
      }
      if (PAGES > 1) {
        const med = (xs) => [...xs].sort((a, b) => a - b)[xs.length >> 1]
        console.log(`  medians of the ${PAGES} pages at ${t} thread(s):`)
        for (const name of Object.keys(pages[0].rows)) {
          const col = (k) => med(pages.map((r) => r.rows[name][k]))
          console.log(`  ${name.padEnd(22)} decode ${col('tokS').toFixed(2)} tok/s, prompt ${col('prompt').toFixed(1)} ms` + (pages[0].rows[name].tokCpu === null ? '' : `, CPU ${col('tokCpu').toFixed(1)} ms/token`))
        }
        for (const [name, baseName] of Object.keys(pages[0].rows).filter((k) => k.startsWith('polygrad-js') && !k.includes('base')).map((k) => [k, k === 'polygrad-js' ? 'polygrad-js base' : 'base ' + k.slice(12)])) {
          if (!BASE || pages[0].rows[name].tokCpu === null) break
          const ratios = pages.map((r) => r.rows[name].tokCpu / r.rows[baseName].tokCpu)
          console.log(`  ${name} / ${baseName} CPU a token, per page: ${ratios.map((x) => x.toFixed(3)).join(' ')}`)
        }
      }
    }
  } finally {
    server.close()
  }
}

main().catch((e) => {
  console.error(e.message || e)
  process.exit(1)
})
