'use strict'
/**
 * Packed weights for the few-rows variant of x @ W.T, and for x @ W (a weight read across its rows: GPT-2's
 * Conv1D layout) in any variant: a load that reads every element of a buffer once per
 * kernel, at an index affine in constant-size ranges, reads instead a packed copy laid out in the order the
 * kernel's loops visit it (loops outermost first, then the register tile's unrolled points, then the vector
 * lanes), so each reduction step reads one contiguous block instead of one short piece of each of the
 * tile's rows (the bench MLP's batch-1 forward: 8 interleaved row streams become one stream).
 *
 * Stage: lowering, after applyOpts (compile.js), before linearizing. Input: the lowered kernel and which of
 * its parameters may be packed. Output: the kernel reading the packed copies (new parameters after the
 * kernel's own, as fission's scratch) and their layouts. The values read are the same elements, so results
 * are unchanged bit for bit. The runtime (runtime.js) fills a packed copy from its buffer before a call
 * whenever the buffer was written since the copy was made (`repack`).
 */

const { toposort } = require('./ir')

/** {terms: Map RANGE -> coefficient, c} of an index that is a sum of constant multiples of ranges, or null. */
function affine (x) {
  if (x.op === 'RANGE') return { terms: new Map([[x, 1]]), c: 0 }
  if (x.op === 'CONST') return { terms: new Map(), c: Number(x.arg) }
  if (x.op === 'ADD') {
    const a = affine(x.src[0])
    const b = a && affine(x.src[1])
    if (!b) return null
    for (const [r, k] of b.terms) a.terms.set(r, (a.terms.get(r) || 0) + k)
    return { terms: a.terms, c: a.c + b.c }
  }
  if (x.op === 'MUL' && (x.src[1].op === 'CONST' || x.src[0].op === 'CONST')) {
    const [v, m0] = x.src[1].op === 'CONST' ? x.src : [x.src[1], x.src[0]]
    const a = affine(v)
    if (!a) return null
    const m = Number(m0.arg)
    return { terms: new Map([...a.terms].map(([r, k]) => [r, k * m])), c: a.c * m }
  }
  return null
}

const constSize = (r) => (r.src[0].op === 'CONST' ? Number(r.src[0].arg) : null)

/**
 * {ast, packs: [{slot, from, dtype, size, sizes, src}]} of a lowered kernel: `from` is the packed
 * parameter, `slot` the packed copy's parameter, `sizes` the ranges' sizes in the packed order (outermost
 * first) and `src` their coefficients in the original buffer. `eligible(param)` says which parameters may be
 * packed; a parameter the kernel stores to never is. `vector` is the set of lane ranges (applyOpts). With
 * `main` (a kernel's full-size variant), only loads that no reduction loop reads again and whose innermost
 * loop strides across rows are packed.
 */
