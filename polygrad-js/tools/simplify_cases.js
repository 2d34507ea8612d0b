'use strict'
/**
 * Index expressions or kernels through polygrad-js's simplifier:
 * `node tools/simplify_cases.js IN.json OUT.json [--decompose]`.
 *
 * Stage: tests (tests/test_simplify_differential.py, tests/test_bundle_transcendentals.py). Input: IN.json,
 * {kernels: a serialised kernel table}. Output: OUT.json, {kernels: the table of the simplified roots, in
 * order, bounds: [[min, max] of each input root], coeffs: [{axis id: rangeCoeff(root, that RANGE)} of each
 * input root]}. With --decompose, EXP2/LOG2/SIN are decomposed first
 * (transcendental.js), as compile.js does for an older bundle's kernels.
 */

const fs = require('fs')
const { Graph, decode, encode, toposort } = require('../src/ir')
const { bounds, rangeCoeff, simplifyIndices } = require('../src/simplify')
const { decomposeTranscendentals } = require('../src/transcendental')
const { parse, stringify } = require('../src/json')

function main () {
  const [input, output, flag] = process.argv.slice(2)
  const plan = parse(fs.readFileSync(input, 'utf8'))
  const g = new Graph()
  const roots = decode(plan.kernels, g)
  const decompose = flag === '--decompose' ? (r) => decomposeTranscendentals(g, r) : (r) => r
  const simplified = roots.map((r) => simplifyIndices(g, decompose(r)))
  const coeffs = roots.map((r) => Object.fromEntries(toposort(r).filter((n) => n.op === 'RANGE').map((n) => [n.arg[0], rangeCoeff(r, n)])))
  const out = { kernels: encode(simplified), bounds: roots.map((r) => bounds(r)), coeffs }
  fs.writeFileSync(output, stringify(out))
}

main()
