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
    '/': ['text/html', () => PAGE],
    '/lib/polygrad.browser.mjs': lib(ROOT),
    ...(BASE ? { '/base/polygrad.browser.mjs': lib(BASE) } : {}),
    '/gpt2s.pgb': ['application/octet-stream', () => fs.readFileSync(path.join(__dirname, BUNDLE))]
  })
}

async function main () {
  if (!fs.existsSync(path.join(__dirname, BUNDLE))) throw new Error(`bench/${BUNDLE} is missing: run python polygrad-js/bench/make_gpt2.py${QUANT ? ' --quant ...' : ''}`)
  if (BASE && !fs.existsSync(path.join(BASE, 'dist', 'polygrad.browser.mjs'))) throw new Error(`--base ${BASE} has no dist/polygrad.browser.mjs: run node tools/build.js there`)
  const server = await serve()
  const { chromium } = require('playwright-core')
  const browser = await chromium.launch({ executablePath: process.env.CHROMIUM || '/usr/bin/chromium', headless: true, args: ['--headless', '--no-sandbox', '--disable-gpu'] })
  console.log(`load average ${require('os').loadavg().map((l) => l.toFixed(2)).join(' ')}; ${browser.version()}; us a call, cache-resident slice`)
  console.log(`${BUNDLE}; build | kernel         | slice | fma   | dot   | min us | median us`)
  try {
    for (const lib of BASE ? ['lib', 'base'] : ['lib']) {
      const page = await browser.newPage()
      await page.goto(`http://127.0.0.1:${server.address().port}/?lib=/${lib}`)
      await page.waitForFunction('window.__result !== undefined', null, { timeout: 10 * 60 * 1000 })
      const r = await page.evaluate('window.__result')
      await page.close()
      if (r.error) throw new Error(`the page failed: ${r.error}`)
      for (const x of r.rows) {
        console.log(`${lib.padEnd(5)} | ${x.name.padEnd(14)} | 1/${String(x.parts).padEnd(3)} | ${String(x.fma).padEnd(5)} | ${String(x.dot).padEnd(5)} | ${x.min.toFixed(1).padStart(6)} | ${x.median.toFixed(1).padStart(9)}`)
      }
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