function packLoads (g, ast, vector, eligible, { main = false } = {}) {
  const nodes = toposort(ast)
  const stored = new Set(nodes.filter((n) => n.op === 'STORE').map((n) => n.src[0].src[0].arg[0]))
  // loop order: the blocks' ranges as their END lists them (outermost first), then the reduces' own ranges,
  // outer reduces first
  const loops = []
  const add = (own) => { for (const r of own) if (r.arg[1] !== 'upcast' && !loops.includes(r)) loops.push(r) }
  for (const n of nodes) if (n.op === 'END') add(n.src.slice(1))
  for (const n of [...nodes].reverse()) if (n.op === 'REDUCE') add(n.src.slice(1))
  // the ranges around a node: its block's, and those of each REDUCE whose body holds it (a kernel with two
  // reductions, a block's 3x3 convolution and its 1x1 shortcut, reads each weight inside its own)
  const scopes = nodes.filter((n) => n.op === 'END' || n.op === 'REDUCE').map((n) => ({ body: new Set(toposort(n.src[0])), own: n.src.slice(1) }))
  const enclosing = (x) => scopes.filter((sc) => sc.body.has(x)).flatMap((sc) => sc.own)
  const params = nodes.filter((n) => n.op === 'DEFINE_GLOBAL').map((n) => n.arg[0])
  let next = params.length ? Math.max(...params) + 1 : 0
  const packs = []
  const replace = new Map()
  for (const index of nodes.filter((n) => n.op === 'INDEX' && n.src.length === 2)) {
    const buf = index.src[0]
    const from = buf.arg[0]
    if (stored.has(from) || !nodes.some((n) => n.op === 'LOAD' && n.src[0] === index)) continue
    const size = eligible(from)
    if (!size) continue
    const a = affine(index.src[1])
    if (!a || a.c !== 0 || [...a.terms].some(([r, k]) => k <= 0 || constSize(r) === null)) continue
    // every element exactly once: the coefficients, smallest first, are a mixed radix of the sizes
    const bySrc = [...a.terms].sort((p, q) => p[1] - q[1])
    let span = 1
    if (!bySrc.every(([r, k]) => { const ok = k === span; span *= constSize(r); return ok }) || span !== size) continue
    // main: the loops that read the load again (those around it along which it does not move, the register
    // tiles aside) are all output loops, so the copy is read as one stream per output tile: a matrix
    // product's weight (again per row: a prompt's tokens, BERT's 128 positions) and a convolution's (again per
    // pixel row and column: ResNet-18's 3x3 layers read 32 bytes of each 2 KB-apart row of (ky, kx, ci, co) per
    // step; packed, its deep layers took about 0.6x the time and the whole forward at batch 1 about 0.8x).
    // Not where a reduction loop reads it again (a weight read per step of an outer reduction).
    const again = enclosing(index).filter((r) => !a.terms.has(r) && r.arg[1] !== 'upcast')
    if (main && again.some((r) => r.arg[1] !== 'global')) continue
    const rank = (r) => (vector.has(r) ? 3 : r.arg[1] === 'upcast' ? 2 : loops.includes(r) ? 1 : 0)
    const order = [...a.terms.keys()].sort((p, q) => rank(p) - rank(q) || (rank(p) === 1 ? loops.indexOf(p) - loops.indexOf(q) : a.terms.get(q) - a.terms.get(p)))
    if (order.some((r) => rank(r) === 0)) continue
    // main: only where the innermost loop strides past a cache line (x @ W: a row of W per step), not where it
    // reads its rows contiguously (x @ W.T: a few streams of 16 bytes per step)
    const innermost = order.filter((r) => rank(r) === 1).pop()
    if (main && a.terms.get(innermost) <= 16) continue
    const sizes = order.map(constSize)
    let stride = 1
    const dst = new Map()
    for (let i = order.length - 1; i >= 0; i--) {
      dst.set(order[i], stride)
      stride *= sizes[i]
    }
    if (order.every((r) => dst.get(r) === a.terms.get(r))) continue // already in that order
    const int = index.src[1].dtype
    let idx = null
    for (const r of order) {
      const k = dst.get(r)
      const term = k === 1 ? r : g.alu('MUL', r, g.const(int, k))
      idx = idx === null ? term : g.alu('ADD', idx, term)
    }
    const slot = next++
    const copy = g.node('DEFINE_GLOBAL', buf.dtype, [], [slot, [size]])
    replace.set(index, g.node('INDEX', index.dtype, [copy, idx]))
    packs.push({ slot, from, dtype: index.dtype, size, sizes, src: order.map((r) => a.terms.get(r)) })
  }
  if (!packs.length) return { ast, packs }
  return { ast: g.substitute(ast, replace), packs }
}

/**
 * Fill a packed copy (element i of the copy at `dst`) from its buffer at `src` (element offsets in `view`).
 * Adjacent ranges that are contiguous together in the buffer are walked as one (a tile's columns and lanes:
 * runs of 8); the two innermost are plain loops, the second innermost (a weight's rows) in blocks of 64, so
 * a block's rows stay cached while every column tile takes its piece: GPT-2 small's 85M weights pack in a
 * few hundred ms, where element by element in the copy's order took seconds.
 */
function repack (view, src, dst, { sizes, src: coeffs }) {
  const sz = [sizes[sizes.length - 1]]
  const cf = [coeffs[coeffs.length - 1]]
  for (let i = sizes.length - 2; i >= 0; i--) {
    if (coeffs[i] === cf[0] * sz[0]) sz[0] *= sizes[i]
    else {
      sz.unshift(sizes[i])
      cf.unshift(coeffs[i])
    }
  }
  while (sz.length < 3) {
    sz.unshift(1)
    cf.unshift(0)
  }
  const n = sz.length
  const [K, cK, R, cR] = [sz[n - 2], cf[n - 2], sz[n - 1], cf[n - 1]]
  const outer = sz.slice(0, n - 2).reduce((a, b) => a * b, 1)
  const BLOCK = 64
  for (let k0 = 0; k0 < K; k0 += BLOCK) {
    const k1 = Math.min(K, k0 + BLOCK)
    const digit = new Array(n - 2).fill(0)
    let so = src
    for (let o = 0; o < outer; o++) {
      let d = dst + (o * K + k0) * R
      let s = so + k0 * cK
      for (let k = k0; k < k1; k++, s += cK, d += R) {
        if (cR === 1 && R >= 32) view.copyWithin(d, s, s + R)
        else for (let j = 0; j < R; j++) view[d + j] = view[s + j * cR]
      }
      for (let i = n - 3; i >= 0; i--) {
        so += cf[i]
        if (++digit[i] < sz[i]) break
        so -= cf[i] * sz[i]
        digit[i] = 0
      }
    }
  }
}

module.exports = { packLoads, repack, affine }
