'use strict'
/**
 * Kernel fission for tiled reductions: an elementwise prologue that a register tile would recompute is
 * computed once into a scratch buffer first.
 *
 * Stage: lowering, after index simplification, before choosing opts. Input: a kernel whose one block
 * stores a reduction over one range k (a matmul with fused activations: relu(h + b) @ W.T, or a weight
 * gradient whose rows carry a ReLU mask). Output: the same kernel with extra blocks in front, one per
 * prologue: `scratch[t][flat(ranges)] = prologue` over the prologue's own ranges, and the reduction reading
 * the scratch instead. A prologue qualifies when it is float arithmetic of at least two ops over loads,
 * depends on k, and does not move along an output range of 16 or more points (which the tile would sweep,
 * recomputing it each time). Values are unchanged bit for bit: the scratch holds exactly the prologue's
 * float32 results. Blocks run in order, so the reduction sees the finished scratch.
 *
 * The scratch buffers are extra kernel parameters (slots after the kernel's own); the runtime reserves
 * their memory once at load (`scratchBytes`) and shares it between kernels.
 */

const { toposort } = require('./ir')
const { DTYPES } = require('./dtypes')
const { topLevelReduces } = require('./lower')
const { rangeCoeff } = require('./simplify')

const MIN_COST = 2
const MIN_SWEEP = 16
const constSize = (r) => (r.src[0].op === 'CONST' ? Number(r.src[0].arg) : null)

function depsOf (root) {
  const memo = new Map()
  for (const n of toposort(root)) {
    let s
    if (n.op === 'RANGE') s = new Set([n])
    else {
      s = new Set()
      for (const x of n.src) for (const r of memo.get(x)) s.add(r)
      if (n.op === 'REDUCE') for (const r of n.src.slice(1)) s.delete(r)
    }
    memo.set(n, s)
  }
  return memo
}

/** ALU nodes in x's value (index arithmetic and loads excluded). */
function cost (x) {
  let n = 0
  const seen = new Set()
  const stack = [x]
  while (stack.length) {
    const u = stack.pop()
    if (seen.has(u)) continue
    seen.add(u)
    if (u.op === 'LOAD' || u.op === 'CONST' || u.op === 'INDEX' || u.op === 'RANGE' || u.op === 'DEFINE_VAR') continue
    if (u.op === 'REDUCE') return -1
    n++
    stack.push(...u.src)
  }
  return n
}

function maxSize (r) {
  const c = constSize(r)
  if (c !== null) return c
  const { bounds } = require('./simplify')
  return Math.max(bounds(r.src[0])[1], 0)
}

/**
 * {ast, scratch: [{dtype, size}]} of a kernel with its prologues split off, or null when nothing qualifies.
 */
function fission (g, ast) {
  if (ast.src.length !== 1 || ast.src[0].op !== 'END' || ast.src[0].src[0].op !== 'STORE' || ast.src[0].src[0].arg !== null) return null
  const end = ast.src[0]
  const store = end.src[0]
  const outer = end.src.slice(1)
  const reds = topLevelReduces(store)
  if (reds.length !== 1 || reds[0].src.length !== 2 || reds[0].arg !== 'ADD') return null
  const red = reds[0]
  const k = red.src[1]
  const deps = depsOf(ast)
  const sweeps = outer.filter((r) => (constSize(r) || 0) >= MIN_SWEEP)
  if (!sweeps.length) return null
  // candidates: float32 values inside the reduction that depend on k and miss a long output range
  const inBody = toposort(red.src[0])
  const ok = new Set(inBody.filter((x) => x.dtype === DTYPES.float32 && x.op !== 'LOAD' && x.op !== 'CONST' &&
    deps.get(x).has(k) && sweeps.some((r) => !deps.get(x).has(r)) && [...deps.get(x)].every((r) => r === k || outer.includes(r)) &&
    cost(x) >= MIN_COST))
  // keep the maximal ones (no candidate above them)
  const chosen = [...ok].filter((x) => !inBody.some((y) => ok.has(y) && y !== x && toposort(y).includes(x)))
  if (!chosen.length) return null
  const params = toposort(ast).filter((n) => n.op === 'DEFINE_GLOBAL').map((n) => n.arg[0])
  let slot = params.length ? Math.max(...params) + 1 : 0
  let axis = Math.max(...toposort(ast).filter((n) => n.op === 'RANGE').map((r) => r.arg[0])) + 1
  const int = DTYPES.int32
  const blocks = []
  const replace = new Map()
  const scratch = []
  for (const x of chosen) {
    // the scratch keeps the memory order of the prologue's first load (row-major along its strides), so the
    // reduction reads it with the access pattern the original kernel had
    const first = toposort(x).find((n) => n.op === 'LOAD')
    const order = (r) => (first ? rangeCoeff(first.src[0].src[1], r) || 0 : 0)
    const rs = [...outer, k].filter((r) => deps.get(x).has(r)).sort((a, b) => order(b) - order(a))
    const sizes = rs.map(maxSize)
    const total = sizes.reduce((a, b) => a * b, 1)
    if (total > 2 ** 28) continue
    const buf = g.node('DEFINE_GLOBAL', DTYPES.float32, [], [slot, [total]])
    // the block's own copies of the ranges, so each block is optimised on its own
    const fresh = new Map(rs.map((r) => [r, g.node('RANGE', r.dtype, r.src, [axis++, r.arg[1] === 'reduce' ? 'global' : r.arg[1]])]))
    const flat = (map) => {
      let idx = null
      rs.forEach((r, i) => {
        const stride = sizes.slice(i + 1).reduce((a, b) => a * b, 1)
        const term = stride === 1 ? map(r) : g.alu('MUL', map(r), g.const(int, stride))
        idx = idx === null ? term : g.alu('ADD', idx, term)
      })
      return idx
    }
    const value = g.substitute(x, fresh)
    const st = g.node('STORE', null, [g.node('INDEX', DTYPES.float32, [buf, flat((r) => fresh.get(r))]), value])
    blocks.push(g.node('END', null, [st, ...rs.map((r) => fresh.get(r))]))
    replace.set(x, g.node('LOAD', DTYPES.float32, [g.node('INDEX', DTYPES.float32, [buf, flat((r) => r)])]))
    scratch.push({ slot, dtype: DTYPES.float32, size: total })
    slot++
  }
  if (!blocks.length) return null
  const main = g.substitute(end, replace)
  return { ast: g.node('SINK', null, [...blocks, main], ast.arg), scratch }
}

