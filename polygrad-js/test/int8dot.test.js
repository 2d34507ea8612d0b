'use strict'
// Quantized decode matvecs on 8-bit activations (a bundle captured on Python polygrad's int8 route: Q8_0 and Q4_0
// block sums exact in int32; tools/make_int8_fixture.py: 13 and 16 rows x 96 columns, raw random blocks): polygrad-js
// sums each Q4_0 block's 4 turns of byte products with relaxed SIMD's int8 dot product where the engine computes it
// (linearize.js dotReduce, wasm/emit.js emitDot4; Chromium here) and in 32-bit lanes elsewhere (Node 20; Q8_0's
// 8-bit second operand everywhere). Both against NumPy's float64 over exact int64 block sums (int8_dot.json), and
// the two paths bit for bit; the blocks' float16 scales convert in line (emit.js halfToFloat).
const test = require('node:test')
const assert = require('node:assert')
const fs = require('fs')
const os = require('os')
const path = require('path')
const { spawnSync } = require('child_process')
const { fixture, pageResult, pageFiles, instsOf, checkBlockSums } = require('./helpers')
const { Model } = require('..')
const { relaxedSimdSupported, relaxedDotSupported } = require('../src/wasm/module')
const { lowerKernel } = require('../src/compile')
const { KernelEmitter } = require('../src/wasm/emit')
const { Code, moduleBytes } = require('../src/wasm/encode')

const REF = JSON.parse(fs.readFileSync(path.join(__dirname, 'fixtures', 'int8_dot.json'), 'utf8'))

/** Each case's outputs on the plain path (no dot products, as an engine without them runs). */
function plainOutputs () {
  const m = Model.fromBytesSync(fixture('int8_dot.pgb'), { threads: 1, int8Dot: false })
  assert.strictEqual(m._x.dot, false)
  const out = REF.x.map((x) => { const r = m.forward({ x: Float32Array.from(x) }); return { y8: Array.from(r.y8), y4: Array.from(r.y4) } })
  m.dispose()
  return out
}

const checkReference = (outs, where) => checkBlockSums(REF, outs, where)

test('int8-route matvecs on the plain path match NumPy, and the Q4_0 nibbles stay in lanes', () => {
  checkReference(plainOutputs(), 'plain')
  const m = Model.fromBytesSync(fixture('int8_dot.pgb'), { threads: 1, int8Dot: false })
  m.forward({ x: Float32Array.from(REF.x[0]) })
  // the matvecs (an int32 reduce inside a float one): vectorized, the Q4_0 one's shift and mask of 8-bit lanes too
  const matvecs = [...m._x.lowered.values()].filter((p) => instsOf(p).some((x) => x.k === 'acc' && x.dtype.name === 'int32'))
  assert.strictEqual(matvecs.length, 2)
  for (const p of matvecs) assert.strictEqual(p.vectorized, true, `${p.name} fell back to scalar code`)
  m.dispose()
})

test('with dot products the Q4_0 block sums lower to dot4, the Q8_0 ones (8-bit second operand) do not', () => {
  const m = Model.fromBytesSync(fixture('int8_dot.pgb'), { threads: 1 })
  const prog = m._x.prog
  const shapes = []
  for (const ast of prog.kernels) {
    for (const dot of [false, true]) {
      const p = lowerKernel(prog.graph, ast, { width: 4, dot })
      const dots = instsOf(p).filter((x) => x.k === 'dot4')
      if (!dot) assert.strictEqual(dots.length, 0)
      if (dot && dots.length) {
        // Q4_0's 16 rows in tiles of 2, a block's 2 vectors of lanes unrolled (lower.js dotGroupUnroll): a dot4 per
        // row and vector (its -8 an offset), the activation's 16 bytes of a vector (one `bytes`, gathered) shared by
        // the tile's rows, one per row and vector for the nibbles (narrowed)
        const bytes = instsOf(p).filter((x) => x.k === 'bytes')
        shapes.push(`${dots.map((x) => x.offset).join(',')} bytes ${bytes.filter((x) => x.buf !== null).length}+${bytes.filter((x) => x.buf === null).length}`)
        assert.strictEqual(instsOf(p).some((x) => x.k === 'acc' && x.dtype.name === 'int32'), false, 'no int32 accumulator left')
        const layout = new Map(p.params.map((q, i) => [q.slot, { base: 1024 * (i + 1), size: 4096 }]))
        const stats = new KernelEmitter(p, layout, {}, {}).emit().stats
        // two dot instructions each: the nibbles', and the activation's sum (for the -8)
        assert.strictEqual(stats.int8Dots, 2 * dots.length, 'dot instructions emitted')
      }
    }
  }
  assert.deepStrictEqual(shapes, ['-8,-8,-8,-8 bytes 2+4'])
  m.dispose()
})

