#!/usr/bin/env node
'use strict'
/**
 * Where a GPT-2 small decode step's time goes in headless Chromium, for one or more polygrad-js builds loaded in
 * one page, their rounds alternating (an A/B under the same load): each round runs the 32-token prompt, then
 * --tokens greedy decode steps, every kernel call of a step timed with performance.now() (each step's compiled
 * functions wrapped). Printed per build: the medians over rounds of the page thread's CPU ms a token (its
 * /proc schedstat: waiting for a core left out), wall ms a token, the kernels' sum and the rest (the JS between
 * kernels, the copies, reading the logits), the weights' stream time at one thread's measured read rate; each
 * later build's CPU a token against the first's, paired by round; then the kernels grouped by name, ms a token
 * (the fastest round's: preemption only adds), with GB/s where a kernel streams its parameters.
 *
 *   node polygrad-js/bench/gpt2_decode_browser.js [--build NAME=DIR[:OPTIONS_JSON]]... [--threads N]
 *        [--rounds N] [--warm N] [--tokens N] [--top N] [--steps] [--alone] [--idle-first]
 *
 * Each --build is a polygrad-js folder with dist/ built (default: this checkout, NAME "main"); OPTIONS_JSON goes
 * to Model.fromBytes beside {threads} (e.g. {"fma":false}). Give a build twice or more (A, B, B2, A2): each loaded
 * model keeps its own speed for the page's life, up to about 10% apart for the same build (an A/A pair, paired
 * by round, read 0.89-1.08 on the 2-vCPU EPYC test VM; the first loaded is not always the slow one), so one
 * model of each build cannot tell builds apart by less than that. --steps prints every step of the first
 * build's decode instead of groups (index, name, the variant that ran, us a token in the decode and alone);
 * --alone adds the alone figures (each step called 10 times in a row, its data in the caches where it fits) to
 * the groups. --idle-first loads one more model of the first build before the timed ones and leaves it idle.
 * At --threads > 1 a phase shared with the workers is timed as its whole pool call (this thread's chunks and
 * the wait for the workers'), and the CPU column counts every renderer thread; the last column is the CPU of
 * the renderers' threads other than the page's (workers, V8's compile and GC threads).
 */

const fs = require('fs')
const os = require('os')
const path = require('path')
const { serveIsolated } = require('./serve')

const ROOT = path.join(__dirname, '..')
const argv = process.argv.slice(2)
const arg = (name, dflt) => (argv.includes(name) ? argv[argv.indexOf(name) + 1] : dflt)
const THREADS = Number(arg('--threads', 1))
const ROUNDS = Number(arg('--rounds', 5))
const WARM = Number(arg('--warm', 3))
const TOKENS = Number(arg('--tokens', 16))
const TOP = Number(arg('--top', 14))
const STEPS = argv.includes('--steps')
const ALONE = STEPS || argv.includes('--alone')
const BUILDS = argv.flatMap((a, i) => (a === '--build' ? [argv[i + 1]] : [])).map((spec) => {
  const m = /^([\w.+-]+)=([^:]+)(?::(.*))?$/.exec(spec)
  if (!m) throw new Error(`--build ${spec}: write NAME=DIR or NAME=DIR:{"option":value}`)
  return { name: m[1], dir: path.resolve(m[2]), opts: m[3] ? JSON.parse(m[3]) : {} }
})
if (!BUILDS.length) BUILDS.push({ name: 'main', dir: ROOT, opts: {} })

