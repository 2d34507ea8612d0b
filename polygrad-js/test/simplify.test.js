'use strict'
// The index simplifier interprets polygrad-core's rule table (src/generated/symbolic_rules.js): it implements
// every condition, builder, value and code function the table names, and applies every row, the div/mod
// recombination included (tests/test_simplify_differential.py compares it with Python's on random indices).
const test = require('node:test')
const assert = require('node:assert')
const { Graph } = require('../src/ir')
const { DTYPES } = require('../src/dtypes')
const { simplifyIndices, CONDITIONS, CODE } = require('../src/simplify')
const { BUILDERS, VALUES } = require('../src/ruletable')
const TABLE = require('../src/generated/symbolic_rules')

test('the simplifier implements exactly the vocabulary of the rule table', () => {
  assert.deepStrictEqual(Object.keys(CONDITIONS).sort(), [...TABLE.CONDITIONS].sort())
  assert.deepStrictEqual(Object.keys(CODE).sort(), [...TABLE.CODE].sort())
  assert.deepStrictEqual(Object.keys(BUILDERS).sort(), [...TABLE.BUILDERS].sort())
  assert.deepStrictEqual(Object.keys(VALUES).sort(), [...TABLE.VALUES].sort())
})

test('a flat index split by // and % and joined again is the index (any order, beside other terms)', () => {
  const g = new Graph()
  const i32 = DTYPES.int32
  const c = (v) => g.const(i32, v)
  const r = g.node('RANGE', i32, [c(24)], [0, 'global'])
  const s = g.node('RANGE', i32, [c(5)], [1, 'global'])
  const x = g.alu('ADD', g.alu('MUL', r, c(5)), s)
  const hi = g.alu('MUL', g.alu('IDIV', x, c(7)), c(7))
  const lo = g.alu('MOD', x, c(7))
  assert.strictEqual(simplifyIndices(g, g.alu('ADD', hi, lo)), x)
  assert.strictEqual(simplifyIndices(g, g.alu('ADD', lo, hi)), x)
  const v = g.node('DEFINE_VAR', i32, [], ['n', 1, 9])
  assert.strictEqual(simplifyIndices(g, g.alu('ADD', g.alu('ADD', lo, v), hi)), g.alu('ADD', x, v))
})
