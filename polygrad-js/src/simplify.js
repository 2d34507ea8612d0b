'use strict'
/**
 * Index simplification: constant folding and integer identities, a port of polygrad's symbolic_rules
 * (uop/symbolic.py) and of graph_rewrite (bottom-up to a fixed point).
 *
 * Stage: lowering. Input: kernel IR. Output: the same values with cheaper index arithmetic. Floats are
 * never folded (the rounding rules belong to the renderer), so results do not change, only the work.
 * Also here: `bounds(u)` (the inclusive range an integer expression can take, conservative) and
 * `rangeCoeff(expr, r)` (c with expr = c*r + terms without r, or null), which the lowering uses.
 */

const { DTYPES } = require('./dtypes')
const { toposort } = require('./ir')

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

// ---- folding (integers and bools only; BigInt arithmetic, wrapped by Graph.const)
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
  if (!(a.dtype.isInt || a.dtype.isBool)) return null
  const A = big(a.arg)
  const B = big(b.arg)
  const fn = FOLD[x.op]
  if (fn) return g.const(x.dtype, fn(A, B))
  if (x.op === 'IDIV' && B !== 0n) return g.const(x.dtype, A / B) // BigInt division truncates, as C
  if (x.op === 'MOD' && B !== 0n) return g.const(x.dtype, A % B)
  return null
}

function splitSum (x, out = []) {
  if (x.op === 'ADD') {
    splitSum(x.src[0], out)
    splitSum(x.src[1], out)
  } else {
    out.push(x)
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
      const inner = sum(g, terms.map((t) => divideTerm(g, t, gg)))
      return cv / gg !== 1 ? g.alu('IDIV', inner, g.const(x.dtype, cv / gg)) : inner
    }
    return null
  }
  if (rest.length) {
    const [rlo, rhi] = bounds(sum(g, rest))
    if (rlo < 0 || rhi >= cv) return null
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
  if (keep.length === terms.length) return modReduceFactors(g, terms, cv, x.dtype)
  if (!keep.length) return g.const(x.dtype, 0)
  const rest = sum(g, keep)
  if (bounds(rest)[0] < 0) return null
  return g.alu('MOD', rest, g.const(x.dtype, cv))
}

function modReduceFactors (g, terms, c, dtype) {
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
  return g.alu('MOD', sum(g, out), g.const(dtype, c))
}

const eqConst = (u, v) => isConst(u) && Number(u.arg) === v

