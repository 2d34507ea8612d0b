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
    '/test/case.json': ['application/json', JSON.stringify({ x: ref.x.slice(0, 4).flat(), y: ref.y.slice(0, 4), lr: 0.01 })]
  }
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

async function runPage (isolated, build = 'polygrad.browser.mjs') {
  require('../tools/build').build()
  const server = await serve(isolated, build)
  const profile = fs.mkdtempSync(path.join(os.tmpdir(), 'polygrad-chromium-'))
  const context = await chromium.launchPersistentContext(profile, { executablePath: CHROMIUM, headless: true, args: ['--headless', '--no-sandbox', '--disable-gpu', '--no-first-run'] })
  try {
    const page = context.pages()[0] || await context.newPage()
    const logs = []
    page.on('pageerror', (e) => logs.push(e.message))
    await page.goto(`http://127.0.0.1:${server.address().port}/test/page.html`)
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
    // no thread reason; the only one is why 'auto' did not take webgpu (Chromium runs here without a GPU)
    assert.match(r.info.reason, /WebGPU/)
    assert.doesNotMatch(r.info.reason, /thread|isolated/)
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
