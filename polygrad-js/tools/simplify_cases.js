'use strict'
/**
 * Index expressions through polygrad-js's simplifier: `node tools/simplify_cases.js IN.json OUT.json`.
 *
 * Stage: tests (the differential simplifier test, tests/test_simplify_differential.py). Input: IN.json,
 * {kernels: a serialised kernel table whose roots are the expressions}. Output: OUT.json, {kernels: the
 * table of the simplified roots, in order, bounds: [[min, max] of each input root]}.
 */

const fs = require('fs')
const { Graph, decode, encode } = require('../src/ir')
const { bounds, simplifyIndices } = require('../src/simplify')
const { parse, stringify } = require('../src/json')

function main () {
  const [input, output] = process.argv.slice(2)
  const plan = parse(fs.readFileSync(input, 'utf8'))
  const g = new Graph()
  const roots = decode(plan.kernels, g)
  const simplified = roots.map((r) => simplifyIndices(g, r))
  const out = { kernels: encode(simplified), bounds: roots.map((r) => bounds(r)) }
  fs.writeFileSync(output, stringify(out))
}

main()