/** One rewrite of node x (the first rule that applies), or null. */
function rewrite (g, x) {
  const s = x.src
  switch (x.op) {
    case 'NEG':
      if (isConst(s[0]) && x.dtype !== DTYPES.bool) {
        const v = s[0].arg
        return g.const(x.dtype, x.dtype.isFloat ? -v : -big(v))
      }
      return null
    case 'CAST':
      if (isConst(s[0]) && x.dtype.isInt && s[0].dtype.isInt) return g.const(x.dtype, s[0].arg)
      return null
    case 'WHERE':
      if (isConst(s[0])) return s[0].arg ? s[1] : s[2]
      if (s[1] === s[2]) return s[1]
      // a load gated by s[0] gives +0 where s[0] is false: selecting it by s[0] against +0 changes nothing
      if (s[1].op === 'LOAD' && isConst(s[2]) && Object.is(Number(s[2].arg), 0) && s[1].src[0].op === 'INDEX' &&
          s[1].src[0].src.length > 2 && s[1].src[0].src[2] === s[0]) return s[1]
      return null
  }
  if (s.length !== 2) return null
  const [a, b] = s
  if (isConst(a) && isConst(b) && x.op in FOLD_OPS) {
    const r = foldBinary(g, x)
    if (r) return r
  }
  switch (x.op) {
    case 'ADD':
      if (isConst(a) && !isConst(b)) return g.node('ADD', x.dtype, [b, a])
      if (eqConst(b, 0) && isInt(a)) return a
      if (a.op === 'ADD' && isConst(a.src[1]) && isConst(b) && isInt(a.src[0])) {
        return g.alu('ADD', a.src[0], g.const(a.src[0].dtype, big(a.src[1].arg) + big(b.arg)))
      }
      if (a.op === 'ADD' && isConst(a.src[1]) && isInt(a.src[0]) && !isConst(b)) {
        return g.alu('ADD', g.alu('ADD', a.src[0], b), a.src[1])
      }
      return null
    case 'MUL':
      if (isConst(a) && !isConst(b)) return g.node('MUL', x.dtype, [b, a])
      if (eqConst(b, 1) && a.dtype) return a // exact in every dtype (floats keep -0, infinities, NaN)
      if (eqConst(b, 0) && isInt(a)) return g.const(x.dtype, 0)
      if (a.op === 'MUL' && isConst(a.src[1]) && isConst(b) && isInt(a.src[0])) {
        return g.alu('MUL', a.src[0], g.const(a.src[0].dtype, big(a.src[1].arg) * big(b.arg)))
      }
      if (a.op === 'ADD' && isConst(b) && isInt(a.src[0])) {
        return g.alu('ADD', g.alu('MUL', a.src[0], b), g.alu('MUL', a.src[1], b))
      }
      return null
    case 'IDIV':
      if (eqConst(b, 1) && isInt(a)) return a
      if (isConst(b)) {
        const r = divSimplify(g, a, b)
        if (r) return r
        if (a.op === 'IDIV' && isConst(a.src[1]) && isInt(a.src[0]) && bounds(a.src[0])[0] >= 0 && a.src[1].arg > 0 && b.arg > 0) {
          return g.alu('IDIV', a.src[0], g.const(b.dtype, big(a.src[1].arg) * big(b.arg)))
        }
      }
      return null
    case 'MOD':
      if (isConst(b)) {
        const r = modSimplify(g, a, b)
        if (r) return r
        if (a.op === 'MOD' && isConst(a.src[1]) && isInt(a.src[0]) && bounds(a.src[0])[0] >= 0 && b.arg > 0 && big(a.src[1].arg) % big(b.arg) === 0n) {
          return g.alu('MOD', a.src[0], b)
        }
      }
      return null
    case 'CMPLT':
      if (isInt(a) && isInt(b)) {
        const [alo, ahi] = bounds(a)
        const [blo, bhi] = bounds(b)
        if (ahi < blo) return g.const(DTYPES.bool, true)
        if (alo >= bhi) return g.const(DTYPES.bool, false)
      }
      return null
    case 'AND':
      if (x.dtype === DTYPES.bool) {
        if (isConst(b) && b.arg === true) return a
        if (isConst(a) && a.arg === true) return b
      }
      return null
  }
  return null
}
const FOLD_OPS = { ADD: 1, MUL: 1, MAX: 1, IDIV: 1, MOD: 1, CMPLT: 1, CMPNE: 1, CMPEQ: 1, AND: 1, OR: 1, XOR: 1 }

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
        cur = done.has(nxt) ? done.get(nxt) : visit(nxt)
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

/** c such that expr = c*r + (terms without r), 0 if r does not appear, null if it appears otherwise. */
function rangeCoeff (expr, r) {
  if (expr === r) return 1
  if (!toposort(expr).includes(r)) return 0
  if (expr.op === 'ADD') {
    const a = rangeCoeff(expr.src[0], r)
    const b = rangeCoeff(expr.src[1], r)
    return a === null || b === null ? null : a + b
  }
  if (expr.op === 'MUL' && isConst(expr.src[1])) {
    const a = rangeCoeff(expr.src[0], r)
    return a === null ? null : a * Number(expr.src[1].arg)
  }
  return null
}

module.exports = { bounds, simplifyIndices, graphRewrite, rangeCoeff, splitSum, tdiv }
