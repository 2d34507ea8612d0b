'use strict'
/**
 * The linearize pass: a lowered kernel -> a structured program that every emitter walks (WebAssembly,
 * plain JavaScript).
 *
 * Stage: linearizing, between lowering (lower.js) and emitting. Input: kernel IR after applyOpts, the set
 * of vector ranges and the lane width. Output: a Program whose body is a tree of instructions:
 *
 *   const var                      constants and integer parameters (the head, first)
 *   loop {start, end, pre, body}   a loop over [start, end); `pre` runs once before it (hoisted values)
 *   acc update read                an accumulator: defined before its loops, updated inside, read after
 *   if {cond, body}                a gated store, or one copy of a versioned loop (versionGatedLoops)
 *   load store alu bcast           memory, arithmetic, a scalar broadcast into lanes
 *   hsum {src: [init, a0..a3]}     lane j = init + the sum of a_j's lanes (a split reduction's lane epilogue)
 *
 * It follows polygrad's renderer/linearize.py (loop order, accumulators, lanes, the fallback to scalar
 * code), with three differences suited to emitters without a C compiler behind them:
 * - `upcast` ranges are unrolled here: each point is emitted with the range replaced by a constant, and a
 *   value is keyed by the upcast values it depends on, so a load shared by a register tile is one load;
 * - every value is placed in the outermost loop its operands allow (loop-invariant code motion): a bias or
 *   a row's scale is loaded once per row, not once per reduction step;
 * - one vector range per kernel becomes lanes (4 x 32 bits, wasm SIMD). A reduce over the lanes (the
 *   final sum of a split reduction) folds them in order 0..3. Anything without a lane form (integer
 *   division, 64-bit or 16-bit lanes, gathers of narrow types) makes the whole kernel scalar again.
 *   Where the store after such a fold moves contiguously along a 4-point upcast range (the columns of an
 *   x @ W.T tile), that range becomes the lanes of the epilogue instead (laneEpilogue): the columns' partial
 *   sums fold in one `hsum` and bias, activation and store run once per 4 columns.
 * Loads and stores whose index the validator could not prove in bounds carry `check` (emitters trap).
 */

const { DTYPES } = require('./dtypes')
const { toposort } = require('./ir')
const { rangeCoeff, simplifyIndices } = require('./simplify')
const { topLevelReduces } = require('./lower')
const { KernelError } = require('./errors')
const { aluFn } = require('./scalar')

function constValue (x) {
  const d = x.dtype
  if (d.isBool) return x.value ? 1 : 0
  if (d.bits === 64) return d.isUnsigned ? BigInt.asUintN(64, BigInt(x.value)) : BigInt.asIntN(64, BigInt(x.value))
  return Number(x.value)
}

class NoVector extends Error {}

// the parameters of a threaded kernel phase (linearize with split): which slice of its first loop it runs.
// '#' is no Variable's first character (names are identifiers), so these never meet a Variable's name.
const PART = '#part'
const PARTS = '#parts'

const F32_LANE_OPS = new Set(['ADD', 'MUL', 'NEG', 'FDIV', 'MAX', 'CMPLT', 'CMPLE', 'CMPNE', 'CMPEQ', 'WHERE', 'SQRT', 'TRUNC',
  'RECIPROCAL', 'CAST', 'BITCAST'])
const I32_LANE_OPS = new Set(['ADD', 'MUL', 'NEG', 'AND', 'OR', 'XOR', 'SHL', 'SHR', 'CMPLT', 'CMPLE', 'CMPNE', 'CMPEQ', 'WHERE',
  'MAX', 'CAST', 'BITCAST', 'TRUNC'])
const BOOL_LANE_OPS = new Set(['ADD', 'MUL', 'NEG', 'MAX', 'CMPLT', 'CMPLE', 'CMPNE', 'CMPEQ', 'AND', 'OR', 'XOR', 'WHERE', 'CAST'])
const LANE_DTYPES = new Set(['float32', 'int32', 'uint32', 'bool'])
// 8-bit integers in lanes: each lane an i32 holding the value extended (zero for uint8, sign for int8), so
// a CAST to 32 bits is free and a CAST to float32 one convert. Only what a quantized weight's dequantization
// does with its uint8 blocks has a lane form: a contiguous load, a BITCAST between the two, a CAST out.
const NARROW_LANE_DTYPES = new Set(['uint8', 'int8'])
// the most points of one rowDotReduce, straight code (a Q8_0 or Q4_0 block's 32: 8 dot4s)
const ROW_DOT_POINTS = 64
const LEAVES = new Set(['CONST', 'RANGE', 'DEFINE_VAR', 'REDUCE']) // value() computes these without operands first

function identity (op, d) {
  if (op === 'ADD') return 0
  if (op === 'MUL') return 1
  if (d.isFloat) return -Infinity
  if (d.isBool) return false
  if (d.isUnsigned) return 0
  return d.bits === 64 ? -(2n ** 63n) : -(2 ** (d.bits - 1))
}

class Linearizer {
  constructor (g, ast, { vector, width, check, split = false, block = null, version = false, dot = false, dotLanes = false }) {
    this.g = g
    this.dot = dot // int32 sums of 4 byte products as one `dot4` (relaxed SIMD's int8 dot product; dotOf)
    // ... or, where the engine has no relaxed dot product, as a standard-SIMD one (i32x4.dot_i16x8_s; dotOf)
    this.dotLanes = dotLanes
    this.version = version // versionGatedLoops after linearizing (the SIMD target)
    this.split = split // the first top-level loop runs the slice [start, end) of part PART of PARTS
    this.onlyBlock = block // emit only this block of the kernel (a phase of a threaded kernel)
    this.ast = ast
    this.vectorRanges = vector
    this.width = width
    this.check = check || (() => false)
    this.V = null
    this.head = []
    this.consts = new Map()
    this.vars = new Map()
    this.env = new Map()
    this.depsMemo = new Map()
    this.levels = [{ block: [], cse: new Map(), loop: null }]
    this.open = new Map() // RANGE -> loop inst
    this.nextId = 0
    this.laneIndexCache = new Map()
    this.coeffCache = new Map()
  }

  inst (k, dtype, lanes, fields) {
    return Object.assign({ k, dtype, lanes, id: this.nextId++, level: 0 }, fields)
  }

  get depth () {
    return this.levels.length - 1
  }

  place (x, level) {
    x.level = level
    if (level >= this.depth) this.levels[this.depth].block.push(x)
    else this.levels[level + 1].loop.pre.push(x)
    return x
  }

  // ---- dependencies
  deps (u) {
    let d = this.depsMemo.get(u)
    if (d) return d
    for (const n of toposort(u)) {
      if (this.depsMemo.has(n)) continue
      let s
      if (n.op === 'RANGE') {
        s = new Set([n])
      } else {
        s = new Set()
        for (const x of n.src) for (const r of this.depsMemo.get(x)) s.add(r)
        if (n.op === 'REDUCE') for (const r of n.src.slice(1)) s.delete(r)
      }
      this.depsMemo.set(n, s)
    }
    d = this.depsMemo.get(u)
    return d
  }

  key (u) {
    let k = String(u.id)
    for (const r of this.deps(u)) if (this.env.has(r)) k += `,${r.id}=${this.env.get(r)}`
    return k
  }

  lookup (k) {
    for (let i = this.depth; i >= 0; i--) {
      const hit = this.levels[i].cse.get(k)
      if (hit !== undefined) return hit
    }
    return undefined
  }

