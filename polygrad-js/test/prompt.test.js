'use strict'
// A prompt's kernels that the constant-size rules left scalar or slow (issue 31, GPT-2 small's prefill in Node):
// attention's softmax over the prompt's keys (rows and keys both the Variable `tokens`) gets lanes along the
// Variable's range, its last tile's stores gated; a matrix product whose epilogue is long (GPT-2's tanh GELU)
// is split into the product and the epilogue (fission.js epilogueFission). Each against a float64 reference
// within float32 rounding, and bit for bit against the program without the change (same operations in the
// same order), at token counts the lanes do not divide.
const test = require('node:test')
const assert = require('node:assert')
const { Graph } = require('../src/ir')
const { DTYPES } = require('../src/dtypes')
const { chooseOpts } = require('../src/lower')
const { lowerKernel, prepareKernel } = require('../src/compile')
const { buildModule, importObject } = require('../src/wasm/module')
const { KernelEmitter } = require('../src/wasm/emit')
const { simplifyIndices } = require('../src/simplify')

const f32 = DTYPES.float32
const i32 = DTYPES.int32
const MAXT = 36 // the Variable's bound (a multiple of the 4 lanes, as symbolicTiles asks)
const HEADS = 3

let seed = 4242
const rand = () => {
  seed = (seed * 1103515245 + 12345) % 2147483648
  return seed / 1073741824 - 1
}

/** Run `prog` with buffers {slot: Float32Array} (each placed with room past its end, filled with NaN there and
 * in every output) and Variable values `vars` (name -> int); returns the buffers' contents after the call. */
function run (prog, buffers, vars) {
  const layout = new Map()
  let pos = 64
  for (const [slot, data] of Object.entries(buffers)) {
    layout.set(Number(slot), { base: pos, size: data.length })
    pos += Math.ceil(data.length * 4 / 64) * 64 + 256
  }
  const pages = Math.ceil(pos / 65536) + 1
  const memory = new WebAssembly.Memory({ initial: pages })
  const inst = new WebAssembly.Instance(new WebAssembly.Module(buildModule([{ prog, layout }], pages)), importObject(memory))
  const view = new Float32Array(memory.buffer)
  for (const [slot, data] of Object.entries(buffers)) view.set(data, layout.get(Number(slot)).base / 4)
  inst.exports.k0(...prog.vars.map((v) => vars[v]))
  const out = {}
  for (const [slot, data] of Object.entries(buffers)) {
    const at = layout.get(Number(slot)).base / 4
    out[slot] = view.slice(at, at + data.length)
  }
  return out
}

const sameBits = (a, b) => a.length === b.length && Buffer.compare(Buffer.from(a.buffer, a.byteOffset, a.byteLength), Buffer.from(b.buffer, b.byteOffset, b.byteLength)) === 0

/**
 * Attention's softmax pieces over `tokens` queries and keys, HEADS heads (scores s[h, i, j] at h*T*T + i*T + j,
 * an additive mask[i, j] at i*MAXT + j): 'max' m[h, i] = max_j (s + mask); 'sum' z[h, i] = sum_j e(s + mask - m)
 * and 'norm' p[h, i, j] = e(s + mask - m) / z, with e(x) = 1 + x + x*x/2 standing for the exponential (a
 * polynomial: the reference computes it exactly in float64). Slots: 0 the output, 1 s, 2 mask, 3 m, 4 z.
 */
