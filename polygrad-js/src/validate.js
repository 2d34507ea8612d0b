'use strict'
/**
 * A static safety check for untrusted kernel IR, a port of polygrad's uop/validate.py.
 *
 * Stage: loading, before lowering. `checkKernel(ast, where)` checks the structure (ops, dtypes, src
 * counts, args, loop scopes, names) and proves with an interval analysis that every LOAD/STORE index stays
 * inside its buffer's declared size for every value of the Variables, that no index or loop-size arithmetic
 * overflows, and that no loop end is negative or always 0; otherwise it throws KernelError. `kernelWork(ast)`
 * counts its node evaluations for the per-entrypoint work cap (manifest.js). Gates narrow the analysis: an INDEX's gate, and a WHERE's condition for its two arms, are
 * split into AND-ed comparisons whose linear sides tighten the intervals of their terms (single nodes or
 * linear forms such as r4 + 2*r2). `provenIndices(ast)` runs the same analysis on a lowered kernel and
 * returns the INDEX nodes it proves, without throwing: the emitters check the others at run time.
 * Intervals are BigInt pairs, exact at any width.
 */

const { KernelError } = require('./errors')
const { DTYPES, intRange } = require('./dtypes')
const { toposort } = require('./ir')
const { MAX_RANGE, MAX_NODES, MAX_STEPS, MAX_NARROW_DEPTH, MAX_UPCAST, MAX_NAME } = require('./limits')
const OPS = require('./generated/ops')

const INF = 1n << 256n
const EMPTY = Symbol('EMPTY')
const UNTRACKED = Symbol('UNTRACKED')

// The one rule for the names a kernel carries (its name, its Variables'), as polygrad's uop/names.py: names
// are metadata and never reach generated code, so any plain identifier of at most MAX_NAME characters is a
// name (no reserved words: 'for' and 'HUGE_VALF' are names like 'batch').
const PLAIN_NAME = /^[A-Za-z_][A-Za-z0-9_]*$/
const NAME_RULE = `a plain name: ASCII letters, digits and _, not starting with a digit, 1 to ${MAX_NAME} characters`
const isPlainName = (name) => typeof name === 'string' && name.length <= MAX_NAME && PLAIN_NAME.test(name)

const fail = (where, msg) => new KernelError(`${where}: ${msg}`)
const isTuple = (v) => Array.isArray(v)
const bmin = (...xs) => xs.reduce((a, b) => (b < a ? b : a))
const bmax = (...xs) => xs.reduce((a, b) => (b > a ? b : a))
const babs = (x) => (x < 0n ? -x : x)
const bitLength = (x) => (x === 0n ? 0 : babs(x).toString(2).length)
const floordiv = (a, b) => {
  const q = a / b
  return (a % b !== 0n && ((a < 0n) !== (b < 0n))) ? q - 1n : q
}
const hull = (vs) => [bmin(...vs), bmax(...vs)]
const tracked = (d) => d !== null && (d.isInt || d.isBool)
const dtypeInterval = (d) => intRange(d)

// the op table's classes (polygrad-core's polygrad/definitions/ops.py, as Python's uop/validate.py reads it)
const COMPARE = new Set(OPS.COMPARISONS)
const FLOAT_ONLY = new Set(OPS.FLOAT_ONLY)
const INT_ONLY = new Set(OPS.INT_ONLY)
const INT_OR_BOOL = new Set(OPS.INT_OR_BOOL_ONLY)
const ELEMENTWISE = new Set(OPS.KERNEL_ELEMENTWISE) // the elementwise ops a stored kernel may hold
const ARITY = new Map(OPS.OPS.filter((o) => Number.isInteger(o.src)).map((o) => [o.name, o.src]))
const SIZE_OPS = new Set(OPS.SIZE_OPS)
const RANGE_KINDS = new Set(OPS.STORED_AXIS_KINDS)
const REDUCE_OPS = new Set(OPS.REDUCE_OPS)

function describe (n) {
  return `${n.op} (${n.dtype ? n.dtype.name : 'no dtype'}, ${n.src.length} src)`
}

// ---------------------------------------------------------------------------------------------------
// 1. structure

function checkAlu (where, n) {
  const { op, dtype: dt, src } = n
  const want = ARITY.get(op)
  if (src.length !== want || dt === null || n.arg !== null) throw fail(where, `${op} takes ${want} src, a dtype and no arg, got ${describe(n)}`)
  const same = (dts) => {
    if (dts.some((d) => d === null || d !== dts[0])) throw fail(where, `${op} needs operands of one dtype, got ${dts.map((d) => (d ? d.name : null)).join(', ')}`)
  }
  if (op === 'CAST') return same([src[0].dtype])
  if (op === 'BITCAST') {
    if (src[0].dtype === null || src[0].dtype.size !== dt.size || dt.isBool || src[0].dtype.isBool) throw fail(where, `BITCAST between types of different widths: ${describe(n)}`)
    return
  }
  if (COMPARE.has(op)) {
    same(src.map((s) => s.dtype))
    if (dt !== DTYPES.bool) throw fail(where, `${op} gives a bool, got ${dt.name}`)
    return
  }
  if (op === 'WHERE') {
    if (src[0].dtype !== DTYPES.bool) throw fail(where, "WHERE's condition must be a bool")
    return same([dt, src[1].dtype, src[2].dtype])
  }
  same([dt, ...src.map((s) => s.dtype)])
  if ((FLOAT_ONLY.has(op) && !dt.isFloat) || (INT_ONLY.has(op) && !dt.isInt) || (INT_OR_BOOL.has(op) && dt.isFloat)) {
    throw fail(where, `${op} is not defined on ${dt.name}`)
  }
}

