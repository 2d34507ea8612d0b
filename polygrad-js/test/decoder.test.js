'use strict'
// Bundle format 2 (docs/bundle-format.md section 5): a decoder with key/value caches, a `decode` entrypoint
// taking the Variable `pos` as an integer, Variables in two dimensions of one input; and accumulating stores
// (an embedding's gradient is a scatter-add). References: Python's results (tools/make_fixtures.py).
const test = require('node:test')
const assert = require('node:assert')
const { Model, ModelInputError, EntrypointError } = require('..')
const bundle = require('../src/bundle')
const { fixture, reference, maxRel } = require('./helpers')

const ref = reference()
const ids = ref.decoder.ids
const cols = (from, to) => ids.map((row) => row.slice(from, to))
const close = (got, want) => assert.ok(maxRel(got, want.flat(2), 1e-3) < 1e-5, `${Array.from(got).slice(0, 4)} vs ${want.flat(2).slice(0, 4)}`)

for (const backend of ['wasm', 'js']) {
  test(`forward fills the caches, decode steps read them (${backend})`, () => {
    const m = Model.fromBytesSync(fixture('decoder.pgb'), { backend, verify: true, validate: 'all' })
    assert.deepStrictEqual(m.entrypoints, ['forward', 'decode'])
    assert.deepStrictEqual(m.variables, { batch: { min: 1, max: 2 }, tokens: { min: 1, max: 8 }, pos: { min: 0, max: 7 } })
    const out = m.forward({ ids: cols(0, 3) }).logits
    assert.deepStrictEqual(out.shape, [2, 3, 13])
    close(out, ref.decoder.forward)
    ref.decoder.decode.forEach((want, i) => {
      const p = 3 + i
      const y = m.call('decode', { ids: { data: Int32Array.from(cols(p, p + 1).flat()), shape: [2, 1] }, pos: p }).logits
      assert.deepStrictEqual(y.shape, [2, 1, 13])
      close(y, want)
    })
    if (backend === 'wasm') assert.strictEqual(m._x.stats.checks, 0)
    m.dispose()
  })
}

test('a loaded model starts with zeroed caches, and save() writes version 2 that loads again', () => {
  const m = Model.fromBytesSync(fixture('decoder.pgb'))
  close(m.call('decode', { ids: [[ids[0][2]]], pos: 2 }).logits, ref.decoder.fresh_decode)
  m.forward({ ids: cols(0, 3) }) // caches are not saved: the copy starts from zeros again
  const bytes = m.save()
  assert.strictEqual(new DataView(bytes.buffer).getUint32(8, true), 2)
  const { manifest } = bundle.read(bytes)
  assert.deepStrictEqual(manifest.entrypoints.decode.arguments, ['pos'])
  assert.ok(manifest.buffers.filter((b) => b.role === 'cache').every((b) => b.data === undefined))
  const again = Model.fromBytesSync(bytes)
  close(again.call('decode', { ids: [[ids[0][2]]], pos: 2 }).logits, ref.decoder.fresh_decode)
  close(again.forward({ ids: cols(0, 3) }).logits, ref.decoder.forward)
  m.dispose()
  again.dispose()
})

test('Variable arguments and Variable dimensions are checked', () => {
  const m = Model.fromBytesSync(fixture('decoder.pgb'))
  const step = { ids: [[1], [2]] }
  assert.throws(() => m.call('decode', step), (e) => e instanceof ModelInputError && /missing \["pos"\]/.test(e.message))
  assert.throws(() => m.call('decode', { ...step, pos: 8 }), (e) => e instanceof ModelInputError && /outside Variable 'pos' bounds 0..7/.test(e.message))
  assert.throws(() => m.call('decode', { ...step, pos: 1.5 }), (e) => e instanceof ModelInputError && /takes an integer/.test(e.message))
  assert.throws(() => m.call('decode', { ...step, pos: '3' }), ModelInputError)
  assert.throws(() => m.call('decode', { ...step, pos: 1, tokens: 2 }), (e) => e instanceof ModelInputError && /unknown \["tokens"\]/.test(e.message))
  assert.throws(() => m.call('decode', { ids: [[1, 2]], pos: 1 }), (e) => e instanceof ModelInputError && /shape \[1, 2\]; expected \[batch, 1\]/.test(e.message))
  assert.throws(() => m.forward({ ids: [[1, 2, 3, 4, 5, 6, 7, 8, 9]] }), (e) => e instanceof ModelInputError && /Variable 'tokens' allows 1..8/.test(e.message))
  assert.throws(() => m.forward({ ids: [[1], [2], [3]] }), (e) => e instanceof ModelInputError && /3 rows; Variable 'batch' allows 1..2/.test(e.message))
  // flat data cannot say how it splits between two Variable dimensions
  assert.throws(() => m.forward({ ids: Int32Array.from([1, 2, 3]) }), (e) => e instanceof ModelInputError && /2 Variable dimensions/.test(e.message))
  assert.throws(() => m.call('generate', {}), EntrypointError)
  // one row and one token: the smallest sizes both Variables allow
  assert.deepStrictEqual(m.forward({ ids: [[4]] }).logits.shape, [1, 1, 13])
  m.dispose()
})

for (const backend of ['wasm', 'js']) {
  test(`an embedding trains: its gradient is an accumulating store (${backend})`, () => {
    const m = Model.fromBytesSync(fixture('embedding_sgd.pgb'), { backend, verify: true, validate: 'all' })
    const losses = m.fit({ ids: ref.embedding.ids, y: ref.embedding.y }, { epochs: 3, batchSize: 4, optimizer: 'sgd', lr: 0.5 })
    assert.strictEqual(losses.length, 6)
    assert.ok(maxRel(losses, ref.embedding.sgd) < 1e-5, `${losses} vs ${ref.embedding.sgd}`)
    m.dispose()
  })
}
