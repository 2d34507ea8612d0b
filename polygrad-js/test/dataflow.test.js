'use strict'
// Bundles that read what no call wrote, or pass one buffer as two parameters of a call, are refused at load
// with the verdicts Python gives (polygrad/model/format.py _check_dataflow, tests/test_bundle_dataflow.py, which
// also runs this package on the files Python edits): a forward with no calls, a loop ending at -1 or 0, a copy
// from a temporary nothing wrote, calls in the wrong order, aliased arguments. A kernel that writes part of its
// output loads; the rest reads as zeros (a model's memory is its own and starts zeroed).
const test = require('node:test')
const assert = require('node:assert')
const { Model, BundleError } = require('..')
const bundle = require('../src/bundle')
const { fixture } = require('./helpers')

/** The bundle rewritten with edit(manifest) applied (bundle.write lays out the data again). */
function edited (bytes, edit) {
  const { manifest, body } = bundle.read(bytes)
  edit(manifest)
  const blobs = []
  for (const buf of manifest.buffers) {
    if (buf.data !== null && typeof buf.data === 'object') {
      blobs.push(body.slice(buf.data.offset, buf.data.offset + buf.data.nbytes))
      buf.data = true
    }
  }
  return bundle.write(manifest, blobs)
}

/** The serialised CONST node that ends the loop of forward's first kernel (linear.pgb: 5 points). */
function forwardRangeEnd (m) {
  const { nodes, roots } = m.kernels
  const stack = [roots[m.entrypoints.forward.calls[0].kernel]]
  const seen = new Set()
  while (stack.length) {
    const i = stack.pop()
    if (seen.has(i)) continue
    seen.add(i)
    if (nodes[i][0] === 'RANGE') return nodes[nodes[i][2][0]]
    stack.push(...nodes[i][2])
  }
  throw new Error('forward has no loop')
}

const setRangeEnd = (value) => (m) => {
  const end = forwardRangeEnd(m)
  assert.deepStrictEqual(end[3], ['int', 5])
  end[3] = ['int', value]
}
const forward = (m) => m.entrypoints.forward
const args = (...positions) => (m) => {
  const call = forward(m).calls[0]
  call.args = positions.map((p) => call.args[p])
}

// linear.pgb's forward is one call (prediction, a, x, b); mlp_untrained.pgb's two (hidden, then logits)
const REJECTED = [
  ['no calls', 'linear.pgb', (m) => { forward(m).calls = [] }, /outputs\.prediction: buffer \d+ \("output\.prediction"\) is never written/],
  ['a loop ending at -1', 'linear.pgb', setRangeEnd(-1), /RANGE 0 .* has an end in \[-1, -1\]/],
  ['a loop of 0 points', 'linear.pgb', setRangeEnd(0), /RANGE 0 .* has an end in \[0, 0\]/],
  ['a copy from a temporary nothing wrote', 'linear.pgb', (m) => {
    m.buffers.push({ name: 'temp.leak', role: 'temporary', dtype: 'float32', shape: [5], size: 5 })
    forward(m).calls = [{ copy: [forward(m).outputs.prediction, m.buffers.length - 1] }]
  }, /calls\[0\]: the copy reads buffer \d+ \(temporary "temp\.leak"\) before any earlier call/],
  ['a temporary read before it is written', 'mlp_untrained.pgb', (m) => forward(m).calls.reverse(),
    /calls\[0\]: kernel \d+ \(parameter 1\) reads buffer \d+ \(temporary "temp\.forward\.0"\)/],
  ['a copy into an input', 'linear.pgb', (m) => forward(m).calls.push({ copy: [forward(m).inputs.x, forward(m).outputs.prediction] }),
    /calls\[1\]: the copy writes buffer \d+ \(input "input\.x"\)/],
  ['the output passed as an input', 'linear.pgb', args(0, 1, 0, 3), /passed as parameters 0 and 2/],
  ['one buffer read twice', 'linear.pgb', args(0, 1, 2, 1), /passed as parameters 1 and 3/],
  ['a copy onto itself', 'linear.pgb', (m) => {
    const out = forward(m).outputs.prediction
    forward(m).calls.push({ copy: [out, out] })
  }, /passed as parameters 0 and 1/]
]

for (const [what, file, edit, message] of REJECTED) {
  test(`refused at load: ${what}`, () => {
    assert.throws(() => Model.fromBytesSync(edited(fixture(file), edit)), (e) => e instanceof BundleError && message.test(e.message))
  })
}

test('a kernel that writes part of its output loads; the rest reads as zeros', () => {
  const m = Model.fromBytesSync(edited(fixture('linear.pgb'), setRangeEnd(2)))
  const x = new Float32Array([3, 4, 5, 6, 7])
  const full = Model.fromBytesSync(fixture('linear.pgb')).forward({ x }).prediction
  for (let k = 0; k < 2; k++) {
    const y = m.forward({ x }).prediction
    assert.deepStrictEqual(Array.from(y), [full[0], full[1], 0, 0, 0])
  }
  m.dispose()
})

test('the unedited fixtures still load with every kernel checked', () => {
  for (const f of ['linear.pgb', 'mlp_untrained.pgb', 'mlp_adam.pgb', 'embedding_sgd.pgb', 'decoder.pgb', 'mlp_wide.pgb']) {
    Model.fromBytesSync(fixture(f), { validate: 'all' }).dispose()
  }
})
