'use strict'
// The browser build in headless Chromium (playwright-core; skipped without it or /usr/bin/chromium): the test
// page (test/browser/page.html) served cross-origin isolated runs the model on worker threads (forwardAsync, bit
// for bit the synchronous forward), and served without the isolation headers it reports one thread and why.
const test = require('node:test')
const assert = require('node:assert')
const fs = require('fs')
const http = require('http')
const os = require('os')
const path = require('path')
const { fixture, reference } = require('./helpers')

const ROOT = path.join(__dirname, '..')
const CHROMIUM = process.env.CHROMIUM || '/usr/bin/chromium'
let chromium = null
try {
  chromium = require('playwright-core').chromium
} catch (e) {}
const skip = !chromium ? 'playwright-core is not installed' : !fs.existsSync(CHROMIUM) ? `no Chromium at ${CHROMIUM}` : false

/** Serve the page, the browser build and a bundle on 127.0.0.1; `isolated` adds COOP/COEP. */
function serve (isolated, build) {
  const ref = reference().mlp
  const files = {
    '/test/page.html': ['text/html', fs.readFileSync(path.join(ROOT, 'test', 'browser', 'page.html'))],
    '/dist/polygrad.browser.mjs': ['text/javascript', fs.readFileSync(path.join(ROOT, 'dist', build))],
    '/test/bundle.pgb': ['application/octet-stream', fixture('mlp_adam.pgb')],
    '/test/case.json': ['application/json', JSON.stringify({ x: ref.x.slice(0, 4).flat(), y: ref.y.slice(0, 4), lr: 0.01 })],
    '/test/webgpu.html': ['text/html', fs.readFileSync(path.join(ROOT, 'test', 'browser', 'webgpu.html'))],
    '/test/webgpu.json': ['application/json', JSON.stringify(WEBGPU_CASE)]
  }
  for (const f of FIXTURE_FILES) files[`/test/${f}`] = ['application/octet-stream', fixture(f)]
  const server = http.createServer((req, res) => {
    const f = files[req.url.split('?')[0]]
    if (!f) {
      res.writeHead(404)
      return res.end()
    }
    const headers = { 'Content-Type': f[0] }
    if (isolated) Object.assign(headers, { 'Cross-Origin-Opener-Policy': 'same-origin', 'Cross-Origin-Embedder-Policy': 'require-corp' })
    res.writeHead(200, headers)
    res.end(f[1])
  })
  return new Promise((resolve) => server.listen(0, '127.0.0.1', () => resolve(server)))
}

// the webgpu page's cases: each fixture's forward (a decode step too), and a short fine-tune
const FIXTURE_FILES = ['linear.pgb', 'mlp_untrained.pgb', 'mlp_wide.pgb', 'embedding_sgd.pgb', 'decoder.pgb', 'mlp_adam.pgb']
const all = reference()
const WEBGPU_CASE = {
  forwards: [
    { bundle: '/test/linear.pgb', entry: 'forward', inputs: { x: all.linear.x } },
    { bundle: '/test/mlp_untrained.pgb', entry: 'forward', inputs: { x: all.mlp.x } },
    { bundle: '/test/mlp_wide.pgb', entry: 'forward', inputs: { x: all.wide.x.slice(0, 3) } },
    { bundle: '/test/embedding_sgd.pgb', entry: 'forward', inputs: { ids: all.embedding.ids } },
    { bundle: '/test/decoder.pgb', entry: 'forward', inputs: { ids: all.decoder.ids.map((r) => r.slice(0, 3)) } }
  ],
  train: { bundle: '/test/mlp_adam.pgb', data: { x: all.mlp.x, y: all.mlp.y }, opts: { batchSize: 4 } }
}

async function runPage (isolated, build = 'polygrad.browser.mjs', pageName = 'page.html', flags = ['--disable-gpu']) {
  require('../tools/build').build()
  const server = await serve(isolated, build)
  const profile = fs.mkdtempSync(path.join(os.tmpdir(), 'polygrad-chromium-'))
  const context = await chromium.launchPersistentContext(profile, { executablePath: CHROMIUM, headless: true, args: ['--headless', '--no-sandbox', '--no-first-run', ...flags] })
  try {
    const page = context.pages()[0] || await context.newPage()
    const logs = []
    page.on('pageerror', (e) => logs.push(e.message))
    await page.goto(`http://127.0.0.1:${server.address().port}/test/${pageName}`)
    await page.waitForFunction('window.__result !== undefined', null, { timeout: 60000 })
    const r = await page.evaluate('window.__result')
    assert.ok(!r.error, `${r.error} ${logs.join('; ')}`)
    return r
  } finally {
    await context.close()
    fs.rmSync(profile, { recursive: true, force: true })
    server.close()
  }
}