/**
 * Per innermost loop of a lowered kernel that reads `weights` (slots of uint8 blocks): the SIMD instructions its
 * body emits per weight byte it reads (each load address once, at its widest): how much work a weight byte costs
 * in the decode matvec's block loop, counted in the emitted code, not timed.
 */
function simdPerWeightByte (p, weights) {
  const depthOf = new Map()
  const innermost = []
  const walk = (insts, depth) => {
    for (const x of insts) {
      if (x.k === 'loop') {
        depthOf.set(x.body, x)
        if (!instsOf({ head: [], body: x.body }).some((y) => y.k === 'loop')) innermost.push(x)
        walk(x.pre, depth)
        walk(x.body, depth + 1)
      }
      if (x.k === 'if') walk(x.body, depth)
    }
  }
  walk(p.head, 0)
  walk(p.body, 0)
  const counts = new Map()
  let current = null
  const layout = new Map(p.params.map((q, i) => [q.slot, { base: 1024 * (i + 1), size: 4096 }]))
  const e = new KernelEmitter(p, layout, {}, {})
  const block = e.block.bind(e)
  e.block = (insts) => {
    const loop = depthOf.get(insts)
    const outer = current
    if (loop) current = loop
    try { block(insts) } finally { current = outer }
  }
  const simd = e.c.simd.bind(e.c)
  e.c.simd = (code) => { if (current) counts.set(current, (counts.get(current) || 0) + 1); return simd(code) }
  e.emit()
  const width = { load: (x) => x.lanes * x.dtype.size, bytes: () => 16, raw16: () => 16, rowbytes: () => 16 }
  const out = []
  for (const loop of innermost) {
    const reads = new Map()
    for (const x of instsOf({ head: [], body: loop.body })) {
      if (!width[x.k] || !weights.has(x.buf) || (x.k === 'bytes' && x.buf === null)) continue
      const key = `${x.k === 'load' ? x.idx.id : x.src[0].id}|${x.k === 'raw16' ? x.off : ''}`
      reads.set(key, Math.max(reads.get(key) || 0, width[x.k](x)))
    }
    const bytes = [...reads.values()].reduce((a, b) => a + b, 0)
    if (bytes) out.push(counts.get(loop) / bytes)
  }
  return out
}