function softmaxKernel (kind) {
  const g = new Graph()
  const c = (v) => g.const(i32, v)
  const fc = (v) => g.const(f32, v)
  const T = g.node('DEFINE_VAR', i32, [], ['tokens', 1, MAXT])
  const buf = (slot, n) => g.node('DEFINE_GLOBAL', f32, [], [slot, [n]])
  const h = g.node('RANGE', i32, [c(HEADS)], [0, 'global'])
  const i = g.node('RANGE', i32, [T], [1, 'global'])
  const j = g.node('RANGE', i32, [T], [2, kind === 'norm' ? 'global' : 'reduce'])
  const load = (slot, n, idx) => g.node('LOAD', f32, [g.node('INDEX', f32, [buf(slot, n), idx])])
  const TT = g.alu('MUL', T, T)
  const s = load(1, HEADS * MAXT * MAXT, g.alu('ADD', g.alu('ADD', g.alu('MUL', h, TT), g.alu('MUL', i, T)), j))
  const mask = load(2, MAXT * MAXT, g.alu('ADD', g.alu('MUL', i, c(MAXT)), j))
  const row = g.alu('ADD', g.alu('MUL', h, T), i)
  const x = g.alu('ADD', s, mask)
  const e = (v) => g.alu('ADD', g.alu('ADD', fc(1), v), g.alu('MUL', g.alu('MUL', v, v), fc(0.5)))
  const shifted = g.alu('ADD', x, g.alu('NEG', load(3, HEADS * MAXT, row)))
  let st
  if (kind === 'norm') {
    const p = g.alu('FDIV', e(shifted), load(4, HEADS * MAXT, row))
    st = g.node('STORE', null, [g.node('INDEX', f32, [buf(0, HEADS * MAXT * MAXT), g.alu('ADD', g.alu('ADD', g.alu('MUL', h, TT), g.alu('MUL', i, T)), j)]), p])
    return { g, ast: g.node('SINK', null, [g.node('END', null, [st, h, i, j])]) }
  }
  const red = kind === 'max' ? g.node('REDUCE', f32, [x, j], 'MAX') : g.node('REDUCE', f32, [e(shifted), j], 'ADD')
  st = g.node('STORE', null, [g.node('INDEX', f32, [buf(0, HEADS * MAXT), row]), red])
  return { g, ast: g.node('SINK', null, [g.node('END', null, [st, h, i])]) }
}

/** float64 m, z and p of softmaxKernel at `T` tokens (flat as the kernels store them). */
function softmaxReference (S, M, T) {
  const m = []
  const z = []
  const p = []
  const e = (v) => 1 + v + v * v / 2
  for (let h = 0; h < HEADS; h++) {
    for (let i = 0; i < T; i++) {
      const xs = Array.from({ length: T }, (_, j) => Math.fround(S[h * T * T + i * T + j] + M[i * MAXT + j]))
      const mx = Math.max(...xs)
      const sum = xs.reduce((a, x) => a + e(x - mx), 0)
      m.push(mx)
      z.push(sum)
      for (const x of xs) p.push(e(x - mx) / sum)
    }
  }
  return { m, z, p }
}

