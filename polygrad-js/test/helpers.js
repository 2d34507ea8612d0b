'use strict'
// Shared helpers for the node --test suite.
const assert = require('node:assert')
const fs = require('fs')
const path = require('path')
const bundle = require('../src/bundle')
const { crc32 } = require('../src/crc32')
const { DTYPES } = require('../src/dtypes')

const FIXTURES = path.join(__dirname, 'fixtures')
const REPO = path.join(__dirname, '..', '..')

function fixture (name) {
  return fs.readFileSync(path.join(FIXTURES, name))
}

function reference () {
  return JSON.parse(fs.readFileSync(path.join(FIXTURES, 'reference.json'), 'utf8'))
}

/** max |a - b| / max(|b|, floor) over two arrays */
function maxRel (a, b, floor = 1e-6) {
  let m = 0
  for (let i = 0; i < b.length; i++) m = Math.max(m, Math.abs(a[i] - b[i]) / Math.max(Math.abs(b[i]), floor))
  return m
}

/** {text, data, version}: a bundle's manifest bytes, data section and header version. */
function split (bytes) {
  const v = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength)
  const mlen = v.getUint32(16, true)
  const start = 64 + Math.ceil(mlen / 64) * 64
  return { text: bytes.slice(64, 64 + mlen), data: bytes.slice(start), version: v.getUint32(8, true) }
}

/** A bundle of manifest bytes and a data section with a consistent header (lengths, checksums). */
function pack (text, data, version = 1) {
  const start = 64 + Math.ceil(text.length / 64) * 64
  const out = new Uint8Array(start + data.length)
  out.set(bundle.MAGIC, 0)
  const v = new DataView(out.buffer)
  v.setUint32(8, version, true)
  v.setUint32(16, text.length, true)
  v.setUint32(24, data.length, true)
  v.setUint32(32, crc32(text), true)
  v.setUint32(36, crc32(data), true)
  out.set(text, 64)
  out.set(data, start)
  return out
}

/** A golden kernel's buffers (tests/golden/*.json) laid out in one byte space: {layout: slot -> {base, size, d},
 * bytes} with the inputs' values and 0xa5 in every output byte (the kernel must write every element). */
function goldenLayout (obj) {
  const layout = new Map()
  let pos = 64
  for (const item of obj.buffers) {
    const d = DTYPES[item.dtype]
    const n = item.shape.reduce((a, b) => a * b, 1)
    layout.set(item.slot, { base: pos, size: n, d })
    pos += Math.ceil((n * d.size) / 64) * 64 + 64
  }
  const bytes = new Uint8Array(pos)
  for (const item of obj.buffers) {
    const L = layout.get(item.slot)
    if (item.role === 'input') bytes.set(Buffer.from(item.data, 'base64'), L.base)
    else bytes.fill(0xa5, L.base, L.base + L.size * L.d.size) // the kernel must write every element
  }
  return { layout, bytes }
}

/**
 * pageResult's files for a test page importing '/dist/polygrad.browser.mjs': the page, that build (made
 * first) and `extra` (url path -> [content type, body]).
 */
function pageFiles (page, extra) {
  require('../tools/build').build()
  const lib = fs.readFileSync(path.join(__dirname, '..', 'dist', 'polygrad.browser.mjs'))
  return { '/': ['text/html', page], '/dist/polygrad.browser.mjs': ['text/javascript', lib], ...extra }
}

/**
 * window.__result of a page in headless Chromium (playwright-core; CHROMIUM names the browser), served from
 * `files` (url path -> [content type, body]) with cross-origin isolation (threads need it); the reason to skip
 * where there is no browser: `pageResult.skip`.
 */
async function pageResult (files) {
  const http = require('http')
  const os = require('os')
  const server = http.createServer((req, res) => {
    const f = files[req.url.split('?')[0]]
    if (!f) {
      res.writeHead(404)
      return res.end()
    }
    res.writeHead(200, { 'Content-Type': f[0], 'Cross-Origin-Opener-Policy': 'same-origin', 'Cross-Origin-Embedder-Policy': 'require-corp' })
    res.end(f[1])
  })
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve))
  const profile = fs.mkdtempSync(path.join(os.tmpdir(), 'polygrad-chromium-'))
  const context = await chromium.launchPersistentContext(profile, { executablePath: CHROMIUM, headless: true, args: ['--headless', '--no-sandbox', '--no-first-run', '--disable-gpu'] })
  try {
    const page = context.pages()[0] || await context.newPage()
    await page.goto(`http://127.0.0.1:${server.address().port}/`)
    await page.waitForFunction('window.__result !== undefined', null, { timeout: 60000 })
    return await page.evaluate('window.__result')
  } finally {
    await context.close()
    fs.rmSync(profile, { recursive: true, force: true })
    server.close()
  }
}
const CHROMIUM = process.env.CHROMIUM || '/usr/bin/chromium'
let chromium = null
try {
  chromium = require('playwright-core').chromium
} catch (e) {}
pageResult.skip = !chromium ? 'playwright-core is not installed' : !fs.existsSync(CHROMIUM) ? `no Chromium at ${CHROMIUM}` : false

/** Every instruction of a linearized program (loops' pre and body, ifs' body). */
function instsOf (prog) {
  const out = []
  const walk = (xs) => { for (const x of xs) { out.push(x); if (x.pre) walk(x.pre); if (x.body) walk(x.body) } }
  walk(prog.head)
  walk(prog.body)
  return out
}

/**
 * Check a fixture's int8-route outputs (y8: Q8_0 rows, y4: Q4_0 rows, one {y8, y4} a case of ref.x) against the
 * NumPy values the fixture holds (ref.cases[i][name]: want and bound): float32 rounding only, since each block's
 * products are exact and only the scales and the sum over blocks round.
 */
function checkBlockSums (ref, outs, where) {
  outs.forEach((o, i) => {
    for (const name of ['y8', 'y4']) {
      const { want, bound } = ref.cases[i][name]
      assert.strictEqual(o[name].length, ref.rows[name])
      want.forEach((w, r) => assert.ok(Math.abs(o[name][r] - w) <= 1e-5 * bound[r] + 1e-30,
        `${where} case ${i} ${name}[${r}]: ${o[name][r]} vs ${w} (bound ${bound[r]})`))
    }
  })
}

module.exports = { FIXTURES, REPO, fixture, reference, maxRel, split, pack, goldenLayout, pageResult, pageFiles, instsOf, checkBlockSums }
