'use strict'
const test = require('node:test')
const assert = require('node:assert')
const path = require('path')
const { Model, ModelError, ModelInputError, EntrypointError, BundleError, simdSupported } = require('..')
const { FIXTURES, fixture, reference, maxRel } = require('./helpers')

const ref = reference()

test('the spec example: Model.load, forward with a Float32Array, dispose', () => {
  const model = Model.load(path.join(FIXTURES, 'linear.pgb'))
  try {
    const { prediction } = model.forward({ x: new Float32Array([3, 4, 5, 6, 7]) })
    assert.ok(prediction instanceof Float32Array)
    assert.deepStrictEqual(prediction.shape, [5])
    assert.deepStrictEqual(Array.from(prediction), ref.linear.prediction) // bit for bit: elementwise kernels
  } finally {
    model.dispose()
  }
})

for (const backend of ['wasm', 'js']) {
  test(`forward matches Python on a variable batch (${backend})`, () => {
    const m = Model.fromBytesSync(fixture('mlp_untrained.pgb'), { backend, verify: true })
    const x = ref.mlp.x.slice(0, 5)
    const out = m.forward({ x: { data: Float32Array.from(x.flat()), shape: [5, 4] } }).logits
    assert.deepStrictEqual(out.shape, [5, 3])
    assert.ok(maxRel(out, ref.mlp.logits_untrained.flat(), 1e-3) < 1e-5)
    // the same rows from a nested array and from a flat one give the same bits; 1 row too
    assert.deepStrictEqual(Array.from(m.forward({ x }).logits), Array.from(out))
    assert.deepStrictEqual(m.forward({ x: x[0] }).logits.shape, [1, 3])
    m.dispose()
  })
}

test('wasm and plain-JS backends agree', () => {
  const a = Model.fromBytesSync(fixture('mlp_adam.pgb'), { backend: 'wasm' })
  const b = Model.fromBytesSync(fixture('mlp_adam.pgb'), { backend: 'js' })
  const x = Float32Array.from(ref.mlp.x.flat())
  const ya = a.forward({ x }).logits
  const yb = b.forward({ x }).logits
  assert.ok(maxRel(ya, yb, 1e-3) < 1e-5)
  const la = a.fit({ x, y: Int32Array.from(ref.mlp.y) }, { batchSize: 4 })
  const lb = b.fit({ x, y: Int32Array.from(ref.mlp.y) }, { batchSize: 4 })
  assert.ok(maxRel(la, lb) < 1e-5)
})

test('fit resumes the bundle optimizer and follows Python', () => {
  const m = Model.fromBytesSync(fixture('mlp_adam.pgb'))
  const losses = m.fit({ x: Float32Array.from(ref.mlp.x.flat()), y: ref.mlp.y }, { epochs: 2, batchSize: 4 })
  assert.strictEqual(losses.length, 6)
  assert.ok(maxRel(losses, ref.mlp.adam_resume) < 1e-5, `${losses} vs ${ref.mlp.adam_resume}`)
  m.dispose()
})

test('a JS-built Adam on an untrained bundle follows Python; trainStep returns the loss before the update', () => {
  const m = Model.fromBytesSync(fixture('mlp_untrained.pgb'))
  const x = Float32Array.from(ref.mlp.x.flat())
  const losses = m.fit({ x, y: ref.mlp.y }, { batchSize: 4, optimizer: 'adam', lr: 0.01 })
  assert.ok(maxRel(losses, ref.mlp.adam_first) < 1e-5, `${losses} vs ${ref.mlp.adam_first}`)
  const l1 = m.trainStep({ x: x.subarray(0, 16), y: ref.mlp.y.slice(0, 4) })
  assert.ok(Number.isFinite(l1))
  assert.strictEqual(m.summary().optimizer.name, 'adam')
  m.dispose()
})

test('minibatch rules: incomplete batches, remainder drop/keep, bounds', () => {
  const m = Model.fromBytesSync(fixture('mlp_untrained.pgb'))
  const x = Float32Array.from(ref.mlp.x.flat()) // 12 samples
  const y = ref.mlp.y
  assert.throws(() => m.fit({ x, y }, { batchSize: 5 }), ModelInputError)
  assert.strictEqual(m.fit({ x, y }, { batchSize: 5, remainder: 'drop', optimizer: 'sgd', lr: 0.1 }).length, 2)
  assert.strictEqual(m.fit({ x, y }, { batchSize: 5, remainder: 'keep' }).length, 3)
  assert.throws(() => m.fit({ x, y }, { batchSize: 17 }), /outside Variable 'batch' bounds 1..16/)
  assert.throws(() => m.fit({ x, y: y.slice(1) }), /samples/)
  assert.throws(() => m.fit({ x }), /missing \["y"\]/)
  assert.strictEqual(m.fit({ x, y }, { epochs: 0 }).length, 0)
  m.dispose()
})