function checkNode (where, n, vars) {
  const op = n.op
  if (n.arg !== null && typeof n.arg === 'object' && !Array.isArray(n.arg) && 'unexpected' in n.arg) throw fail(where, `${op} has an unexpected arg`)
  switch (op) {
    case 'CONST': {
      if (n.dtype === null || n.src.length) throw fail(where, `CONST needs a dtype and no src, got ${describe(n)}`)
      return
    }
    case 'DEFINE_VAR': {
      if (n.dtype !== DTYPES.int32 || n.src.length || !Array.isArray(n.arg) || n.arg.length !== 3) throw fail(where, 'DEFINE_VAR must be int32 with no src and arg (name, min, max)')
      const [name, lo, hi] = n.arg
      if (!isPlainName(name)) throw fail(where, `Variable name ${JSON.stringify(String(name)).slice(0, 80)} must be ${NAME_RULE}`)
      if (!(BigInt(lo) >= 0n && BigInt(lo) <= BigInt(hi) && BigInt(hi) <= 2n ** 31n - 1n)) throw fail(where, `bad Variable ${JSON.stringify(name)}: bounds must satisfy 0 <= min <= max <= ${2 ** 31 - 1}`)
      const other = vars.get(name)
      if (other && other !== n) throw fail(where, `Variable ${JSON.stringify(name)} appears with two sets of bounds`)
      vars.set(name, n)
      return
    }
    case 'DEFINE_GLOBAL':
      if (n.dtype === null || n.src.length || !Array.isArray(n.arg) || n.arg.length !== 2) throw fail(where, 'DEFINE_GLOBAL needs a dtype, no src and arg (slot, shape)')
      return
    case 'RANGE': {
      if ((n.dtype !== DTYPES.int32 && n.dtype !== DTYPES.int64) || n.src.length !== 1 || n.src[0].dtype !== n.dtype) throw fail(where, `RANGE is int32 or int64 with one end of its dtype, got ${describe(n)}`)
      const arg = n.arg
      if (!Array.isArray(arg) || arg.length !== 2 || !Number.isInteger(arg[0]) || arg[0] < 0 || BigInt(arg[0]) > MAX_RANGE || !RANGE_KINDS.has(arg[1])) throw fail(where, 'RANGE arg must be (axis id in [0, 2**48], global|reduce|upcast)')
      if (arg[1] === 'upcast' && n.src[0].op !== 'CONST') throw fail(where, 'an upcast RANGE needs a constant end')
      return
    }
    case 'INDEX': {
      const ok = (n.src.length === 2 || n.src.length === 3) && n.src[0].op === 'DEFINE_GLOBAL' && n.dtype === n.src[0].dtype &&
        n.src[1].dtype !== null && n.src[1].dtype.isInt && n.arg === null && (n.src.length === 2 || n.src[2].dtype === DTYPES.bool)
      if (!ok) throw fail(where, `INDEX is (DEFINE_GLOBAL, int index[, bool gate]) with the buffer's dtype, got ${describe(n)}`)
      return
    }
    case 'LOAD':
      if (n.src.length !== 1 || n.src[0].op !== 'INDEX' || n.dtype !== n.src[0].dtype || n.arg !== null) throw fail(where, `LOAD reads one INDEX of its dtype, got ${describe(n)}`)
      return
    case 'STORE':
      if (n.src.length !== 2 || n.src[0].op !== 'INDEX' || n.dtype !== null || n.src[1].dtype === null || (n.arg !== null && !REDUCE_OPS.has(n.arg)) || n.src[1].op === 'VECTORIZE') {
        throw fail(where, `STORE is (INDEX, scalar value) with no dtype and arg null, ADD, MUL or MAX, got ${describe(n)}`)
      }
      return
    case 'REDUCE':
      if (n.src.length < 2 || !REDUCE_OPS.has(n.arg) || n.dtype === null || n.dtype !== n.src[0].dtype || n.src.slice(1).some((r) => r.op !== 'RANGE') || new Set(n.src.slice(1)).size !== n.src.length - 1) {
        throw fail(where, `REDUCE is (body, RANGE, ...) with arg ADD, MUL or MAX, got ${describe(n)}`)
      }
      return
    case 'END':
      if (n.src.length < 1 || n.dtype !== null || !['STORE', 'END'].includes(n.src[0].op) || n.arg !== null || n.src.slice(1).some((r) => r.op !== 'RANGE') || new Set(n.src.slice(1)).size !== n.src.length - 1) {
        throw fail(where, `END is (STORE or END, distinct RANGEs...), got ${describe(n)}`)
      }
      return
    case 'SINK':
      throw fail(where, 'a SINK inside a kernel; only the root is a SINK')
  }
  if (ELEMENTWISE.has(op)) return checkAlu(where, n)
  throw fail(where, `op ${op} is not allowed in a stored kernel`)
}

