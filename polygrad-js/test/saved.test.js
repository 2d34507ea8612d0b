'use strict'
// Bundles saved before issue 29 (test/fixtures/saved_at_20af852/, written by polygrad at commit 20af852) load
// and give the results Python recorded for them then (their own reference.json): the tables now generated
// from polygrad-core's definitions read old files as the hand-kept ones did. tests/test_js_fixtures.py loads
// the same files in Python.
const test = require('node:test')
const assert = require('node:assert')
const fs = require('fs')
const path = require('path')
const { Model } = require('..')
const { FIXTURES, maxRel } = require('./helpers')

const OLD = path.join(FIXTURES, 'saved_at_20af852')
const ref = JSON.parse(fs.readFileSync(path.join(OLD, 'reference.json'), 'utf8'))
const load = (name) => Model.fromBytesSync(fs.readFileSync(path.join(OLD, `${name}.pgb`)), { validate: 'all' })
const close = (got, want, what) => assert.ok(maxRel(got, want.flat(2), 1e-3) < 1e-5, `${what}: ${Array.from(got).slice(0, 4)} vs ${want.flat(2).slice(0, 4)}`)

test('an old linear and MLPs: forward, a JS-built Adam, and a resumed bundle Adam', () => {
  const lin = load('linear')
  close(lin.forward({ x: Float32Array.from(ref.linear.x) }).prediction, ref.linear.prediction, 'linear')
  lin.dispose()
  const x = Float32Array.from(ref.mlp.x.flat())
  const mlp = load('mlp_untrained')
  close(mlp.forward({ x: ref.mlp.x.slice(0, 5) }).logits, ref.mlp.logits_untrained, 'mlp forward')
  close(mlp.fit({ x, y: ref.mlp.y }, { batchSize: 4, optimizer: 'adam', lr: 0.01 }), ref.mlp.adam_first, 'adam from scratch')
  mlp.dispose()
  const adam = load('mlp_adam')
  close(adam.fit({ x, y: ref.mlp.y }, { epochs: 2, batchSize: 4 }), ref.mlp.adam_resume, 'adam resumed')
  adam.dispose()
  const wide = load('mlp_wide')
  for (const n of [1, 3, 8]) close(wide.forward({ x: ref.wide.x.slice(0, n) }).logits, ref.wide[String(n)], `wide ${n}`)
  wide.dispose()
})

test('an old version-2 decoder (caches, a Variable argument) and an embedding trained by SGD', () => {
  const ids = ref.decoder.ids
  const cols = (from, to) => ids.map((row) => row.slice(from, to))
  const dec = load('decoder')
  close(dec.call('decode', { ids: [[ids[0][2]]], pos: 2 }).logits, ref.decoder.fresh_decode, 'fresh decode')
  close(dec.forward({ ids: cols(0, 3) }).logits, ref.decoder.forward, 'decoder forward')
  ref.decoder.decode.forEach((want, i) => close(dec.call('decode', { ids: cols(3 + i, 4 + i), pos: 3 + i }).logits, want, `decode ${3 + i}`))
  dec.dispose()
  const emb = load('embedding_sgd')
  const losses = emb.fit({ ids: ref.embedding.ids, y: ref.embedding.y }, { epochs: 3, batchSize: 4, optimizer: 'sgd', lr: 0.5 })
  close(losses, ref.embedding.sgd, 'embedding sgd')
  emb.dispose()
})
