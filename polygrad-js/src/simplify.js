'use strict'
/**
 * Index simplification: constant folding and integer identities. The rule rows are polygrad-core's
 * definitions/symbolic_rules.py, rendered into src/generated/symbolic_rules.js and interpreted here (through
 * ruletable.js) as Python's uop/symbolic.py interprets them; this module implements the table's named
 * conditions and code rows, and graphRewrite (bottom-up to a fixed point, as Python's graph_rewrite).
 *
 * Stage: lowering. Input: kernel IR. Output: the same values with cheaper index arithmetic. Floats are
 * never folded (the rounding rules belong to the renderer), so results do not change, only the work.
 * Also here: `bounds(u)` (the inclusive range an integer expression can take, conservative) and
 * `rangeCoeff(expr, r)` (c with expr = c*r + terms without r, or null), which the lowering uses.
 */

const { DTYPES } = require('./dtypes')
const { toposort } = require('./ir')
const { compileRules, constValue, exact } = require('./ruletable')
const TABLE = require('./generated/symbolic_rules')

const BIG = 2 ** 62
const isInt = (u) => u.dtype !== null && u.dtype.isInt
const isConst = (u) => u.op === 'CONST'

function tdiv (a, b) {
  const q = Math.floor(Math.abs(a) / Math.abs(b))
  return (a >= 0) === (b >= 0) ? q : -q
}

const BOUNDS = new WeakMap()

/** [min, max] an integer (or bool) expression can take; [-2**62, 2**62] when unknown. */
function bounds (u) {
  let b = BOUNDS.get(u)
  if (b === undefined) {
    b = computeBounds(u)
    BOUNDS.set(u, b)
  }
  return b
}

function computeBounds (u) {
  const big = [-BIG, BIG]
  switch (u.op) {
    case 'CONST': {
      const v = Number(u.arg)
      return [v, v]
    }
    case 'RANGE': {
      const [, hi] = bounds(u.src[0])
      return [0, Math.max(hi - 1, 0)]
    }
    case 'DEFINE_VAR':
      return [Number(u.arg[1]), Number(u.arg[2])]
  }
  if (u.dtype === DTYPES.bool) return [0, 1]
  switch (u.op) {
    case 'ADD': {
      const [a, b] = bounds(u.src[0])
      const [c, d] = bounds(u.src[1])
      return [a + c, b + d]
    }
    case 'NEG': {
      const [a, b] = bounds(u.src[0])
      return [-b, -a]
    }
    case 'MUL': {
      const [a, b] = bounds(u.src[0])
      const [c, d] = bounds(u.src[1])
      const p = [a * c, a * d, b * c, b * d]
      return [Math.min(...p), Math.max(...p)]
    }
    case 'IDIV':
      if (isConst(u.src[1]) && u.src[1].arg > 0) {
        const [a, b] = bounds(u.src[0])
        const c = Number(u.src[1].arg)
        return [tdiv(a, c), tdiv(b, c)]
      }
      return big
    case 'MOD':
      if (isConst(u.src[1]) && u.src[1].arg > 0) {
        const [a, b] = bounds(u.src[0])
        const c = Number(u.src[1].arg)
        if (a >= 0) return b < c ? [a, b] : [0, c - 1]
        return [-(c - 1), c - 1]
      }
      return big
    case 'MAX': {
      const [a, b] = bounds(u.src[0])
      const [c, d] = bounds(u.src[1])
      return [Math.max(a, c), Math.max(b, d)]
    }
    case 'WHERE': {
      const [a, b] = bounds(u.src[1])
      const [c, d] = bounds(u.src[2])
      return [Math.min(a, c), Math.max(b, d)]
    }
    case 'CAST':
      if (u.src[0].dtype && u.src[0].dtype.isInt) return bounds(u.src[0])
      return big
  }
  return big
}

// ---- the code rows of the rule table (integers and bools only; BigInt arithmetic, wrapped by Graph.const)
const big = (v) => (typeof v === 'boolean' ? (v ? 1n : 0n) : BigInt(v))
const FOLD = {
  ADD: (a, b) => a + b,
  MUL: (a, b) => a * b,
  MAX: (a, b) => (a > b ? a : b),
  CMPLT: (a, b) => a < b,
  CMPNE: (a, b) => a !== b,
  CMPEQ: (a, b) => a === b,
  AND: (a, b) => a & b,
  OR: (a, b) => a | b,
  XOR: (a, b) => a ^ b
}

function foldBinary (g, x) {
  const [a, b] = x.src
  if (x.dtype === null || !(a.dtype.isInt || a.dtype.isBool)) return null
  const A = big(a.arg)
  const B = big(b.arg)
  const fn = FOLD[x.op]
  if (fn) return g.const(x.dtype, fn(A, B))
  if (x.op === 'IDIV' && B !== 0n) return g.const(x.dtype, A / B) // BigInt division truncates, as C
  if (x.op === 'MOD' && B !== 0n) return g.const(x.dtype, A % B)
  return null
}