test('typed errors: names, shapes, dtypes, entrypoints, disposal, bundles', () => {
  const m = Model.fromBytesSync(fixture('linear.pgb'))
  assert.throws(() => m.forward({ z: [1, 2, 3, 4, 5] }), (e) => e instanceof ModelInputError && /unknown \["z"\]/.test(e.message))
  assert.throws(() => m.forward({ x: [1, 2, 3] }), (e) => e instanceof ModelInputError && /has shape \[3\]; expected \[5\]/.test(e.message))
  assert.throws(() => m.forward({ x: new Float32Array(3) }), /has 3 values; expected 5/)
  assert.throws(() => m.forward({ x: { data: [1, 2, 3, 4, 5], shape: [1, 5] } }), /has shape \[1, 5\]; expected \[5\]/)
  assert.throws(() => m.forward({ x: ['a', 2, 3, 4, 5] }), ModelInputError)
  assert.throws(() => m.call('sample', {}), EntrypointError)
  assert.throws(() => m.call('sample', {}), ModelError)
  const mi = Model.fromBytesSync(fixture('mlp_untrained.pgb'))
  assert.throws(() => mi.call('loss', { x: [[1, 2, 3, 4]], y: new Float32Array([1]) }), /Float32Array; expected int32/)
  assert.throws(() => mi.call('loss', { x: [[1, 2, 3, 4]], y: [0.5] }), /needs integers/)
  assert.throws(() => mi.forward({ x: new Float32Array(4 * 17) }), /17 rows; Variable 'batch' allows 1..16/)
  assert.throws(() => mi.forward({ x: new Float32Array(4 * 2 + 1) }), /has 9 values; expected a multiple of 4/)
  assert.throws(() => mi.forward({ x: new Float32Array(0) }), /0 rows; Variable 'batch' allows 1..16/)
  assert.throws(() => mi.forward({ x: new Float32Array(8), y: new Int32Array(2) }), /unknown \["y"\]/)
  // the flat typed array of the input's dtype (data.js flatTyped) and the general reader agree
  const x8 = Float32Array.from({ length: 8 }, (_, i) => Math.sin(i))
  const a = mi.forward({ x: x8 }).logits
  for (const other of [Float64Array.from(x8), Array.from(x8), { data: x8, shape: [2, 4] }]) {
    const b = mi.forward({ x: other }).logits
    assert.deepStrictEqual(b.shape, [2, 3])
    assert.deepStrictEqual(Array.from(b), Array.from(a))
  }
  assert.throws(() => mi.fit({ x: [[1, 2, 3, 4]], y: [0] }, { optimizer: 'rmsprop' }), /optimizer must be one of/)
  assert.throws(() => mi.fit({ x: [[1, 2, 3, 4]], y: [0] }, { optimizer: 'adam', momentum: 0.9 }), /unknown \["momentum"\]/)
  m.dispose()
  m.dispose() // idempotent
  assert.throws(() => m.forward({ x: [1, 2, 3, 4, 5] }), (e) => e instanceof ModelError && /disposed/.test(e.message))
  assert.throws(() => Model.load(path.join(FIXTURES, 'missing.pgb')), BundleError)
  assert.throws(() => Model.fromBytesSync(new Uint8Array(10)), BundleError)
  const bad = new Uint8Array(fixture('linear.pgb'))
  bad[bad.length - 1] ^= 1
  assert.throws(() => Model.fromBytesSync(bad), /checksum/)
  for (const e of [ModelError, ModelInputError, EntrypointError, BundleError]) assert.ok(new e('x') instanceof Error)
})