function checkSizeExpr (where, u, what, vars) {
  for (const n of toposort(u)) {
    if (!SIZE_OPS.has(n.op) || n.dtype === null || !n.dtype.isInt) throw fail(where, `${what} may only use constants, Variables and integer arithmetic, found ${describe(n)}`)
    checkNode(where, n, vars)
  }
}

function freeRanges (ast) {
  const free = new Map()
  for (const n of toposort(ast)) {
    if (n.op === 'RANGE') free.set(n, new Set([n]))
    else if (n.op === 'REDUCE') {
      const s = new Set(free.get(n.src[0]))
      for (const r of n.src.slice(1)) s.delete(r)
      free.set(n, s)
    } else if (n.op === 'END' || n.op === 'SINK') free.set(n, new Set())
    else {
      const s = new Set()
      for (const x of n.src) for (const r of free.get(x) || []) s.add(r)
      free.set(n, s)
    }
  }
  return free
}

function checkStructure (ast, where) {
  if (ast.op !== 'SINK') throw fail(where, `a kernel is a SINK, got ${ast.op}`)
  if (ast.arg && !isPlainName(ast.arg.name)) throw fail(where, `kernel name ${JSON.stringify(String(ast.arg.name)).slice(0, 80)} must be ${NAME_RULE}`)
  if (ast.dtype !== null || ast.src.some((b) => b.op !== 'STORE' && b.op !== 'END')) throw fail(where, 'the kernel SINK holds blocks: STORE or END(STORE, RANGE...) nodes')
  const nodes = toposort(ast)
  if (nodes.length > MAX_NODES) throw fail(where, `${nodes.length} nodes; kernels of more than ${MAX_NODES} are not checked`)
  const vars = new Map()
  const axes = new Map()
  const globals = new Map()
  nodes.slice(0, -1).forEach((n, i) => {
    const at = `${where}, node #${i}`
    checkNode(at, n, vars)
    if (n.src.some((s) => s.op === 'INDEX') && n.op !== 'LOAD' && n.op !== 'STORE') throw fail(at, `${n.op} uses an INDEX; only LOAD and STORE may`)
    if (n.src.some((s, k) => s.op === 'DEFINE_GLOBAL' && (n.op !== 'INDEX' || k))) throw fail(at, `${n.op} uses a DEFINE_GLOBAL (a buffer) as a value; only an INDEX's first src may`)
    if (n.op === 'STORE' && n.src[1].op === 'INDEX') throw fail(at, "STORE's value is an INDEX (an address); load it first")
    if (n.op === 'RANGE') {
      const other = axes.get(n.arg[0])
      if (other && other !== n) throw fail(at, `two different RANGEs share axis id ${n.arg[0]}`)
      axes.set(n.arg[0], n)
      checkSizeExpr(at, n.src[0], `RANGE ${n.arg[0]}'s end`, vars)
    }
    if (n.op === 'DEFINE_GLOBAL') {
      if (!globals.has(n.arg[0])) globals.set(n.arg[0], [])
      globals.get(n.arg[0]).push(n)
      for (const d of n.arg[1]) if (typeof d === 'object' && d !== null) checkSizeExpr(at, d, `buffer ${n.arg[0]}'s shape`, vars)
    }
  })
  const free = freeRanges(ast)
  for (const block of ast.src) {
    const loops = new Set()
    let node = block
    while (node.op === 'END') {
      for (const r of node.src.slice(1)) loops.add(r)
      node = node.src[0]
    }
    const outside = [...free.get(node)].filter((r) => !loops.has(r))
    if (outside.length) throw fail(where, `a STORE uses RANGE ${JSON.stringify(outside.map((r) => r.arg[0]))} outside any loop over it`)
  }
  checkLoops(ast, where)
  blocks(ast, where)
  return globals
}

/** Each RANGE is one loop: the loop of one REDUCE, or of blocks' END chains (each chain naming it once). */
function checkLoops (ast, where) {
  const owner = new Map()
  for (const n of toposort(ast)) {
    if (n.op !== 'REDUCE') continue
    for (const r of n.src.slice(1)) {
      if (!owner.has(r)) owner.set(r, n)
      if (owner.get(r) !== n) throw fail(where, `RANGE ${r.arg[0]} is reduced by two REDUCEs; each loop has one owner`)
    }
  }
  for (const block of ast.src) {
    const chain = new Set()
    let node = block
    while (node.op === 'END') {
      for (const r of node.src.slice(1)) {
        if (!owner.has(r)) owner.set(r, 'END')
        if (chain.has(r) || owner.get(r) !== 'END') throw fail(where, `RANGE ${r.arg[0]} is looped twice (by a REDUCE or twice by one block's ENDs)`)
        chain.add(r)
      }
      node = node.src[0]
    }
  }
}

/**
 * [node count, RANGEs] of each block (SINK source). A block's upcast RANGEs (unrolled by the emitters) span
 * at most MAX_UPCAST points, and the blocks' node counts, each times its points, total at most MAX_NODES; the
 * walk stops as soon as that total is passed, so it is bounded too (blocks may share nodes). Each RANGE is
 * checked (checkNode) before its end is read: this runs on kernels not yet validated (kernelWork).
 */