test("attention's softmax over a prompt's tokens: lanes along the Variable's range, the last tile's stores gated, bits of the scalar program", () => {
  const lowered = {}
  for (const kind of ['max', 'sum', 'norm']) {
    const { g, ast } = softmaxKernel(kind)
    const prepared = prepareKernel(g, ast)
    const opts = chooseOpts(prepared.ast, 4)
    // max and sum: lanes along the rows (each lane its own row's reduction, in order); norm: along the keys
    const want = kind === 'norm' ? 2 : 1
    assert.deepStrictEqual(opts.map((o) => `${o.kind}:${o.range.arg[0]}:${o.amount}`), [`VECTOR:${want}:4`], kind)
    const lanes = lowerKernel(g, ast, { width: 4, prepared, opts, verify: true })
    assert.ok(lanes.vectorized, `${kind}: the program runs in lanes`)
    const scalar = lowerKernel(g, ast, { width: 4, prepared, opts: [], verify: true })
    assert.ok(!scalar.vectorized)
    lowered[kind] = { lanes, scalar }
  }
  // the normalise kernel's stores: one vector store where all 4 lanes are inside the rows
  const layout = new Map([0, 1, 2, 3, 4].map((s) => [s, { base: 0, size: HEADS * MAXT * MAXT }]))
  assert.strictEqual(new KernelEmitter(lowered.norm.lanes, layout, {}, {}).emit().stats.wholeGatedStores, 1)
  for (const T of [1, 3, 5, 17, 32, 36]) {
    const S = Float32Array.from({ length: HEADS * MAXT * MAXT }, rand)
    const M = Float32Array.from({ length: MAXT * MAXT }, (_, k) => (k % MAXT > Math.floor(k / MAXT) ? -1e9 : 0))
    const ref = softmaxReference(S, M, T)
    const outs = {}
    for (const variant of ['lanes', 'scalar']) {
      const nan = (n) => new Float32Array(n).fill(NaN)
      const m = run(lowered.max[variant], { 0: nan(HEADS * MAXT), 1: S, 2: M }, { tokens: T })[0]
      const z = run(lowered.sum[variant], { 0: nan(HEADS * MAXT), 1: S, 2: M, 3: m }, { tokens: T })[0]
      const p = run(lowered.norm[variant], { 0: nan(HEADS * MAXT * MAXT), 1: S, 2: M, 3: m, 4: z }, { tokens: T })[0]
      outs[variant] = { m, z, p }
      for (const [name, got, want] of [['max', m, ref.m], ['sum', z, ref.z], ['norm', p, ref.p]]) {
        for (let k = 0; k < want.length; k++) {
          const tol = 4 * T * 2 ** -24 * Math.max(Math.abs(want[k]), 1)
          assert.ok(Math.abs(got[k] - want[k]) <= tol, `${name} (${variant}) at ${T} tokens, element ${k}: ${got[k]} against ${want[k]}`)
        }
        assert.ok(got.subarray(want.length).every(Number.isNaN), `${name} (${variant}) at ${T} tokens: nothing stored past the rows`)
      }
    }
    for (const name of ['m', 'z', 'p']) assert.ok(sameBits(outs.lanes[name], outs.scalar[name]), `${name} at ${T} tokens: bits of the scalar program`)
  }
})

/** out[m, n] = epilogue(sum_k X[m, k] * W[k, n] + b[n]) over `tokens` rows (a Variable up to `rows`): slot 0 out,
 * 1 X, 2 W, 3 b; `epilogue`: 'poly' (a 30-step polynomial, as long as a tanh GELU's), 'relu' (short), 'residual'
 * (the poly plus the output's old value: reads the buffer it writes). `block`: the sum over two ranges, K / block
 * blocks of `block` values (as a quantized weight's matmul sums), not one. */
function productKernel (rows, K, N, epilogue, block = 0) {
  const g = new Graph()
  const c = (v) => g.const(i32, v)
  const fc = (v) => g.const(f32, v)
  const buf = (slot, n) => g.node('DEFINE_GLOBAL', f32, [], [slot, [n]])
  const tokens = g.node('DEFINE_VAR', i32, [], ['tokens', 1, rows])
  const m = g.node('RANGE', i32, [tokens], [0, 'global'])
  const n = g.node('RANGE', i32, [c(N)], [1, 'global'])
  const own = block ? [g.node('RANGE', i32, [c(K / block)], [2, 'reduce']), g.node('RANGE', i32, [c(block)], [3, 'reduce'])] : [g.node('RANGE', i32, [c(K)], [2, 'reduce'])]
  const k = block ? g.alu('ADD', g.alu('MUL', own[0], c(block)), own[1]) : own[0]
  const x = g.node('LOAD', f32, [g.node('INDEX', f32, [buf(1, rows * K), g.alu('ADD', g.alu('MUL', m, c(K)), k)])])
  const w = g.node('LOAD', f32, [g.node('INDEX', f32, [buf(2, K * N), g.alu('ADD', g.alu('MUL', k, c(N)), n)])])
  const y = g.alu('ADD', g.node('REDUCE', f32, [g.alu('MUL', x, w), ...own], 'ADD'), g.node('LOAD', f32, [g.node('INDEX', f32, [buf(3, N), n])]))
  const outIndex = g.node('INDEX', f32, [buf(0, rows * N), g.alu('ADD', g.alu('MUL', m, c(N)), n)])
  let v
  if (epilogue === 'relu') {
    v = g.node('WHERE', f32, [g.alu('CMPLT', fc(0), y), y, fc(0)])
  } else {
    v = fc(0.001)
    for (let s = 0; s < 30; s++) v = g.alu('ADD', g.alu('MUL', v, y), fc(((s * 37) % 11 - 5) / 8))
    if (epilogue === 'residual') v = g.alu('ADD', v, g.node('LOAD', f32, [outIndex]))
  }
  const st = g.node('STORE', null, [outIndex, v])
  return { g, ast: g.node('SINK', null, [g.node('END', null, [st, m, n])]) }
}

