#!/usr/bin/env node
'use strict'
/**
 * GPT-2 small's decode matvecs in headless Chromium, each timed alone on a slice small enough to stay in the
 * caches: the kernel's compute rate without the memory traffic, so a change to its instructions shows under a
 * load that makes whole-token timings noise (other processes share the memory bandwidth, not this core's
 * caches). The page loads bench/gpt2s.pgb with 2 threads (each kernel is then compiled as phases over slices
 * of its first loop: runtime.js) and calls one phase on its first slice of `parts` many times, with the fma
 * load option on (Chromium's default: relaxed SIMD's multiply-add) and off. Figures are microseconds a call:
 * the fastest and the median of 40 samples of 10 calls.
 *
 *   python polygrad-js/bench/make_gpt2.py                      # bench/gpt2s.pgb (once)
 *   node polygrad-js/bench/gpt2_kernels_browser.js [--base DIR] # DIR: a second polygrad-js build, timed after
 *        [--quant FMT]  # bench/gpt2s_<FMT>.pgb's decode matvecs (make_gpt2.py --quant), each with the int8 dot
 *                       # product (an int8-route bundle's block sums: linearize.js dotReduce) on and off, fma on
 *        [--js-flags F] # V8 flags for Chromium's renderer (e.g. --no-liftoff), to test what a change of engine does
 *        [--profile [decode|prefill|forward]]  # instead: one call of the entrypoint (decode: a step; the
 *                       # others a 32-token prompt) at 1 thread, each kernel's time (the fastest of 9 calls)
 *                       # in Node and in the page, the same bundle and build side by side: where the page's
 *                       # extra time goes
 */

const fs = require('fs')
const path = require('path')
const { serveIsolated } = require('./serve')

const ROOT = path.join(__dirname, '..')
const arg = (name, dflt) => (process.argv.includes(name) ? process.argv[process.argv.indexOf(name) + 1] : dflt)
const BASE = process.argv.includes('--base') ? path.resolve(arg('--base')) : null
const QUANT = process.argv.includes('--quant') ? arg('--quant') : null
const BUNDLE = QUANT ? `gpt2s_${QUANT}.pgb` : 'gpt2s.pgb'
// [entrypoint, kernel name, slices]: the head's 50257 columns in 64 slices, the others in 4 (a quantized bundle's
// matvecs are named by their output size alone; its two 768-wide ones are told apart by their index)
const KERNELS = QUANT
  ? [['decode', 'r_1_1_50257', 64], ['decode', 'r_1_1_3072', 4], ['decode', 'r_1_1_2304', 4], ['decode', 'r_1_1_768', 4, 0], ['decode', 'r_1_1_768', 4, 1]]
  : [['decode', 'r_1_1_50257', 64], ['decode', 'r_1_1_3072', 4], ['decode', 'r_1_1_2304_1', 4], ['decode', 'r_1_1_768_1', 4]]
// [fma, dot]: the load option, and the int8 dot product (on where the engine computes it)
const CONFIGS = QUANT ? [[true, true], [true, false]] : [[true, true], [false, true]]

const PROFILE = process.argv.includes('--profile')
const PROFILE_ENTRY = PROFILE && !String(arg('--profile', '')).startsWith('--') ? arg('--profile') : 'decode'
if (!['decode', 'prefill', 'forward'].includes(PROFILE_ENTRY)) throw new Error(`--profile takes decode, prefill or forward, not ${JSON.stringify(PROFILE_ENTRY)}`)
const JS_FLAGS = arg('--js-flags', null)
const launchArgs = () => ['--headless', '--no-sandbox', '--disable-gpu', ...(JS_FLAGS ? [`--js-flags=${JS_FLAGS}`] : [])]

/**
 * One call's kernels on one thread (no phases): each step's compiled function wrapped with `now()`'s
 * timer, 3 warm steps and 9 timed ones; per kernel name the sum over its calls of each call's fastest time, and
 * the fastest whole step (ms). Runs in Node and, as its source, in the page (so the two run the same code).
 */
