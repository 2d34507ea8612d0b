'use strict'
// A padded convolution through the wasm lowering (issue 34, ResNet-18 in Node): its input is read through a
// padding gate, fixed along the innermost loop (the input channels) for each kernel offset and output pixel.
// linearize versions that loop (versionGatedLoops): the image's interior runs a copy whose loads are ungated,
// the border the gated loop. Checked: the copy exists and reads nothing through a gate, and the kernel's
// results at odd sizes (a 9-pixel row: 4-pixel tiles with a clamped last one; 3 and 7 input channels) match a
// float64 reference within float32 rounding, on one thread and split in two phases as threads run it.
// Window reductions (a depthwise 3x3 convolution, a 3x3 max pool; lower.windowOpts): the window unrolled whole
// (no loop left for it) and the row tiled in lanes (the last tile moved back on rows the lanes do not divide; at
// stride 2 every second element loaded by two vector loads and a shuffle), against float64 at odd rows, strides
// 1 and 2, padded or not.
const test = require('node:test')
const assert = require('node:assert')
const { Graph } = require('../src/ir')
const { DTYPES } = require('../src/dtypes')
const { lowerKernel, prepareKernel } = require('../src/compile')
const { chooseOpts } = require('../src/lower')
const { buildModule, importObject } = require('../src/wasm/module')
const { KernelEmitter } = require('../src/wasm/emit')
const { repack } = require('../src/pack')

const f32 = DTYPES.float32
const i32 = DTYPES.int32

/** out[co, y, x] = sum_{ky, kx, ci} X[ci, y + ky - 1, x + kx - 1] * W[ky, kx, ci, co] (0 outside the image): a
 * 3x3 convolution with padding 1, its weight stored output-channels-last as polygrad.onnx keeps it; with
 * `shortcut` = C2 channels, plus sum_cj Z[cj, y, x] * V[cj, co] (a residual block's 1x1 shortcut, its own
 * reduction in the same kernel; Z in slot 3, V in slot 4). */
function paddedConv (C, CO, S, shortcut = 0) {
  const g = new Graph()
  const c = (v) => g.const(i32, v)
  const buf = (slot, n) => g.node('DEFINE_GLOBAL', f32, [], [slot, [n]])
  const [co, y, x] = [CO, S, S].map((n, i) => g.node('RANGE', i32, [c(n)], [i, 'global']))
  const [ky, kx, ci] = [3, 3, C].map((n, i) => g.node('RANGE', i32, [c(n)], [3 + i, 'reduce']))
  const iy = g.alu('ADD', y, ky)
  const ix = g.alu('ADD', x, kx)
  const inside = (v) => g.alu('AND', g.alu('CMPLT', c(0), v), g.alu('CMPLT', v, c(S + 1)))
  const xi = g.alu('ADD', g.alu('ADD', g.alu('MUL', ci, c(S * S)), g.alu('MUL', iy, c(S))), g.alu('ADD', ix, c(-S - 1)))
  const xl = g.node('LOAD', f32, [g.node('INDEX', f32, [buf(1, C * S * S), xi, g.alu('AND', inside(iy), inside(ix))])])
  const wi = g.alu('ADD', g.alu('MUL', g.alu('ADD', g.alu('MUL', g.alu('ADD', g.alu('MUL', ky, c(3)), kx), c(C)), ci), c(CO)), co)
  const wl = g.node('LOAD', f32, [g.node('INDEX', f32, [buf(2, 9 * C * CO), wi])])
  let sum = g.node('REDUCE', f32, [g.alu('MUL', xl, wl), ky, kx, ci], 'ADD')
  if (shortcut) {
    const cj = g.node('RANGE', i32, [c(shortcut)], [6, 'reduce'])
    const zi = g.alu('ADD', g.alu('ADD', g.alu('MUL', cj, c(S * S)), g.alu('MUL', y, c(S))), x)
    const zl = g.node('LOAD', f32, [g.node('INDEX', f32, [buf(3, shortcut * S * S), zi])])
    const vl = g.node('LOAD', f32, [g.node('INDEX', f32, [buf(4, shortcut * CO), g.alu('ADD', g.alu('MUL', cj, c(CO)), co)])])
    sum = g.alu('ADD', sum, g.node('REDUCE', f32, [g.alu('MUL', zl, vl), cj], 'ADD'))
  }
  const out = g.alu('ADD', g.alu('ADD', g.alu('MUL', co, c(S * S)), g.alu('MUL', y, c(S))), x)
  const st = g.node('STORE', null, [g.node('INDEX', f32, [buf(0, CO * S * S), out]), sum])
  return { g, ast: g.node('SINK', null, [g.node('END', null, [st, co, y, x])]) }
}