  remember (k, x) {
    this.levels[Math.min(x.level, this.depth)].cse.set(k, x)
    return x
  }

  // ---- constants and broadcasts (the head)
  const (dtype, value, lanes = 1) {
    const k = `${dtype.name}|${lanes}|${Array.isArray(value) ? value.join(',') : (typeof value === 'number' && Object.is(value, -0) ? '-0' : String(value))}`
    let x = this.consts.get(k)
    if (!x) {
      x = this.inst('const', dtype, lanes, { value })
      this.consts.set(k, x)
      this.head.push(x)
    }
    return x
  }

  bcast (x, n) {
    if (x.lanes === n) return x
    if (x.lanes !== 1) throw new NoVector(`${x.lanes} lanes where ${n} are needed`)
    if (!LANE_DTYPES.has(x.dtype.name)) throw new NoVector(`${x.dtype.name} lanes`)
    if (x.k === 'const') {
      const k = `bcast|${x.id}|${n}`
      let b = this.consts.get(k)
      if (!b) {
        b = this.inst('bcast', x.dtype, n, { src: [x] })
        this.consts.set(k, b)
        this.head.push(b)
      }
      return b
    }
    const k = `bcast|${x.id}|${n}`
    const hit = this.lookup(k)
    if (hit) return hit
    return this.remember(k, this.place(this.inst('bcast', x.dtype, n, { src: [x] }), x.level))
  }

  // ---- values
  /**
   * The instruction computing u. The operands of ALU ops and loads are computed first, sources before
   * users, with an explicit stack, so a dependency chain of any length never deepens the call stack; only
   * reduces recurse (reduce -> value of its body), as deep as they nest.
   */
  value (u) {
    const todo = [[u, false]]
    while (todo.length) {
      const [n, expanded] = todo.pop()
      if (expanded) {
        if (n !== u) this.valueOf(n)
        continue
      }
      if (LEAVES.has(n.op) || this.lookup(this.key(n)) !== undefined) continue
      todo.push([n, true])
      const srcs = this.operandsOf(n)
      for (let i = srcs.length - 1; i >= 0; i--) todo.push([srcs[i], false])
    }
    return this.valueOf(u)
  }

  /** The nodes valueOf(n) asks the value of, in its order (a load: its gate, then its index unless the
   * vector range makes that index a lane index, which access() derives itself). */
  operandsOf (n) {
    if (n.op !== 'LOAD') return n.src
    const index = n.src[0]
    const out = index.src.length > 2 ? [index.src[2]] : []
    if (this.V === null || !this.deps(index).has(this.V)) out.push(index.src[1])
    return out
  }

  valueOf (u) {
    const op = u.op
    if (op === 'CONST') return this.const(u.dtype, u.arg)
    if (op === 'RANGE') {
      if (u === this.V) return this.const(u.dtype, [0, 1, 2, 3].slice(0, this.width), this.width)
      if (this.env.has(u)) return this.const(u.dtype, this.env.get(u))
      const loop = this.open.get(u)
      if (!loop) throw new KernelError(`range ${u.arg[0]} is used outside its loop`)
      return loop
    }
    if (op === 'DEFINE_VAR') return this.variable(u.arg[0], u.dtype)
    const k = this.key(u)
    const hit = this.lookup(k)
    if (hit) return hit
    if (op === 'REDUCE') {
      this.reduce(u)
      const r = this.lookup(k)
      if (!r) throw new KernelError('internal: a reduce was not emitted')
      return r
    }
    let x
    if (op === 'LOAD') {
      x = this.load(u)
    } else {
      x = this.alu(u.op, u.dtype, u.src.map((s) => this.value(s)))
    }
    return this.remember(k, x)
  }

  /** The function parameter holding Variable `name` (or PART / PARTS of a threaded kernel). */
  variable (name, dtype) {
    let x = this.vars.get(name)
    if (!x) {
      x = this.inst('var', dtype, 1, { name })
      this.vars.set(name, x)
      this.head.push(x)
    }
    return x
  }

  alu (op, dtype, src) {
    if (op === 'OR' && src.length === 2) {
      // a <= b written as a < b or a == b (ReLU's mask): one comparison
      const [x, y] = src
      const pair = (p, q) => p.k === 'alu' && q.k === 'alu' && p.op === 'CMPLT' && q.op === 'CMPEQ' && p.src[0] === q.src[0] && p.src[1] === q.src[1]
      if (pair(x, y) || pair(y, x)) return this.alu('CMPLE', dtype, (pair(x, y) ? x : y).src)
    }
    let n = 1
    for (const s of src) n = Math.max(n, s.lanes)
    if (n > 1) {
      const from = src[0].dtype
      if (NARROW_LANE_DTYPES.has(from.name) || NARROW_LANE_DTYPES.has(dtype.name)) return this.narrowAlu(op, dtype, src, n)
      for (const d of [dtype, ...src.map((s) => s.dtype)]) if (!LANE_DTYPES.has(d.name)) throw new NoVector(`${d.name} lanes`)
      const table = dtype.isBool && (op !== 'CAST' || from.isBool) ? BOOL_LANE_OPS : (dtype.isFloat || from.isFloat) ? F32_LANE_OPS : I32_LANE_OPS
      if (!table.has(op)) throw new NoVector(`no lanes for ${op} on ${dtype.name}`)
      if ((op === 'SHL' || op === 'SHR') && src[1].lanes > 1) throw new NoVector('a shift by lanes')
      if (op === 'BITCAST' && (dtype.isBool || from.isBool)) throw new NoVector('bool BITCAST lanes')
      src = src.map((s, i) => ((op === 'SHL' || op === 'SHR') && i === 1 ? s : this.bcast(s, n)))
    }
    if (n === 1 && !dtype.isFloat && src.every((s) => s.k === 'const') && op !== 'BITCAST' && !src[0].dtype.isFloat) {
      const fn = aluFn(op, dtype, src[0].dtype)
      const v = fn && fn(...src.map((s) => constValue(s)))
      if (v !== null && v !== undefined) return this.const(dtype, typeof v === 'bigint' ? v : Number(v))
    }
    if (n === 1 && dtype.isInt && (op === 'ADD' || op === 'MUL')) {
      const [a, b] = src
      const unit = op === 'ADD' ? 0 : 1
      if (b.k === 'const' && Number(b.value) === unit && a.dtype === dtype) return a
      if (a.k === 'const' && Number(a.value) === unit && b.dtype === dtype) return b
      if (op === 'MUL' && ((b.k === 'const' && Number(b.value) === 0) || (a.k === 'const' && Number(a.value) === 0))) return this.const(dtype, 0)
    }
    let level = 0
    for (const s of src) level = Math.max(level, s.level)
    return this.place(this.inst('alu', dtype, n, { op, src }), level)
  }

