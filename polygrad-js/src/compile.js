'use strict'
/**
 * One kernel from stored IR to a linearized program: the order of passes, in one place.
 *
 *   (checkKernel (validate.js) ran on the stored kernel when the bundle was read)
 *   0. decomposeTranscendentals   (transcendental.js) only for a bundle saved before polygrad-core stored
 *                                                   kernels decomposed (docs/bundle-format.md 2.4): frozen
 *   1. simplifyIndices, fission   (simplify.js, fission.js)  simplify index arithmetic; split off prologues a
 *                                                   register tile would recompute (scratch buffers)
 *   2. chooseOpts + applyOpts     (lower.js)        vector lanes, register tiles (width > 1 only)
 *      packLoads (pack, optional)  (pack.js)         weights read through a copy in loop order
 *   3. provenIndices (verify)     (validate.js)     accesses not proven in bounds get run-time checks
 *   4. linearize                  (linearize.js)    the structured program an emitter walks (`dot`: int32 sums
 *                                                   of byte products as relaxed SIMD's int8 dot product)
 *      (threads) phases: with `threaded`, when lower.threadable, each block linearized again with its
 *      first loop split into slices (linearize's `split`), one program per block, run block after block
 */

const { simplifyIndices } = require('./simplify')
const { chooseOpts, applyOpts, threadable } = require('./lower')
const { decomposeTranscendentals } = require('./transcendental')
const { linearize } = require('./linearize')
const { toposort } = require('./ir')
const { provenIndices } = require('./validate')
const { fission, epilogueFission } = require('./fission')
const { packLoads } = require('./pack')

/** The kernel after index simplification and fission: {ast, scratch: [{slot, dtype, size}]} (cache it). */
function prepareKernel (g, ast) {
  // an older bundle's EXP2/LOG2/SIN first: the kernel is then in the form a save stores today
  const simple = simplifyIndices(g, decomposeTranscendentals(g, ast))
  const split = fission(g, simple)
  const out = split ? { ast: simplifyIndices(g, split.ast), scratch: split.scratch } : { ast: simple, scratch: [] }
  const tail = epilogueFission(g, out.ast)
  if (tail) out.ast = simplifyIndices(g, tail)
  return out
}

/**
 * The linearized program of a kernel. The stored kernel was proven safe (validate.checkKernel) and every
 * pass here keeps its indices in bounds by construction; `verify` proves the lowered kernel again and
 * guards what it cannot prove with run-time checks (the tests run with it).
 */
function lowerKernel (g, ast, { width = 1, check = null, opts = null, prepared = null, verify = false, pack = null, packMain = false, threaded = false, dot = false, dotLanes = false } = {}) {
  let k = (prepared || prepareKernel(g, ast)).ast
  let vector = new Set()
  const chosen = opts !== null ? opts : chooseOpts(k, width)
  if (chosen.length) ({ ast: k, vector } = applyOpts(g, k, chosen))
  let packs = []
  if (pack) ({ ast: k, packs } = packLoads(g, k, vector, pack, { main: packMain }))
  const proven = check === null && verify ? provenIndices(k) : null
  const needsCheck = check || (proven ? (index) => !proven.has(index) : () => false)
  const prog = linearize(g, k, { vector, width, check: needsCheck, dot, dotLanes })
  if (chosen.length && !prog.vectorized && !toposort(k).some((n) => n.op === 'REDUCE')) {
    // lanes did not fit (a 64-bit or integer-division op): plain loops beat an unrolled scalar copy
    return lowerKernel(g, ast, { width, check, opts: [], prepared, verify, threaded, dot, dotLanes })
  }
  prog.packs = packs
  prog.phases = threaded ? phasesOf(g, k, prog, { vector, width, check: needsCheck, dot, dotLanes }) : null
  return prog
}

/**
 * The threaded form of a lowered kernel: per block, a program over a slice of its first loop (parameters
 * PART and PARTS first), with the lanes the whole kernel got, so every element is computed by the same
 * instructions as in `prog` (bit for bit). Null when the kernel cannot be split (lower.threadable).
 */
function phasesOf (g, k, prog, { vector, width, check, dot, dotLanes }) {
  if (!threadable(k)) return null
  const lanes = prog.vectorized ? vector : new Set()
  const phases = k.src.map((_, block) => linearize(g, k, { vector: lanes, width, check, split: true, block, dot, dotLanes }))
  return phases.every((p) => !!p.vectorized === !!prog.vectorized) ? phases : null
}

module.exports = { lowerKernel, prepareKernel }