/** Every instruction of a program, with the `if`s around it: [inst, ifs]. */
function walk (insts, ifs = [], out = []) {
  for (const x of insts) {
    out.push([x, ifs])
    if (x.k === 'loop') {
      walk(x.pre, ifs, out)
      walk(x.body, ifs, out)
    }
    if (x.k === 'if') walk(x.body, [...ifs, x], out)
  }
  return out
}

test("a padded convolution's innermost loop has an ungated copy for the image's interior", () => {
  const { g, ast } = paddedConv(7, 8, 9)
  const prog = lowerKernel(g, ast, { width: 4, verify: true })
  assert.ok(prog.vectorized, 'the output channels get lanes')
  const channelLoops = walk(prog.body).filter(([x]) => x.k === 'loop' && x.kind === 'reduce' && !x.body.some((y) => y.k === 'loop' || y.k === 'if'))
  assert.strictEqual(channelLoops.length, 2, 'two copies of the input-channel loop')
  const gated = ([loop]) => loop.body.filter((x) => x.k === 'load' && x.gate).length
  const [interior, border] = channelLoops
  assert.strictEqual(gated(interior), 0, 'the interior copy reads through no gate')
  assert.ok(interior[1].length === 1 && border[1].length === 1 && interior[1][0] !== border[1][0], 'each copy under its own if')
  assert.ok(gated(border) > 0, 'the border copy keeps its gates')
  assert.strictEqual(interior[0].body.filter((x) => x.k === 'load').length, border[0].body.filter((x) => x.k === 'load').length)
  // the border copy's gated loads (4 pixels of the row tile) each get a pointer that is 0 where the gate is off
  const layout = new Map([0, 1, 2].map((s) => [s, { base: 64, size: 8 * 81 * 2 }]))
  const { stats } = new KernelEmitter(prog, layout, {}, {}, {}).emit()
  assert.strictEqual(stats.gatedPointers, gated(border))
})

test("the memory's first bytes stay zeros: a padded convolution's gated loads read them where the gate is off", () => {
  // wasm/emit.js loads from address 0 instead of selecting 0 after the load: planMemory places every buffer
  // after ZERO_BYTES and the executor clears them in a memory it is given
  const { Model } = require('..')
  const { Executor, ZERO_BYTES } = require('../src/runtime')
  const { fixture } = require('./helpers')
  const m = Model.fromBytesSync(fixture('linear.pgb'), { threads: 1 })
  assert.ok(ZERO_BYTES >= 16, 'a vector load at address 0 reads zeros too')
  assert.ok(m._p.slots.every((s) => s.base >= ZERO_BYTES))
  const memory = new WebAssembly.Memory({ initial: 1 })
  new Uint8Array(memory.buffer).fill(0xa5)
  const x = new Executor(m._p, { memory, threads: 1 })
  assert.deepStrictEqual([...new Uint8Array(x.memory.buffer, 0, ZERO_BYTES)], new Array(ZERO_BYTES).fill(0))
  m.dispose()
})

let seed = 4321
const rand = () => {
  seed = (seed * 1103515245 + 12345) % 2147483648
  return seed / 1073741824 - 1
}

/** The worst error of the kernel's wasm (whole, or as its threaded phases in `parts` slices) relative to the
 * float32 bound against a float64 reference; with `pack`, the full-size variant reading its weights (slots 2
 * and 4) through packed copies (pack.js, filled by repack as the runtime does). */