function blocks (ast, where) {
  let total = 0
  const out = []
  for (const block of ast.src) {
    const seen = new Set()
    const stack = [block]
    const ranges = []
    while (stack.length) {
      const n = stack.pop()
      if (seen.has(n)) continue
      seen.add(n)
      if (total + seen.size > MAX_NODES) throw fail(where, `the blocks hold more than ${MAX_NODES} nodes together (counted per block)`)
      if (n.op === 'RANGE') {
        checkNode(where, n, new Map())
        ranges.push(n)
      }
      for (const s of n.src) stack.push(s)
    }
    let points = 1n
    for (const r of ranges) if (r.arg[1] === 'upcast') points *= bmax(BigInt(r.src[0].arg), 1n)
    if (points > BigInt(MAX_UPCAST)) throw fail(where, `a block unrolls ${points} points of upcast RANGEs; the limit is ${MAX_UPCAST}`)
    total += seen.size * Number(points)
    if (total > MAX_NODES) throw fail(where, `the blocks hold more than ${MAX_NODES} nodes once their upcast RANGEs are unrolled`)
    out.push([seen.size, ranges])
  }
  return out
}

/**
 * Node evaluations of one run at the Variables' maxima (BigInt), as Python's uop/validate.kernel_work counts
 * them: each block evaluates each of its nodes at most once per point of all its RANGEs (max(1, trip count)
 * each, multiplied), and the blocks add up.
 */
function kernelWork (ast, where = 'kernel') {
  if (ast.op !== 'SINK') throw fail(where, `a kernel is a SINK, got ${ast.op}`)
  const root = new Analysis(where).root
  const trips = new Map()
  let work = 0n
  for (const [nodes, ranges] of blocks(ast, where)) {
    let block = BigInt(nodes)
    for (const r of ranges) {
      if (!trips.has(r)) {
        checkSizeExpr(where, r.src[0], `RANGE ${r.arg[0]}'s end`, new Map())
        trips.set(r, bmax(root.of(r.src[0])[1], 1n))
      }
      block *= trips.get(r)
    }
    work += block
  }
  return work
}

// ---------------------------------------------------------------------------------------------------
// 2. intervals

function divisors ([lo, hi]) {
  const parts = []
  if (lo < 0n) parts.push([lo, bmin(hi, -1n)])
  if (hi > 0n) parts.push([bmax(lo, 1n), hi])
  if (lo <= 0n && 0n <= hi) parts.push([1n, 1n])
  return parts
}

function idiv (a, b) {
  const out = []
  for (const p of divisors(b)) for (const x of a) for (const y of p) out.push(x / y)
  return hull(out)
}

function mod (a, b) {
  const ys = divisors(b).flat().map(babs)
  const m = bmax(...ys) - 1n
  const [lo, hi] = a
  if (lo >= 0n && hi <= bmin(...ys) - 1n) return a
  return [lo < 0n ? bmax(lo, -m) : 0n, hi > 0n ? bmin(hi, m) : 0n]
}

function bits (n, a, b, op) {
  if (n.dtype === DTYPES.bool) {
    if (op === 'AND') return [a[0] & b[0], a[1] & b[1]]
    if (op === 'OR') return [a[0] | b[0], a[1] | b[1]]
    return a[0] === a[1] && b[0] === b[1] ? [a[0] ^ b[0], a[0] ^ b[0]] : [0n, 1n]
  }
  if (a[0] >= 0n && b[0] >= 0n) {
    const top = (1n << BigInt(bitLength(bmax(a[1], b[1])))) - 1n
    if (op === 'AND') return [0n, bmin(a[1], b[1])]
    return [op === 'OR' ? bmax(a[0], b[0]) : 0n, top]
  }
  if (op === 'AND' && (a[0] >= 0n || b[0] >= 0n)) return [0n, a[0] >= 0n ? a[1] : b[1]]
  const k = BigInt(bitLength(bmax(...[...a, ...b].map(babs))))
  return [-(1n << k), (1n << k) - 1n]
}

function shift (n, a, b, left) {
  if (b[0] < 0n || b[1] >= BigInt(8 * n.dtype.size)) {
    const full = dtypeInterval(n.dtype)
    return [full[0] - 1n, full[1] + 1n]
  }
  const out = []
  for (const x of a) for (const y of b) out.push(left ? x << y : x >> y)
  return hull(out)
}

function cmp (op, a, b) {
  if (op === 'CMPLT') return a[1] < b[0] ? [1n, 1n] : a[0] >= b[1] ? [0n, 0n] : [0n, 1n]
  const disjoint = a[1] < b[0] || b[1] < a[0]
  const same = a[0] === a[1] && a[1] === b[0] && b[0] === b[1]
  if (op === 'CMPNE') return disjoint ? [1n, 1n] : same ? [0n, 0n] : [0n, 1n]
  return disjoint ? [0n, 0n] : same ? [1n, 1n] : [0n, 1n]
}

