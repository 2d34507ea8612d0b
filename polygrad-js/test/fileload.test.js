'use strict'
// Model.load(path) and Model.loadAsync(path) read a bundle a piece at a time (src/bundlefile.js): the same
// models as Model.fromBytesSync of the file's bytes, the same refusals, and about the model's memory resident
// after the load instead of the file's bytes beside it.
const test = require('node:test')
const assert = require('node:assert')
const fs = require('fs')
const os = require('os')
const path = require('path')
const { spawnSync } = require('child_process')
const { Model, BundleError } = require('..')
const json = require('../src/json')
const { FIXTURES, fixture, reference, maxRel, split, pack } = require('./helpers')

const ROOT = path.join(__dirname, '..')
const BUNDLES = fs.readdirSync(FIXTURES).filter((f) => f.endsWith('.pgb')).sort()

function tmpFile (name, bytes) {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'pgfile-'))
  const file = path.join(dir, name)
  fs.writeFileSync(file, bytes)
  return file
}

/**
 * A fixture with parameters added that no call reads: `big` (n float32 values, byte i of them i * 7 mod 251)
 * after the file's data, and with `alias`, a parameter whose stored bytes are the second half of big's (two
 * buffers may name overlapping bytes of the data section: a reader must fill both).
 */
function withParameters (name, n, alias = true) {
  const { text, data, version } = split(fixture(name))
  const manifest = json.parse(new TextDecoder().decode(text))
  const at = Math.ceil(data.length / 64) * 64
  const half = n / 2
  manifest.buffers.push({ name: 'big', role: 'parameter', dtype: 'float32', shape: [n], size: n, data: { offset: at, nbytes: 4 * n } })
  if (alias) manifest.buffers.push({ name: 'alias', role: 'parameter', dtype: 'float32', shape: [half], size: half, data: { offset: at + 4 * half, nbytes: 4 * half } })
  const out = new Uint8Array(at + 4 * n)
  out.set(data)
  for (let i = at; i < out.length; i++) out[i] = (i * 7) % 251
  return pack(new TextEncoder().encode(json.stringify(manifest)), out, version)
}

test('Model.load(path) and loadAsync(path) hold what fromBytesSync of the same bytes holds, every fixture', async () => {
  for (const name of [...BUNDLES, 'withParameters']) {
    const bytes = name === 'withParameters' ? withParameters('mlp_adam.pgb', 1 << 16) : fixture(name)
    const file = tmpFile('m.pgb', bytes)
    const want = Model.fromBytesSync(bytes)
    const loaded = [Model.load(file), await Model.loadAsync(file)]
    for (const m of loaded) {
      // every buffer's bytes, as save() writes them from the model's memory
      assert.deepStrictEqual(Buffer.from(m.save()), Buffer.from(want.save()), name)
      m.dispose()
    }
    want.dispose()
  }
})

test('a model loaded from its path computes the reference outputs (Python\'s)', () => {
  const ref = reference()
  const m = Model.load(path.join(FIXTURES, 'mlp_untrained.pgb'))
  const x = ref.mlp.x.slice(0, 5)
  const out = m.forward({ x: { data: Float32Array.from(x.flat()), shape: [5, 4] } }).logits
  assert.ok(maxRel(out, ref.mlp.logits_untrained.flat(), 1e-3) < 1e-5)
  m.dispose()
})

/** The bundle with one byte of its data section changed: at `where` bytes into the section. */
function flipped (bytes, where) {
  const { data } = split(bytes)
  const out = Uint8Array.from(bytes)
  out[bytes.length - data.length + where] ^= 0x10
  return out
}

test('a changed data byte, a stored one or padding, is a BundleError from every path load', async () => {
  const bytes = withParameters('mlp_wide.pgb', 1 << 10)
  const { data } = split(bytes)
  // a byte of big's values, and the last byte of the section: the padding after the last buffer no slot reads
  const m = JSON.parse(new TextDecoder().decode(split(bytes).text))
  const big = m.buffers.find((b) => b.name === 'big').data
  const stored = m.buffers.filter((b) => b.data).map((b) => [b.data.offset, b.data.offset + b.data.nbytes])
  const gap = [...Array(data.length).keys()].find((i) => !stored.some(([a, b]) => a <= i && i < b))
  assert.ok(gap !== undefined, 'the fixture has padding between its buffers')
  for (const where of [big.offset + 5, gap]) {
    const file = tmpFile('bad.pgb', flipped(bytes, where))
    const refused = (e) => e instanceof BundleError && /data checksum mismatch/.test(e.message)
    assert.throws(() => Model.fromBytesSync(fs.readFileSync(file)), refused)
    assert.throws(() => Model.load(file), refused)
    assert.throws(() => Model.load(file, { threads: 2 }), refused)
    await assert.rejects(Model.loadAsync(file), refused)
  }
})

test('a path load refuses what the bytes load refuses, with the same error where the data is sound', async () => {
  const bytes = fixture('linear.pgb')
  const cases = {
    truncated: bytes.subarray(0, bytes.length - 1),
    'shorter than the header': bytes.subarray(0, 10),
    empty: new Uint8Array(0),
    'manifest checksum': (() => { const b = Uint8Array.from(bytes); b[70] ^= 1; return b })()
  }
  for (const [what, b] of Object.entries(cases)) {
    const file = tmpFile('bad.pgb', b)
    let message = null
    try {
      Model.fromBytesSync(b)
    } catch (e) {
      message = e.message
    }
    assert.ok(message !== null, what)
    assert.throws(() => Model.load(file), (e) => e instanceof BundleError && e.message === message, what)
    await assert.rejects(Model.loadAsync(file), (e) => e instanceof BundleError && e.message === message, what)
  }
  assert.throws(() => Model.load(path.join(FIXTURES, 'missing.pgb')), (e) => e instanceof BundleError && /no such file/.test(e.message))
  await assert.rejects(Model.loadAsync(FIXTURES), (e) => e instanceof BundleError && /cannot read bundle/.test(e.message))
})

// The resident set a load adds, measured in a fresh process (this one's memory does not count): the model's
// memory (the bundle's size: its one large parameter) plus what compiling and the runtime add (FIXED).
const FIXED = 16 << 20
const RESIDENT = `
const { Model } = require('.')
const before = process.memoryUsage().rss
const m = Model.load(process.argv[1])
process.stdout.write(String(process.memoryUsage().rss - before))
`

test('after Model.load(path) of a 48 MiB bundle the process holds at most 1.3 x its size + 16 MiB more', () => {
  const bytes = withParameters('linear.pgb', 12 << 20, false)
  const file = tmpFile('big.pgb', bytes)
  const r = spawnSync(process.execPath, ['-e', RESIDENT, file], { cwd: ROOT, timeout: 120000, encoding: 'utf8' })
  assert.strictEqual(r.status, 0, r.stderr)
  const grew = Number(r.stdout)
  // measured 53 MiB (AMD EPYC, Node 20); 101 MiB when the file's bytes were read whole first
  assert.ok(grew <= 1.3 * bytes.length + FIXED, `grew ${grew} bytes for a ${bytes.length}-byte bundle`)
})
