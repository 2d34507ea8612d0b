'use strict'
// A decode step's matvecs on the int8 route, one row of block sums (Q4_0 19 rows, an odd count as GPT-2's 50257-row
// head; Q8_0 18; x 96 columns, tools/make_int8_fixture.py --head, captured on Python polygrad's int8 route).
// lower.js blockOpts tiles Q4_0's columns anyway (dotCols a tile, the last tile moved back to end at the last row,
// overlapping the one before), where one column a tile re-widened the activations for every row and folded each
// row's lane sums alone; Q8_0 (a byte of weight a value, streamsBlocks) reads one row at a time, where it took a
// tile of 2 columns. Against NumPy's float64 over exact int64 block sums (int8_head.json), in Node (2
// columns) and Chromium (4), on one thread and on two (the overlapping tiles split between the threads).
const test = require('node:test')
const assert = require('node:assert')
const fs = require('fs')
const os = require('os')
const path = require('path')
const { fixture, pageResult, pageFiles, instsOf, checkBlockSums } = require('./helpers')
const { Model } = require('..')
const { lowerKernel } = require('../src/compile')
const { chooseOpts } = require('../src/lower')

const REF = JSON.parse(fs.readFileSync(path.join(__dirname, 'fixtures', 'int8_head.json'), 'utf8'))

function outputs (options, minWork = null) {
  const m = Model.fromBytesSync(fixture('int8_head.pgb'), Object.assign({ threads: 1 }, options))
  if (minWork !== null) m._x.minWork = minWork
  const out = REF.x.map((x) => { const r = m.forward({ x: Float32Array.from(x) }); return { y8: Array.from(r.y8), y4: Array.from(r.y4) } })
  m.dispose()
  return out
}

const checkReference = (outs, where) => checkBlockSums(REF, outs, where)

test('one row of Q4_0 block sums over an odd row count takes a column tile of dotCols, its last tile moved back; of Q8_0 one column', () => {
  const m = Model.fromBytesSync(fixture('int8_head.pgb'), { threads: 1 })
  const prog = m._x.prog
  for (const cols of [2, 4]) {
    const seen = []
    for (const ast of prog.kernels) {
      const prepared = m._x.prepare1(ast)
      const opts = chooseOpts(prepared.ast, 4, { dotCols: cols })
      const p = lowerKernel(prog.graph, ast, { width: 4, prepared, opts, dotLanes: true })
      const dots = instsOf(p).filter((x) => x.k === 'dot4')
      if (!dots.length) continue
      const tile = opts.find((o) => o.kind === 'UPCAST')
      const q4 = instsOf(p).some((x) => x.k === 'byteops')
      if (q4) assert.ok(tile && tile.clamp && tile.amount === cols, `${p.name}: a clamped tile of ${cols} columns (${JSON.stringify(opts.map((o) => o.kind))})`)
      else assert.strictEqual(tile, undefined, `${p.name}: Q8_0 one column a tile`)
      // a dot4 per column and vector of lanes (a block's 2)
      assert.strictEqual(dots.length, 2 * (q4 ? cols : 1), `${p.name}: dot4s`)
      seen.push(q4 ? 'Q4_0' : 'Q8_0')
    }
    assert.deepStrictEqual(seen.sort(), ['Q4_0', 'Q8_0'])
  }
  m.dispose()
})

test('the tiled head matches NumPy, the plain path\'s bits, on one thread and on two', () => {
  const plain = outputs({ int8Dot: false })
  checkReference(plain, 'plain')
  const one = outputs({})
  checkReference(one, 'dot')
  assert.deepStrictEqual(one, plain, 'exact int32 block sums, the float sums in the plain path\'s order')
  if (os.cpus().length >= 2) {
    // every kernel split between the two threads (phases): the overlapping last tile may be stored by both
    const two = outputs({ threads: 2 }, 0)
    assert.deepStrictEqual(two, plain, 'on two threads')
  }
})

const PAGE = `<!doctype html><meta charset="utf-8"><script type="module">
import { Model } from '/dist/polygrad.browser.mjs'
const instsOf = ${instsOf.toString()}
try {
  const ref = await (await fetch('/ref.json')).json()
  const bytes = new Uint8Array(await (await fetch('/int8_head.pgb')).arrayBuffer())
  const run = async (m) => {
    const out = []
    for (const x of ref.x) {
      const r = await m.callAsync('forward', { x: Float32Array.from(x) })
      out.push({ y8: Array.from(r.y8), y4: Array.from(r.y4) })
    }
    return out
  }
  const m = await Model.fromBytes(bytes, { threads: 1 })
  const one = await run(m)
  let dots = 0
  for (const p of m._x.lowered.values()) dots += instsOf(p).filter((x) => x.k === 'dot4').length
  const dotCols = m._x.dotCols
  m.dispose()
  const m2 = await Model.fromBytes(bytes, { threads: 2 })
  m2._x.minWork = 0 // every kernel shared with the worker (phases)
  const two = await run(m2)
  window.__result = { one, two, dots, dotCols, calls: m2._x.pool ? m2._x.pool.calls : 0 }
  m2.dispose()
} catch (e) {
  window.__result = { error: String(e && e.stack || e) }
}
</script>`

test('in Chromium the Q4_0 head takes 4 columns a tile and matches NumPy, on one thread and on two', { skip: pageResult.skip || (os.cpus().length < 2 && 'one core'), timeout: 120000 }, async () => {
  const r = await pageResult(pageFiles(PAGE, {
    '/int8_head.pgb': ['application/octet-stream', fixture('int8_head.pgb')],
    '/ref.json': ['application/json', JSON.stringify(REF)]
  }))
  assert.ok(!r.error, r.error)
  assert.strictEqual(r.dotCols, 4)
  assert.strictEqual(r.dots, 4 * 2 + 2, 'Q4_0: 4 columns x 2 vectors of lanes; Q8_0: 1 column')
  assert.ok(r.calls > 0, 'the worker ran slices')
  checkReference(r.one, 'Chromium')
  checkReference(r.two, 'Chromium, two threads')
  assert.deepStrictEqual(r.two, r.one, 'two threads: the same bits')
})
