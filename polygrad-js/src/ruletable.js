'use strict'
/**
 * Rule rows written as data (src/generated/*_rules.js, rendered from polygrad-core's definitions/) applied to
 * a node: the JavaScript twin of polygrad-core's uop/rule_table.py, for the same pattern language
 * (documented in polygrad-core's definitions/symbolic_rules.py).
 *
 * Stage: shared (rule tables). Input: the rows, and the implementations of the table's named conditions and
 * code functions. Output: `rule(g, node)`, the replacement the first row that applies builds (or null), in the
 * rows' order, as graphRewrite takes it. The builders and values, which need nothing but the IR, live here.
 */

const { KernelError } = require('./errors')

/** An integer arg (number, BigInt or bool) as a BigInt, a float arg as a Number. */
function exact (v) {
  if (typeof v === 'bigint') return v
  if (typeof v === 'boolean') return v ? 1n : 0n
  return Number.isInteger(v) ? BigInt(v) : v
}

/** A CONST's value as Python's `arg` reads it: exact integers for int and bool dtypes, Numbers for floats. */
const constValue = (c) => (c.dtype.isFloat ? Number(c.arg) : exact(c.arg))

/** Two values of one kind (a BigInt and an int literal are made one). */
function pair (v, w) {
  if (typeof v === typeof w) return [v, w]
  return typeof v === 'bigint' ? [v, BigInt(w)] : [BigInt(v), w]
}

/** Python's truth of an arg: 0, -0, false and 0n are false, everything else (NaN included) true. */
const truthy = (v) => (typeof v === 'number' ? v !== 0 : typeof v === 'bigint' ? v !== 0n : Boolean(v))

/** A pattern's arg as Python compares it: as numbers (True == 1, 0 == 0.0). */
function argEquals (arg, want) {
  const t = typeof arg
  if (t !== 'number' && t !== 'bigint' && t !== 'boolean') return false
  const a = exact(arg)
  const b = exact(want)
  return typeof a === typeof b ? a === b : Number(a) === Number(b)
}

const VALUES = {
  arg: (c) => (cap) => constValue(cap[c]),
  add: (v, w) => arith(v, w, (a, b) => a + b),
  mul: (v, w) => arith(v, w, (a, b) => a * b),
  neg: (v) => {
    const f = value(v)
    return (cap) => -f(cap)
  }
}

function arith (v, w, fn) {
  const [f, h] = [value(v), value(w)]
  return (cap) => fn(...pair(f(cap), h(cap)))
}

function value (v) {
  if (typeof v === 'number') return () => v
  return VALUES[v[0]](...v.slice(1))
}

const BUILDERS = {
  const: (like, v) => {
    const f = value(v)
    return (g, cap) => g.const(cap[like].dtype, f(cap))
  },
  alu: (op, a, b) => {
    const [fa, fb] = [builder(a), builder(b)]
    return (g, cap) => g.alu(op, fa(g, cap), fb(g, cap))
  },
  with_src: (x, ...src) => {
    const parts = src.map(builder)
    return (g, cap) => g.node(cap[x].op, cap[x].dtype, parts.map((p) => p(g, cap)), cap[x].arg)
  },
  select: (c, a, b) => (g, cap) => (truthy(cap[c].arg) ? cap[a] : cap[b])
}

function builder (e) {
  if (typeof e === 'string') return (g, cap) => cap[e]
  if (!Object.prototype.hasOwnProperty.call(BUILDERS, e[0])) throw new KernelError(`internal: unknown builder ${e[0]} in a rule table`)
  return BUILDERS[e[0]](...e.slice(1))
}

function compilePattern (p) {
  return {
    ops: p.op ? new Set(p.op) : null,
    name: p.name === undefined ? null : p.name,
    arg: p.arg === undefined ? null : p.arg,
    src: p.src === undefined ? null : p.src.map(compilePattern)
  }
}

/** Whether node u matches pattern p, capturing into cap (a name used twice must capture one node). */
function match (p, u, cap) {
  if (p.ops !== null && !p.ops.has(u.op)) return false
  if (p.arg !== null && !argEquals(u.arg, p.arg)) return false
  if (p.name !== null) {
    const prev = cap[p.name]
    if (prev !== undefined && prev !== u) return false
    cap[p.name] = u
  }
  if (p.src === null) return true
  if (p.src.length !== u.src.length) return false
  for (let i = 0; i < p.src.length; i++) if (!match(p.src[i], u.src[i], cap)) return false
  return true
}

function compileRow (row, conditions, code) {
  if (row.code !== undefined) {
    const fn = code[row.code]
    const names = row.args
    return (g, cap) => fn(g, ...names.map((n) => cap[n]))
  }
  const checks = (row.when || []).map(([name, ...args]) => [conditions[name], args])
  const build = builder(row.build)
  return (g, cap) => {
    for (const [check, args] of checks) if (!check(...args.map((n) => cap[n]))) return null
    return build(g, cap)
  }
}

/**
 * The rule function of a table: rows in order, data rows through `conditions`, code rows through `code`
 * (functions (g, ...captures) -> node or null), both keyed by the names the rows use.
 */
function compileRules (rows, conditions, code) {
  const compiled = rows.map((row) => ({ pattern: compilePattern(row.pattern), apply: compileRow(row, conditions, code) }))
  const byOp = new Map()
  for (const r of compiled) {
    if (r.pattern.ops === null) continue
    for (const op of r.pattern.ops) if (!byOp.has(op)) byOp.set(op, compiled.filter((x) => x.pattern.ops === null || x.pattern.ops.has(op)))
  }
  const anyOp = compiled.filter((x) => x.pattern.ops === null)
  return (g, x) => {
    for (const r of byOp.get(x.op) || anyOp) {
      const cap = {}
      if (!match(r.pattern, x, cap)) continue
      const out = r.apply(g, cap)
      if (out !== null && out !== undefined && out !== x) return out
    }
    return null
  }
}

module.exports = { compileRules, constValue, exact, BUILDERS, VALUES }
