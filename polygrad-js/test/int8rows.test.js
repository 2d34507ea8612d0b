'use strict'
// A prompt's quantized x @ W.T on Python polygrad's multi-row int8 route (nn/quant.py _int8_matmul_rows: x
// rounded to 8 bits per block, weights in 8-row panels as unsigned bytes, Q8_0's byte ^ 0x80 and Q4_0's nibbles,
// block sums less offset x the activations' block sums; tools/make_int8_fixture.py --rows: 5 rows of x, 24
// weight rows x 96 columns, raw random blocks). polygrad-js runs the block sums in lanes along the weight rows
// (lower.js rowDotShape, linearize.js rowDotReduce: a dot4 of each lane's 4 bytes, wasm/emit.js emitDot4Lanes),
// where they had fallen to scalar code. Against NumPy's float64 over exact int64 block sums (int8_rows.json),
// and the vector and scalar programs bit for bit.
const test = require('node:test')
const assert = require('node:assert')
const fs = require('fs')
const path = require('path')
const { fixture, pageResult, pageFiles, instsOf } = require('./helpers')
const { Model } = require('..')
const { lowerKernel } = require('../src/compile')
const { KernelEmitter } = require('../src/wasm/emit')

const REF = JSON.parse(fs.readFileSync(path.join(__dirname, 'fixtures', 'int8_rows.json'), 'utf8'))

function outputs (options) {
  const m = Model.fromBytesSync(fixture('int8_rows.pgb'), Object.assign({ threads: 1 }, options))
  const out = REF.x.map((x) => { const r = m.forward({ x: Float32Array.from(x.flat()) }); return { y8: Array.from(r.y8), y4: Array.from(r.y4) } })
  m.dispose()
  return out
}

test('prompt-route int8 matmuls match NumPy, vectorized and scalar bit for bit', () => {
  const vec = outputs({})
  vec.forEach((o, i) => {
    for (const name of ['y8', 'y4']) {
      const { want, bound } = REF.cases[i][name]
      assert.strictEqual(o[name].length, REF.xrows * REF.rows[name])
      // float32 rounding: each block's products are exact, the scales and the sum over blocks round
      want.forEach((w, r) => assert.ok(Math.abs(o[name][r] - w) <= 1e-5 * bound[r] + 1e-30,
        `case ${i} ${name}[${r}]: ${o[name][r]} vs ${w} (bound ${bound[r]})`))
    }
  })
  assert.deepStrictEqual(vec, outputs({ backend: 'js' }), 'lanes and scalar code differ')
})

test('prompt-route int8 matmuls run in lanes: a dot4 per 4 bytes of each weight row, no int32 accumulator', () => {
  const m = Model.fromBytesSync(fixture('int8_rows.pgb'), { threads: 1 })
  const prog = m._x.prog
  const shapes = []
  for (const ast of prog.kernels) {
    const p = lowerKernel(prog.graph, ast, { width: 4 })
    const insts = instsOf(p)
    if (!insts.some((x) => x.k === 'load' && x.buf !== undefined && ['uint8'].includes(x.dtype.name)) && !insts.some((x) => x.k === 'rowbytes')) continue
    assert.strictEqual(p.vectorized, true, 'a block-sum kernel fell back to scalar code')
    const rowbytes = insts.filter((x) => x.k === 'rowbytes')
    shapes.push(`${insts.filter((x) => x.k === 'dot4').length} dot4 ${rowbytes.filter((x) => x.lane === 0).length}+${rowbytes.filter((x) => x.lane !== 0).length} ${[...new Set(insts.filter((x) => x.k === 'byteops').map((x) => x.ops.join('')))].join('|')}`)
    assert.strictEqual(insts.some((x) => x.k === 'acc' && x.dtype.name === 'int32'), false, 'an int32 accumulator left')
  }
  // Q8_0 and Q4_0: a tile of 4 rows x 2 vectors, 8 groups of 4 points a block: 64 dot4s; the rows' activation
  // bytes splat (4 rows x 8 groups), the weight bytes shared by the rows (2 vectors x 8 groups); Q4_0's 16 bytes
  // of a block read once for both nibbles' groups
  assert.deepStrictEqual(shapes.sort(), ['64 dot4 32+16 XOR', '64 dot4 32+8 SHRAND'])
  m.dispose()
})