  /** A lane op on 8-bit integer lanes (NARROW_LANE_DTYPES): a BITCAST between uint8 and int8, a CAST of one to
   * a 32-bit lane type, or a shift right by a scalar or an AND of one and a scalar of its type (Q4_0's nibbles,
   * `(byte >> 4h) & 15`: each lane's value extended to 32 bits, shifted or masked as the scalar code does, stays
   * the extended 8-bit result), or an ADD of a scalar of its type (Q4_0's `nibble - 8` in int8, nn/quant.py
   * _offset: the 32-bit sum wrapped to 8 bits as the scalar code wraps it, wasm/emit.js vectorAlu); anything else
   * has no lane form here. */
  narrowAlu (op, dtype, [x, y], n) {
    const from = x.dtype
    const bitcast = op === 'BITCAST' && NARROW_LANE_DTYPES.has(dtype.name) && NARROW_LANE_DTYPES.has(from.name)
    const widen = op === 'CAST' && NARROW_LANE_DTYPES.has(from.name) && LANE_DTYPES.has(dtype.name) && !dtype.isBool
    const bits = (op === 'SHR' || op === 'AND') && dtype === from && y !== undefined && y.dtype === from && y.lanes === 1
    const add = op === 'ADD' && dtype === from && y !== undefined && y.dtype === from && y.lanes === 1
    if (!bitcast && !widen && !bits && !add) throw new NoVector(`no lanes for ${op} from ${from.name} to ${dtype.name}`)
    if (x.lanes === 1) throw new NoVector(`${from.name} lanes`)
    if (add) return this.place(this.inst('alu', dtype, n, { op, src: [x, this.place(this.inst('bcast', from, n, { src: [y] }), y.level)] }), Math.max(x.level, y.level))
    if (bits) {
      // a shift's count stays a scalar (wasm's i32x4.shr_u/s); a mask is splat into the lanes
      const scalar = op === 'SHR' ? y : this.place(this.inst('bcast', from, n, { src: [y] }), y.level)
      return this.place(this.inst('alu', dtype, n, { op, src: [x, scalar] }), Math.max(x.level, y.level))
    }
    if (bitcast && x.k === 'load') {
      // the same bytes loaded with the other extension (wasm/emit.js emitLoad): int8 weights (Q8_0) are
      // sign-extended as they are widened, not widened and then shifted
      const k = `narrow|${x.id}|${dtype.name}`
      const hit = this.lookup(k)
      if (hit) return hit
      return this.remember(k, this.place(Object.assign(this.inst('load', dtype, x.lanes, {}), { buf: x.buf, idx: x.idx, gate: x.gate, mode: x.mode, check: x.check }), x.level))
    }
    return this.place(this.inst('alu', dtype, x.lanes, { op, src: [x] }), x.level)
  }

  laneIndex (expr) {
    // expr with the vector range set to 0: the index of lane 0 of a contiguous access (cached: every
    // unrolled point of a tile asks for the same expression)
    const key = expr.id + ':' + this.V.id
    let hit = this.laneIndexCache.get(key)
    if (hit === undefined) {
      const zero = this.g.const(this.V.dtype, 0)
      hit = simplifyIndices(this.g, this.g.substitute(expr, new Map([[this.V, zero]])))
      this.laneIndexCache.set(key, hit)
    }
    return hit
  }

  access (index, { strided = false } = {}) {
    const gate = index.src.length > 2 ? this.value(index.src[2]) : null
    if (this.V === null || !this.deps(index).has(this.V)) return { idx: this.value(index.src[1]), gate, mode: 'scalar', lanes: gate ? gate.lanes : 1 }
    const ck = index.src[1].id + ':' + this.V.id
    let c = this.coeffCache.get(ck)
    if (c === undefined) {
      c = rangeCoeff(index.src[1], this.V)
      this.coeffCache.set(ck, c)
    }
    if (c === 1) return { idx: this.value(this.laneIndex(index.src[1])), gate, mode: 'contiguous', lanes: this.width }
    // a load every second element (a stride-2 window's row): two vector loads and a shuffle (wasm/emit.js);
    // not under a scalar gate or a run-time check (those go lane by lane)
    if (strided && c === 2 && this.width === 4 && index.dtype.size === 4 && (gate === null || gate.lanes > 1) && !this.check(index)) {
      return { idx: this.value(this.laneIndex(index.src[1])), gate, mode: 'strided', lanes: this.width }
    }
    const idx = this.value(index.src[1])
    if (idx.lanes === 1 && (gate === null || gate.lanes === 1)) return { idx, gate, mode: 'scalar', lanes: 1 }
    return { idx: this.bcast(idx, this.width), gate, mode: 'gather', lanes: this.width }
  }

  load (u) {
    const index = u.src[0]
    const a = this.access(index, { strided: true })
    if (a.mode === 'scalar' && a.lanes > 1) {
      // a scalar address under a lane gate: gather the same element
      a.idx = this.bcast(a.idx, a.lanes)
      a.mode = 'gather'
    }
    // bool lanes are masks (0 or -1): a bool buffer's bytes load in lanes only contiguously and ungated (an
    // attention mask along a score row), widened by the emitter; so do 8-bit integers (NARROW_LANE_DTYPES)
    const narrow = NARROW_LANE_DTYPES.has(u.dtype.name)
    if (a.lanes > 1 && narrow && (a.mode !== 'contiguous' || a.gate)) throw new NoVector(`${u.dtype.name} gathers in lanes`)
    const boolLanes = u.dtype.isBool && (a.mode !== 'contiguous' || a.gate)
    if (a.lanes > 1 && !narrow && (!LANE_DTYPES.has(u.dtype.name) || boolLanes)) throw new NoVector(`${u.dtype.name} loads in lanes`)
    let level = a.idx.level
    if (a.gate) level = Math.max(level, a.gate.level)
    return this.place(this.inst('load', u.dtype, a.lanes, {
      buf: index.src[0].arg[0], idx: a.idx, gate: a.gate, mode: a.mode, check: this.check(index)
    }), level)
  }

  // ---- reduces
  upcastPoints (ranges) {
    // every combination of values of these (unrolled) ranges, as lists of [range, value]
    let points = [[]]
    for (const r of ranges) {
      const n = Number(r.src[0].arg)
      const next = []
      for (const p of points) for (let i = 0; i < n; i++) next.push([...p, [r, i]])
      points = next
    }
    return points
  }

  withEnv (point, fn) {
    for (const [r, v] of point) this.env.set(r, v)
    try {
      return fn()
    } finally {
      for (const [r] of point) this.env.delete(r)
    }
  }

  /** Emit red's accumulators and loops for every point of its free upcast ranges, once. */
  ensure (red) {
    const k = 'emitted:' + this.key(red)
    if (this.lookup(k)) return
    this.reduce(red)
    this.levels[this.depth].cse.set(k, true)
  }