const PAGE = `<!doctype html><meta charset="utf-8"><body><script type="module">
const builds = ${JSON.stringify(BUILDS.map((b) => ({ name: b.name, opts: b.opts })))}
const q = new URLSearchParams(location.search)
const threads = Number(q.get('threads')), rounds = Number(q.get('rounds')), warm = Number(q.get('warm')), tokens = Number(q.get('tokens'))
const VOCAB = 50257
const median = (xs) => [...xs].sort((a, b) => a - b)[xs.length >> 1]
// a read stream's rate on this thread (GB/s): 512 MB of float32 summed in 4 lanes x 4 accumulators by a
// hand-written wasm function, the machine's memory bandwidth for one thread at that moment (others' load moves it)
const STREAM_BYTES = 512 << 20
const stream = (() => {
  const leb = (n) => { const o = []; do { let b = n & 127; n >>>= 7; if (n) b |= 128; o.push(b) } while (n); return o }
  const acc = (i, off) => [0x20, 2 + i, 0x20, 1, 0xfd, 0, 4, ...leb(off), 0xfd, 0xe4, 1, 0x21, 2 + i]
  const code = [2, 1, 0x7f, 4, 0x7b, 0x03, 0x40, ...acc(0, 0), ...acc(1, 16), ...acc(2, 32), ...acc(3, 48),
    0x20, 1, 0x41, 0xc0, 0, 0x6a, 0x22, 1, 0x20, 0, 0x49, 0x0d, 0, 0x0b,
    0x20, 2, 0x20, 3, 0xfd, 0xe4, 1, 0x20, 4, 0xfd, 0xe4, 1, 0x20, 5, 0xfd, 0xe4, 1, 0xfd, 0x1f, 0, 0x0b]
  const sec = (id, body) => [id, ...leb(body.length), ...body]
  const bytes = new Uint8Array([0, 0x61, 0x73, 0x6d, 1, 0, 0, 0, ...sec(1, [1, 0x60, 1, 0x7f, 1, 0x7d]), ...sec(3, [1, 0]),
    ...sec(5, [1, 0, ...leb(STREAM_BYTES / 65536 + 1)]), ...sec(7, [2, 1, 0x73, 0, 0, 1, 0x6d, 2, 0]),
    ...sec(10, [1, ...leb(code.length), ...code])])
  const { s: f, m } = new WebAssembly.Instance(new WebAssembly.Module(bytes)).exports
  new Float32Array(m.buffer).fill(1) // touched: pages never written read the kernel's one zero page, from cache
  return () => {
    let best = Infinity
    for (let i = 0; i < 3; i++) {
      const t = performance.now()
      f(STREAM_BYTES)
      best = Math.min(best, performance.now() - t)
    }
    return STREAM_BYTES / 1e6 / best
  }
})()
try {
  const ref = await (await fetch('/gpt2_ref.json')).json()
  const prompt = Int32Array.from(ref.prompt)
  const bytes = new Uint8Array(await (await fetch('/gpt2s.pgb')).arrayBuffer())
  const argmax = (a) => { let b = 0; for (let i = 1; i < a.length; i++) if (a[i] > a[b]) b = i; return b }
  const runs = []
  // --idle-first: a model of the first build loaded (and run once) before the timed ones, then left idle
  const idle = []
  if (q.get('idleFirst') === '1') {
    const { Model } = await import('/lib0/polygrad.browser.mjs')
    const model = await Model.fromBytes(bytes, Object.assign({ threads }, builds[0].opts))
    await model.callAsync('decode', { input_ids: Int32Array.of(1), pos: 0 })
    idle.push(model)
  }
  for (const [i, b] of builds.entries()) {
    const { Model } = await import('/lib' + i + '/polygrad.browser.mjs')
    const model = await Model.fromBytes(bytes, Object.assign({ threads }, b.opts))
    await model.callAsync('forward', { input_ids: prompt })
    await model.callAsync('decode', { input_ids: Int32Array.of(1), pos: prompt.length })
    // every compiled function of a decode step timed, per step and variant
    const steps = model._x.entries.decode
    const times = steps.map(() => ({}))
    const calls = steps.map(() => ({}))
    // a phase shared with the workers runs inside pool.callAsync: the whole call (this thread's chunks and the
    // wait for the workers') is timed there and counted to the step whose phase it runs
    let shared = false
    let cur = null
    const pool = model._x.pool
    if (pool) {
      const callAsync = pool.callAsync.bind(pool)
      pool.callAsync = async (...a) => {
        cur = a[1].step
        shared = true
        const t = performance.now()
        try {
          await callAsync(...a)
        } finally {
          shared = false
          if (cur) times[cur[0]][cur[1]] += performance.now() - t
        }
      }
    }
    steps.forEach((st, s) => {
      if (st.copy) return
      for (const v of ['main', 'small', 'packed', 'packedMain']) {
        const run = st[v]
        if (!run) continue
        times[s][v] = 0
        calls[s][v] = 0
        const wrap = (f) => (...a) => {
          calls[s][v]++
          if (shared) return f(...a)
          const t = performance.now()
          f(...a)
          times[s][v] += performance.now() - t
        }
        if (run.phases === null) run.fn = wrap(run.fn)
        else run.phases = run.phases.map((ph) => Object.assign({}, ph, { fn: Object.assign(wrap(ph.fn), { step: [s, v] }) }))
      }
    })
    const bytesOf = steps.map((st) => {
      if (st.copy) return 0
      const c = model._p.entries.decode.calls[steps.indexOf(st)]
      return c.args.filter((a) => a.role === 'parameter').reduce((n, a) => n + a.size * a.dtype.size, 0)
    })
    const params = new Set(model._p.entries.decode.calls.flatMap((c) => (c.copy ? [] : c.args.filter((a) => a.role === 'parameter'))))
    const weightBytes = [...params].reduce((n, a) => n + a.size * a.dtype.size, 0)
    runs.push({ name: b.name, weightBytes, model, steps, times, calls, bytesOf, cpu: [], cpuOther: [], wall: [], kern: [], gbs: [], bytesTok: [], tokens: null, fma: model.backendInfo.fma })
  }
  for (let r = 0; r < rounds + warm; r++) {
    const order = r % 2 ? [...runs].reverse() : runs
    const gbs = stream()
    for (const x of order) {
      const last = (out) => out.logits.subarray(out.logits.length - VOCAB)
      let logits = last(await x.model.callAsync('forward', { input_ids: prompt }))
      for (const t of x.times) for (const v in t) t[v] = 0
      for (const t of x.calls) for (const v in t) t[v] = 0
      const toks = []
      const c0 = await window.__cpuMs()
      const t0 = performance.now()
      for (let i = 0; i < tokens; i++) {
        toks.push(argmax(logits))
        logits = last(await x.model.callAsync('decode', { input_ids: Int32Array.of(toks[i]), pos: prompt.length + i }))
      }
      const wall = (performance.now() - t0) / tokens
      const c1 = await window.__cpuMs()
      // at one thread the page's main thread (it runs every kernel); with threads, every renderer thread
      const cpu = (threads > 1 ? c1[1] - c0[1] : c1[0] - c0[0]) / tokens
      x.cpuOther.push((c1[1] - c0[1] - (c1[0] - c0[0])) / tokens)
      if (x.tokens === null) x.tokens = toks.slice(0, ref.tokens.length).join(' ') === ref.tokens.slice(0, toks.length).join(' ')
      if (r < warm) continue
      x.cpu.push(cpu)
      x.gbs.push(gbs)
      x.bytesTok.push(cpu * gbs / 1e3)
      x.wall.push(wall)
      x.kern.push(x.times.map((t) => Object.fromEntries(Object.entries(t).map(([v, ms]) => [v, ms / tokens]))))
    }
  }
  // --alone: each step of each build's decode also timed alone, called 10 times in a row (data a kernel reads
  // again stays in the caches) at the last round's position, the fastest of 5 such runs: a step much slower in
  // the decode than alone pays for something around it (memory traffic, cache state), not its own instructions
  const env = { pos: prompt.length + tokens - 1 }
  for (const x of q.get('alone') === '1' ? runs : []) {
    const alone = x.alone = []
    x.steps.forEach((st, s) => {
      if (st.copy) return alone.push(null)
      const v = Object.keys(x.times[s]).find((k) => x.kern[0][s][k] > 0)
      const run = st[v]
      const args = run.vars.map((n) => env[n])
      const fns = run.phases === null ? [run.fn] : run.phases.map((ph) => (...a) => ph.fn(0, 1, ...a))
      let best = Infinity
      for (let r = 0; r < 5; r++) {
        const t0 = performance.now()
        for (let i = 0; i < 10; i++) for (const f of fns) f(...args)
        best = Math.min(best, (performance.now() - t0) / 10)
      }
      alone.push(best)
    })
  }
  window.__result = {
    rows: runs.map((x) => {
      // per step: the median over rounds of its ms a token (each variant that ran)
      const perStep = x.steps.map((st, s) => {
        if (st.copy) return null
        const vs = Object.keys(x.times[s]).filter((v) => x.kern.some((k) => k[s][v] > 0))
        return { name: st.name, variants: vs, ms: vs.reduce((a, v) => a + Math.min(...x.kern.map((k) => k[s][v])), 0), bytes: x.bytesOf[s], alone: x.alone ? x.alone[s] : null }
      })
      const kernSum = x.kern.map((k) => k.reduce((a, t) => a + Object.values(t).reduce((p, q) => p + q, 0), 0))
      return { name: x.name, fma: x.fma, tokens: x.tokens, cpu: median(x.cpu), cpuAll: x.cpu, cpuOther: median(x.cpuOther), gbs: median(x.gbs), gbTok: median(x.bytesTok), weightBytes: x.weightBytes, wall: median(x.wall), kern: median(kernSum), perStep, copies: x.steps.filter((s) => s.copy).length }
    })
  }
  for (const x of runs) x.model.dispose()
} catch (e) {
  window.__result = { error: String(e && e.stack || e) }
}
</script>`