test('without relaxed SIMD both matvecs sum a block with standard SIMD\'s 16-bit dot product: fewer instructions a byte, the plain path\'s bits', () => {
  const m = Model.fromBytesSync(fixture('int8_dot.pgb'), { threads: 1 })
  assert.strictEqual(m._x.dotLanes, true, 'the standard-SIMD dot wherever the relaxed one does not apply')
  const prog = m._x.prog
  const weights = new Set()
  const seen = []
  for (const c of m._p.entries.forward.calls) {
    if (c.copy) continue
    const ast = prog.kernels[c.kernel]
    const slots = new Set(c.args.map((a, j) => (a && a.dtype.name === 'uint8' && (a.role === 'parameter' || a.role === 'state') ? j : -1)).filter((j) => j >= 0))
    const plain = lowerKernel(prog.graph, ast, { width: 4, dot: false })
    if (!instsOf(plain).some((x) => x.k === 'acc' && x.dtype.name === 'int32')) continue
    for (const j of slots) weights.add(j)
    const p = lowerKernel(prog.graph, ast, { width: 4, dotLanes: true })
    const dots = instsOf(p).filter((x) => x.k === 'dot4')
    // a dot4 per row of the tile (Q4_0's 16 rows: 2, lower.js; Q8_0's 13: 1) and vector of lanes, each on two pair
    // vectors of each operand (unpack)
    const rows = dots.length / 2
    assert.ok(rows === 1 || rows === 2, `${p.name}: ${dots.length} dot4s`)
    assert.ok(dots.every((x) => x.wide), 'each operand a block of 8 lanes x 4 turns, read with 16-byte loads')
    assert.strictEqual(instsOf(p).some((x) => x.k === 'acc' && x.dtype.name === 'int32'), false, 'no int32 accumulator left')
    const q4 = instsOf(p).some((x) => x.k === 'byteops')
    // the block loop: Q8_0 (34 bytes a block) reads its 32 quant bytes a row with two 16-byte loads, Q4_0 (18) its
    // 16 nibble bytes with one; the activation's two loads serve the tile's 4 rows
    assert.strictEqual(instsOf(p).filter((x) => x.k === 'raw16').length, rows * (q4 ? 1 : 2) + 2, `${p.name}: 16-byte loads`)
    // each row's block scale (float16) read as one 16-bit load, not two bytes put together (emit.js halfBits)
    const layout = new Map(p.params.map((q, i) => [q.slot, { base: 1024 * (i + 1), size: 4096 }]))
    assert.strictEqual(new KernelEmitter(p, layout, {}, {}).emit().stats.halfLoads, rows, `${p.name}: 16-bit scale loads`)
    const per = simdPerWeightByte(p, slots)
    const before = simdPerWeightByte(plain, slots)
    assert.strictEqual(per.length, 1, 'one innermost loop: the blocks\' (no loop over a block\'s turns)')
    // measured: Q8_0 0.68 (plain path 2.0: a turn's 4 bytes of each operand widened to 32 bits, multiplied,
    // added), Q4_0 1.69 (plain 2.75)
    assert.ok(per[0] <= (q4 ? 2 : 1), `${p.name}: ${per[0]} SIMD instructions a weight byte (plain path ${before})`)
    seen.push(q4 ? 'Q4_0' : 'Q8_0')
  }
  assert.deepStrictEqual(seen.sort(), ['Q4_0', 'Q8_0'])
  const plain = plainOutputs()
  const run = (threads) => {
    const mm = Model.fromBytesSync(fixture('int8_dot.pgb'), { threads })
    mm._x.minWork = 0 // on two threads every kernel splits (phases)
    const out = REF.x.map((x) => { const r = mm.forward({ x: Float32Array.from(x) }); return { y8: Array.from(r.y8), y4: Array.from(r.y4) } })
    mm.dispose()
    return out
  }
  const one = run(1)
  checkReference(one, 'standard dot')
  assert.deepStrictEqual(one, plain, 'the plain path\'s bits (exact int32 block sums, the float sums in its order)')
  if (os.cpus().length >= 2) assert.deepStrictEqual(run(2), plain, 'on two threads too')
  m.dispose()
})

test('no 16-bit dot product takes two extends: one operand widened by an interleave and a shift, the columns\' shared one', () => {
  // V8 in Chromium (not Node 20's) rewrites i32x4.dot_i16x8_s of two i16x8.extend_*_i8x16 as a 16-bit multiply and
  // a pairwise add: in GPT-2 small's Q4_0 decode block loop 148 x86 instructions against 128 (emit.js widen16)
  const m = Model.fromBytesSync(fixture('int8_dot.pgb'), { threads: 1 })
  const prog = m._x.prog
  const seen = []
  for (const ast of prog.kernels) {
    const p = lowerKernel(prog.graph, ast, { width: 4, dotLanes: true })
    const dots = instsOf(p).filter((x) => x.k === 'dot4' && x.wide)
    if (!dots.length) continue
    const byId = new Map(instsOf(p).map((x) => [x.id, x]))
    for (const d of dots) {
      const [a0, a1, b0, b1] = d.src.map((x) => byId.get(x.id))
      for (const [a, b] of [[a0, b0], [a1, b1]]) {
        assert.ok(a.k === 'widen' && b.k === 'widen')
        assert.strictEqual(Boolean(a.spread) + Boolean(b.spread), 1, `${p.name}: one operand of each 16-bit dot spread`)
      }
    }
    // the spread operand is the one the tile's rows share: one spread pair a vector of lanes, not one a dot4
    const spread = new Set(dots.flatMap((d) => d.src.map((x) => byId.get(x.id)).filter((x) => x.spread).map((x) => x.id)))
    assert.strictEqual(spread.size, 4, `${p.name}: the activations' 2 pair vectors x 2 halves`)
    // and in the emitted code: extends at most one a 16-bit dot
    const layout = new Map(p.params.map((q, i) => [q.slot, { base: 1024 * (i + 1), size: 4096 }]))
    const e = new KernelEmitter(p, layout, {}, {})
    let dots16 = 0
    const simd = e.c.simd.bind(e.c)
    e.c.simd = (code) => { if (code === 0xba) dots16++; return simd(code) }
    const stats = e.emit().stats
    assert.ok(stats.spreads === 4 && stats.extends <= dots16, `${p.name}: ${stats.extends} extends, ${stats.spreads} spreads, ${dots16} dots`)
    seen.push(dots.length)
  }
  assert.deepStrictEqual(seen.sort(), [2, 4], 'both matvecs (Q8_0: 1 row a tile, Q4_0: 2)')
  m.dispose()
})