  reduce (red) {
    if (this.rowDotReduce(red) || ((this.dot || this.dotLanes) && this.dotReduce(red))) return
    const body = red.src[0]
    const own = red.src.slice(1)
    const free = [...this.deps(red)].filter((r) => r.arg[1] === 'upcast' && r !== this.V && !this.env.has(r) && !this.open.has(r))
      .sort((a, b) => a.arg[0] - b.arg[0])
    const lanes = this.V !== null && this.deps(red).has(this.V) ? this.width : 1
    const overLanes = this.V !== null && own.includes(this.V)
    if (overLanes && own[own.length - 1] !== this.V) throw new NoVector('a reduce over the lanes and later ranges')
    if ((lanes > 1 || overLanes) && !LANE_DTYPES.has(red.dtype.name)) throw new NoVector(`${red.dtype.name} lanes`)
    const accLanes = overLanes ? 1 : lanes
    const points = this.upcastPoints(free)
    const init = this.const(red.dtype, identity(red.arg, red.dtype))
    const accs = points.map(() => this.place(this.inst('acc', red.dtype, accLanes, { src: [accLanes > 1 ? this.bcast(init, accLanes) : init] }), this.depth))
    const loops = own.filter((r) => r.arg[1] !== 'upcast')
    const unrolled = own.filter((r) => r.arg[1] === 'upcast' && r !== this.V)
    // partial reduces that do not move with this reduce's loops (the partial sums of a split reduction)
    // are emitted first, all tile points in one loop nest
    for (const inner of topLevelReduces(body)) {
      if (!loops.some((r) => this.deps(inner).has(r))) this.ensure(inner)
    }
    for (const r of loops) this.openLoop(r)
    points.forEach((p, i) => this.withEnv(p, () => {
      for (const q of this.upcastPoints(unrolled)) {
        this.withEnv(q, () => {
          let v = this.value(body)
          if (overLanes) {
            v = this.bcast(v, this.width)
            this.place(this.inst('update', null, 1, { acc: accs[i], op: red.arg, src: [v], fold: true }), this.depth)
          } else {
            this.place(this.inst('update', null, accLanes, { acc: accs[i], op: red.arg, src: [this.bcast(v, accLanes)], fold: false }), this.depth)
          }
        })
      }
    }))
    for (let j = loops.length - 1; j >= 0; j--) this.closeLoop(loops[j])
    points.forEach((p, i) => this.withEnv(p, () => {
      const read = this.place(this.inst('read', red.dtype, accLanes, { acc: accs[i] }), this.depth)
      this.levels[this.depth].cse.set(this.key(red), read)
    }))
  }

  // ---- int8 dot products
  /**
   * An int32 sum over 4 points of a product of two bytes in lanes (a quantized decode matvec's block sums on
   * 8-bit activations: polygrad's nn/quant.py _int8_matmul_t, one sum per lane over 4 turns) as one `dot4`:
   * each operand's 16 bytes in a v128 (`bytes`; a load's 4 lanes at each point gathered with no widening, or
   * a computed byte value narrowed), lane j = the sum of its 4 points' products (relaxed SIMD's
   * i32x4.relaxed_dot_i8x16_i7x16_add_s, wasm/emit.js emitDot4). Exact integer arithmetic, so the lanes equal
   * the loop's (the plain path). Returns false, having emitted nothing, for any other reduce.
   */
  dotReduce (red) {
    const shape = this.dotOf(red)
    if (!shape) return false
    // where relaxed SIMD's dot4 applies, the standard one's pair form still goes first where it applies
    // (pairHalves: 16-byte loads, no gathered lanes, no second dot for an offset)
    const alt = !shape.signs && this.dotLanes ? this.dotOf(red, false) : null
    const free = [...this.deps(red)].filter((r) => r.arg[1] === 'upcast' && r !== this.V && !this.env.has(r) && !this.open.has(r))
      .sort((a, b) => a.arg[0] - b.arg[0])
    const points = this.upcastPoints(red.src.slice(1))
    for (const p of this.upcastPoints(free)) {
      this.withEnv(p, () => {
        const own = red.src.slice(1)
        const pairShape = shape.signs ? shape : alt
        const wide = pairShape ? this.pairHalves(pairShape, points, own, free) : null
        if (wide) {
          const x = this.inst('dot4', red.dtype, this.width, { src: wide, offset: 0, signs: pairShape.signs, wide: true })
          let level = 0
          for (const v of wide) level = Math.max(level, v.level)
          this.remember(this.key(red), this.place(x, level))
          return
        }
        const [a, b] = [shape.a, shape.b].map((o) => this.dotBytes(o, points, own, shape.signs))
        const fields = shape.signs ? { src: [a, b], offset: 0, signs: shape.signs, pairs: true } : { src: [a, b], offset: shape.b.offset }
        const x = this.inst('dot4', red.dtype, this.width, fields)
        this.remember(this.key(red), this.place(x, Math.max(a.level, b.level)))
      })
    }
    return true
  }

  /** {a, b} when red is a dot4 (see dotReduce): a the signed operand, b the 7-bit one (values in [0, 127],
   * relaxed SIMD's second operand: a Q4_0 nibble) with its int32 offset; else null. A second operand of 8 bits
   * (Q8_0's int8 weights) stays on the plain path: split into two 7-bit parts, two dot products and the
   * split measured slower than 32-bit lanes on x86 without AVX-VNNI (Chromium 156, Zen 4: GPT-2's Q8_0 fc
   * matvec 131.5 against 125.5 us a cache-resident slice; Q4_0's 135.5 against 216), so no split is made. */
  dotOf (red, relaxed = true) {
    const own = red.src.slice(1)
    const body = red.src[0]
    if (this.V === null || this.width !== 4 || red.arg !== 'ADD' || red.dtype.name !== 'int32' || !this.deps(red).has(this.V)) return null
    if (own.includes(this.V) || own.some((r) => r.src[0].op !== 'CONST') || own.reduce((n, r) => n * Number(r.src[0].arg), 1) !== 4) return null
    if (body.op !== 'MUL') return null
    const ops = body.src.map((u) => this.dotOperand(u, own))
    if (ops.some((o) => o === null)) return null
    // the signed operand: bytes of int8 (or of values in [0, 127]) with no offset
    const signedOk = (o) => o.offset === 0 && (o.signed || o.seven)
    const first = ops[1].seven && signedOk(ops[0]) ? 0 : ops[0].seven && signedOk(ops[1]) ? 1 : -1
    if (relaxed && this.dot && first >= 0) return { a: ops[first], b: ops[1 - first] }
    if (!this.dotLanes) return null
    // standard SIMD (emit.js emitDot4Lanes): bytes of either sign, widened to 16 bits by it; an offset is added to
    // the bytes where every value stays a byte (Q4_0's nibble - 8: [-8, 7], signed)
    const fits = (o) => o.offset === 0 || (o.mask >= 0 && o.offset >= -128 && o.mask + o.offset <= 127)
    if (!ops.every(fits)) return null
    return { a: ops[0], b: ops[1], signs: ops.map((o) => o.signed || o.offset !== 0) }
  }

  /** An int32 operand of a dot4: CAST(int32, e) (+ an int32 constant) for e an 8-bit value in lanes: {e, load
   * (e's bytes read straight from memory), signed, seven (values in [0, 127]), offset}; null for anything else. */
  dotOperand (u, own) {
    let offset = 0
    if (u.op === 'ADD' && u.src[1].op === 'CONST') {
      offset = Number(u.src[1].arg)
      u = u.src[0]
    }
    if (u.op !== 'CAST' || u.dtype.name !== 'int32' || !NARROW_LANE_DTYPES.has(u.src[0].dtype.name)) return null
    const e = u.src[0]
    if (!this.deps(e).has(this.V)) return null
    const signed = e.dtype.name === 'int8'
    // values in [0, 127] (a Q4_0 nibble, `... & 15`) are a 7-bit operand as they are
    const mask = e.op === 'AND' && e.src[1].op === 'CONST' ? Number(e.src[1].arg) : -1
    const seven = mask >= 0 && mask <= 127
    const raw = e.op === 'LOAD' ? e : e.op === 'BITCAST' && e.src[0].op === 'LOAD' && NARROW_LANE_DTYPES.has(e.src[0].dtype.name) ? e.src[0] : null
    let load = null
    if (raw) {
      const index = raw.src[0]
      const ix = index.src[1]
      const steps = own.map((r) => rangeCoeff(ix, r))
      if (index.src.length === 2 && !this.check(index) && rangeCoeff(ix, this.V) === 1 && steps.every((c) => c !== null && c >= 0)) {
        load = { index, steps }
      }
    }
    return { e, load, signed, seven, offset, mask }
  }