for (const build of ['polygrad.browser.mjs', 'polygrad.browser.min.mjs']) {
  const missing = (!fs.existsSync(path.join(ROOT, 'node_modules', 'esbuild')) && build.includes('.min.') && 'esbuild is not installed (no minified build)') || (os.cpus().length < 2 && 'one core: the default is one thread')
  test(`browser (${build}), cross-origin isolated: the model runs on worker threads, bit for bit one thread`, { skip: skip || missing, timeout: 120000 }, async () => {
    const r = await runPage(true, build)
    assert.strictEqual(r.isolated, true)
    assert.strictEqual(r.backend, 'wasm')
    assert.ok(r.info.threads > 1, JSON.stringify(r.info))
    assert.strictEqual(r.info.reason, null) // no backend option: no WebGPU probe, and threads as asked
    assert.strictEqual(r.info.fma, true, 'Chromium has relaxed SIMD: the reduction steps are multiply-adds')
    assert.ok(r.threadCalls > 0, 'the workers ran slices')
    assert.strictEqual(r.threadedSame, true)
  })
}

test('browser, not isolated: one thread, and the reason says which headers to send', { skip, timeout: 120000 }, async () => {
  const r = await runPage(false)
  assert.strictEqual(r.isolated, false)
  assert.strictEqual(r.info.threads, 1)
  assert.match(r.info.reason, /not cross-origin isolated.*Cross-Origin-Opener-Policy: same-origin.*Cross-Origin-Embedder-Policy: require-corp/)
  assert.strictEqual(r.threadCalls, 0)
  assert.strictEqual(r.threadedSame, true)
})

for (const build of ['polygrad.browser.mjs', 'polygrad.browser.min.mjs']) {
  const missing = !fs.existsSync(path.join(ROOT, 'node_modules', 'esbuild')) && build.includes('.min.') && 'esbuild is not installed (no minified build)'
  test(`browser (${build}) with WebGPU (--enable-unsafe-webgpu): the fixtures' forwards and a fine-tune match wasm within 1e-5`, { skip: skip || missing, timeout: 180000 }, async (t) => {
    const r = await runPage(false, build, 'webgpu.html', ['--enable-unsafe-webgpu'])
    assert.deepStrictEqual(r.info, { name: 'webgpu', threads: 1, reason: null, fma: false })
    // Chromium's SwiftShader adapter is a fallback one: 'auto' leaves it for wasm and says why
    assert.strictEqual(r.autoInfo.name, 'wasm')
    assert.match(r.autoInfo.reason, /only a fallback \(software\) adapter/)
    const { Model } = require('..')
    WEBGPU_CASE.forwards.forEach((c, i) => {
      const m = Model.fromBytesSync(fixture(c.bundle.slice(6)), { threads: 1 })
      const want = m.call(c.entry, c.inputs)
      for (const k of Object.keys(want)) assert.ok(relDiff(r.forwards[i][k], want[k]) <= 1e-5, `${c.bundle} ${k}`)
      m.dispose()
    })
    const m = Model.fromBytesSync(fixture('mlp_adam.pgb'), { threads: 1 })
    const losses = m.fit(WEBGPU_CASE.train.data, WEBGPU_CASE.train.opts)
    assert.ok(relDiff(r.losses, losses) <= 1e-5, `${r.losses} vs ${losses}`)
    assert.ok(relDiff(r.after, m.forward({ x: WEBGPU_CASE.train.data.x }).logits) <= 1e-5)
    m.dispose()
  })
}

function relDiff (a, b) {
  let m = 0
  for (let i = 0; i < b.length; i++) if (a[i] !== b[i]) m = Math.max(m, Math.abs(a[i] - b[i]) / Math.max(Math.abs(b[i]), 1e-6))
  return a.length === b.length ? m : Infinity
}