test('the Q4_0 nibbles\' mask and offset are locals set before the loops, not constants built in the block loop', () => {
  // V8 builds a v128.const again at each use inside a loop (3 x86 instructions); a splat it cannot see is constant
  // stays in a register (emit.js byteSplat): GPT-2 small's Q4_0 decode block loop 222 -> 204 x86 instructions
  // (Chromium, 4 columns), 126 -> 120 (Node 20, 2)
  const m = Model.fromBytesSync(fixture('int8_dot.pgb'), { threads: 1 })
  const prog = m._x.prog
  let checked = 0
  for (const ast of prog.kernels) {
    const p = lowerKernel(prog.graph, ast, { width: 4, dotLanes: true })
    if (!instsOf(p).some((x) => x.k === 'byteops')) continue
    const loops = new Set()
    const walk = (xs) => { for (const x of xs) { if (x.k === 'loop') { loops.add(x.body); walk(x.body) } if (x.k === 'if') walk(x.body) } }
    walk(p.head)
    walk(p.body)
    const layout = new Map(p.params.map((q, i) => [q.slot, { base: 1024 * (i + 1), size: 4096 }]))
    const e = new KernelEmitter(p, layout, {}, {})
    let depth = 0
    let inLoops = 0
    const block = e.block.bind(e)
    e.block = (insts) => {
      const loop = loops.has(insts)
      if (loop) depth++
      try { block(insts) } finally { if (loop) depth-- }
    }
    const konst = e.c.v128const.bind(e.c)
    e.c.v128const = (bytes) => { if (depth > 0) inLoops++; return konst(bytes) }
    const f = e.emit()
    assert.strictEqual(inLoops, 0, `${p.name}: v128.const in a loop`)
    // the mask 15 (low nibble; 255 >> 4 after the high one's 16-bit shift) and -8
    assert.strictEqual(f.stats.byteSplats, 2, `${p.name}: byte splats`)
    // and the function still computes the plain path's bits (the standard-SIMD test above runs it)
    checked++
  }
  assert.strictEqual(checked, 1, 'the Q4_0 matvec')
  m.dispose()
})

/**
 * Each int8-route matvec of `m` lowered with its block's second vector of lanes left a loop (no dotGroupUnroll),
 * so each dot4 gathers its own bytes (linearize.js dotBytes), with `dotOpts` (the standard-SIMD dot4:
 * {dotLanes: true}; relaxed SIMD's: {dot: true}) and without (the plain loop), run on the same random bytes
 * in every buffer: {checked, dots, relaxed, same} (same: the two wrote the same bytes everywhere). Runs in Node
 * and, as its source, in a page (`L` the lowering's stages: index.js _internals.lowering).
 */