const RULES = {
  ADD: (n, v) => [v[0][0] + v[1][0], v[0][1] + v[1][1]],
  MUL: (n, v) => hull([v[0][0] * v[1][0], v[0][0] * v[1][1], v[0][1] * v[1][0], v[0][1] * v[1][1]]),
  NEG: (n, v) => (n.dtype === DTYPES.bool ? [1n - v[0][1], 1n - v[0][0]] : [-v[0][1], -v[0][0]]),
  MAX: (n, v) => [bmax(v[0][0], v[1][0]), bmax(v[0][1], v[1][1])],
  IDIV: (n, v) => idiv(v[0], v[1]),
  MOD: (n, v) => mod(v[0], v[1]),
  AND: (n, v) => bits(n, v[0], v[1], 'AND'),
  OR: (n, v) => bits(n, v[0], v[1], 'OR'),
  XOR: (n, v) => bits(n, v[0], v[1], 'XOR'),
  SHL: (n, v) => shift(n, v[0], v[1], true),
  SHR: (n, v) => shift(n, v[0], v[1], false),
  CMPLT: (n, v) => cmp('CMPLT', v[0], v[1]),
  CMPNE: (n, v) => cmp('CMPNE', v[0], v[1]),
  CMPEQ: (n, v) => cmp('CMPEQ', v[0], v[1]),
  FMA: (n, v) => RULES.ADD(n, [RULES.MUL(n, v.slice(0, 2)), v[2]])
}

function meet (a, b) {
  if (b === undefined || b === null || !isTuple(a) || !isTuple(b)) return a
  const lo = bmax(a[0], b[0])
  const hi = bmin(a[1], b[1])
  return lo <= hi ? [lo, hi] : EMPTY
}

function traps (n, srcs) {
  const [a, b] = srcs
  return isTuple(a) && isTuple(b) && a[0] === dtypeInterval(n.dtype)[0] && b[0] <= -1n && -1n <= b[1]
}

/** u is never 0: by its interval, or a guard such as WHERE(x == 0, 1, x) (how // is scheduled). */
function nonzero (u, env) {
  const v = env.of(u)
  if (isTuple(v) && !(v[0] <= 0n && 0n <= v[1])) return true
  if (u.op !== 'WHERE') return false
  for (const [arm, truth] of [[u.src[1], true], [u.src[2], false]]) {
    const lits = literals(u.src[0], truth)
    if (lits === null) continue // this arm is never chosen
    const armv = env.of(arm)
    if (isTuple(armv) && !(armv[0] <= 0n && 0n <= armv[1])) continue
    if (!lits.some(([c, t]) => saysNonzero(c, t, arm))) return false
  }
  return true
}

/** The literal `c == truth` is x != 0. */
function saysNonzero (c, truth, x) {
  if ((c.op !== 'CMPNE' && c.op !== 'CMPEQ') || (c.op === 'CMPNE') !== truth || !c.src.includes(x)) return false
  const other = c.src[0] === x ? c.src[1] : c.src[0]
  return other.op === 'CONST' && Number(other.arg) === 0
}

function sumBounds (terms, env) {
  let lo = 0n
  let hi = 0n
  for (const [t, k] of terms) {
    const v = env.of(t)
    if (!isTuple(v)) return null
    lo += bmin(k * v[0], k * v[1])
    hi += bmax(k * v[0], k * v[1])
  }
  return [lo, hi]
}

const sameIv = (a, b) => (a === b) || (isTuple(a) && isTuple(b) && a[0] === b[0] && a[1] === b[1])

class Env {
  constructor (analysis, facts, parent, depth) {
    this.analysis = analysis
    this.facts = facts
    this.parent = parent
    this.depth = depth
    this.newFacts = new Map()
    for (const [k, v] of facts) if (!parent || !sameIv(parent.facts.get(k), v)) this.newFacts.set(k, v)
    this.linear = [...facts].filter(([k]) => typeof k === 'string').map(([k, v]) => [analysis.forms.get(k), v]).sort((a, b) => b[0].size - a[0].size)
    this.linearNew = [...this.newFacts.keys()].some((k) => typeof k === 'string')
    this.memo = new Map()
  }

  value (n) {
    for (let e = this; e; e = e.parent) {
      const hit = e.memo.get(n)
      if (hit !== undefined) return hit
    }
    throw new Error('internal: interval read before it was computed')
  }

  of (u) {
    const hit = this.memo.get(u)
    if (hit !== undefined) return hit
    if (this.parent) this.parent.of(u)
    const nodes = toposort(u)
    this.analysis.step(nodes.length)
    for (const n of nodes) {
      if (this.memo.has(n)) continue
      if (this.parent && !this.newFacts.has(n) && !n.src.some((s) => this.memo.has(s)) && !(this.linearNew && n.op === 'ADD')) continue
      this.memo.set(n, this.compute(n))
    }
    return this.value(u)
  }

  compute (n) {
    this.analysis.step()
    if (!tracked(n.dtype) || n.op === 'INDEX' || n.op === 'DEFINE_GLOBAL') return UNTRACKED
    let out
    if (n.op === 'REDUCE') {
      out = this.reduce(n)
    } else {
      const srcs = n.src.map((s) => this.value(s))
      if (srcs.some((v) => v === EMPTY)) return EMPTY
      out = this.interval(n, srcs)
      if ((n.op === 'IDIV' || n.op === 'MOD') && n.dtype.kind === 'int' && traps(n, srcs)) this.analysis.overflows.add(n)
    }
    if (this.linear.length && n.op === 'ADD' && isTuple(out)) {
      const lb = this.linearBound(n)
      if (lb !== null) out = meet(out, lb)
    }
    const full = dtypeInterval(n.dtype)
    if (isTuple(out) && (out[0] < full[0] || out[1] > full[1])) {
      this.analysis.overflows.add(n)
      out = full
    }
    const fact = this.facts.get(n)
    return fact !== undefined ? meet(out, fact) : out
  }