function serve () {
  const files = {
    '/': ['text/html', () => PAGE],
    '/gpt2s.pgb': ['application/octet-stream', () => fs.readFileSync(path.join(__dirname, 'gpt2s.pgb'))],
    '/gpt2_ref.json': ['application/json', () => fs.readFileSync(path.join(__dirname, 'gpt2_ref.json'))]
  }
  BUILDS.forEach((b, i) => {
    files[`/lib${i}/polygrad.browser.mjs`] = ['text/javascript', () => fs.readFileSync(path.join(b.dir, 'dist', 'polygrad.browser.mjs'))]
  })
  return serveIsolated(files)
}

/** [main, all]: CPU ms of the renderers' main threads (the page's: a renderer's main thread has the process's
 * id; at one thread it runs every kernel) and of all their threads (workers, V8's compile and GC threads),
 * from /proc/<pid>/task/<tid>/schedstat. */
async function pageCpuMs (cdp) {
  const { processInfo } = await cdp.send('SystemInfo.getProcessInfo')
  let main = 0
  let all = 0
  for (const p of processInfo.filter((x) => x.type === 'renderer')) {
    try {
      for (const t of fs.readdirSync(`/proc/${p.id}/task`)) {
        const ns = Number(fs.readFileSync(`/proc/${p.id}/task/${t}/schedstat`, 'utf8').split(' ')[0])
        all += ns
        if (t === String(p.id)) main += ns
      }
    } catch (e) {} // the process or thread ended
  }
  return [main / 1e6, all / 1e6]
}