function gatheredDots (m, L, dotOpts) {
  const prog = m._x.prog
  const out = { checked: 0, dots: 0, relaxed: 0, same: [] }
  for (const c of m._p.entries.forward.calls) {
    if (c.copy) continue
    const ast = prog.kernels[c.kernel]
    const prepared = L.prepareKernel(prog.graph, ast)
    const all = L.chooseOpts(prepared.ast, 4)
    const opts = all.filter((o) => o.kind !== 'UNROLL' || o.range.arg[1] !== 'reduce' || o.amount !== 2 ||
      !all.some((q) => q.kind === 'SPLIT_REDUCE' && q.range === o.range))
    const lanes = L.lowerKernel(prog.graph, ast, { width: 4, prepared, opts, ...dotOpts })
    const walk = (xs, f) => { for (const x of xs) { f(x); if (x.pre) walk(x.pre, f); if (x.body) walk(x.body, f) } }
    const dots = []
    walk([...lanes.head, ...lanes.body], (x) => { if (x.k === 'dot4') dots.push(x) })
    if (!dots.length) continue
    out.dots += dots.length
    out.relaxed += dots.filter((x) => !x.signs).length
    if (dots.some((x) => x.wide)) throw new Error('a dot4 read whole vectors: the gathered form was not taken')
    const plain = L.lowerKernel(prog.graph, ast, { width: 4, prepared, opts })
    // every buffer of the call filled with the same random bytes (float buffers with finite floats) for both
    const layout = new Map()
    let at = 64
    c.args.forEach((a, j) => {
      if (!a) return
      layout.set(j, { base: at, size: a.size, d: a.dtype })
      at += Math.ceil((a.size * a.dtype.size + 16) / 64) * 64
    })
    const fill = (mem) => {
      let seed = 12345
      const rnd = () => { seed = (seed * 1103515245 + 12345) >>> 0; return seed >>> 8 }
      for (const [, L] of layout) {
        if (L.d.isFloat) new Float32Array(mem.buffer, L.base, L.size).forEach((_, i, v) => { v[i] = (rnd() % 2001 - 1000) / 997 })
        else new Uint8Array(mem.buffer, L.base, L.size * L.d.size).forEach((_, i, v) => { v[i] = rnd() & 255 })
      }
    }
    const run = (p) => {
      const memory = new WebAssembly.Memory({ initial: Math.ceil(at / 65536) + 1 })
      fill(memory)
      new WebAssembly.Instance(new WebAssembly.Module(L.buildModule([{ prog: p, layout }], memory.buffer.byteLength / 65536)), L.importObject(memory)).exports.k0()
      return new Uint8Array(memory.buffer, 0, at).slice()
    }
    const [a, b] = [run(lanes), run(plain)]
    out.same.push(a.length === b.length && a.every((v, i) => v === b[i]))
    out.checked++
  }
  return out
}

test('the standard-SIMD dot4 on gathered bytes (no second vector of lanes to pair with) gives the plain loop\'s bits', () => {
  const m = Model.fromBytesSync(fixture('int8_dot.pgb'), { threads: 1 })
  const L = { ...require('../src/lower'), ...require('../src/compile'), ...require('../src/wasm/module') }
  const r = gatheredDots(m, L, { dotLanes: true })
  m.dispose()
  assert.strictEqual(r.checked, 2, 'both matvecs (Q8_0 and Q4_0)')
  assert.strictEqual(r.relaxed, 0)
  assert.deepStrictEqual(r.same, [true, true], 'the same bytes everywhere')
})

const GATHERED_PAGE = `<!doctype html><meta charset="utf-8"><script type="module">
import api from '/dist/polygrad.browser.mjs'
${gatheredDots.toString()}
try {
  const m = await api.Model.fromBytes(new Uint8Array(await (await fetch('/int8_dot.pgb')).arrayBuffer()), { threads: 1 })
  const L = api._internals.lowering
  window.__result = { supported: L.relaxedDotSupported(), ...gatheredDots(m, L, { dot: true }) }
  m.dispose()
} catch (e) {
  window.__result = { error: String(e && e.stack || e) }
}
</script>`

test('in Chromium relaxed SIMD\'s dot4 on gathered bytes (the fallback where the pair form does not apply) gives the plain loop\'s bits', { skip: pageResult.skip, timeout: 120000 }, async () => {
  const r = await pageResult(pageFiles(GATHERED_PAGE, { '/int8_dot.pgb': ['application/octet-stream', fixture('int8_dot.pgb')] }))
  assert.ok(!r.error, r.error)
  assert.strictEqual(r.supported, true, 'Chromium computes relaxed SIMD\'s int8 dot product')
  // Q4_0's nibbles (7-bit, their -8 an offset: a second dot with ones) take it; Q8_0's 8-bit weights stay plain
  assert.strictEqual(r.checked, 1, 'the Q4_0 matvec')
  assert.ok(r.relaxed > 0 && r.relaxed === r.dots, `${r.relaxed} of ${r.dots} dot4s relaxed`)
  assert.deepStrictEqual(r.same, [true], 'the same bytes everywhere')
})