function worstError (C, CO, S, parts, { shortcut = 0, pack = false } = {}) {
  const { g, ast } = paddedConv(C, CO, S, shortcut)
  const sizes = [CO * S * S, C * S * S, 9 * C * CO, shortcut * S * S, shortcut * CO]
  const eligible = pack ? (i) => (i === 2 || i === 4 ? sizes[i] : 0) : null
  const prog = lowerKernel(g, ast, { width: 4, verify: true, threaded: parts > 1, pack: eligible, packMain: pack })
  if (pack) assert.strictEqual(prog.packs.length, shortcut ? 2 : 1, 'every weight read through its packed copy')
  const progs = parts > 1 ? prog.phases : [prog]
  assert.ok(progs && progs.length, 'the kernel splits into phases')
  const layout = new Map()
  let pos = 64
  const place = (slot, n) => {
    layout.set(slot, { base: pos, size: n })
    pos += Math.ceil(n * 4 / 64) * 64 + 64
  }
  sizes.forEach((n, slot) => place(slot, n))
  for (const pk of prog.packs) place(pk.slot, pk.size)
  const pages = Math.ceil(pos / 65536) + 1
  const memory = new WebAssembly.Memory({ initial: pages })
  const mod = new WebAssembly.Module(buildModule(progs.map((p) => ({ prog: p, layout })), pages))
  const inst = new WebAssembly.Instance(mod, importObject(memory))
  const view = new Float32Array(memory.buffer)
  const [X, W, Z, V] = sizes.slice(1).map((n) => Float32Array.from({ length: n }, rand))
  ;[X, W, Z, V].forEach((a, i) => view.set(a, layout.get(i + 1).base / 4))
  view.fill(NaN, layout.get(0).base / 4, layout.get(0).base / 4 + sizes[0])
  for (const pk of prog.packs) repack(view, layout.get(pk.from).base / 4, layout.get(pk.slot).base / 4, pk)
  progs.forEach((_, i) => {
    for (let part = 0; part < parts; part++) inst.exports[`k${i}`](...(parts > 1 ? [part, parts] : []))
  })
  const out = view.subarray(layout.get(0).base / 4)
  let worst = 0
  for (let co = 0; co < CO; co++) {
    for (let y = 0; y < S; y++) {
      for (let x = 0; x < S; x++) {
        let exact = 0
        let mag = 0
        for (let ky = 0; ky < 3; ky++) {
          for (let kx = 0; kx < 3; kx++) {
            const [iy, ix] = [y + ky - 1, x + kx - 1]
            if (iy < 0 || iy >= S || ix < 0 || ix >= S) continue
            for (let ci = 0; ci < C; ci++) {
              const p = X[ci * S * S + iy * S + ix] * W[((ky * 3 + kx) * C + ci) * CO + co]
              exact += p
              mag += Math.abs(p)
            }
          }
        }
        for (let cj = 0; cj < shortcut; cj++) {
          const p = Z[cj * S * S + y * S + x] * V[cj * CO + co]
          exact += p
          mag += Math.abs(p)
        }
        const got = out[co * S * S + y * S + x]
        worst = Math.max(worst, Number.isNaN(got) ? Infinity : Math.abs(got - exact) / ((9 * C + shortcut + 1) * 2 ** -24 * mag + 1e-30))
      }
    }
  }
  return worst
}

test("a convolution's register tile: 8 output channels x 4 pixels, 16 x 2 on a row of 14 (8 accumulators each)", () => {
  const tile = (C, CO, S, shortcut) => {
    const { g, ast } = paddedConv(C, CO, S, shortcut)
    const opts = chooseOpts(prepareKernel(g, ast).ast, 4)
    return opts.map((o) => `${o.kind}:${o.range.arg[0]}:${o.amount}${o.clamp ? 'c' : ''}`)
  }
  // ranges 0, 1, 2: output channels, pixel rows, pixels of a row (the row tile clamped where 4 does not divide it)
  assert.deepStrictEqual(tile(8, 64, 28, 0), ['VECTOR:0:4', 'UPCAST:0:2', 'UPCAST:2:4'])
  assert.deepStrictEqual(tile(8, 64, 7, 0), ['VECTOR:0:4', 'UPCAST:0:2', 'UPCAST:2:4c'])
  assert.deepStrictEqual(tile(8, 64, 14, 0), ['VECTOR:0:4', 'UPCAST:0:4', 'UPCAST:2:2'])
  assert.deepStrictEqual(tile(8, 64, 14, 4), ['VECTOR:0:4', 'UPCAST:0:4', 'UPCAST:2:2'], 'with a shortcut')
  assert.deepStrictEqual(tile(8, 8, 14, 0), ['VECTOR:0:4', 'UPCAST:0:2', 'UPCAST:2:2'], '8 channels: no 16 to take')
})

test('a padded convolution matches a float64 reference at odd sizes, on one thread and in two slices', () => {
  for (const [C, CO, S] of [[3, 8, 9], [7, 8, 5], [7, 16, 9], [3, 32, 14]]) {
    for (const parts of [1, 2]) {
      const worst = worstError(C, CO, S, parts)
      assert.ok(worst <= 1, `C=${C} CO=${CO} S=${S} parts=${parts}: error ${worst.toFixed(2)} x its float32 bound`)
    }
  }
})