test('summary, signature and variables describe the bundle without running it', () => {
  const m = Model.fromBytesSync(fixture('mlp_adam.pgb'))
  const s = m.summary()
  assert.deepStrictEqual(s.inputs, [{ name: 'x', dtype: 'float32', shape: ['batch', 4] }])
  assert.deepStrictEqual(m.signature.targets, [{ name: 'y', dtype: 'int32', shape: ['batch'] }])
  assert.deepStrictEqual(m.variables, { batch: { min: 1, max: 16 } })
  assert.strictEqual(s.parameterCount, 4 * 8 + 8 + 8 * 3 + 3)
  assert.deepStrictEqual(m.entrypoints, ['forward', 'loss', 'optimizer_step', 'train_step'])
  assert.match(String(s), /l1\.weight\s+float32\s+\[8, 4\]/)
  assert.strictEqual(s.optimizer.name, 'adam')
  m.dispose()
})

test('save returns bundle bytes that load again with the trained weights', () => {
  const m = Model.fromBytesSync(fixture('mlp_untrained.pgb'))
  const x = Float32Array.from(ref.mlp.x.flat())
  m.fit({ x, y: ref.mlp.y }, { batchSize: 4, optimizer: 'sgd', lr: 0.5, epochs: 2 })
  const before = m.forward({ x }).logits
  const bytes = m.save()
  assert.ok(bytes instanceof Uint8Array)
  const again = Model.fromBytesSync(bytes)
  assert.deepStrictEqual(Array.from(again.forward({ x }).logits), Array.from(before))
  assert.deepStrictEqual(again.summary().optimizer, m.summary().optimizer)
  // the saved optimizer state resumes: the same next steps from both
  assert.deepStrictEqual(again.fit({ x, y: ref.mlp.y }, { batchSize: 4 }), m.fit({ x, y: ref.mlp.y }, { batchSize: 4 }))
  m.dispose()
  again.dispose()
})

test('results are copies: a later call does not change them', () => {
  const m = Model.fromBytesSync(fixture('linear.pgb'))
  const a = m.forward({ x: [1, 1, 1, 1, 1] }).prediction
  const copy = Array.from(a)
  m.forward({ x: [9, 9, 9, 9, 9] })
  assert.deepStrictEqual(Array.from(a), copy)
})

test('fromBytes is asynchronous and compiles every entrypoint', async () => {
  const m = await Model.fromBytes(fixture('mlp_adam.pgb').buffer.slice(0))
  assert.deepStrictEqual(m.forward({ x: [[0, 0, 0, 0]] }).logits.shape, [1, 3])
  m.dispose()
})

// Deterministic guards of the lowering the speed depends on (timings live in bench/, never in tests): x @ W.T
// at a Variable batch runs a 2-row x 4-column register tile of vector accumulators over the reduction split
// into lanes; below 2 rows a variant without the row tile runs, 8 columns per tile and the reduction unrolled
// by 2 (16 weight loads in flight per iteration). Both give Python's results. The tile's reduction loop has
// no counter of its own: it ends when its first address pointer reaches its last value; its epilogue runs in
// lanes over the tile's columns. Below the row tile the weights are read through packed copies.
function flat (insts, out = []) {
  for (const x of insts) {
    out.push(x)
    if (x.k === 'loop') { flat(x.pre, out); flat(x.body, out) }
    if (x.k === 'if') flat(x.body, out)
  }
  return out
}

function innerLoop (insts) {
  let found = null
  const walk = (xs) => {
    for (const x of xs) {
      if (x.k === 'loop') {
        if (x.kind === 'reduce' && !x.body.some((y) => y.k === 'loop')) found = found || x
        walk(x.pre)
        walk(x.body)
      }
    }
  }
  walk(insts)
  return found
}