test('a matrix product with a long epilogue (a tanh GELU) is split into the product and the epilogue: bits unchanged', () => {
  const ROWS = 36
  const [K, N] = [40, 48]
  const blocks = (e, block = 0) => { const { g, ast } = productKernel(ROWS, K, N, e, block); return prepareKernel(g, ast).ast.src.length }
  assert.strictEqual(blocks('poly'), 2, 'product, then epilogue')
  // a sum over blocks and their values (a quantized weight's: GPT-2's Q4_0 c_fc over a prompt 0.52x the time in
  // Chromium with its GELU split off)
  assert.strictEqual(blocks('poly', 8), 2, 'a sum over two ranges: product, then epilogue')
  assert.strictEqual(blocks('relu'), 1, 'a short epilogue stays in the product')
  assert.strictEqual(blocks('residual'), 1, 'an epilogue reading the output stays (it would read the product)')
  for (const block of [0, 8]) checkSplit(ROWS, K, N, block)
})

function checkSplit (ROWS, K, N, block) {
  const { g, ast } = productKernel(ROWS, K, N, 'poly', block)
  const split = prepareKernel(g, ast)
  const whole = { ast: simplifyIndices(g, ast), scratch: [] }
  const programs = [split, whole].map((prepared) => lowerKernel(g, ast, { width: 4, prepared, opts: chooseOpts(prepared.ast, 4), verify: true }))
  assert.ok(programs.every((p) => p.vectorized))
  const X = Float32Array.from({ length: ROWS * K }, () => rand() / 4)
  const W = Float32Array.from({ length: K * N }, () => rand() / 4)
  const B = Float32Array.from({ length: N }, () => rand() / 4)
  for (const T of [1, 3, 17, 36]) {
    const [a, b] = programs.map((p) => run(p, { 0: new Float32Array(ROWS * N).fill(NaN), 1: X, 2: W, 3: B }, { tokens: T })[0])
    assert.ok(sameBits(a, b), `${T} tokens: the split kernel's bits are the fused one's`)
    for (let r = 0; r < ROWS; r++) {
      for (let col = 0; col < N; col++) {
        const got = a[r * N + col]
        if (r >= T) {
          assert.ok(Number.isNaN(got), `row ${r} >= ${T} tokens was written`)
          continue
        }
        // float64 reference of the product (within float32 rounding), then the epilogue in float32 steps
        let y = 0
        for (let kk = 0; kk < K; kk++) y += X[r * K + kk] * W[kk * N + col]
        y = Math.fround(Math.fround(y) + B[col])
        let v = Math.fround(0.001)
        for (let s = 0; s < 30; s++) v = Math.fround(Math.fround(v * y) + Math.fround(((s * 37) % 11 - 5) / 8))
        assert.ok(Math.abs(got - v) <= 1e-4 * Math.max(1, Math.abs(v)), `row ${r} column ${col} at ${T} tokens: ${got} against ${v}`)
      }
    }
  }
}