  /** A dot4 operand's 16 bytes (byte 4j + k: lane j at point k, so the dot's groups of 4 are the lanes; with
   * `signs`, the standard-SIMD dot's layout: byte 8h + 2j + m lane j at point 2h + m, so each 16-bit pair of a
   * half is one lane's two points), its offset added to each byte (signs: see dotOf). */
  dotBytes (o, points, own, signs) {
    const pairs = !!signs
    const add = pairs ? o.offset : 0
    if (o.load) {
      // the 4 lanes at every point, read from the address at point 0 plus each point's constant step
      const zero = own.map((r) => [r, 0])
      const idx = this.withEnv(zero, () => this.value(this.laneIndex(o.load.index.src[1])))
      const offsets = points.map((p) => p.reduce((sum, [, v], i) => sum + v * o.load.steps[i], 0))
      const k = `bytes|${o.load.index.src[0].arg[0]}|${idx.id}|${offsets.join(',')}|${pairs}|${add}`
      const hit = this.lookup(k)
      if (hit) return hit
      return this.remember(k, this.place(this.inst('bytes', o.e.dtype, 16, { src: [idx], buf: o.load.index.src[0].arg[0], offsets, pairs, add }), idx.level))
    }
    const parts = points.map((p) => this.withEnv(p, () => this.value(o.e)))
    if (parts.some((x) => x.lanes !== this.width)) throw new NoVector('a dot operand without lanes')
    const k = `bytes|narrow|${parts.map((x) => x.id).join(',')}|${pairs}|${add}`
    const hit = this.lookup(k)
    if (hit) return hit
    let level = 0
    for (const x of parts) level = Math.max(level, x.level)
    return this.remember(k, this.place(this.inst('bytes', o.e.dtype, 16, { src: parts, buf: null, offsets: null, pairs, add }), level))
  }

  /**
   * A standard-SIMD dot4's operands where each is a block of 8 lanes x 4 turns (nn/quant.py _int8_matmul_t: the
   * turns 8 bytes apart, the lanes 2 vectors, the second an unrolled range 4 bytes on): [a0, a1, b0, b1], 16-bit
   * lanes (`widen`) of this vector's half of each operand's two pair vectors (`unpack`: bytes interleaved so
   * each 16-bit pair is one lane's turns 0 and 2, or 1 and 3), read once for both vectors of lanes: a Q8_0
   * block's 32 bytes are two 16-byte loads, a Q4_0 block's 16 nibble bytes one (pairOperand). Null, having
   * emitted nothing, where either operand is not such a block.
   */
  pairHalves (shape, points, own, free = []) {
    if (points.length !== 4) return null
    // both operands checked first (no instruction made), then made
    const fit = [shape.a, shape.b].map((o) => this.pairOperand(o, points, own, true))
    if (fit.some((o) => o === null) || fit[0] !== fit[1]) return null
    const ops = [shape.a, shape.b].map((o) => this.pairOperand(o, points, own, false))
    const half = this.env.get(ops[0].group)
    // one operand of each 16-bit dot widened by an interleave and a shift (emit.js emitWiden `spread`), never
    // both by extend: the one the tile's columns share (the activations), widened once for all of them
    const shared = [shape.a, shape.b].map((o) => !free.some((r) => this.deps(o.e).has(r)))
    const spreadAt = shared[1] && !shared[0] ? 1 : 0
    const out = []
    ops.forEach((o, i) => {
      for (const pv of o.pairs) {
        const spread = i === spreadAt
        const k = `widen|${pv.id}|${half}|${shape.signs[i]}|${spread}`
        out.push(this.lookup(k) || this.remember(k, this.place(this.inst('widen', DTYPES.int16, 8, { src: [pv], high: half === 1, signed: shape.signs[i], spread }), pv.level)))
      }
    })
    return [out[0], out[1], out[2], out[3]]
  }

  /**
   * One dot4 operand's two pair vectors (pairHalves): {pairs: [P0, P1], group: the unrolled range of its 2
   * vectors of lanes}, P0 the bytes of points 0 and 2 interleaved (lane 4g + j of vector g at bytes 8g + 2j and
   * 8g + 2j + 1), P1 of points 1 and 3; or null. Either the bytes as read (points 1 and 3 the 8 bytes after 0
   * and 2: two 16-byte loads A, B, P0 = A and B's first halves interleaved, P1 their second), or byte ops (a
   * shift, a mask, the offset) on one byte load whose points 0 and 2 read the same bytes, and 1 and 3 the 8 after
   * (a Q4_0 block's low and high nibbles): the ops at point 0 and at point 2, interleaved.
   */
  pairOperand (o, points, own, dry) {
    let e = o.e
    const ops = []
    while (e.op === 'AND' || e.op === 'XOR' || e.op === 'SHR') {
      if (!NARROW_LANE_DTYPES.has(e.dtype.name) || e.src[0].dtype !== e.dtype || this.deps(e.src[1]).has(this.V)) return null
      if (e.op !== 'SHR' && e.src[1].op !== 'CONST') return null
      ops.unshift(e)
      e = e.src[0]
    }
    if (e.op === 'BITCAST' && !ops.length) e = e.src[0]
    if (e.op !== 'LOAD' || !NARROW_LANE_DTYPES.has(e.dtype.name)) return null
    const index = e.src[0]
    if (index.src.length !== 2 || this.check(index)) return null
    const ix = index.src[1]
    if (rangeCoeff(ix, this.V) !== 1) return null
    const coeffs = own.map((r) => rangeCoeff(ix, r))
    if (coeffs.some((c) => c === null || c < 0)) return null
    const at = points.map((p) => p.reduce((sum, [, v], i) => sum + v * coeffs[i], 0))
    // the unrolled range of the lanes' second vector: 4 bytes on, 2 values; no other unrolled range moves the
    // address by less than a block
    let group = null
    for (const [r] of this.env) {
      const c = rangeCoeff(ix, r)
      if (c === null || c < 0) return null
      if (c === 4 && r.src[0].op === 'CONST' && Number(r.src[0].arg) === 2 && group === null) group = r
      else if (c !== 0 && c < 32) return null
    }
    if (group === null) return null
    if (!ops.length && (o.offset !== 0 || at[1] !== at[0] + 8 || at[3] !== at[2] + 8)) return null
    if (ops.length && (at[2] !== at[0] || at[3] !== at[1] || at[1] !== at[0] + 8)) return null
    // the byte ops at a point (their counts and constants), then the offset (in range: dotOf); points 0 and 1
    // (and 2 and 3) must share them
    const opsAt = (p) => this.withSaved(p, () => {
      const list = ops.map((u) => [u.op, this.value(u.src[1])])
      if (o.offset) list.push(['ADD', this.const(DTYPES.int32, o.offset)])
      return list
    })
    const [lo, hi] = ops.length ? [opsAt(points[0]), opsAt(points[2])] : [null, null]
    if (ops.length) {
      if (opsAt(points[1]).some(([, y], i) => y !== lo[i][1]) || opsAt(points[3]).some(([, y], i) => y !== hi[i][1])) return null
      // scalar counts and constants; a shift's count a constant below 8 (i8x16.shr_u takes it modulo 8)
      if ([...lo, ...hi].some(([op, y]) => y.lanes !== 1 || (op === 'SHR' && (y.k !== 'const' || Number(y.value) < 0 || Number(y.value) > 7)))) return null
    }
    if (dry) return group
    const buf = index.src[0].arg[0]
    const idx = this.withSaved([...own.map((r) => [r, 0]), [group, 0]], () => this.value(this.laneIndex(ix)))
    const raw = (off) => {
      const k = `raw16|${buf}|${idx.id}|${off}`
      return this.lookup(k) || this.remember(k, this.place(this.inst('raw16', e.dtype, 16, { src: [idx], buf, off }), idx.level))
    }
    const unpack = (a, b, high) => {
      const k = `unpack|${a.id}|${b.id}|${high}`
      return this.lookup(k) || this.remember(k, this.place(this.inst('unpack', o.e.dtype, 16, { src: [a, b], high }), Math.max(a.level, b.level)))
    }
    if (!ops.length) {
      const [A, B] = [raw(at[0]), raw(at[2])]
      return { pairs: [unpack(A, B, false), unpack(A, B, true)], group }
    }
    const q = raw(at[0])
    const byteops = (list) => {
      const k = `byteops|${q.id}|${list.map(([op, y]) => op + y.id).join(',')}`
      let level = q.level
      for (const [, y] of list) level = Math.max(level, y.level)
      return this.lookup(k) || this.remember(k, this.place(this.inst('byteops', o.e.dtype, 16, { src: [q, ...list.map(([, y]) => y)], ops: list.map(([op]) => op) }), level))
    }
    const [L, H] = [byteops(lo), byteops(hi)]
    return { pairs: [unpack(L, H, false), unpack(L, H, true)], group }
  }

