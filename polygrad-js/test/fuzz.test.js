'use strict'
// Fuzzing the loader with mutated real bundles: every case loads (and then runs or fails with a typed
// error) or is rejected with a typed error. Nothing may throw another exception type, hang, or allocate
// beyond the declared limit. Three families: raw bytes anywhere; manifest bytes with recomputed checksums;
// one JSON value anywhere in the manifest replaced (huge, negative, wrong type, nested) with consistent
// checksums, so the semantic checks (buffer table, kernels, entrypoints, training) see it. The bundles are
// version 1 (linear, MLP with Adam, an embedding whose gradient is a scatter-add) and version 2 (a decoder with
// caches, a `decode` entrypoint taking `pos`, Variables in two dimensions); a loaded one runs every
// evaluation entrypoint.
const test = require('node:test')
const assert = require('node:assert')
const { Model, PolygradError, BundleError } = require('..')
const json = require('../src/json')
const { fixture, split, pack } = require('./helpers')

const LIMITS = { maxBytes: 64 << 20, maxWork: 2 ** 24, validate: 'all' }
const CASES = Number(process.env.POLYGRAD_FUZZ_CASES || 150)

function rng (seed) {
  let s = seed >>> 0
  return () => {
    s = (s + 0x6d2b79f5) >>> 0
    let t = s
    t = Math.imul(t ^ (t >>> 15), t | 1)
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61)
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296
  }
}

function attempt (bytes) {
  const t0 = Date.now()
  let m
  try {
    m = Model.fromBytesSync(bytes, LIMITS)
  } catch (e) {
    if (!(e instanceof PolygradError)) throw new Error(`a mutated bundle raised ${e.constructor.name}: ${e.stack}`)
    return 'rejected'
  }
  try {
    String(m.summary())
    // every evaluation entrypoint, with zeros at the Variables' smallest sizes (internals: the API has no
    // per-entrypoint signature)
    const vars = m.variables
    const size = (d) => (typeof d === 'string' ? vars[d].min : d)
    for (const [name, e] of Object.entries(m._p.entries)) {
      if (['loss', 'train_step', 'optimizer_step'].includes(name)) continue
      const inputs = {}
      for (const [k, s] of Object.entries(e.inputs)) inputs[k] = { data: new Array(s.shape.reduce((a, d) => a * size(d), 1)).fill(0), shape: s.shape.map(size) }
      for (const v of e.args || []) inputs[v] = vars[v].min
      try {
        m.call(name, inputs)
      } catch (err) {
        if (!(err instanceof PolygradError)) throw err
      }
    }
  } catch (e) {
    if (!(e instanceof PolygradError)) throw new Error(`a loaded mutated bundle raised ${e.constructor.name}: ${e.stack}`)
  } finally {
    m.dispose()
  }
  assert.ok(Date.now() - t0 < 10000, 'a case took more than 10 s')
  return 'loaded'
}

const BUNDLES = ['linear.pgb', 'mlp_adam.pgb', 'decoder.pgb', 'embedding_sgd.pgb'].map((f) => new Uint8Array(fixture(f)))

test('raw byte mutations are rejected with typed errors', () => {
  const r = rng(1)
  for (let i = 0; i < CASES; i++) {
    const b = BUNDLES[i % BUNDLES.length].slice()
    const n = 1 + Math.floor(r() * 4)
    for (let k = 0; k < n; k++) b[Math.floor(r() * b.length)] = Math.floor(r() * 256)
    attempt(r() < 0.1 ? b.subarray(0, Math.floor(r() * b.length)) : b)
  }
})

test('manifest byte mutations with consistent checksums', () => {
  const r = rng(2)
  for (let i = 0; i < CASES; i++) {
    const { text, data, version } = split(BUNDLES[i % BUNDLES.length])
    const t = text.slice()
    const n = 1 + Math.floor(r() * 3)
    for (let k = 0; k < n; k++) t[Math.floor(r() * t.length)] = ' {}[],:"0123456789-eE.tfn'.charCodeAt(Math.floor(r() * 25))
    attempt(pack(t, data, version))
  }
})

const REPLACEMENTS = [0, -1, 1, 2, 7, 2 ** 31, 2 ** 53, -(2 ** 40), 1e300, 0.5, '', 'x', 'forward', 'float16', 'int64', 'parameter', 'temporary',
  'cache', 'pos', 'tokens', 'ADD', ['op', 'ADD'], ['op', 'FDIV'], ['pos'], [1, 'tokens'], ['tokens', 'batch'],
  null, true, false, [], [0], [[0]], {}, { a: 1 }, [2 ** 31 - 1], ['batch'], 12345678901234567890n]