test('register tiles of x @ W.T: 2x4 at full batch, 8 columns and an unrolled reduction for a few rows', () => {
  const m = Model.fromBytesSync(fixture('mlp_wide.pgb'), { verify: true })
  for (const n of ['1', '3', '8']) {
    const out = m.forward({ x: ref.wide.x.slice(0, Number(n)) }).logits
    assert.ok(maxRel(out, ref.wide[n].flat(), 1e-3) < 1e-5, `batch ${n}`)
  }
  if (m.backend !== 'wasm') return
  const first = m._p.entries.forward.calls.find((c) => !c.copy)
  const p = m._x.lower(first.kernel)
  const count = (loop, k) => loop.body.filter((x) => x.k === k && x.lanes === 4).length
  const big = innerLoop(p.body)
  assert.strictEqual(count(big, 'load'), 2 + 4)
  assert.strictEqual(count(big, 'update'), 2 * 4)
  assert.strictEqual(p.smallBelow, 2)
  assert.ok(p.small, 'a variant for fewer rows than the tile')
  const small = innerLoop(p.small.body)
  assert.strictEqual(count(small, 'load'), 2 * (1 + 8))
  assert.strictEqual(count(small, 'update'), 2 * 8)
  assert.ok(m._x.stats.checks === 0)
  // the few-rows variant reads both layers' weights through copies packed in its loop order (pack.js): the
  // 16 weight loads of a reduction step read one contiguous block; the copies are made once (no weights
  // were written since), not per call
  assert.strictEqual(m._x.packed.size, 2)
  for (const r of m._x.packed.values()) {
    assert.strictEqual(r.source.role, 'parameter')
    assert.deepStrictEqual(r.layout.sizes.slice(-3), [8, 2, 4])
  }
  const site = m._x.siteFns.get(m._x.siteKey(first) + '|packed')
  assert.strictEqual(site.packs.length, 1)
  const packedLoop = innerLoop(site.prog.body)
  assert.strictEqual(packedLoop.body.filter((x) => x.k === 'load' && x.buf === site.prog.packs[0].slot).length, 2 * 8)
  // the first batch-1 call ran unpacked (a first result pays no refill); the second makes the copies, once
  assert.strictEqual(m._x.stats.repacks, 0)
  const again = m.forward({ x: ref.wide.x.slice(0, 1) }).logits
  assert.ok(maxRel(again, ref.wide['1'].flat(), 1e-3) < 1e-5, 'batch 1, packed')
  m.forward({ x: ref.wide.x.slice(0, 1) })
  assert.strictEqual(m._x.stats.repacks, 2)
  // the full-batch tile's epilogue runs in lanes over its 4 columns: per tile row one hsum folds the 4
  // columns' partial sums into one vector, then bias, ReLU and one 4-lane store (no lane-by-lane folds)
  const all = flat(p.body)
  assert.strictEqual(all.filter((x) => x.k === 'hsum').length, 2)
  assert.ok(!all.some((x) => x.k === 'update' && x.fold), 'no lane-by-lane fold')
  const stores = all.filter((x) => x.k === 'store')
  assert.ok(stores.length === 2 && stores.every((x) => x.lanes === 4 && x.mode === 'contiguous'), 'one 4-lane store per tile row')
  // the emitted function: every reduction loop ends on its address pointer (no counter)
  const { KernelEmitter } = require('../src/wasm/emit')
  const layout = new Map(first.args.map((s, i) => [i, { base: s.base, size: s.size }]))
  const { stats } = new KernelEmitter(p, layout, {}, {}).emit()
  assert.ok(stats.pointerExits >= 1, 'the reduction loop ends on its pointer')
  m.dispose()
})

test('repack fills a packed copy in the loop order of its layout', () => {
  const { repack } = require('../src/pack')
  // a 3 x 4 buffer read as (column pair j, row i, lane l): element i*4 + j*2 + l at packed (j*3 + i)*2 + l
  const view = new Float32Array(40)
  for (let e = 0; e < 12; e++) view[e] = e + 1
  repack(view, 0, 20, { sizes: [2, 3, 2], src: [2, 4, 1], size: 12 })
  const want = []
  for (let j = 0; j < 2; j++) for (let i = 0; i < 3; i++) for (let l = 0; l < 2; l++) want.push(i * 4 + j * 2 + l + 1)
  assert.deepStrictEqual(Array.from(view.subarray(20, 32)), want)
})

test('repack gives every layout the order an element-by-element walk gives (runs merged, rows in blocks)', () => {
  const { repack } = require('../src/pack')
  let seed = 7
  const rand = (n) => { seed = (seed * 1103515245 + 12345) % 2147483648; return seed % n }
  // x @ W's layout (column tile, 130 rows: more than one block of 64, 2 columns, 4 lanes), then random ones
  const layouts = [{ sizes: [3, 130, 2, 4], order: [3, 2, 0, 1] }]
  for (let t = 0; t < 60; t++) {
    const n = 1 + rand(4)
    const sizes = Array.from({ length: n }, () => 1 + rand(5))
    const order = [...Array(n).keys()].sort((a, b) => rand(3) - 1 || a - b)
    layouts.push({ sizes, order })
  }
  for (const { sizes, order } of layouts) {
    const coeffs = new Array(sizes.length)
    let size = 1
    for (const d of order) { coeffs[d] = size; size *= sizes[d] }
    const view = new Float32Array(2 * size + 8)
    for (let i = 0; i < size; i++) view[3 + i] = i + 1
    repack(view, 3, size + 5, { sizes, src: coeffs, size })
    for (let i = 0; i < size; i++) {
      let s = 0
      let r = i
      for (let k = sizes.length - 1; k >= 0; k--) { s += (r % sizes[k]) * coeffs[k]; r = Math.floor(r / sizes[k]) }
      assert.strictEqual(view[size + 5 + i], view[3 + s], `sizes ${sizes} order ${order} element ${i}`)
    }
  }
})