async function profileEntry (Model, bytes, now, entry) {
  const m = await Model.fromBytes(bytes, { threads: 1 })
  let pos = 0
  const prompt = Int32Array.from({ length: 32 }, (_, i) => (i * 797) % 50257)
  const step = () => (entry === 'decode' ? m.callAsync('decode', { input_ids: Int32Array.of(5), pos: pos++ }) : m.callAsync(entry, { input_ids: prompt }))
  for (let i = 0; i < 3; i++) await step()
  const steps = m._x.entries[entry]
  const times = steps.map(() => [])
  steps.forEach((st, i) => {
    for (const key of ['main', 'small', 'packed', 'packedMain']) {
      const run = st[key]
      if (!run || run.phases !== null || run.timed) continue
      const fn = run.fn
      run.timed = true
      run.fn = (...a) => {
        const t0 = now()
        fn(...a)
        times[i].push(now() - t0)
      }
    }
  })
  const whole = []
  for (let r = 0; r < 9; r++) {
    const t0 = now()
    await step()
    whole.push(now() - t0)
  }
  const by = new Map()
  steps.forEach((st, i) => {
    if (st.copy || !times[i].length) return
    const g = by.get(st.name) || { name: st.name, calls: 0, ms: 0 }
    g.calls++
    g.ms += Math.min(...times[i])
    by.set(st.name, g)
  })
  const info = { fma: m._x.fma, dot: m._x.dot, dotLanes: m._x.dotLanes }
  m.dispose()
  return { kernels: [...by.values()], whole: Math.min(...whole), info }
}

const PROFILE_PAGE = `<!doctype html><meta charset="utf-8"><body><script type="module">
const { Model } = await import(new URLSearchParams(location.search).get('lib') + '/polygrad.browser.mjs')
${profileEntry.toString()}
try {
  const bytes = new Uint8Array(await (await fetch('/gpt2s.pgb')).arrayBuffer())
  window.__result = await profileEntry(Model, bytes, () => performance.now(), ${JSON.stringify(PROFILE_ENTRY)})
} catch (e) {
  window.__result = { error: String(e && e.stack || e) }
}
</script>`

const PAGE = `<!doctype html><meta charset="utf-8"><body><script type="module">
const { Model } = await import(new URLSearchParams(location.search).get('lib') + '/polygrad.browser.mjs')
const kernels = ${JSON.stringify(KERNELS)}
const configs = ${JSON.stringify(CONFIGS)}
const rows = []
try {
  const bytes = new Uint8Array(await (await fetch('/gpt2s.pgb')).arrayBuffer())
  for (const [fma, dot] of configs) {
    let m
    try {
      m = await Model.fromBytes(bytes, Object.assign({ threads: 2, fma }, dot ? {} : { int8Dot: false }))
    } catch (e) {
      if (/unknown load option "int8Dot"/.test(e.message)) continue // a --base build from before the option
      throw e
    }
    const dotOn = m._x.dot === true
    for (let i = 0; i < 3; i++) await m.callAsync('decode', { input_ids: Int32Array.of(5), pos: i })
    for (const [entry, name, parts, nth = 0] of kernels) {
      const st = m._x.entries[entry].filter((s) => !s.copy && s.name === name)[nth]
      if (!st) throw new Error(entry + ' has no kernel ' + name)
      const run = st.packedMain || st.packed || st.main
      const f = run.phases[0].fn
      for (let r = 0; r < 100; r++) f(0, parts)
      const t = []
      for (let r = 0; r < 40; r++) {
        const t0 = performance.now()
        for (let j = 0; j < 10; j++) f(0, parts)
        t.push((performance.now() - t0) * 100)
      }
      t.sort((a, b) => a - b)
      rows.push({ name: name + (nth ? '#' + nth : ''), parts, fma: m.backendInfo.fma, dot: dotOn, min: t[0], median: t[20] })
    }
    m.dispose()
  }
  window.__result = { rows }
} catch (e) {
  window.__result = { error: String(e && e.stack || e) }
}
</script>`

function serve () {
  const lib = (dir) => ['text/javascript', () => fs.readFileSync(path.join(dir, 'dist', 'polygrad.browser.mjs'))]
  return serveIsolated({
    '/': ['text/html', () => (PROFILE ? PROFILE_PAGE : PAGE)],
    '/lib/polygrad.browser.mjs': lib(ROOT),
    ...(BASE ? { '/base/polygrad.browser.mjs': lib(BASE) } : {}),
    '/gpt2s.pgb': ['application/octet-stream', () => fs.readFileSync(path.join(__dirname, BUNDLE))]
  })
}

