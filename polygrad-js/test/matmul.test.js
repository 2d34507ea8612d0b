'use strict'
// Matrix products through the wasm lowering (issues 31 and 34): x @ W (GPT-2's Conv1D layout) and x @ W.T
// (Linear's, GPT-2's tied head), their rows a Variable as in a prompt. Every variant the runtime may run (the
// full tile, the few-rows tile, each reading the weight directly or through its packed copy) at sizes the
// tiles do not divide, against a float64 reference within float32 rounding; and the tile shapes of GPT-2's
// prompt matmuls (loop order, accumulators, loads per step), so a change that loses them fails here. With
// relaxed SIMD (Node 22+; Node 20 behind a flag, run in a child process) the same checks hold with every
// reduction step a relaxed multiply-add.
const test = require('node:test')
const assert = require('node:assert')
const { spawnSync } = require('child_process')
const { Graph } = require('../src/ir')
const { DTYPES } = require('../src/dtypes')
const { chooseOpts, fewRowsOpts } = require('../src/lower')
const { lowerKernel, prepareKernel } = require('../src/compile')
const { buildModule, importObject, relaxedSimdSupported } = require('../src/wasm/module')
const { KernelEmitter } = require('../src/wasm/emit')
const { repack } = require('../src/pack')

const f32 = DTYPES.float32
const i32 = DTYPES.int32

/** out[m, n] = sum_k X[m, k] * W[k, n] (or W[n, k] with `trans`), m < tokens (a Variable up to `rows`); rows 0:
 * one row, no m range (a decode step's kernel, its row range folded away). */
function matmul (rows, K, N, trans, constant = false) {
  const g = new Graph()
  const c = (v) => g.const(i32, v)
  const buf = (slot, n) => g.node('DEFINE_GLOBAL', f32, [], [slot, [n]])
  const tokens = constant ? c(rows) : g.node('DEFINE_VAR', i32, [], ['tokens', 1, rows])
  const m = rows ? g.node('RANGE', i32, [tokens], [0, 'global']) : c(0)
  const n = g.node('RANGE', i32, [c(N)], [1, 'global'])
  const k = g.node('RANGE', i32, [c(K)], [2, 'reduce'])
  const R = Math.max(rows, 1)
  const x = g.node('LOAD', f32, [g.node('INDEX', f32, [buf(1, R * K), g.alu('ADD', g.alu('MUL', m, c(K)), k)])])
  const wi = trans ? g.alu('ADD', g.alu('MUL', n, c(K)), k) : g.alu('ADD', g.alu('MUL', k, c(N)), n)
  const w = g.node('LOAD', f32, [g.node('INDEX', f32, [buf(2, K * N), wi])])
  const sum = g.node('REDUCE', f32, [g.alu('MUL', x, w), k], 'ADD')
  const st = g.node('STORE', null, [g.node('INDEX', f32, [buf(0, R * N), g.alu('ADD', g.alu('MUL', m, c(N)), n)]), sum])
  return { g, ast: g.node('SINK', null, [g.node('END', null, rows ? [st, m, n] : [st, n])]) }
}

/** The variants the runtime builds for one kernel (runtime.js lower, packedFor): [name, program]. */
function variants (rows, K, N, trans, constant = false) {
  const { g, ast } = matmul(rows, K, N, trans, constant)
  const prepared = prepareKernel(g, ast)
  const opts = chooseOpts(prepared.ast, 4)
  const lower = (o, pack, main) => lowerKernel(g, ast, { width: 4, prepared, opts: o, verify: true, pack: pack ? (i) => (i === 2 ? K * N : 0) : null, packMain: main })
  const out = [['tile', lower(opts, false, false)], ['tile, packed', lower(opts, true, true)]]
  const rowTile = opts.filter((o) => o.kind === 'UPCAST' && o.range.src[0].op === 'DEFINE_VAR')
  if (rowTile.length === 1) {
    const few = fewRowsOpts(opts, rowTile[0])
    out.push(['few rows', lower(few, false, false)], ['few rows, packed', lower(few, true, false)])
  }
  return { opts, variants: out }
}