// an epilogue of at least this many ALU ops (GPT-2's tanh GELU: about 150) is split off a matrix product
const EPILOGUE_MIN_COST = 48

/**
 * Epilogue fission: a matrix product (two or more global ranges, one sum over at least MIN_SWEEP points: one
 * range, or a quantized weight's blocks and their values) whose stored value applies a long float epilogue to
 * its sum (GPT-2's c_fc: bias and tanh GELU, about 150 ops an element) becomes two blocks: the sum stored into
 * the output, then, over fresh copies of the output's ranges, the epilogue reading it back from there. The
 * tile's accumulators stay in registers across the product's loop instead of beside an epilogue that needs
 * more registers than the product (V8 spills), and the epilogue runs in lanes of its own. Values are unchanged
 * bit for bit: the output holds exactly the float32 sum the epilogue read from a register. Not where the block
 * reads its own output (an in-place update would see the sum), accumulates into it, or stores another dtype
 * than the sum's. Returns the kernel with its last block so split, or null.
 */
function epilogueFission (g, ast) {
  const end = ast.src[ast.src.length - 1]
  if (!ast.src.every((b) => b.op === 'END') || end.src[0].op !== 'STORE' || end.src[0].arg !== null) return null
  const store = end.src[0]
  const [index, value] = store.src
  const outer = end.src.slice(1)
  if (outer.filter((r) => r.arg[1] === 'global').length < 2 || outer.some((r) => r.arg[1] !== 'global')) return null
  const reds = topLevelReduces(store)
  if (reds.length !== 1 || reds[0].arg !== 'ADD') return null
  const red = reds[0]
  // the sum's points over all its ranges (a quantized weight's: its blocks, then a block's values)
  const points = red.src.slice(1).reduce((n, r) => n * (constSize(r) || 0), 1)
  if (red.dtype !== index.dtype || !red.dtype.isFloat || points < MIN_SWEEP) return null
  const slot = index.src[0].arg[0]
  const nodes = toposort(store)
  if (nodes.some((n) => n.op === 'LOAD' && n.src[0].src[0].arg[0] === slot)) return null
  // the epilogue's ALU ops: the value's nodes that are not the sum's own
  const own = new Set(toposort(red))
  const epi = toposort(value).filter((n) => !own.has(n) && !['LOAD', 'CONST', 'INDEX', 'RANGE', 'DEFINE_VAR', 'DEFINE_GLOBAL'].includes(n.op))
  if (epi.filter((n) => n.dtype && n.dtype.isFloat).length < EPILOGUE_MIN_COST) return null
  let axis = Math.max(...toposort(ast).filter((n) => n.op === 'RANGE').map((r) => r.arg[0])) + 1
  const product = g.node('END', null, [g.node('STORE', null, [index, red]), ...outer])
  const fresh = new Map(outer.map((r) => [r, g.node('RANGE', r.dtype, r.src, [axis++, r.arg[1]])]))
  const epilogue = g.substitute(g.substitute(value, new Map([[red, g.node('LOAD', red.dtype, [index])]])), fresh)
  const tail = g.node('END', null, [g.node('STORE', null, [g.substitute(index, fresh), epilogue]), ...outer.map((r) => fresh.get(r))])
  return g.node('SINK', null, [...ast.src.slice(0, -1), product, tail], ast.arg)
}

module.exports = { fission, epilogueFission }