  /** fn() with env holding `point`'s values, each range's earlier value (or none) restored after. */
  withSaved (point, fn) {
    const before = point.map(([r]) => [r, this.env.has(r), this.env.get(r)])
    for (const [r, v] of point) this.env.set(r, v)
    try {
      return fn()
    } finally {
      for (const [r, had, v] of before) {
        if (had) this.env.set(r, v)
        else this.env.delete(r)
      }
    }
  }

  /**
   * An int32 sum of byte products whose weight bytes are not contiguous along the lanes (a prompt's x @ W.T on
   * polygrad's multi-row int8 route, nn/quant.py _int8_matmul_rows: the lanes 4 weight rows, each row's 4 bytes
   * of a turn contiguous): the reduce's points (at most ROW_DOT_POINTS) in groups of 4 along its last range,
   * each group one `dot4` over `rowBytes` (lane j's 4 bytes read together: one 4-byte load a lane, or one
   * splat where the lanes share them) and the groups' dot4s added. The dot4 is exact (int32 sums of 4
   * products), so the lanes equal the scalar loop's. Returns false, having emitted nothing, for any other reduce.
   */
  rowDotReduce (red) {
    const shape = this.rowDotOf(red)
    if (!shape) return false
    const own = red.src.slice(1)
    const last = own[own.length - 1]
    const free = [...this.deps(red)].filter((r) => r.arg[1] === 'upcast' && r !== this.V && !this.env.has(r) && !this.open.has(r))
      .sort((a, b) => a.arg[0] - b.arg[0])
    const groups = this.upcastPoints(own.slice(0, -1))
    // relaxed SIMD's int8 dot product where the engine has it (this.dot) and one operand is int8 bytes as read,
    // the other 7-bit (a Q4_0 nibble, `& 15`): its second operand; else the standard-SIMD dot4
    const seven = (o) => o.ops.length > 0 && o.ops[o.ops.length - 1][0] === 'AND' && Number(o.ops[o.ops.length - 1][1].arg) <= 127
    const plainSigned = (o) => o.signed && o.ops.length === 0
    const flip = seven(shape[0]) && plainSigned(shape[1])
    const relaxed = this.dot && (flip || (seven(shape[1]) && plainSigned(shape[0])))
    const order = flip ? [shape[1], shape[0]] : shape
    for (const p of this.upcastPoints(free)) {
      this.withEnv(p, () => {
        let sum = null
        for (const g of groups) {
          const [a, b] = order.map((o) => this.withEnv([...g, [last, 0]], () => this.rowBytes(o)))
          // signs: the standard-SIMD dot4 (emit.js emitDot4Lanes); none: relaxed SIMD's (emitDot4)
          const signs = relaxed ? undefined : order.map((o) => o.signed)
          const x = this.place(this.inst('dot4', red.dtype, this.width, { src: [a, b], offset: 0, signs }), Math.max(a.level, b.level))
          sum = sum === null ? x : this.place(this.inst('alu', red.dtype, this.width, { op: 'ADD', src: [sum, x] }), Math.max(sum.level, x.level))
        }
        this.remember(this.key(red), sum)
      })
    }
    return true
  }

  /** The two operands of a rowDotReduce ({load: INDEX, lane: the address's step along the lanes, ops: [[op,
   * UOp]] applied to the loaded bytes, signed}), or null. At least one operand moves along the lanes by neither
   * 0 nor 1 (the lanes' bytes are not one vector's), else the usual paths take the reduce. */
  rowDotOf (red) {
    if (this.V === null || this.width !== 4 || red.arg !== 'ADD' || red.dtype.name !== 'int32' || !this.deps(red).has(this.V)) return null
    const own = red.src.slice(1)
    if (own.includes(this.V) || own.some((r) => r.src[0].op !== 'CONST')) return null
    const points = own.reduce((n, r) => n * Number(r.src[0].arg), 1)
    const last = own[own.length - 1]
    if (Number(last.src[0].arg) !== 4 || points > ROW_DOT_POINTS || red.src[0].op !== 'MUL') return null
    const ops = red.src[0].src.map((u) => this.rowDotOperand(u, last))
    if (ops.some((o) => o === null) || !ops.some((o) => o.lane !== 0 && o.lane !== 1)) return null
    return ops
  }

  rowDotOperand (u, last) {
    if (u.op !== 'CAST' || u.dtype.name !== 'int32' || !NARROW_LANE_DTYPES.has(u.src[0].dtype.name)) return null
    const signed = u.src[0].dtype.name === 'int8'
    const ops = []
    let e = u.src[0]
    // byte ops on the loaded value: XOR or AND with a constant (Q8_0's ^ 0x80, Q4_0's & 15), a shift right by a
    // count that does not move along the lanes or the group (Q4_0's nibble, 4h)
    while (e.op !== 'LOAD') {
      if (!['XOR', 'AND', 'SHR'].includes(e.op) || e.src[0].dtype !== e.dtype || !NARROW_LANE_DTYPES.has(e.dtype.name)) return null
      const y = e.src[1]
      if (e.op !== 'SHR' && y.op !== 'CONST') return null
      if (this.deps(y).has(this.V) || this.deps(y).has(last)) return null
      ops.unshift([e.op, y])
      e = e.src[0]
    }
    const index = e.src[0]
    if (e.dtype !== u.src[0].dtype || index.src.length !== 2 || this.check(index)) return null
    const lane = rangeCoeff(index.src[1], this.V)
    if (rangeCoeff(index.src[1], last) !== 1 || lane === null || lane < 0) return null
    return { index, lane, ops, signed }
  }

