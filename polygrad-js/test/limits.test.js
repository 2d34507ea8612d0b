'use strict'
// What a bundle may ask of the loader (src/limits.js, the same caps as Python's polygrad/limits.py): work and
// memory grow with the file, JSON nesting and upcast unrolling are bounded, deep graphs load without
// exhausting the stack or the engine's locals, and every failure is a BundleError that says how to raise
// the cap. The crafted files come from tests/bundle_corpus.py (`python tests/bundle_corpus.py --js-fixtures`);
// the shared corpus both languages must agree on is tests/test_bundle_differential.py.
const test = require('node:test')
const assert = require('node:assert')
const { Model, BundleError } = require('..')
const bundle = require('../src/bundle')
const ir = require('../src/ir')
const json = require('../src/json')
const limits = require('../src/limits')
const { readProgram } = require('../src/manifest')
const { DTYPES } = require('../src/dtypes')
const { fixture, split, pack } = require('./helpers')

const crafted = (name) => new Uint8Array(fixture(`crafted/${name}.pgb`))
const encode = (m) => new TextEncoder().encode(json.stringify(m))
const manifestOf = (bytes) => json.parse(new TextDecoder().decode(split(bytes).text))

test('a 1.3 KB bundle asking for a 2**38-step reduction is refused, unless the caller raises maxWork', () => {
  const bytes = crafted('work_2_38_reduction')
  assert.throws(() => Model.fromBytesSync(bytes), (e) => e instanceof BundleError && /evaluates up to \d+ kernel nodes per call/.test(e.message) && /maxWork/.test(e.message))
  Model.fromBytesSync(bytes, { maxWork: 2 ** 42 }).dispose() // loads (nothing runs)
})

test('a tiny file cannot make the loader zero-fill a 1 GiB cache', () => {
  const bytes = crafted('cache_1gib')
  assert.ok(bytes.length < 2048)
  assert.throws(() => Model.fromBytesSync(bytes), (e) => e instanceof BundleError && /maxBytes/.test(e.message))
})

test('the default caps admit a GPT-2 small saved by load_hf with max_seq_len 1024', () => {
  // measured (docs/bundle-format.md, "Trust model"): a 502,081,984-byte file whose buffers need 2,491,544,208
  // bytes and whose forward evaluates 8,261,019,893,760 nodes. The buffer table here declares that much
  // memory (unstored, so nothing is allocated by readProgram); the old 2 GiB default refused it (issue 31).
  const file = 502081984
  const m = manifestOf(crafted('cache_1gib'))
  const cache = m.buffers.find((b) => b.role === 'cache')
  cache.size = cache.shape[0] = Math.ceil(2491544208 / 4)
  const { manifest, body } = bundle.read(pack(encode(m), new Uint8Array(0), 2))
  readProgram(manifest, body, { fileBytes: file })
  assert.throws(() => readProgram(manifest, body, { fileBytes: 4096 }), /maxBytes/)
  assert.ok(limits.defaultMaxWork(file) >= 8261019893760)
})

test('manifest JSON nested 10,000 deep is a BundleError, not a RangeError', () => {
  const { text, data } = split(new Uint8Array(fixture('linear.pgb')))
  const m = json.parse(new TextDecoder().decode(text))
  m.kernels.nodes.find((n) => n[3] === null)[3] = 'RAW' // a node's arg: its error message shows the value
  const withArg = (arg) => pack(new TextEncoder().encode(json.stringify(m).replace('"RAW"', arg)), data)
  const nested = (depth) => '['.repeat(depth) + '0' + ']'.repeat(depth)
  assert.throws(() => Model.fromBytesSync(withArg(nested(10000))), (e) => e instanceof BundleError && /deeper than 256/.test(e.message))
  // nesting within the limit parses, and is then refused as an arg by the kernel decoder
  assert.throws(() => Model.fromBytesSync(withArg(nested(250))), (e) => e instanceof BundleError && /expected null or a \[tag, payload\] pair/.test(e.message))
})

test('a 60,000-op dependency chain loads, compiles and computes (no stack or local-count limit)', () => {
  // y[i] = x[i] + 1 + ... + 1, the 600-op fixture's kernel extended to 60,000 ADDs
  const m = manifestOf(crafted('chain_600'))
  const g = new ir.Graph()
  const [sink] = ir.decode(m.kernels, g)
  const end = sink.src[0]
  const store = end.src[0]
  const one = g.const(DTYPES.float32, 1)
  let v = store.src[1]
  for (let i = 600; i < 60000; i++) v = g.node('ADD', DTYPES.float32, [v, one])
  const store2 = g.node('STORE', null, [store.src[0], v], store.arg)
  m.kernels = ir.encode([g.node('SINK', null, [g.node('END', null, [store2, ...end.src.slice(1)], end.arg)], sink.arg)])
  const model = Model.fromBytesSync(pack(encode(m), new Uint8Array(0)))
  assert.deepStrictEqual(Array.from(model.forward({ x: [1, 2, 3, 4] }).y), [60001, 60002, 60003, 60004])
  model.dispose()
})

test('an upcast range of 65,536 points is refused at load (it would be unrolled)', () => {
  assert.throws(() => Model.fromBytesSync(crafted('upcast_65536')), (e) => e instanceof BundleError && /unrolls 65536 points of upcast RANGEs; the limit is 256/.test(e.message))
})

test('a load option of the wrong kind is a ModelError naming it', () => {
  assert.throws(() => Model.fromBytesSync(new Uint8Array(fixture('linear.pgb')), { maxWork: 'lots' }), /maxWork load option/)
})

test('a model past WebAssembly\'s 4 GiB is a BundleError that says so, even with maxBytes raised', () => {
  const m = manifestOf(crafted('cache_1gib'))
  const cache = m.buffers.find((b) => b.role === 'cache')
  cache.size = cache.shape[0] = 2 ** 31 - 1 // 8 GiB of float32
  const bytes = pack(encode(m), new Uint8Array(0), 2)
  assert.throws(() => Model.fromBytesSync(bytes, { maxBytes: 2 ** 40 }), (e) => e instanceof BundleError && /at most 4 GiB/.test(e.message))
})
