'use strict'
// Which opts chooseOpts gives a convolution whose weight is stored output-channels-last (as polygrad.onnx keeps
// a group-1 Conv's weight): vector lanes on the output channels when the image row is too narrow for lanes (7
// pixels), when the row's input loads are gated by padding, and when one kernel sums two reductions (a block's
// conv and its 1x1 shortcut). Without them ResNet-18 ran 10x slower than onnxruntime-web (issue 34).
const test = require('node:test')
const assert = require('node:assert')
const { Graph } = require('../src/ir')
const { DTYPES } = require('../src/dtypes')
const { chooseOpts } = require('../src/lower')

const f32 = DTYPES.float32
const i32 = DTYPES.int32

/** out[co, y, x] = sum_ci X[ci, y, x] * W[ci, co] (+ a second such sum): a 1x1 convolution, C channels, an S x S
 * image; `pad` reads X through a gate (x >= 1, as a padded 3x3 window's first column is). */
function conv (C, S, { pad = false, two = false } = {}) {
  const g = new Graph()
  const c = (v) => g.const(i32, v)
  const buf = (slot, n) => g.node('DEFINE_GLOBAL', f32, [], [slot, [n]])
  const [co, y, x] = [C, S, S].map((n, i) => g.node('RANGE', i32, [c(n)], [i, 'global']))
  const sum = (slot, id) => {
    const ci = g.node('RANGE', i32, [c(C)], [id, 'reduce'])
    const xi = g.alu('ADD', g.alu('ADD', g.alu('MUL', ci, c(S * S)), g.alu('MUL', y, c(S))), x)
    const xs = pad ? [buf(slot, C * S * S), xi, g.alu('CMPLT', c(0), x)] : [buf(slot, C * S * S), xi]
    const xl = g.node('LOAD', f32, [g.node('INDEX', f32, xs)])
    const wl = g.node('LOAD', f32, [g.node('INDEX', f32, [buf(slot + 1, C * C), g.alu('ADD', g.alu('MUL', ci, c(C)), co)])])
    return g.node('REDUCE', f32, [g.alu('MUL', xl, wl), ci], 'ADD')
  }
  const value = two ? g.alu('ADD', sum(1, 3), sum(3, 4)) : sum(1, 3)
  const out = g.alu('ADD', g.alu('ADD', g.alu('MUL', co, c(S * S)), g.alu('MUL', y, c(S))), x)
  const st = g.node('STORE', null, [g.node('INDEX', f32, [buf(0, C * S * S), out]), value])
  return { ast: g.node('SINK', null, [g.node('END', null, [st, co, y, x])]), co, x }
}

const summary = (opts) => opts.map((o) => [o.kind, o.range.arg[0], o.amount])

test('a convolution on a 7-pixel row gets vector lanes on its output channels', () => {
  const { ast, co } = conv(16, 7)
  const opts = summary(chooseOpts(ast, 4))
  assert.deepStrictEqual(opts.slice(0, 2), [['VECTOR', co.arg[0], 4], ['UPCAST', co.arg[0], 2]])
})

test('a row of 8 pixels takes the lanes, unless its input loads are gated (padding): then the channels do', () => {
  const plain = conv(16, 8)
  assert.deepStrictEqual(summary(chooseOpts(plain.ast, 4))[0], ['VECTOR', plain.x.arg[0], 4])
  const padded = conv(16, 8, { pad: true })
  assert.deepStrictEqual(summary(chooseOpts(padded.ast, 4))[0], ['VECTOR', padded.co.arg[0], 4])
})

test('two reductions in one kernel (a conv and its shortcut) get channel lanes too', () => {
  const { ast, co } = conv(16, 7, { two: true })
  assert.deepStrictEqual(summary(chooseOpts(ast, 4))[0], ['VECTOR', co.arg[0], 4])
})

test('a 7-pixel row the row tile does not divide still gets a 4-pixel tile, its last one moved back (clamp)', () => {
  // one pixel a tile left 2 vector accumulators per reduction step: ResNet-18's last stage ran at a fraction of the rate
  const { ast, x } = conv(16, 7)
  const tile = chooseOpts(ast, 4).find((o) => o.kind === 'UPCAST' && o.range === x)
  assert.ok(tile && tile.amount === 4 && tile.clamp === true, JSON.stringify(summary(chooseOpts(ast, 4))))
})