  /** A rowDotReduce operand's 16 bytes at the group's point (in this.env): lane j's 4 bytes at byte 4j, read
   * once (`rowbytes`: Q4_0's two nibbles of a byte share it), then its byte ops (`byteops`). */
  rowBytes (o) {
    const idx = this.value(this.laneIndex(o.index.src[1]))
    const buf = o.index.src[0].arg[0]
    const k = `rowbytes|${buf}|${idx.id}|${o.lane}`
    let raw = this.lookup(k)
    if (!raw) raw = this.remember(k, this.place(this.inst('rowbytes', o.index.dtype, 16, { src: [idx], buf, lane: o.lane }), idx.level))
    if (!o.ops.length) return raw
    const ys = o.ops.map(([, y]) => this.value(y))
    const kk = `byteops|${raw.id}|${o.ops.map(([op], i) => op + ys[i].id).join(',')}`
    const hit = this.lookup(kk)
    if (hit) return hit
    let level = raw.level
    for (const y of ys) level = Math.max(level, y.level)
    return this.remember(kk, this.place(this.inst('byteops', o.index.dtype, 16, { src: [raw, ...ys], ops: o.ops.map(([op]) => op) }), level))
  }

  // ---- loops
  openLoop (r) {
    let start = this.const(r.dtype, 0)
    let end = this.value(r.src[0])
    if (this.split && this.depth === 0) {
      if (r.arg[1] !== 'global' || r.dtype.name !== 'int32') throw new KernelError(`internal: a threaded kernel's first loop must be a global int32 range, not ${r.arg[1]} ${r.dtype.name}`);
      ({ start, end } = this.slice(end, r.dtype))
      this.split = false
    }
    const loop = this.inst('loop', r.dtype, 1, { start, end, pre: [], body: [], axis: r.arg[0], kind: r.arg[1] })
    this.place(loop, this.depth)
    this.levels.push({ block: loop.body, cse: new Map(), loop })
    loop.level = this.depth
    this.open.set(r, loop)
  }

  /**
   * The slice of [0, n) that part PART of PARTS runs: q = n / PARTS points each, the first n % PARTS parts
   * one more; start = PART*q + min(PART, n % PARTS). No product exceeds n, so nothing overflows.
   */
  slice (n, int) {
    const part = this.variable(PART, int)
    const parts = this.variable(PARTS, int)
    const q = this.alu('IDIV', int, [n, parts])
    const rem = this.alu('MOD', int, [n, parts])
    const before = this.alu('CMPLT', DTYPES.bool, [part, rem])
    const start = this.alu('ADD', int, [this.alu('MUL', int, [part, q]), this.alu('WHERE', int, [before, part, rem])])
    const end = this.alu('ADD', int, [this.alu('ADD', int, [start, q]), this.alu('WHERE', int, [before, this.const(int, 1), this.const(int, 0)])])
    return { start, end }
  }

  closeLoop (r) {
    this.open.delete(r)
    this.levels.pop()
  }

  // ---- blocks
  store (st) {
    const [index, valueNode] = st.src
    let v = this.value(valueNode)
    if (valueNode.dtype !== index.dtype) v = this.alu('CAST', index.dtype, [v])
    const a = this.access(index)
    if (st.arg !== null) return this.accumulate(st, index, v, a)
    let { idx, gate, mode, lanes } = a
    if (mode === 'scalar' && v.lanes > 1) {
      idx = this.bcast(idx, v.lanes)
      mode = 'scatter'
      lanes = v.lanes
    }
    if (mode === 'scalar' && lanes > 1) {
      idx = this.bcast(idx, lanes)
      mode = 'scatter'
    }
    if (mode === 'gather') mode = 'scatter'
    if (lanes > 1) {
      if (!LANE_DTYPES.has(index.dtype.name) || index.dtype.isBool) throw new NoVector(`${index.dtype.name} stores in lanes`)
      v = this.bcast(v, lanes)
    }
    const x = this.inst('store', index.dtype, lanes, { buf: index.src[0].arg[0], idx, src: [v], gate: null, mode, check: this.check(index) })
    if (gate && gate.lanes > 1) {
      x.gate = gate
      this.place(x, this.depth)
    } else if (gate) {
      const cond = this.inst('if', null, 1, { cond: gate, body: [x] })
      this.place(cond, this.depth)
    } else {
      this.place(x, this.depth)
    }
  }

  /**
   * An accumulating store: load the element, fold the value in with the store's op, store it back, one point
   * at a time, inside the gate's `if`. The load and the op are placed at the store, never hoisted or shared
   * (the element changes between points).
   */
  accumulate (st, index, v, a) {
    if (a.lanes > 1 || v.lanes > 1) throw new NoVector('an accumulating store in lanes')
    const d = index.dtype
    const check = this.check(index)
    const old = this.inst('load', d, 1, { buf: index.src[0].arg[0], idx: a.idx, gate: null, mode: 'scalar', check })
    const sum = this.inst('alu', d, 1, { op: st.arg, src: [old, v] })
    const put = this.inst('store', d, 1, { buf: index.src[0].arg[0], idx: a.idx, src: [sum], gate: null, mode: 'scalar', check })
    for (const x of [old, sum, put]) x.level = this.depth
    if (a.gate) this.place(this.inst('if', null, 1, { cond: a.gate, body: [old, sum, put] }), this.depth)
    else for (const x of [old, sum, put]) this.place(x, this.depth)
  }

  // ---- the lane epilogue of a split reduction
  /**
   * {red, c} when a store's value folds a reduce over the lanes (the partial sums of a split reduction) and
   * a free upcast range `c` of `width` points moves the store contiguously: the column tile's partial sums
   * are then folded together (one `hsum`: lane j sums column j's partial lanes) and the rest of the store
   * (bias, activation, the store itself) runs in lanes over `c`. Null when anything after the reduce has no
   * lane form (checked before anything is emitted).
   */
  laneEpilogue (store) {
    if (this.V === null || this.width < 2 || store.op !== 'STORE' || store.arg !== null || this.deps(store).has(this.V)) return null
    const reds = topLevelReduces(store)
    if (reds.length !== 1) return null
    const red = reds[0]
    if (red.arg !== 'ADD' || red.src.length !== 2 || red.src[1] !== this.V || (red.dtype.name !== 'float32' && red.dtype.name !== 'int32')) return null
    const index = store.src[0]
    if (!LANE_DTYPES.has(index.dtype.name) || index.dtype.isBool) return null
    const c = [...this.deps(store)].find((r) => r.arg[1] === 'upcast' && !this.env.has(r) && r.src[0].op === 'CONST' &&
      Number(r.src[0].arg) === this.width && this.deps(red).has(r) && rangeCoeff(index.src[1], r) === 1)
    if (!c) return null
    const inside = new Set(toposort(red))
    for (const n of toposort(store)) {
      if (n === store || inside.has(n) || !this.deps(n).has(c)) continue
      if (n.op === 'INDEX' || n.op === 'RANGE') continue
      if (!LANE_DTYPES.has(n.dtype.name)) return null
      if (n.op === 'LOAD') {
        if (n.dtype.isBool) return null
        continue
      }
      const from = n.src[0].dtype
      const table = n.dtype.isBool && (n.op !== 'CAST' || from.isBool) ? BOOL_LANE_OPS : (n.dtype.isFloat || from.isFloat) ? F32_LANE_OPS : I32_LANE_OPS
      if (!table.has(n.op) || n.op === 'SHL' || n.op === 'SHR' || n.op === 'BITCAST' || n.src.some((x) => !LANE_DTYPES.has(x.dtype.name))) return null
    }
    return { red, c }
  }