/** The terms of a tree of ADDs, left to right (an explicit stack: a kernel's index may be a long sum). */
function splitSum (x) {
  const out = []
  const stack = [x]
  while (stack.length) {
    const t = stack.pop()
    if (t.op === 'ADD') stack.push(t.src[1], t.src[0])
    else out.push(t)
  }
  return out
}

function sum (g, terms) {
  let out = terms[0]
  for (let i = 1; i < terms.length; i++) out = g.alu('ADD', out, terms[i])
  return out
}

function constFactor (t) {
  if (isConst(t)) return Number(t.arg)
  if (t.op === 'MUL' && isConst(t.src[1])) return Number(t.src[1].arg)
  return 1
}

const pymod = (a, c) => ((a % c) + c) % c
function gcd (a, b) {
  a = Math.abs(a)
  b = Math.abs(b)
  while (b) [a, b] = [b, a % b]
  return a
}

function divideTerm (g, t, c) {
  if (isConst(t)) return g.const(t.dtype, Math.floor(Number(t.arg) / c))
  const k = Math.floor(Number(t.src[1].arg) / c)
  return k === 1 ? t.src[0] : g.alu('MUL', t.src[0], g.const(t.dtype, k))
}

/** (sum of terms)//c: pull out the terms that are multiples of c when the rest is non-negative (gone when it stays below c). */
function divSimplify (g, x, c) {
  const cv = Number(c.arg)
  if (!isInt(x) || cv <= 0) return null
  const [lo, hi] = bounds(x)
  if (lo >= 0 && hi < cv) return g.const(x.dtype, 0)
  if (lo < 0) return null
  const terms = splitSum(x)
  const whole = []
  const rest = []
  for (const t of terms) {
    const k = constFactor(t);
    (pymod(k, cv) === 0 && k !== 0 ? whole : rest).push(t)
  }
  if (!whole.length) {
    const factors = terms.map(constFactor)
    const gg = factors.reduce((a, b) => gcd(a, b), 0)
    if (gg > 1 && cv % gg === 0 && factors.every((f) => f !== 0)) {
      // (a*g + b*g) // c = (a + b) // (c/g)
      const inner = sum(g, terms.map((t) => divideTerm(g, t, gg)))
      return cv / gg !== 1 ? g.alu('IDIV', inner, g.const(inner.dtype, cv / gg)) : inner
    }
    return null
  }
  if (rest.length) {
    const restSum = sum(g, rest)
    const [rlo, rhi] = bounds(restSum)
    if (rlo < 0) return null
    // x and the rest non-negative: C's x/c is the floor, and floor(c*k + r, c) = k + r//c
    if (rhi >= cv) return sum(g, [...whole.map((t) => divideTerm(g, t, cv)), g.alu('IDIV', restSum, c)])
  }
  return sum(g, whole.map((t) => divideTerm(g, t, cv)))
}

function modSimplify (g, x, c) {
  const cv = Number(c.arg)
  if (!isInt(x) || cv <= 0) return null
  const [lo, hi] = bounds(x)
  if (lo >= 0 && hi < cv) return x
  if (cv === 1) return g.const(x.dtype, 0)
  if (lo < 0) return null
  const terms = splitSum(x)
  const keep = terms.filter((t) => pymod(constFactor(t), cv) !== 0)
  if (keep.length === terms.length) return modReduceFactors(g, terms, cv)
  if (!keep.length) return g.const(x.dtype, 0)
  const rest = sum(g, keep)
  if (bounds(rest)[0] < 0) return null // C's % truncates: dropping a multiple of c is only exact if the sign is kept
  return g.alu('MOD', rest, g.const(rest.dtype, cv))
}

/** (a*k + b) % c -> (a*(k % c) + b) % c when every term stays non-negative (sliding-window indices). */
function modReduceFactors (g, terms, c) {
  const out = []
  let changed = false
  for (let t of terms) {
    const k = constFactor(t)
    if (t.op === 'MUL' && isConst(t.src[1]) && k >= c && bounds(t.src[0])[0] >= 0) {
      t = k % c === 1 ? t.src[0] : g.alu('MUL', t.src[0], g.const(t.dtype, k % c))
      changed = true
    } else if (isConst(t) && Number(t.arg) >= c) {
      t = g.const(t.dtype, Number(t.arg) % c)
      changed = true
    }
    out.push(t)
  }
  if (!changed || out.some((t) => bounds(t)[0] < 0)) return null
  const s = sum(g, out)
  return g.alu('MOD', s, g.const(s.dtype, c))
}

/**
 * (a//c)*c + a%c + rest -> a + rest: C's truncating division and remainder satisfy (a/c)*c + a%c == a for
 * every a (a flat index split into two axes and joined again).
 */