  linearBound (n) {
    const { terms, c } = linear(n, this)
    let lo = c
    let hi = c
    for (const [form, iv] of this.linear) {
      const t0 = form.keys().next().value
      const have = terms.get(t0) || 0n
      if (have % form.get(t0) !== 0n) continue
      const alpha = have / form.get(t0)
      if (alpha === 0n || [...form].some(([t, k]) => (terms.get(t) || 0n) !== alpha * k)) continue
      const span = sumBounds(form, this)
      if (span === null) return null
      const flo = bmax(iv[0], span[0])
      const fhi = bmin(iv[1], span[1])
      for (const t of form.keys()) terms.delete(t)
      lo += bmin(alpha * flo, alpha * fhi)
      hi += bmax(alpha * flo, alpha * fhi)
    }
    if (lo === c && hi === c) return null
    const rest = sumBounds(terms, this)
    return rest === null ? null : [lo + rest[0], hi + rest[1]]
  }

  interval (n, srcs) {
    const op = n.op
    const full = dtypeInterval(n.dtype)
    if (op === 'CONST') {
      const v = typeof n.arg === 'boolean' ? (n.arg ? 1n : 0n) : BigInt(n.arg)
      return [v, v]
    }
    if (op === 'DEFINE_VAR') return [BigInt(n.arg[1]), BigInt(n.arg[2])]
    if (op === 'RANGE') {
      const end = srcs[0]
      return end[1] >= 1n ? [0n, end[1] - 1n] : EMPTY
    }
    if (op === 'LOAD' || op === 'BITCAST') return full
    if (op === 'CAST') {
      const src = srcs[0]
      if (src === UNTRACKED) return full
      if (n.dtype === DTYPES.bool) return src[0] === 0n && src[1] === 0n ? [0n, 0n] : src[0] > 0n || src[1] < 0n ? [1n, 1n] : [0n, 1n]
      return full[0] <= src[0] && src[1] <= full[1] ? src : full
    }
    if (op === 'WHERE') return this.where(n, srcs)
    if (srcs.some((v) => v === UNTRACKED)) return full
    const rule = RULES[op]
    return rule ? rule(n, srcs) : full
  }

  reduce (n) {
    const body = this.value(n.src[0])
    const identity = n.arg === 'ADD' ? [0n, 0n] : n.arg === 'MUL' ? [1n, 1n] : [dtypeInterval(n.dtype)[0], dtypeInterval(n.dtype)[0]]
    if (body === EMPTY) return identity
    if (n.arg === 'ADD') {
      let total = 1n
      for (const r of n.src.slice(1)) {
        const end = this.value(r.src[0])
        total *= isTuple(end) ? bmax(end[1], 0n) : 0n
      }
      return [bmin(0n, body[0] * total), bmax(0n, body[1] * total)]
    }
    if (n.arg === 'MAX') return [identity[0], body[1]]
    return dtypeInterval(n.dtype)
  }

  where (n, srcs) {
    const c = srcs[0]
    if (c[0] === 1n && c[1] === 1n) return srcs[1]
    if (c[0] === 0n && c[1] === 0n) return srcs[2]
    let arms = [srcs[1], srcs[2]]
    if (this.depth < MAX_NARROW_DEPTH) {
      for (const [k, truth] of [[0, true], [1, false]]) {
        const env = this.analysis.assume(this, n.src[0], truth)
        arms[k] = env === null ? EMPTY : env.of(n.src[1 + k])
      }
    }
    arms = arms.filter((a) => a !== EMPTY)
    if (!arms.length) return EMPTY
    return [bmin(...arms.map((a) => a[0])), bmax(...arms.map((a) => a[1]))]
  }
}

class Analysis {
  constructor (where, ranges = []) {
    this.where = where
    this.steps = 0
    this.overflows = new Set()
    this.envs = new Map()
    this.forms = new Map()
    this.root = new Env(this, new Map(), null, 0)
    const facts = new Map()
    for (const r of ranges) if (r.src[0].op !== 'CONST') atMostLinear(r, r.src[0], -1n, this.root, facts)
    if (facts.size) this.root = new Env(this, facts, null, 0)
  }

  step (count = 1) {
    this.steps += count
    if (this.steps > MAX_STEPS) throw fail(this.where, `the interval analysis took more than ${MAX_STEPS} steps; the kernel is too large or too deeply gated to check`)
  }

  assume (env, cond, truth) {
    const facts = narrow(env, cond, truth)
    if (facts === null) return null
    if (facts === env.facts) return env
    const key = [...facts].map(([k, v]) => `${typeof k === 'string' ? k : '#' + k.id}=${isTuple(v) ? v[0] + ':' + v[1] : String(v)}`).sort().join(';')
    let hit = this.envs.get(key)
    if (!hit) {
      hit = new Env(this, facts, env, env.depth + 1)
      this.envs.set(key, hit)
    }
    return hit
  }
}

// ---- narrowing