function paths (v, prefix = [], out = []) {
  out.push(prefix)
  if (Array.isArray(v)) v.forEach((x, i) => paths(x, [...prefix, i], out))
  else if (v !== null && typeof v === 'object') for (const k of Object.keys(v)) paths(v[k], [...prefix, k], out)
  return out
}

test('structure-aware manifest mutations (semantic checks, kernels, limits)', () => {
  const r = rng(3)
  const decoded = BUNDLES.map((b) => {
    const { text, data, version } = split(b)
    const manifest = json.parse(new TextDecoder().decode(text))
    return { manifest, data, version, paths: paths(manifest).filter((p) => p.length) }
  })
  const counts = { rejected: 0, loaded: 0 }
  for (let i = 0; i < CASES * 2; i++) {
    const d = decoded[i % decoded.length]
    const m = json.parse(json.stringify(d.manifest))
    const p = d.paths[Math.floor(r() * d.paths.length)]
    let obj = m
    for (const k of p.slice(0, -1)) obj = obj[k]
    const last = p[p.length - 1]
    if (r() < 0.15 && Array.isArray(obj)) obj.splice(last, 1)
    else if (r() < 0.1 && !Array.isArray(obj)) delete obj[last]
    else obj[last] = REPLACEMENTS[Math.floor(r() * REPLACEMENTS.length)]
    counts[attempt(pack(new TextEncoder().encode(json.stringify(m)), d.data, d.version))]++
  }
  assert.ok(counts.rejected > counts.loaded / 4, JSON.stringify(counts))
})

test('a kernel that reads past its buffer is rejected at load', () => {
  const { text, data } = split(BUNDLES[0])
  const m = json.parse(new TextDecoder().decode(text))
  // make every DEFINE_GLOBAL of size 5 claim 6 elements: the buffer table no longer covers it
  for (const n of m.kernels.nodes) {
    if (n[0] === 'CONST' && n[1] === 'int32' && n[3][1] === 5) n[3][1] = 6
  }
  assert.throws(() => Model.fromBytesSync(pack(new TextEncoder().encode(json.stringify(m)), data)), PolygradError)
})

test('sizes beyond maxBytes are refused before anything is allocated', () => {
  const { text, data } = split(BUNDLES[1])
  const m = json.parse(new TextDecoder().decode(text))
  const tmp = m.buffers.find((b) => b.role === 'temporary')
  tmp.shape = [2 ** 30]
  tmp.size = 2 ** 30
  assert.throws(() => Model.fromBytesSync(pack(new TextEncoder().encode(json.stringify(m)), data), LIMITS), /maxBytes/)
})

test('version-2 features in a version-1 file, and malformed arguments, are rejected', () => {
  const { text, data } = split(BUNDLES[2])
  const base = json.parse(new TextDecoder().decode(text))
  const bad = [
    (m) => { m.version = 1 }, // a cache, inner Variable dims and arguments need version 2
    (m) => { m.entrypoints.decode.arguments = ['nope'] },
    (m) => { m.entrypoints.decode.arguments = ['pos', 'pos'] },
    (m) => { m.entrypoints.decode.arguments = [7] },
    (m) => { m.entrypoints.decode.arguments = 'pos' },
    (m) => { m.entrypoints.decode.arguments = ['ids'] }, // an input's name
    (m) => { m.buffers.find((b) => b.role === 'cache').data = { offset: 0, nbytes: 4 } }, // a cache is not stored
    (m) => { m.buffers.find((b) => b.role === 'cache').role = 'catch' },
    (m) => { const b = m.buffers.find((x) => x.role === 'cache'); b.shape = [b.shape[0], 'undeclared', ...b.shape.slice(2)] }
  ]
  for (const change of bad) {
    const m = json.parse(json.stringify(base))
    change(m)
    const version = m.version === 1 ? 1 : 2
    assert.throws(() => Model.fromBytesSync(pack(new TextEncoder().encode(json.stringify(m)), data, version), LIMITS), (e) => e instanceof BundleError, change.toString())
  }
  // a header that disagrees with the manifest, and a version this reader does not know
  assert.throws(() => Model.fromBytesSync(pack(text, data, 1)), /differs from the header/)
  assert.throws(() => Model.fromBytesSync(pack(text, data, 3)), /version 3 is not supported/)
})

test('an accumulating store with an unknown op is rejected at load', () => {
  const { text, data } = split(BUNDLES[3])
  const m = json.parse(new TextDecoder().decode(text))
  const stores = m.kernels.nodes.filter((n) => n[0] === 'STORE' && n[3] !== null)
  assert.ok(stores.length > 0, 'the embedding gradient is a scatter-add')
  for (const n of stores) n[3] = ['op', 'FDIV']
  assert.throws(() => Model.fromBytesSync(pack(new TextEncoder().encode(json.stringify(m)), data), { validate: 'all' }), (e) => e instanceof BundleError && /STORE/.test(e.message))
})