test('relaxedDotSupported holds exactly where the instruction computes the standard result', (t) => {
  if (relaxedSimdSupported() || process.execArgv.includes('--experimental-wasm-relaxed-simd')) {
    // run the instruction on every extreme pair (a in [-128, 127], b in [0, 127]) and an addend
    const body = new Code()
    body.i32(48).i32(0).vmem(0x00, 0, 0).i32(0).vmem(0x00, 0, 16).i32(0).vmem(0x00, 0, 32).simd(0x113).vmem(0x0b, 0, 0)
    const bytes = moduleBytes({ types: [{ params: [], results: [] }], imports: [{ module: 'env', name: 'memory', kind: 'memory', min: 1 }], funcs: [{ type: 0, locals: [], body }], exports: [{ name: 'f', func: 0 }] })
    let right = false
    if (WebAssembly.validate(bytes)) {
      const memory = new WebAssembly.Memory({ initial: 1 })
      const f = new WebAssembly.Instance(new WebAssembly.Module(bytes), { env: { memory } }).exports.f
      const i8 = new Int8Array(memory.buffer)
      const i32 = new Int32Array(memory.buffer)
      right = true
      for (const [a, b] of [[-128, 127], [127, 127], [-128, 0], [-77, 93]]) {
        i8.fill(a, 0, 16)
        i8.fill(b, 16, 32)
        i32.set([1, -2, 3, -4], 8)
        f()
        right = right && [1, -2, 3, -4].every((c, j) => i32[12 + j] === c + 4 * a * b)
      }
    }
    assert.strictEqual(relaxedDotSupported(), right)
    return
  }
  assert.strictEqual(relaxedDotSupported(), false, 'no relaxed SIMD, no dot product')
  // Node 20 has relaxed SIMD behind a flag, whose draft dot product computes another result: this test again there
  const env = Object.assign({}, process.env)
  delete env.NODE_TEST_CONTEXT // the child reports as a test run of its own
  const r = spawnSync(process.execPath, ['--experimental-wasm-relaxed-simd', '--test', '--test-name-pattern', 'relaxedDotSupported', __filename], { encoding: 'utf8', env })
  if (r.status !== 0 && /bad option|not allowed/.test(r.stderr)) return t.skip('this Node has no relaxed-SIMD flag')
  assert.strictEqual(r.status, 0, r.stdout + r.stderr)
  assert.match(r.stdout, /^ok \d+ - relaxedDotSupported[^#\n]*$/m, 'it ran in the child, not skipped')
})

const PAGE = `<!doctype html><meta charset="utf-8"><script type="module">
import { Model } from '/dist/polygrad.browser.mjs'
const instsOf = ${instsOf.toString()}
try {
  const ref = await (await fetch('/ref.json')).json()
  const bytes = new Uint8Array(await (await fetch('/int8_dot.pgb')).arrayBuffer())
  // fma off: the float sum over blocks rounds as Node's (no relaxed multiply-add), so the bits compare
  const withFma = await Model.fromBytes(bytes, { threads: 1 })
  const fma = ref.x.map((x) => { const r = withFma.forward({ x: Float32Array.from(x) }); return { y8: Array.from(r.y8), y4: Array.from(r.y4) } })
  withFma.dispose()
  // the plain path in this engine (the same tiles as the dot path: runtime.js dotCols is the engine's, so the
  // float sums run in the same order; Node's 2-column tiles add them in another)
  const plainM = await Model.fromBytes(bytes, { threads: 1, fma: false, int8Dot: false })
  const plain = ref.x.map((x) => { const r = plainM.forward({ x: Float32Array.from(x) }); return { y8: Array.from(r.y8), y4: Array.from(r.y4) } })
  const plainDot = plainM._x.dot || plainM._x.dotLanes
  plainM.dispose()
  const m = await Model.fromBytes(bytes, { threads: 2, fma: false })
  const sync = []
  const threaded = []
  for (const x of ref.x) {
    const r = m.forward({ x: Float32Array.from(x) })
    sync.push({ y8: Array.from(r.y8), y4: Array.from(r.y4) })
  }
  m._x.minWork = 0 // every kernel shared with the worker (phases)
  for (const x of ref.x) {
    const r = await m.callAsync('forward', { x: Float32Array.from(x) })
    threaded.push({ y8: Array.from(r.y8), y4: Array.from(r.y4) })
  }
  let dots = 0
  let relaxedDots = 0
  let phaseDots = 0
  for (const p of m._x.lowered.values()) {
    dots += instsOf(p).filter((x) => x.k === 'dot4').length
    relaxedDots += instsOf(p).filter((x) => x.k === 'dot4' && !x.signs).length
    for (const ph of p.phases || []) phaseDots += instsOf(ph).filter((x) => x.k === 'dot4').length
  }
  window.__result = { fma, plain, plainDot, dotCols: m._x.dotCols, dot: m._x.dot, threads: m.backendInfo.threads, calls: m._x.pool ? m._x.pool.calls : 0, sync, threaded, dots, relaxedDots, phaseDots }
  m.dispose()
} catch (e) {
  window.__result = { error: String(e && e.stack || e) }
}
</script>`

test('in Chromium the dot-product path gives the plain path\'s bits, on one thread and on two', { skip: pageResult.skip || (os.cpus().length < 2 && 'one core'), timeout: 120000 }, async () => {
  const r = await pageResult(pageFiles(PAGE, {
    '/int8_dot.pgb': ['application/octet-stream', fixture('int8_dot.pgb')],
    '/ref.json': ['application/json', JSON.stringify(REF)]
  }))
  assert.ok(!r.error, r.error)
  assert.strictEqual(r.dot, true, 'Chromium computes relaxed SIMD\'s int8 dot product')
  // both matvecs sum their blocks with the standard dot4's pair form (Q4_0: a tile of 4 rows where the engine has
  // relaxed SIMD, runtime.js dotCols; Q8_0's 13: 1; 2 vectors of lanes), which goes before relaxed SIMD's gathered
  // one where it applies (linearize.js dotReduce)
  assert.strictEqual(r.dots, 8 + 2, 'dot4s')
  assert.strictEqual(r.relaxedDots, 0, 'relaxed dot4s')
  assert.strictEqual(r.phaseDots, 8 + 2, 'so do its threaded phases')
  assert.strictEqual(r.threads, 2)
  assert.ok(r.calls > 0, 'the worker ran slices')
  assert.strictEqual(r.dotCols, 4, 'relaxed SIMD: 4 columns a tile')
  assert.strictEqual(r.plainDot, false, 'int8Dot: false takes the plain path')
  checkReference(r.plain, 'Chromium, plain path')
  checkReference(r.sync, 'Chromium')
  checkReference(r.fma, 'Chromium, fma on')
  assert.deepStrictEqual(r.sync, r.plain, 'dot products: the plain path\'s bits')
  assert.deepStrictEqual(r.threaded, r.plain, 'threaded: the same bits')
})

test('float16 scales convert in line, bit for bit the h2f helper, every one of the 65536 patterns', () => {
  const { T } = require('../src/wasm/encode')
  const { helperFuncs } = require('../src/wasm/helpers')
  const e = Object.create(KernelEmitter.prototype)
  Object.assign(e, { c: new Code(), params: [T.i32], locals: [], free: new Map(), scratch: [] })
  e.c.get(0)
  e.halfToFloat()
  e.c.op(0xbc) // i32.reinterpret_f32: NaN payloads compared too
  const h2f = helperFuncs(0).funcs[0]
  const wrap = new Code().get(0).byte(0x10).u32(0).op(0xbc)
  const bytes = moduleBytes({
    types: [{ params: [T.i32], results: [T.f32] }, { params: [T.i32], results: [T.i32] }],
    imports: [],
    funcs: [{ type: 0, locals: h2f.locals, body: h2f.body }, { type: 1, locals: [], body: wrap }, { type: 1, locals: e.locals, body: e.c }],
    exports: [{ name: 'helper', func: 1 }, { name: 'inline', func: 2 }]
  })
  const f = new WebAssembly.Instance(new WebAssembly.Module(bytes)).exports
  const f32 = new Float32Array(1)
  const u32 = new Uint32Array(f32.buffer)
  for (let h = 0; h < 65536; h++) {
    assert.strictEqual(f.inline(h), f.helper(h), `0x${h.toString(16)}`)
    // and the value float16 stands for (sign, exponent 0: subnormal, 31: inf or NaN)
    const e5 = (h >> 10) & 31
    const m = h & 1023
    const v = (h >> 15 ? -1 : 1) * (e5 === 0 ? m * 2 ** -24 : e5 === 31 ? (m ? NaN : Infinity) : (1 + m / 1024) * 2 ** (e5 - 15))
    u32[0] = f.inline(h)
    assert.ok(Object.is(f32[0], v) || (Number.isNaN(v) && Number.isNaN(f32[0])), `0x${h.toString(16)}: ${f32[0]} vs ${v}`)
  }
})