function linear (u, env, limit = 64) {
  const terms = new Map()
  let c = 0n
  const stack = [[u, 1n]]
  while (stack.length) {
    const [n, k] = stack.pop()
    limit--
    if (n.op === 'CONST') {
      c += k * (typeof n.arg === 'boolean' ? (n.arg ? 1n : 0n) : BigInt(n.arg))
    } else if (limit > 0 && n.op === 'ADD') {
      stack.push([n.src[0], k], [n.src[1], k])
    } else if (limit > 0 && n.op === 'NEG') {
      stack.push([n.src[0], -k])
    } else if (limit > 0 && n.op === 'MUL' && n.src[1].op === 'CONST') {
      stack.push([n.src[0], k * BigInt(n.src[1].arg)])
    } else if (limit > 0 && n.op === 'MUL' && n.src[0].op === 'CONST') {
      stack.push([n.src[1], k * BigInt(n.src[0].arg)])
    } else if (limit > 0 && n.op === 'CAST' && tracked(n.src[0].dtype) && sameIv(env.of(n), env.of(n.src[0]))) {
      stack.push([n.src[0], k])
    } else {
      terms.set(n, (terms.get(n) || 0n) + k)
    }
  }
  for (const [t, k] of terms) if (k === 0n) terms.delete(t)
  return { terms, c }
}

const current = (t, env, facts) => meet(env.of(t), facts.get(t))

function gcd (a, b) {
  a = babs(a)
  b = babs(b)
  while (b) [a, b] = [b, a % b]
  return a
}

function linearKey (analysis, terms, bound) {
  let first = null
  for (const t of terms.keys()) if (first === null || t.id < first.id) first = t
  let g = [...terms.values()].reduce((a, b) => gcd(a, b), 0n)
  if (terms.get(first) < 0n) g = -g
  const form = new Map([...terms].sort((a, b) => a[0].id - b[0].id).map(([t, k]) => [t, k / g]))
  const key = [...form].map(([t, k]) => `${t.id}*${k}`).join('+')
  analysis.forms.set(key, form)
  const limit = g > 0n ? floordiv(bound, g) : -floordiv(-bound, g)
  return { key, iv: g > 0n ? [-INF, limit] : [limit, INF] }
}

function atMost (terms, c, bound, env, facts) {
  const ivs = new Map()
  for (const t of terms.keys()) {
    const v = current(t, env, facts)
    if (v === EMPTY) return false
    if (v === UNTRACKED) return true
    ivs.set(t, v)
  }
  const lows = new Map([...terms].map(([t, k]) => [t, bmin(k * ivs.get(t)[0], k * ivs.get(t)[1])]))
  let totalLow = 0n
  for (const v of lows.values()) totalLow += v
  if (totalLow + c > bound) return false
  for (const [t, k] of terms) {
    const room = bound - c - (totalLow - lows.get(t))
    let [lo, hi] = ivs.get(t)
    if (k > 0n) hi = bmin(hi, floordiv(room, k))
    else lo = bmax(lo, -floordiv(room, -k))
    if (lo !== ivs.get(t)[0] || hi !== ivs.get(t)[1]) facts.set(t, [lo, hi])
  }
  if (terms.size > 1 && [...terms.keys()].every((t) => t.op !== 'CONST')) {
    const { key, iv } = linearKey(env.analysis, terms, bound - c)
    const known = meet(iv, facts.get(key))
    if (known === EMPTY) return false
    facts.set(key, known)
  }
  return true
}

function atMostLinear (x, y, slack, env, facts) {
  const a = linear(x, env)
  const b = linear(y, env)
  for (const [t, k] of b.terms) a.terms.set(t, (a.terms.get(t) || 0n) - k)
  const diff = new Map([...a.terms].filter(([, k]) => k !== 0n))
  const whole = x !== y ? new Map([[x, 1n], [y, -1n]]) : new Map()
  return atMost(diff, a.c - b.c, slack, env, facts) && atMost(whole, 0n, slack, env, facts)
}

function constrain (op, a, b, truth, env, facts) {
  if (op === 'CMPLT') return truth ? atMostLinear(a, b, -1n, env, facts) : atMostLinear(b, a, 0n, env, facts)
  if ((op === 'CMPEQ') === truth) return atMostLinear(a, b, 0n, env, facts) && atMostLinear(b, a, 0n, env, facts)
  for (const [x, y] of [[a, b], [b, a]]) {
    const vx = current(x, env, facts)
    const vy = current(y, env, facts)
    if (vx === EMPTY || vy === EMPTY) return false
    if (isTuple(vx) && isTuple(vy) && vy[0] === vy[1]) {
      const lo = vx[0] + (vx[0] === vy[0] ? 1n : 0n)
      const hi = vx[1] - (vx[1] === vy[0] ? 1n : 0n)
      if (lo > hi) return false
      facts.set(x, [lo, hi])
    }
  }
  return true
}

function literals (cond, truth) {
  const out = []
  const stack = [[cond, truth]]
  while (stack.length && out.length < 64) {
    const [c, t] = stack.pop()
    if (c.op === 'CONST') {
      if (Boolean(c.arg) !== t) return null
      continue
    }
    out.push([c, t])
    if ((c.op === 'AND' && t) || (c.op === 'OR' && !t)) stack.push([c.src[0], t], [c.src[1], t])
    else if (c.op === 'NEG') stack.push([c.src[0], !t])
    else if ((c.op === 'CMPNE' || c.op === 'CMPEQ' || c.op === 'XOR') && c.src[0].dtype === DTYPES.bool) {
      const [x, y] = c.src[1].op === 'CONST' ? c.src : [c.src[1], c.src[0]]
      if (y.op === 'CONST') stack.push([x, Boolean(y.arg) === (c.op === 'CMPEQ' ? t : !t)])
    }
  }
  return out
}