  /** The store of a lane epilogue (laneEpilogue) for every point of its other free upcast ranges. */
  laneStore (store, { red, c }, free) {
    const V = this.V
    for (const p of this.upcastPoints(free.filter((r) => r !== c))) {
      this.withEnv(p, () => {
        const parts = []
        for (let j = 0; j < this.width; j++) this.withEnv([[c, j]], () => parts.push(this.bcast(this.value(red.src[0]), this.width)))
        const init = this.const(red.dtype, identity(red.arg, red.dtype)) // a scalar: emitters splat it in place
        let level = 0
        for (const x of parts) level = Math.max(level, x.level)
        const sum = this.place(this.inst('hsum', red.dtype, this.width, { op: red.arg, src: [init, ...parts] }), level)
        this.V = c
        try {
          this.levels[Math.min(level, this.depth)].cse.set(this.key(red), sum)
          this.store(store)
        } finally {
          this.V = V
        }
      })
    }
  }

  block (node) {
    if (node.op === 'STORE') {
      const free = [...this.deps(node)].filter((r) => r.arg[1] === 'upcast' && r !== this.V && !this.env.has(r))
      const lanes = this.laneEpilogue(node)
      if (lanes) return this.laneStore(node, lanes, free)
      for (const p of this.upcastPoints(free)) this.withEnv(p, () => this.store(node))
      return
    }
    if (node.op !== 'END') throw new KernelError(`a kernel block must be STORE or END, got ${node.op}`)
    const inner = node.src[0]
    const ranges = node.src.slice(1)
    const chosen = this.V === null ? toposort(node).find((r) => r.op === 'RANGE' && this.vectorRanges.has(r)) || null : null
    if (chosen) this.V = chosen
    const loops = ranges.filter((r) => r.arg[1] !== 'upcast')
    for (const r of loops) this.openLoop(r)
    if (inner.op === 'STORE') {
      // a lane epilogue folds its reduce's partial sums itself (laneStore): only those are emitted here
      const lanes = this.laneEpilogue(inner)
      for (const red of topLevelReduces(inner)) {
        if (lanes && red === lanes.red) for (const part of topLevelReduces(red.src[0])) this.ensure(part)
        else this.ensure(red)
      }
    }
    this.block(inner)
    for (let j = loops.length - 1; j >= 0; j--) this.closeLoop(loops[j])
    if (chosen) this.V = null
  }

  /**
   * Loop versioning for padded windows, in a list of instructions (returned anew; loops and ifs inside are
   * versioned in place). An innermost loop with loads gated by scalar conditions fixed for the whole loop (a
   * padded convolution's input, valid or not per kernel offset and output pixel, read along the input channels)
   * becomes `if (all gates) { the loop with those loads ungated } if (not all) { the loop }`: in the image's
   * interior, most of the loop's runs, each such load is one plain load (a load32_splat in lanes) instead of two
   * selects around it. Same values in the same order, so results are unchanged. The loop's hoisted values
   * (`pre`) move before the two copies, which share them.
   */
  versionGatedLoops (insts) {
    const out = []
    for (const x of insts) {
      if (x.k === 'loop') {
        x.pre = this.versionGatedLoops(x.pre)
        x.body = this.versionGatedLoops(x.body)
      }
      if (x.k === 'if') x.body = this.versionGatedLoops(x.body)
      const gates = x.k === 'loop' ? loopInvariantGates(x) : []
      if (!gates.length) {
        out.push(x)
        continue
      }
      out.push(...x.pre)
      x.pre = []
      const bool = gates[0].dtype
      let all = gates[0]
      for (const gate of gates.slice(1)) {
        all = this.inst('alu', bool, 1, { op: 'AND', src: [all, gate], level: x.level - 1 })
        out.push(all)
      }
      const fixed = new Set(gates)
      const copy = cloneInsts([x], new Map(), () => this.nextId++, (y) => { if (y.k === 'load' && fixed.has(y.gate)) y.gate = null })[0]
      const none = this.inst('alu', bool, 1, { op: 'XOR', src: [all, this.const(bool, true)], level: x.level - 1 })
      out.push(this.inst('if', null, 1, { cond: all, body: [copy], level: x.level - 1 }), none,
        this.inst('if', null, 1, { cond: none, body: [x], level: x.level - 1 }))
    }
    return out
  }

  run () {
    const params = new Map()
    const vars = new Map()
    for (const n of toposort(this.ast)) {
      if (n.op === 'DEFINE_GLOBAL') params.set(n.arg[0], n.dtype)
      if (n.op === 'DEFINE_VAR') vars.set(n.arg[0], n)
    }
    const threaded = this.split
    this.ast.src.forEach((node, i) => { if (this.onlyBlock === null || i === this.onlyBlock) this.block(node) })
    if (this.split) throw new KernelError('internal: a threaded kernel phase has no loop to split')
    const body = this.version ? this.versionGatedLoops(this.levels[0].block) : this.levels[0].block
    return {
      name: this.ast.arg ? this.ast.arg.name : 'kernel',
      params: [...params].sort((a, b) => a[0] - b[0]).map(([slot, dtype]) => ({ slot, dtype })),
      vars: [...(threaded ? [PART, PARTS] : []), ...[...vars.keys()].sort()],
      head: this.head,
      body,
      count: this.nextId
    }
  }
}

/** The distinct scalar gates, defined outside `loop`, of the loads directly in the body of an innermost
 * loop (none for a loop holding loops or ifs: each copy would double more code). */
function loopInvariantGates (loop) {
  if (loop.body.some((x) => x.k === 'loop' || x.k === 'if')) return []
  const inside = new Set(loop.body)
  const gates = []
  for (const x of loop.body) {
    if (x.k === 'load' && x.gate && x.gate.lanes === 1 && !inside.has(x.gate) && !gates.includes(x.gate)) gates.push(x.gate)
  }
  return gates
}

/** Copies of instructions with fresh ids (`newId`), references to copied instructions redirected to their
 * copies (`map`: original -> copy, filled here); `edit(copy)` may change a copy before its body is copied. */
function cloneInsts (insts, map, newId, edit) {
  const ref = (v) => (v && typeof v === 'object' && !Array.isArray(v) && map.has(v) ? map.get(v) : v)
  return insts.map((x) => {
    const y = Object.assign({}, x, { id: newId() })
    map.set(x, y)
    for (const [key, v] of Object.entries(x)) {
      if (key === 'id' || key === 'pre' || key === 'body') continue
      y[key] = Array.isArray(v) ? v.map(ref) : ref(v)
    }
    edit(y)
    if (x.pre) y.pre = cloneInsts(x.pre, map, newId, edit)
    if (x.body) y.body = cloneInsts(x.body, map, newId, edit)
    return y
  })
}

/** The structured program of a lowered kernel (see the module docstring). */
function linearize (g, ast, { vector = new Set(), width = 1, check, split = false, block = null, dot = false, dotLanes = false } = {}) {
  if (vector.size && width > 1) {
    try {
      const prog = new Linearizer(g, ast, { vector, width, check, split, block, version: true, dot, dotLanes }).run()
      prog.vectorized = true
      return prog
    } catch (e) {
      if (!(e instanceof NoVector)) throw e
    }
  }
  return new Linearizer(g, ast, { vector: new Set(), width: 1, check, split, block, version: width > 1 }).run()
}

module.exports = { linearize, NoVector, identity, PART, PARTS }