test("a convolution's weights are read through copies packed in loop order (the full-size variant), with a shortcut's", () => {
  // the 3x3 weight (ky, kx, ci, co): one stream per tile of 8 output channels, where the kernel read 32 bytes of
  // each CO-apart row per step (pack.js packs rows over 64 bytes apart) (ResNet-18's deep layers about 0.6x the time packed); the pixel loops read it
  // again. The shortcut's weight is read inside its own reduction only, the 3x3's inside theirs: each packs.
  const { g, ast } = paddedConv(7, 32, 9, 5)
  const prepared = prepareKernel(g, ast)
  const eligible = (i) => ({ 2: 9 * 7 * 32, 4: 5 * 32 }[i] || 0)
  const prog = lowerKernel(g, ast, { width: 4, prepared, opts: chooseOpts(prepared.ast, 4), pack: eligible, packMain: true })
  const layouts = new Map(prog.packs.map((pk) => [pk.from, pk]))
  assert.deepStrictEqual(layouts.get(2).sizes, [32 / 8, 3, 3, 7, 2, 4], 'channel tiles, ky, kx, ci, tile columns, lanes')
  assert.deepStrictEqual(layouts.get(2).src, [8, 3 * 7 * 32, 7 * 32, 32, 4, 1])
  assert.deepStrictEqual(layouts.get(4).sizes, [32 / 8, 5, 2, 4], 'channel tiles, cj, tile columns, lanes')
  for (const [C, CO, S, shortcut] of [[7, 32, 9, 5], [3, 32, 5, 0], [5, 40, 7, 3]]) {
    for (const parts of [1, 2]) {
      const worst = worstError(C, CO, S, parts, { shortcut, pack: true })
      assert.ok(worst <= 1, `C=${C} CO=${CO} S=${S} shortcut ${shortcut} parts=${parts}: error ${worst.toFixed(2)} x its float32 bound`)
    }
  }
})

/** out[c, y, x] = sum (or max) over ky, kx < 3 of X[c, s*y + ky - P, s*x + kx - P] (* W[c, ky, kx]), 0 (or -inf)
 * outside the image: a depthwise 3x3 convolution with padding P = `pad` (1 or 0; `pool`: a 3x3 max pool) at
 * stride s, an S x S input. */
function window (C, S, stride, pool, pad = 1) {
  const g = new Graph()
  const c = (v) => g.const(i32, v)
  const buf = (slot, n) => g.node('DEFINE_GLOBAL', f32, [], [slot, [n]])
  const O = Math.floor((S + 2 * pad - 3) / stride) + 1
  const [ch, y, x] = [C, O, O].map((n, i) => g.node('RANGE', i32, [c(n)], [i, 'global']))
  const [ky, kx] = [3, 3].map((n, i) => g.node('RANGE', i32, [c(n)], [3 + i, 'reduce']))
  const iy = g.alu('ADD', g.alu('MUL', y, c(stride)), ky)
  const ix = g.alu('ADD', g.alu('MUL', x, c(stride)), kx)
  const inside = (v) => g.alu('AND', g.alu('CMPLT', c(0), v), g.alu('CMPLT', v, c(S + 1)))
  const xi = g.alu('ADD', g.alu('ADD', g.alu('MUL', ch, c(S * S)), g.alu('MUL', iy, c(S))), g.alu('ADD', ix, c(-(S + 1) * pad)))
  const gate = pad ? g.alu('AND', inside(iy), inside(ix)) : null
  const xl = g.node('LOAD', f32, [g.node('INDEX', f32, [buf(1, C * S * S), xi, ...(gate ? [gate] : [])])])
  let term
  if (pool && !gate) {
    term = xl
  } else if (pool) {
    term = g.node('WHERE', f32, [gate, xl, g.const(f32, -Infinity)])
  } else {
    const wi = g.alu('ADD', g.alu('MUL', ch, c(9)), g.alu('ADD', g.alu('MUL', ky, c(3)), kx))
    term = g.alu('MUL', xl, g.node('LOAD', f32, [g.node('INDEX', f32, [buf(2, 9 * C), wi])]))
  }
  const red = g.node('REDUCE', f32, [term, ky, kx], pool ? 'MAX' : 'ADD')
  const out = g.alu('ADD', g.alu('ADD', g.alu('MUL', ch, c(O * O)), g.alu('MUL', y, c(O))), x)
  const st = g.node('STORE', null, [g.node('INDEX', f32, [buf(0, C * O * O), out]), red])
  return { g, ast: g.node('SINK', null, [g.node('END', null, [st, ch, y, x])]), O, x }
}