function sameFacts (a, b) {
  if (a.size !== b.size) return false
  for (const [k, v] of a) if (!sameIv(b.get(k), v)) return false
  return true
}

function narrow (env, cond, truth) {
  const lits = literals(cond, truth)
  if (lits === null) return null
  const facts = new Map(env.facts)
  for (let pass = 0; pass < 2; pass++) {
    for (const [c, t] of lits) {
      const v = current(c, env, facts)
      const tv = t ? 1n : 0n
      if (v === EMPTY || !(isTuple(v) && v[0] <= tv && tv <= v[1])) return null
      facts.set(c, [tv, tv])
      if (COMPARE.has(c.op) && c.src[0].dtype !== DTYPES.bool && tracked(c.src[0].dtype)) {
        if (!constrain(c.op, c.src[0], c.src[1], t, env, facts)) return null
      }
    }
  }
  return sameFacts(facts, env.facts) ? env.facts : facts
}

// ---------------------------------------------------------------------------------------------------
// 3. the checks

function declaredCount (g, root) {
  let count = 1n
  for (const d of g.arg[1]) {
    let lo, hi
    if (typeof d === 'object' && d !== null) [lo, hi] = root.of(d)
    else lo = hi = BigInt(d)
    if (lo < 0n) throw fail('kernel', `buffer ${g.arg[0]}'s shape entry can be negative`)
    count *= hi
  }
  return count
}

/**
 * Check a stored kernel (structure, unrolled size, every index in bounds, no overflow in index arithmetic).
 * Returns the set of its INDEX nodes (all proven). Its work is capped per entrypoint (manifest.js, kernelWork).
 */
function checkKernel (ast, where = 'kernel') {
  const label = ast.arg && isPlainName(ast.arg.name) ? `${where} '${ast.arg.name}'` : where
  checkStructure(ast, label)
  const { proven, failures } = analyse(ast, label, true)
  if (failures.length) throw failures[0]
  return proven
}

/** The INDEX nodes of a (lowered) kernel whose element is proven inside its buffer. */
function provenIndices (ast) {
  try {
    return analyse(ast, 'kernel', false).proven
  } catch (e) {
    if (e instanceof KernelError) return new Set()
    throw e
  }
}

function analyse (ast, where, strict) {
  const nodes = toposort(ast)
  const analysis = new Analysis(where, nodes.filter((n) => n.op === 'RANGE'))
  const root = analysis.root
  root.of(ast)
  const unassumed = new Analysis(where).root
  const proven = new Set()
  const failures = []
  const bad = new Set()
  const checked = new Set()
  const counts = new Map()
  nodes.forEach((n, i) => {
    if (n.op === 'RANGE') {
      const end = root.value(n.src[0])
      if (end[1] > MAX_RANGE) failures.push(fail(where, `RANGE ${n.arg[0]} (node #${i}) runs up to ${end[1]} times; the limit is ${MAX_RANGE}`))
      // a loop of no points would make its block's STORE look like a write (manifest.js checkDataflow); the
      // Variables' bounds alone (root assumes every loop runs: r < end)
      const [lo, hi] = unassumed.of(n.src[0])
      if (lo < 0n || hi <= 0n) failures.push(fail(where, `RANGE ${n.arg[0]} (node #${i}) has an end in [${lo}, ${hi}]; a loop size must be >= 0 for every value of the Variables, and not 0 for all of them`))
    }
    if (strict && (n.op === 'IDIV' || n.op === 'MOD') && n.dtype.isInt && !nonzero(n.src[1], root)) {
      failures.push(fail(where, `${n.op} node #${i} can divide by 0 (a trap in C, where Python runs it); guard the divisor, e.g. WHERE(b == 0, 1, b)`))
    }
    if (n.op !== 'INDEX' && n.op !== 'RANGE') return
    let overflow = false
    const tops = n.op === 'INDEX' ? n.src.slice(1) : n.src
    for (const top of tops) {
      for (const s of toposort(top)) {
        if (analysis.overflows.has(s)) {
          overflow = true
          if (!checked.has(s)) failures.push(fail(where, `${describe(s)} in the ${n.op === 'INDEX' ? 'index' : 'loop size'} arithmetic of node #${i} can overflow ${s.dtype.name}`))
        }
        checked.add(s)
      }
    }
    if (n.op === 'RANGE' || overflow) return
    const g = n.src[0]
    if (!counts.has(g)) counts.set(g, declaredCount(g, root))
    const env = n.src.length === 2 ? root : analysis.assume(root, n.src[2], true)
    if (env === null) { proven.add(n); return }
    const v = env.of(n.src[1])
    if (v === EMPTY) { proven.add(n); return }
    const size = counts.get(g)
    if (v[0] < 0n || v[1] > size - 1n) {
      bad.add(n)
      failures.push(fail(where, `INDEX node #${i} into buffer ${g.arg[0]} (${g.dtype.name}, ${size} elements) can reach element ${v[0]}..${v[1]}${n.src.length === 3 ? ' under its gate' : ''}, outside [0, ${size - 1n}]`))
      return
    }
    proven.add(n)
  })
  if (!strict) failures.length = 0
  return { proven, failures }
}

module.exports = { checkKernel, kernelWork, provenIndices, checkStructure, checkSizeExpr, isPlainName, MAX_RANGE, MAX_NAME, NAME_RULE }