let seed = 12345
const rand = () => {
  seed = (seed * 1103515245 + 12345) % 2147483648
  return seed / 1073741824 - 1
}

/** Run `prog` on random X and W with `tokens` rows (rows 0: one row, no row range); returns the largest error
 * relative to its bound, and the output. */
function check (prog, rows, K, N, trans, tokens, fma) {
  rows = Math.max(rows, 1)
  const sizes = [rows * N, rows * K, K * N]
  const layout = new Map()
  let pos = 64
  const place = (slot, n) => {
    layout.set(slot, { base: pos, size: n })
    pos += Math.ceil(n * 4 / 64) * 64 + 64
  }
  sizes.forEach((n, i) => place(i, n))
  for (const pk of prog.packs) place(pk.slot, pk.size)
  const pages = Math.ceil(pos / 65536) + 1
  const memory = new WebAssembly.Memory({ initial: pages })
  const inst = new WebAssembly.Instance(new WebAssembly.Module(buildModule([{ prog, layout }], pages, undefined, { fma })), importObject(memory))
  const view = new Float32Array(memory.buffer)
  const X = Float32Array.from({ length: rows * K }, rand)
  const W = Float32Array.from({ length: K * N }, rand)
  view.set(X, layout.get(1).base / 4)
  view.set(W, layout.get(2).base / 4)
  view.fill(NaN, layout.get(0).base / 4, layout.get(0).base / 4 + rows * N)
  for (const pk of prog.packs) repack(view, layout.get(2).base / 4, layout.get(pk.slot).base / 4, pk)
  inst.exports.k0(...prog.vars.map(() => tokens))
  const out = view.subarray(layout.get(0).base / 4)
  // |float32 sum - exact| <= (K + 1) u sum |x w| (u = 2^-24: each product and each addition rounded once; a
  // fused step rounds less), so a wrong or missing term shows as an error far above 1
  let worst = 0
  for (let i = 0; i < rows * N; i++) {
    const [m, n] = [Math.floor(i / N), i % N]
    if (m >= tokens) {
      assert.ok(Number.isNaN(out[i]), `row ${m} >= tokens ${tokens} was written`)
      continue
    }
    let exact = 0
    let mag = 0
    for (let k = 0; k < K; k++) {
      const p = X[m * K + k] * (trans ? W[n * K + k] : W[k * N + n])
      exact += p
      mag += Math.abs(p)
    }
    worst = Math.max(worst, Math.abs(out[i] - exact) / ((K + 1) * 2 ** -24 * mag + 1e-30))
  }
  check.out = out.slice(0, rows * N)
  return worst
}

// [K, N]: odd sizes (no lanes), reductions the lanes divide with odd columns (x @ W.T's clamped column tile),
// and columns the lanes divide with odd reductions (x @ W's tile)
const SHAPES = [[1, 1], [3, 17], [17, 33], [33, 3], [36, 17], [36, 33], [4, 1], [17, 24], [33, 8], [3, 16]]
const ROWS = 36 // the Variable's bound: 1, 3, 17 and 33 rows leave a partial row tile

function checkAll (fma) {
  let fused = 0
  for (const trans of [false, true]) {
    for (const [K, N] of SHAPES) {
      for (const [name, prog] of variants(ROWS, K, N, trans).variants) {
        const layout = new Map([0, 1, 2, ...prog.packs.map((pk) => pk.slot)].map((s) => [s, { base: 0, size: ROWS * 64 }]))
        fused += new KernelEmitter(prog, layout, {}, {}, { fma }).emit().stats.fusedMadds
        for (const tokens of [1, 3, 17, 33]) {
          const worst = check(prog, ROWS, K, N, trans, tokens, fma)
          assert.ok(worst <= 1, `x @ W${trans ? '.T' : ''} K=${K} N=${N} rows=${tokens} (${name}${fma ? ', fma' : ''}): error ${worst.toFixed(2)} x its float32 bound`)
        }
      }
    }
  }
  // constant row counts the row tile does not divide (its last tile moved back to overlap: lower.rowTile)
  const tiled = { false: [[7, 36, 8], [33, 17, 24], [5, 8, 16]], true: [[7, 36, 8], [7, 36, 33], [5, 8, 16], [33, 36, 24]] }
  for (const trans of [false, true]) {
    for (const [rows, K, N] of tiled[trans]) {
      const { opts, variants: vs } = variants(rows, K, N, trans, true)
      assert.ok(opts.some((o) => o.clamp && o.range.arg[0] === 0), `rows ${rows}: a clamped row tile`)
      for (const [name, prog] of vs) {
        const worst = check(prog, rows, K, N, trans, rows, fma)
        assert.ok(worst <= 1, `x @ W${trans ? '.T' : ''} rows=${rows} K=${K} N=${N} (${name}${fma ? ', fma' : ''}): error ${worst.toFixed(2)} x its float32 bound`)
      }
    }
  }
  assert.ok(fma ? fused > 0 : fused === 0, `${fused} multiply-adds fused`)
}