function divmodFold (g, x) {
  if (!isInt(x)) return null
  const terms = splitSum(x)
  const key = (a, c) => `${a.id}|${exact(c.arg)}`
  const mods = new Map()
  terms.forEach((t, i) => {
    if (t.op === 'MOD' && isConst(t.src[1]) && Number(t.src[1].arg) !== 0) mods.set(key(t.src[0], t.src[1]), i)
  })
  if (!mods.size) return null
  for (let i = 0; i < terms.length; i++) {
    const t = terms[i]
    if (t.op === 'MUL' && isConst(t.src[1]) && t.src[0].op === 'IDIV' && isConst(t.src[0].src[1]) &&
        exact(t.src[0].src[1].arg) === exact(t.src[1].arg)) {
      const j = mods.get(key(t.src[0].src[0], t.src[1]))
      if (j !== undefined) return sum(g, [t.src[0].src[0], ...terms.filter((u, k) => k !== i && k !== j)])
    }
  }
  return null
}

function cmpFold (g, x, a, b) {
  if (!(isInt(a) && isInt(b))) return null
  const [alo, ahi] = bounds(a)
  const [blo, bhi] = bounds(b)
  if (x.op === 'CMPLT') {
    if (ahi < blo) return g.const(DTYPES.bool, true)
    if (alo >= bhi) return g.const(DTYPES.bool, false)
  }
  return null
}

/** WHERE(gate, LOAD gated by gate, +0): a gated load gives +0 where its gate is false, so the select changes nothing. */
function gatedLoadSelect (g, gate, ld, c) {
  if (!Object.is(Number(c.arg), 0)) return null
  const ix = ld.src[0]
  return ix.op === 'INDEX' && ix.src.length > 2 && ix.src[2] === gate ? ld : null
}

// the named conditions and code functions of polygrad-core's definitions/symbolic_rules.py (Python: uop/symbolic.py)
const CONDITIONS = {
  is_int: isInt,
  is_bool: (u) => u.dtype === DTYPES.bool,
  has_dtype: (u) => u.dtype !== null,
  not_bool: (u) => u.dtype !== null && u.dtype !== DTYPES.bool,
  not_const: (u) => !isConst(u),
  nonneg: (u) => bounds(u)[0] >= 0,
  positive: (c) => constValue(c) > 0,
  nonzero: (c) => Number(c.arg) !== 0,
  divides: (b, a) => {
    const [A, B] = [constValue(a), constValue(b)]
    return typeof A === 'bigint' && typeof B === 'bigint' ? A % B === 0n : Number(A) % Number(B) === 0
  },
  same: (a, b) => a === b,
  equal: (...cs) => cs.every((c) => constValue(c) === constValue(cs[0]))
}
const CODE = {
  fold_binary: foldBinary,
  divmod_fold: divmodFold,
  div_simplify: divSimplify,
  mod_simplify: modSimplify,
  cmp_fold: cmpFold,
  gated_load_select: gatedLoadSelect
}

/** One rewrite of node x (the first row of the rule table that applies), or null. */
const rewrite = compileRules(TABLE.RULES, CONDITIONS, CODE)

/** root rewritten bottom-up with `rule(g, node)` until nothing changes (graph_rewrite). */
function graphRewrite (g, root, rule = rewrite) {
  const done = new Map()
  const visit = (start) => {
    const stack = [start, 0]
    while (stack.length) {
      const stage = stack.pop()
      const node = stack.pop()
      if (done.has(node)) continue
      if (stage === 0) {
        stack.push(node, 1)
        for (let i = node.src.length - 1; i >= 0; i--) if (!done.has(node.src[i])) stack.push(node.src[i], 0)
        continue
      }
      let changed = false
      const src = node.src.map((s) => {
        const t = done.get(s)
        if (t !== s) changed = true
        return t
      })
      let cur = changed ? g.node(node.op, node.dtype, src, node.arg) : node
      for (let i = 0; i < 1000; i++) {
        const nxt = rule(g, cur)
        if (nxt === null || nxt === cur) break
        // as Python's graph_rewrite: a new node is rewritten bottom-up first; one already seen is taken as it
        // is (not as it was rewritten), so both languages reach the same fixed point
        cur = done.has(nxt) ? nxt : visit(nxt)
      }
      done.set(node, cur)
    }
    return done.get(start)
  }
  return visit(root)
}

/** Fold constants and simplify index arithmetic (Python's simplify_indices). */
function simplifyIndices (g, ast) {
  return graphRewrite(g, ast)
}

/**
 * c such that expr = c*r + (terms without r) (0 where r does not appear, or only times 0), null if r appears
 * otherwise: Python's range_coeff, one walk over expr's nodes (sources first).
 */
function rangeCoeff (expr, r) {
  if (expr === r) return 1
  const coeff = new Map([[r, 1]])
  for (const node of toposort(expr)) {
    if (coeff.has(node)) continue
    const cs = node.src.map((s) => (coeff.has(s) ? coeff.get(s) : 0))
    let c = null
    if (cs.every((x) => x === 0)) c = 0
    else if (cs.some((x) => x === null)) c = null
    else if (node.op === 'ADD') c = cs[0] + cs[1]
    else if (node.op === 'MUL' && isConst(node.src[1]) && cs[1] === 0) c = cs[0] * Number(node.src[1].arg)
    coeff.set(node, c)
  }
  return coeff.get(expr)
}

module.exports = { bounds, simplifyIndices, graphRewrite, rangeCoeff, splitSum, tdiv, CONDITIONS, CODE }