test('with relaxed SIMD the Q4_0 nibbles take its int8 dot product, the Q8_0 bytes (8 bits) the standard one', () => {
  const m = Model.fromBytesSync(fixture('int8_rows.pgb'), { threads: 1 })
  const prog = m._x.prog
  const counts = []
  for (const ast of prog.kernels) {
    const p = lowerKernel(prog.graph, ast, { width: 4, dot: true })
    const dots = instsOf(p).filter((x) => x.k === 'dot4')
    if (!dots.length) continue
    const layout = new Map(p.params.map((q, i) => [q.slot, { base: 4096 * (i + 1), size: 4096 }]))
    const stats = new KernelEmitter(p, layout, {}, {}).emit().stats
    counts.push(`${dots.filter((x) => !x.signs).length}/${dots.length} relaxed, ${stats.int8Dots} emitted`)
  }
  assert.deepStrictEqual(counts.sort(), ['0/64 relaxed, 0 emitted', '64/64 relaxed, 64 emitted'])
  m.dispose()
})

test('on two threads the prompt-route kernels split with their dot4s, the same bits', () => {
  const m = Model.fromBytesSync(fixture('int8_rows.pgb'), { threads: 2 })
  m._x.minWork = 0 // every kernel shared with the worker (phases)
  const out = REF.x.map((x) => { const r = m.forward({ x: Float32Array.from(x.flat()) }); return { y8: Array.from(r.y8), y4: Array.from(r.y4) } })
  let phaseDots = 0
  for (const p of m._x.lowered.values()) for (const ph of p.phases || []) phaseDots += instsOf(ph).filter((x) => x.k === 'dot4').length
  assert.strictEqual(m.backendInfo.threads, 2)
  assert.ok(m._x.pool && m._x.pool.calls > 0, 'the worker ran slices')
  m.dispose()
  // each phase (one block: the whole kernel) holds the tile's 64 dot4s
  assert.strictEqual(phaseDots, 128)
  assert.deepStrictEqual(out, outputs({}))
})

const PAGE = `<!doctype html><meta charset="utf-8"><script type="module">
import { Model } from '/dist/polygrad.browser.mjs'
try {
  const ref = await (await fetch('/ref.json')).json()
  const bytes = new Uint8Array(await (await fetch('/int8_rows.pgb')).arrayBuffer())
  // fma off: the float sum over blocks rounds as Node's, so the bits compare
  const m = await Model.fromBytes(bytes, { threads: 1, fma: false })
  const out = ref.x.map((x) => { const r = m.forward({ x: Float32Array.from(x.flat()) }); return { y8: Array.from(r.y8), y4: Array.from(r.y4) } })
  let relaxed = 0
  for (const p of m._x.lowered.values()) {
    const walk = (xs) => { for (const x of xs) { if (x.k === 'dot4' && !x.signs) relaxed++; if (x.pre) walk(x.pre); if (x.body) walk(x.body) } }
    walk(p.head); walk(p.body)
  }
  window.__result = { dot: m._x.dot, relaxed, out }
  m.dispose()
} catch (e) {
  window.__result = { error: String(e && e.stack || e) }
}
</script>`

test('in Chromium the relaxed dot product gives Node\'s bits', { skip: pageResult.skip, timeout: 120000 }, async () => {
  const r = await pageResult(pageFiles(PAGE, {
    '/int8_rows.pgb': ['application/octet-stream', fixture('int8_rows.pgb')],
    '/ref.json': ['application/json', JSON.stringify(REF)]
  }))
  assert.ok(!r.error, r.error)
  assert.strictEqual(r.dot, true, 'Chromium computes relaxed SIMD\'s int8 dot product')
  assert.strictEqual(r.relaxed, 64, 'the Q4_0 block sums take it')
  assert.deepStrictEqual(r.out, outputs({}), 'Node\'s bits (the standard-SIMD dot4)')
})