test('matmul: every variant at sizes the tiles do not divide matches float64 within float32 rounding', () => {
  checkAll(false)
})

test('matmul with relaxed-SIMD multiply-adds matches float64 within float32 rounding', (t) => {
  if (relaxedSimdSupported()) return checkAll(true)
  if (process.execArgv.includes('--experimental-wasm-relaxed-simd')) return t.skip('no relaxed SIMD even with the flag')
  // Node 20 has relaxed SIMD only behind a flag: this file again in a child with it
  const env = Object.assign({}, process.env)
  delete env.NODE_TEST_CONTEXT // the child reports in plain text, not to this runner
  const r = spawnSync(process.execPath, ['--experimental-wasm-relaxed-simd', '--test', '--test-name-pattern', 'relaxed-SIMD|fma load option', __filename], { encoding: 'utf8', env })
  if (r.status !== 0 && /bad option|not allowed/.test(r.stderr)) return t.skip('this Node has no relaxed-SIMD flag')
  assert.strictEqual(r.status, 0, r.stdout + r.stderr)
  assert.match(r.stdout, /^ok \d+ - matmul with relaxed-SIMD[^#\n]*$/m, 'it ran in the child, not skipped')
  assert.match(r.stdout, /^ok \d+ - the fma load option[^#\n]*$/m, 'fma: false turns relaxed SIMD off')
})

/** The innermost loop of a program body. */
function innerLoop (body) {
  let loop = null
  const walk = (insts) => {
    for (const x of insts) {
      if (x.k === 'loop') {
        loop = x
        walk(x.body)
      }
    }
  }
  walk(body)
  return loop
}

const summary = (opts) => opts.map((o) => `${o.kind}:${o.range.arg[0]}:${o.amount}`)

test('GPT-2 prompt x @ W: 2 rows x 16 columns of accumulators, groups of column panels outermost, 6 loads per step', () => {
  // fc1 (768 -> 3072); its rows are the Variable tokens (range 0), its columns range 1
  const { opts, variants: [[, tile]] } = variants(128, 768, 3072, false)
  assert.deepStrictEqual(summary(opts), ['VECTOR:1:4', 'UPCAST:1:4', 'UPCAST:0:2', 'PANELS:1:8', 'OUTER:1:1'])
  // loops: 24 groups of 8 column panels (16 columns each; the weight is read once per call), the row tiles, the
  // group's panels (a row tile's 2 rows stay in L1 across them), the reduction
  const loops = []
  for (let body = tile.body, loop; (loop = body.find((x) => x.k === 'loop')); body = loop.body) loops.push(loop.end.k === 'const' ? Number(loop.end.value) : 'rows')
  assert.deepStrictEqual(loops, [3072 / 16 / 8, 'rows', 8, 768])
  const step = innerLoop(tile.body).body
  const lanes4 = (k) => step.filter((x) => x.k === k && x.lanes === 4).length
  assert.strictEqual(lanes4('update'), 8, 'accumulators updated per step')
  assert.strictEqual(lanes4('load'), 4, 'four weight vectors per step')
  assert.strictEqual(lanes4('bcast'), 2, 'two broadcast row values per step')
  const layout = new Map([[0, { base: 0, size: 128 * 3072 }], [1, { base: 0, size: 128 * 768 }], [2, { base: 0, size: 768 * 3072 }]])
  assert.strictEqual(new KernelEmitter(tile, layout, {}, {}).emit().stats.fusedMadds, 0)
  assert.strictEqual(new KernelEmitter(tile, layout, {}, {}, { fma: true }).emit().stats.fusedMadds, 8, 'one multiply-add per accumulator per step')
})

test('x @ W over rows, 2 x 4 tiles in groups of column panels, at odd sizes: within float32 rounding of float64, bits of the 4 x 2 tile', () => {
  // [K, N]: N / 16 column panels of 2 x 4 vectors (4, 6, 10: groups of 2, 3, 5), odd reductions
  for (const [K, N] of [[33, 64], [17, 96], [5, 160], [36, 64]]) {
    for (const [rows, constant, counts] of [[36, false, [1, 2, 3, 17, 36]], [7, true, [7]], [5, true, [5]]]) {
      const { opts, variants: vs } = variants(rows, K, N, false, constant)
      const group = opts.find((o) => o.kind === 'PANELS')
      assert.ok(group && group.amount > 1, `K=${K} N=${N}: a group of column panels`)
      assert.ok(opts.some((o) => o.kind === 'UPCAST' && o.range.arg[0] === 1 && o.amount === 4), 'four column vectors')
      // the tile before: 4 rows x 2 column vectors, no groups (every output the same sum in the same order)
      const { g, ast } = matmul(rows, K, N, false, constant)
      const prepared = prepareKernel(g, ast)
      const before = opts.filter((o) => o.kind !== 'PANELS').map((o) => (o.kind === 'UPCAST' ? Object.assign({}, o, { amount: o.range.arg[0] === 1 ? 2 : 4 }) : o))
      const old = lowerKernel(g, ast, { width: 4, prepared, opts: before, verify: true })
      for (const tokens of counts) {
        const s0 = seed
        check(old, rows, K, N, false, tokens, false)
        const want = check.out
        for (const [name, prog] of vs) {
          seed = s0
          const worst = check(prog, rows, K, N, false, tokens, false)
          assert.ok(worst <= 1, `K=${K} N=${N} rows=${tokens} (${name}): error ${worst.toFixed(2)} x its float32 bound`)
          assert.deepStrictEqual(check.out, want, `K=${K} N=${N} rows=${tokens} (${name}): bits of the 4 x 2 tile`)
        }
      }
    }
  }
})

test("GPT-2's 50257-token head (x @ W.T): 4-column tiles with the last one clamped, one column for few rows", () => {
  const { opts, variants: vs } = variants(128, 768, 50257, true)
  assert.deepStrictEqual(summary(opts), ['SPLIT_REDUCE:2:4', 'UPCAST:1:4', 'UPCAST:0:2', 'OUTER:1:1'])
  const step = innerLoop(vs[0][1].body).body
  assert.strictEqual(step.filter((x) => x.k === 'update' && x.lanes === 4).length, 2 * 4)
  assert.strictEqual(step.filter((x) => x.k === 'load' && x.lanes === 4).length, 2 + 4)
  // few rows: one column sweeping the weight as one stream, 2 steps unrolled; a decode step's head (one row,
  // no row range) keeps its one column too, its lanes' partial sums split over 4 accumulators (below)
  const few = innerLoop(vs.find(([name]) => name === 'few rows')[1].body).body
  assert.strictEqual(few.filter((x) => x.k === 'update' && x.lanes === 4).length, 2)
  assert.deepStrictEqual(summary(variants(0, 768, 50257, true).opts), ['SPLIT_REDUCE:2:4', 'SPLIT_ACC:2:4'])
})

/** The innermost loop's 4-lane updates of `prog`: how many, and on how many distinct accumulators. */
function chains (prog) {
  const updates = innerLoop(prog.body).body.filter((x) => x.k === 'update' && x.lanes === 4)
  return { updates: updates.length, accumulators: new Set(updates.map((x) => x.acc.id)).size }
}

test("a decode step's x @ W (one row): 4 column vectors, 4 independent accumulators a step, the same sums bit for bit", () => {
  // 2 accumulators (the tile before) left each step waiting on an add's latency; each column's sum is still
  // the same chain of steps in the same order, so the output is the 2-vector tile's, bit for bit
  for (const [K, N] of [[768, 3072], [3072, 768], [36, 16], [33, 32]]) {
    const { g, ast } = matmul(0, K, N, false)
    const prepared = prepareKernel(g, ast)
    const opts = chooseOpts(prepared.ast, 4)
    assert.deepStrictEqual(summary(opts), ['VECTOR:1:4', 'UPCAST:1:4'])
    const wide = lowerKernel(g, ast, { width: 4, prepared, opts, verify: true })
    assert.deepStrictEqual(chains(wide), { updates: 4, accumulators: 4 })
    const two = lowerKernel(g, ast, { width: 4, prepared, opts: [opts[0], Object.assign({}, opts[1], { amount: 2 })], verify: true })
    assert.deepStrictEqual(chains(two), { updates: 2, accumulators: 2 })
    for (const fma of relaxedSimdSupported() ? [false, true] : [false]) {
      const s0 = seed
      assert.ok(check(wide, 0, K, N, false, 1, fma) <= 1)
      const a = check.out
      seed = s0
      check(two, 0, K, N, false, 1, fma)
      assert.deepStrictEqual(a, check.out, `K=${K} N=${N}${fma ? ' fma' : ''}: bit for bit the 2-vector tile's sums`)
    }
  }
  // a few-rows variant (x @ W below its row tile) takes the same 4 column vectors
  const { variants: vs } = variants(36, 768, 3072, false)
  assert.deepStrictEqual(chains(vs.find(([name]) => name === 'few rows')[1]), { updates: 4, accumulators: 4 })
})

test("a decode step's x @ W keeps mul + add with fma (4 chains wait on a multiply-add's latency); 8-chain tiles fuse", () => {
  const layout = new Map([[0, { base: 0, size: 128 * 3072 }], [1, { base: 0, size: 128 * 768 }], [2, { base: 0, size: 768 * 3072 }]])
  const fusedOf = (prog) => new KernelEmitter(prog, layout, {}, {}, { fma: true }).emit().stats.fusedMadds
  const { g, ast } = matmul(0, 768, 3072, false)
  assert.strictEqual(fusedOf(lowerKernel(g, ast, { width: 4 })), 0, 'one row: a broadcast value times 4 column vectors')
  const { variants: vs } = variants(36, 768, 3072, false)
  assert.strictEqual(fusedOf(vs.find(([name]) => name === 'few rows')[1]), 0, 'few rows: the same 4 column vectors')
  assert.strictEqual(fusedOf(vs[0][1]), 8, 'a row tile: 8 accumulators, each a multiply-add a step')
  // x @ W.T's head (one row): two streamed vectors a step, no broadcast: fused
  const head = matmul(0, 768, 64, true)
  assert.ok(fusedOf(lowerKernel(head.g, head.ast, { width: 4 })) > 0)
})

test("a decode step's head (x @ W.T, one row, 50257 columns): the lanes' partial sums in 4 accumulators, one weight stream", () => {
  const { g, ast } = matmul(0, 768, 50257, true)
  const prepared = prepareKernel(g, ast)
  const head = lowerKernel(g, ast, { width: 4, prepared, opts: chooseOpts(prepared.ast, 4), verify: true })
  assert.deepStrictEqual(chains(head), { updates: 4, accumulators: 4 })
  // the 4 weight vectors of a step are consecutive: one contiguous stream through the column's row
  const loads = innerLoop(head.body).body.filter((x) => x.k === 'load' && x.lanes === 4 && x.buf === 2)
  assert.strictEqual(loads.length, 4)
  // odd and small sizes: 2 accumulators where the steps do not divide by 4, none below 4 steps; every one
  // within float32 rounding of float64 (the sum's order changed: not bit for bit the one-chain sums)
  const cases = [[768, 33, 4], [24, 17, 2], [8, 5, 0], [4, 3, 0], [3, 7, 0]]
  for (const [K, N, accs] of cases) {
    const m = matmul(0, K, N, true)
    const p = prepareKernel(m.g, m.ast)
    const opts = chooseOpts(p.ast, 4)
    assert.strictEqual((opts.find((o) => o.kind === 'SPLIT_ACC') || { amount: 0 }).amount, accs, `K=${K} N=${N}`)
    const prog = lowerKernel(m.g, m.ast, { width: 4, prepared: p, opts, verify: true })
    for (const fma of relaxedSimdSupported() ? [false, true] : [false]) {
      const worst = check(prog, 0, K, N, true, 1, fma)
      assert.ok(worst <= 1, `K=${K} N=${N}${fma ? ' fma' : ''}: error ${worst.toFixed(2)} x its float32 bound`)
    }
  }
})

test('the fma load option: a boolean (else a ModelError that says so); false keeps mul + add', () => {
  const { Model, ModelError } = require('..')
  const { fixture } = require('./helpers')
  assert.throws(() => Model.fromBytesSync(fixture('linear.pgb'), { fma: 'yes' }), (e) => e instanceof ModelError && /fma must be true or false/.test(e.message))
  const off = Model.fromBytesSync(fixture('linear.pgb'), { fma: false, threads: 1 })
  assert.strictEqual(off.backendInfo.fma, false)
  assert.strictEqual(off._x.fma, false)
  off.dispose()
  const dflt = Model.fromBytesSync(fixture('linear.pgb'), { threads: 1 })
  assert.strictEqual(dflt.backendInfo.fma, relaxedSimdSupported())
  dflt.dispose()
})

test("BERT's x @ W at a constant 128 rows reads its weight through a packed copy; a weight with 64-byte rows is not packed", () => {
  // the FFN's 512 -> 2048: a tile of 8 columns read 32 bytes of each 8 KB weight row per step (rows 8 KB apart
  // share cache sets), about 1.4x the time of the packed stream on the benchmark's BERT
  const { variants: vs } = variants(128, 512, 2048, false, true)
  const packed = vs.find(([name]) => name === 'tile, packed')[1]
  assert.strictEqual(packed.packs.length, 1)
  assert.deepStrictEqual(packed.packs[0].sizes, [2048 / 16 / 8, 8, 512, 4, 4], 'groups, their column panels, reduction steps, tile columns, lanes')
  // out[co, y, x] = sum_ci X[ci, y, x] * W[ci, co] with 16 output channels: each step reads a whole 64-byte row,
  // a cache line, so a copy would not read fewer lines (a wider convolution's weight packs: conv.test.js)
  const g = new Graph()
  const c = (v) => g.const(i32, v)
  const buf = (slot, n) => g.node('DEFINE_GLOBAL', f32, [], [slot, [n]])
  const [co, y, x] = [16, 8, 8].map((n, i) => g.node('RANGE', i32, [c(n)], [i, 'global']))
  const ci = g.node('RANGE', i32, [c(32)], [3, 'reduce'])
  const xl = g.node('LOAD', f32, [g.node('INDEX', f32, [buf(1, 32 * 64), g.alu('ADD', g.alu('ADD', g.alu('MUL', ci, c(64)), g.alu('MUL', y, c(8))), x)])])
  const wl = g.node('LOAD', f32, [g.node('INDEX', f32, [buf(2, 32 * 16), g.alu('ADD', g.alu('MUL', ci, c(16)), co)])])
  const sum = g.node('REDUCE', f32, [g.alu('MUL', xl, wl), ci], 'ADD')
  const st = g.node('STORE', null, [g.node('INDEX', f32, [buf(0, 16 * 64), g.alu('ADD', g.alu('ADD', g.alu('MUL', co, c(64)), g.alu('MUL', y, c(8))), x)]), sum])
  const ast = g.node('SINK', null, [g.node('END', null, [st, co, y, x])])
  const prepared = prepareKernel(g, ast)
  const conv = lowerKernel(g, ast, { width: 4, prepared, opts: chooseOpts(prepared.ast, 4), pack: (i) => (i === 2 ? 32 * 16 : 0), packMain: true })
  assert.strictEqual(conv.packs.length, 0)
})