test('fit and trainStep refuse the optimizer configurations Python refuses, before any step (issue 28)', () => {
  const corpus = JSON.parse(require('fs').readFileSync(path.join(FIXTURES, 'optimizer_hyperparameters.json'), 'utf8'))
  const data = { x: ref.mlp.x.slice(0, 4), y: ref.mlp.y.slice(0, 4) }
  const m = Model.fromBytesSync(fixture('mlp_untrained.pgb'))
  try {
    const before = m.forward({ x: data.x }).logits
    const refused = (fn, message) => assert.throws(fn, (e) => e instanceof ModelError && e.message.includes(message), message)
    for (const { optimizer, hyper, message } of corpus.refused) {
      refused(() => m.fit(data, { optimizer, ...hyper }), message)
      refused(() => m.trainStep(data, { optimizer, ...hyper }), message)
    }
    // values JSON cannot hold
    for (const lr of [NaN, Infinity, -Infinity, 10n]) refused(() => m.fit(data, { optimizer: 'sgd', lr }), 'hyperparameter lr must be')
    refused(() => m.fit(data, { optimizer: 'adam', betas: [NaN, 0.9] }), 'hyperparameter betas must be')
    assert.deepStrictEqual(Array.from(m.forward({ x: data.x }).logits), Array.from(before)) // no step ran
    assert.strictEqual(m.summary().optimizer, null)
    for (const { optimizer, hyper } of corpus.accepted) {
      const losses = m.fit(data, { optimizer, ...hyper })
      assert.ok(losses.every(Number.isFinite), JSON.stringify(hyper))
    }
    // a new learning rate alone (the configured optimizer kept) is checked too
    for (const lr of ['fast', -1, NaN]) refused(() => m.fit(data, { lr }), 'hyperparameter lr must be')
    assert.strictEqual(m.summary().optimizer.lr, 0.01)
  } finally {
    m.dispose()
  }
})

test('an unknown backend or load option is a ModelError naming the choices, never another path', async () => {
  const bytes = fixture('mlp_untrained.pgb')
  for (const backend of ['webgl', 'WASM', '', null, 1]) {
    assert.throws(() => Model.fromBytesSync(bytes, { backend }), (e) => e instanceof ModelError && /unknown backend/.test(e.message) && /'wasm'/.test(e.message) && /'js'/.test(e.message))
    await assert.rejects(Model.fromBytes(bytes, { backend }), (e) => e instanceof ModelError && /unknown backend/.test(e.message))
  }
  assert.throws(() => Model.load(path.join(FIXTURES, 'linear.pgb'), { backend: 'webgpu' }), ModelError)
  assert.throws(() => Model.fromBytesSync(bytes, { workers: 2, maxbytes: 1 }), (e) => e instanceof ModelError && /unknown load option "workers"/.test(e.message) && /maxBytes/.test(e.message))
  assert.throws(() => Model.fromBytesSync(bytes, { validate: 'some' }), (e) => e instanceof ModelError && /validate must be/.test(e.message))
  assert.throws(() => Model.fromBytesSync(bytes, { verify: 'yes' }), (e) => e instanceof ModelError && /verify must be/.test(e.message))
  assert.throws(() => Model.fromBytesSync(bytes, 'wasm'), (e) => e instanceof ModelError && /must be an object/.test(e.message))
  for (const backend of ['auto', 'js', ...(simdSupported() ? ['wasm'] : [])]) {
    const m = Model.fromBytesSync(bytes, { backend })
    assert.strictEqual(m.backend, backend === 'auto' ? (simdSupported() ? 'wasm' : 'js') : backend)
    m.dispose()
  }
})