async function main () {
  if (!fs.existsSync(path.join(__dirname, BUNDLE))) throw new Error(`bench/${BUNDLE} is missing: run python polygrad-js/bench/make_gpt2.py${QUANT ? ' --quant ...' : ''}`)
  if (BASE && !fs.existsSync(path.join(BASE, 'dist', 'polygrad.browser.mjs'))) throw new Error(`--base ${BASE} has no dist/polygrad.browser.mjs: run node tools/build.js there`)
  if (PROFILE) return profileBoth()
  const server = await serve()
  const { chromium } = require('playwright-core')
  const browser = await chromium.launch({ executablePath: process.env.CHROMIUM || '/usr/bin/chromium', headless: true, args: launchArgs() })
  console.log(`load average ${require('os').loadavg().map((l) => l.toFixed(2)).join(' ')}; ${browser.version()}; us a call, cache-resident slice`)
  console.log(`${BUNDLE}; build | kernel         | slice | fma   | dot   | min us | median us`)
  try {
    for (const lib of BASE ? ['lib', 'base'] : ['lib']) {
      const r = await pageResult(browser, server, lib)
      for (const x of r.rows) {
        console.log(`${lib.padEnd(5)} | ${x.name.padEnd(14)} | 1/${String(x.parts).padEnd(3)} | ${String(x.fma).padEnd(5)} | ${String(x.dot).padEnd(5)} | ${x.min.toFixed(1).padStart(6)} | ${x.median.toFixed(1).padStart(9)}`)
      }
    }
  } finally {
    await browser.close()
    server.close()
  }
}

/** The page's window.__result for build `lib` (a new page of `browser`, served by `server`); Error if it failed. */
async function pageResult (browser, server, lib) {
  const page = await browser.newPage()
  await page.goto(`http://127.0.0.1:${server.address().port}/?lib=/${lib}`)
  await page.waitForFunction('window.__result !== undefined', null, { timeout: 10 * 60 * 1000 })
  const r = await page.evaluate('window.__result')
  await page.close()
  if (r.error) throw new Error(`the page failed: ${r.error}`)
  return r
}

/** --profile: the decode step's kernels in Node (this build's index.js) and in the page, per build. */
async function profileBoth () {
  const bytes = fs.readFileSync(path.join(__dirname, BUNDLE))
  const server = await serve()
  const { chromium } = require('playwright-core')
  const browser = await chromium.launch({ executablePath: process.env.CHROMIUM || '/usr/bin/chromium', headless: true, args: launchArgs() })
  console.log(`load average ${require('os').loadavg().map((l) => l.toFixed(2)).join(' ')}; Node ${process.version}; ${browser.version()}; ${BUNDLE}, ${PROFILE_ENTRY} at 1 thread`)
  try {
    for (const lib of BASE ? ['lib', 'base'] : ['lib']) {
      const { Model } = require(lib === 'lib' ? ROOT : BASE)
      const node = await profileEntry(Model, bytes, () => performance.now(), PROFILE_ENTRY)
      const web = await pageResult(browser, server, lib)
      console.log(`\n${lib}: whole step Node ${node.whole.toFixed(2)} ms, page ${web.whole.toFixed(2)} ms; paths Node ${JSON.stringify(node.info)}, page ${JSON.stringify(web.info)}`)
      console.log('kernel                         | calls | Node ms | page ms | page/Node')
      const pageBy = new Map(web.kernels.map((k) => [k.name, k]))
      const rows = node.kernels.map((k) => ({ ...k, web: pageBy.get(k.name) ? pageBy.get(k.name).ms : NaN }))
      rows.sort((a, b) => b.web - a.web)
      for (const r of rows) {
        console.log(`${r.name.slice(0, 30).padEnd(30)} | ${String(r.calls).padStart(5)} | ${r.ms.toFixed(3).padStart(7)} | ${r.web.toFixed(3).padStart(7)} | ${(r.web / r.ms).toFixed(2).padStart(9)}`)
      }
      const sum = (xs) => xs.reduce((a, r) => a + r, 0)
      console.log(`${'all kernels'.padEnd(30)} |       | ${sum(rows.map((r) => r.ms)).toFixed(3).padStart(7)} | ${sum(rows.map((r) => r.web)).toFixed(3).padStart(7)} |`)
    }
  } finally {
    await browser.close()
    server.close()
  }
}

main().catch((e) => {
  console.error(e.message || e)
  process.exit(1)
})