test('a depthwise window is unrolled whole and its row tiled in lanes, at stride 2 read by strided vector loads', () => {
  for (const [S, stride, pad] of [[14, 1, 1], [7, 1, 1], [16, 1, 1], [14, 2, 1], [15, 2, 0]]) {
    const kind = 'VECTOR'
    const { g, ast, x } = window(8, S, stride, false, pad)
    const opts = chooseOpts(prepareKernel(g, ast).ast, 4)
    const tile = opts.find((o) => o.range === x)
    assert.ok(tile && tile.kind === kind && tile.amount === 4, `S=${S} stride ${stride}: ${JSON.stringify(opts.map((o) => o.kind))}`)
    assert.strictEqual(opts.filter((o) => o.kind === 'UNROLL' && o.amount === 3).length, 2)
    const prog = lowerKernel(g, ast, { width: 4, verify: true })
    assert.strictEqual(walk(prog.body).filter(([i]) => i.k === 'loop' && i.kind === 'reduce').length, 0, 'no loop over the window')
    assert.ok(prog.vectorized)
    const strided = walk(prog.body).filter(([i]) => i.k === 'load' && i.mode === 'strided').length
    assert.strictEqual(strided, stride === 2 ? 9 : 0, 'the input loads of a stride-2 window are strided')
  }
})

/** out[co, y, x] = sum_ci X[ci, y, x] * W[co, ci]: a 1x1 convolution (MobileNetV2's expansions and projections). */
function pointwise (C, CO, S) {
  const g = new Graph()
  const c = (v) => g.const(i32, v)
  const buf = (slot, n) => g.node('DEFINE_GLOBAL', f32, [], [slot, [n]])
  const [co, y, x] = [CO, S, S].map((n, i) => g.node('RANGE', i32, [c(n)], [i, 'global']))
  const ci = g.node('RANGE', i32, [c(C)], [3, 'reduce'])
  const xl = g.node('LOAD', f32, [g.node('INDEX', f32, [buf(1, C * S * S), g.alu('ADD', g.alu('ADD', g.alu('MUL', ci, c(S * S)), g.alu('MUL', y, c(S))), x)])])
  const wl = g.node('LOAD', f32, [g.node('INDEX', f32, [buf(2, CO * C), g.alu('ADD', g.alu('MUL', co, c(C)), ci)])])
  const sum = g.node('REDUCE', f32, [g.alu('MUL', xl, wl), ci], 'ADD')
  const st = g.node('STORE', null, [g.node('INDEX', f32, [buf(0, CO * S * S), g.alu('ADD', g.alu('ADD', g.alu('MUL', co, c(S * S)), g.alu('MUL', y, c(S))), x)]), sum])
  return { g, ast: g.node('SINK', null, [g.node('END', null, [st, co, y, x])]) }
}

test('a 1x1 convolution tiles its output channels, across which each vector of its image is reused', () => {
  // the row of 28 pixels in lanes (7 vectors: no second column); the pixel rows reuse no image vector, so the
  // tile is 4 output channels (4 accumulators, each image vector loaded once for them), not one accumulator
  for (const [C, CO, S] of [[8, 24, 28], [5, 12, 12]]) {
    const { g, ast } = pointwise(C, CO, S)
    const opts = chooseOpts(prepareKernel(g, ast).ast, 4).map((o) => `${o.kind}:${o.range.arg[0]}:${o.amount}`)
    assert.deepStrictEqual(opts.filter((o) => o.startsWith('UPCAST:0')), ['UPCAST:0:4'], JSON.stringify(opts))
    const prog = lowerKernel(g, ast, { width: 4, verify: true })
    const sizes = [CO * S * S, C * S * S, CO * C]
    const layout = new Map(sizes.map((n, slot) => [slot, { base: 64 + slot * 131072, size: n }]))
    const memory = new WebAssembly.Memory({ initial: 7 })
    const inst = new WebAssembly.Instance(new WebAssembly.Module(buildModule([{ prog, layout }], 7)), importObject(memory))
    const view = new Float32Array(memory.buffer)
    const [X, W] = sizes.slice(1).map((n) => Float32Array.from({ length: n }, rand))
    view.set(X, layout.get(1).base / 4)
    view.set(W, layout.get(2).base / 4)
    inst.exports.k0()
    let worst = 0
    for (let co = 0; co < CO; co++) {
      for (let p = 0; p < S * S; p++) {
        let exact = 0
        let mag = 0
        for (let ci = 0; ci < C; ci++) {
          exact += X[ci * S * S + p] * W[co * C + ci]
          mag += Math.abs(X[ci * S * S + p] * W[co * C + ci])
        }
        worst = Math.max(worst, Math.abs(view[layout.get(0).base / 4 + co * S * S + p] - exact) / ((C + 1) * 2 ** -24 * mag + 1e-30))
      }
    }
    assert.ok(worst <= 1, `C=${C} CO=${CO} S=${S}: error ${worst.toFixed(2)} x its float32 bound`)
  }
})