async function main () {
  for (const b of BUILDS) {
    if (!fs.existsSync(path.join(b.dir, 'dist', 'polygrad.browser.mjs'))) throw new Error(`--build ${b.name}: ${b.dir} has no dist/polygrad.browser.mjs: run node tools/build.js there`)
  }
  if (!fs.existsSync(path.join(__dirname, 'gpt2s.pgb'))) throw new Error('bench/gpt2s.pgb is missing: run python polygrad-js/bench/make_gpt2.py')
  const server = await serve()
  const { chromium } = require('playwright-core')
  const profile = fs.mkdtempSync(path.join(os.tmpdir(), 'polygrad-chromium-'))
  const context = await chromium.launchPersistentContext(profile, {
    executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
    headless: true,
    args: ['--headless', '--no-sandbox', '--disable-gpu', '--no-first-run', '--disable-background-networking', '--disable-component-update', '--disable-sync']
  })
  console.log(`load average ${os.loadavg().map((l) => l.toFixed(2)).join(' ')}; ${os.cpus()[0].model.trim()}, ${os.cpus().length} cores; GPT-2 small float32, ${THREADS} thread(s), ${TOKENS} tokens a round, medians of ${ROUNDS} rounds after ${WARM}`)
  let r
  try {
    const page = context.pages()[0] || await context.newPage()
    const cdp = await context.browser().newBrowserCDPSession()
    await page.exposeFunction('__cpuMs', async () => pageCpuMs(cdp))
    await page.goto(`http://127.0.0.1:${server.address().port}/?threads=${THREADS}&rounds=${ROUNDS}&warm=${WARM}&tokens=${TOKENS}&alone=${ALONE ? 1 : 0}&idleFirst=${argv.includes('--idle-first') ? 1 : 0}`)
    await page.waitForFunction('window.__result !== undefined', null, { timeout: 30 * 60 * 1000 })
    r = await page.evaluate('window.__result')
  } finally {
    await context.close()
    fs.rmSync(profile, { recursive: true, force: true })
    server.close()
  }
  if (r.error) throw new Error(`the page failed: ${r.error}`)
  console.log(`load average after ${os.loadavg().map((l) => l.toFixed(2)).join(' ')}`)
  console.log(`weights a decode step reads: ${(r.rows[0].weightBytes / 1e6).toFixed(1)} MB; stream: one thread's read rate measured before each round`)
  console.log('build        | fma   | tokens ok | CPU ms/token (rounds)              | wall ms/token | kernels ms | rest ms | stream GB/s | CPU / stream time of the weights | other threads\' CPU ms/token')
  for (const x of r.rows) {
    console.log(`${x.name.padEnd(12)} | ${String(x.fma).padEnd(5)} | ${String(x.tokens).padEnd(9)} | ${x.cpu.toFixed(2).padStart(6)} (${x.cpuAll.map((c) => c.toFixed(1)).join(' ')})`.padEnd(64) +
      ` | ${x.wall.toFixed(2).padStart(13)} | ${x.kern.toFixed(2).padStart(10)} | ${(x.wall - x.kern).toFixed(2).padStart(7)} | ${x.gbs.toFixed(1).padStart(11)} | ${(x.gbTok * 1e9 / x.weightBytes).toFixed(2).padStart(31)}x | ${x.cpuOther.toFixed(2)}`)
  }
  // paired: each round's CPU a token against the first build's in the same round (adjacent in time)
  for (const x of r.rows.slice(1)) {
    const ratios = x.cpuAll.map((c, i) => c / r.rows[0].cpuAll[i]).sort((a, b) => a - b)
    const q = (f) => ratios[Math.min(ratios.length - 1, Math.floor(f * ratios.length))].toFixed(3)
    const above = ratios.filter((v) => v > 1).length
    console.log(`  ${x.name} / ${r.rows[0].name}, CPU a token, paired by round: median ${q(0.5)}, quartiles ${q(0.25)}..${q(0.75)}, range ${q(0)}..${q(1)}; above 1 in ${above} of ${ratios.length}`)
  }
  if (STEPS) {
    console.log('step name                         variant      in decode   alone (us)')
    for (const [i, s] of r.rows[0].perStep.entries()) if (s) console.log(`${String(i).padStart(4)} ${s.name.padEnd(28)} ${s.variants.join('+').padEnd(12)} ${(s.ms * 1000).toFixed(1).padStart(9)} ${s.alone === null ? '        -' : (s.alone * 1000).toFixed(1).padStart(9)}`)
    return
  }
  // kernels grouped by name: ms a token per build, calls, GB/s of their parameters
  const groups = new Map()
  r.rows.forEach((x, b) => {
    for (const s of x.perStep) {
      if (!s) continue
      const g = groups.get(s.name) || { name: s.name, n: 0, ms: r.rows.map(() => 0), alone: r.rows.map(() => 0), bytes: 0, variants: new Set() }
      if (b === 0) { g.n++; g.bytes += s.bytes }
      g.ms[b] += s.ms
      g.alone[b] += s.alone || 0
      for (const v of s.variants) g.variants.add(v)
      groups.set(s.name, g)
    }
  })
  const sorted = [...groups.values()].sort((a, b) => b.ms[0] - a.ms[0])
  console.log(`kernel (by ${r.rows[0].name}'s time)       | calls | variants          | ` + r.rows.map((x) => `${x.name} ms`.padStart(12)).join(' | ') + ` | ${r.rows[0].name} GB/s`)
  for (const g of sorted.slice(0, TOP)) {
    const gbs = g.bytes ? (g.bytes / 1e6 / g.ms[0]).toFixed(1) : '-'
    console.log(`${g.name.padEnd(30)} | ${String(g.n).padStart(5)} | ${[...g.variants].join('+').padEnd(17)} | ` + g.ms.map((m) => m.toFixed(3).padStart(12)).join(' | ') + ` | ${gbs.padStart(6)}` +
      (ALONE ? ' | alone ' + g.alone.map((m) => m.toFixed(3)).join(' ') : ''))
  }
  const rest = sorted.slice(TOP)
  if (rest.length) console.log(`(${rest.length} more names)`.padEnd(30) + ` | ${String(rest.reduce((a, g) => a + g.n, 0)).padStart(5)} | ${''.padEnd(17)} | ` + r.rows.map((_, b) => rest.reduce((a, g) => a + g.ms[b], 0).toFixed(3).padStart(12)).join(' | '))
}

main().catch((e) => {
  console.error(e.message || e)
  process.exit(1)
})