/** The worst error of a window kernel's wasm relative to its float32 bound against float64 (a max: exact). */
function windowError (C, S, stride, pool, parts, pad) {
  const { g, ast, O } = window(C, S, stride, pool, pad)
  const prog = lowerKernel(g, ast, { width: 4, verify: true, threaded: parts > 1 })
  const progs = parts > 1 ? prog.phases : [prog]
  const sizes = [C * O * O, C * S * S, 9 * C]
  const layout = new Map()
  let pos = 64
  sizes.forEach((n, slot) => {
    layout.set(slot, { base: pos, size: n })
    pos += Math.ceil(n * 4 / 64) * 64 + 64
  })
  const pages = Math.ceil(pos / 65536) + 1
  const memory = new WebAssembly.Memory({ initial: pages })
  const inst = new WebAssembly.Instance(new WebAssembly.Module(buildModule(progs.map((p) => ({ prog: p, layout })), pages)), importObject(memory))
  const view = new Float32Array(memory.buffer)
  const X = Float32Array.from({ length: sizes[1] }, rand)
  const W = Float32Array.from({ length: sizes[2] }, rand)
  view.set(X, layout.get(1).base / 4)
  view.set(W, layout.get(2).base / 4)
  view.fill(NaN, layout.get(0).base / 4, layout.get(0).base / 4 + sizes[0])
  progs.forEach((_, i) => {
    for (let part = 0; part < parts; part++) inst.exports[`k${i}`](...(parts > 1 ? [part, parts] : []))
  })
  const out = view.subarray(layout.get(0).base / 4)
  let worst = 0
  for (let ch = 0; ch < C; ch++) {
    for (let y = 0; y < O; y++) {
      for (let x = 0; x < O; x++) {
        let exact = pool ? -Infinity : 0
        let mag = 0
        for (let ky = 0; ky < 3; ky++) {
          for (let kx = 0; kx < 3; kx++) {
            const [iy, ix] = [stride * y + ky - pad, stride * x + kx - pad]
            if (iy < 0 || iy >= S || ix < 0 || ix >= S) continue
            const v = X[ch * S * S + iy * S + ix]
            if (pool) {
              exact = Math.max(exact, v)
              continue
            }
            exact += v * W[ch * 9 + ky * 3 + kx]
            mag += Math.abs(v * W[ch * 9 + ky * 3 + kx])
          }
        }
        const got = out[ch * O * O + y * O + x]
        const err = pool ? (got === Math.fround(exact) ? 0 : Infinity) : Math.abs(got - exact) / (10 * 2 ** -24 * mag + 1e-30)
        worst = Math.max(worst, Number.isNaN(got) ? Infinity : err)
      }
    }
  }
  return worst
}

test('depthwise convolutions and max pools match a float64 reference at odd rows, strides 1 and 2, in slices', () => {
  for (const [C, S, stride, pad] of [[5, 7, 1, 1], [4, 9, 1, 1], [3, 14, 1, 1], [5, 9, 2, 1], [4, 14, 2, 1], [3, 15, 2, 0], [2, 20, 2, 0]]) {
    for (const pool of [false, true]) {
      for (const parts of [1, 2]) {
        const worst = windowError(C, S, stride, pool, parts, pad)
        assert.ok(worst <= 1, `C=${C} S=${S} stride ${stride} pad ${pad} ${pool ? 'max pool' : 'depthwise'} parts=${parts}: error ${worst.toFixed(2)} x its bound`)
      }
    }
  }
})
