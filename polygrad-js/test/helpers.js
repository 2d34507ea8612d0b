'use strict'
// Shared helpers for the node --test suite.
const fs = require('fs')
const path = require('path')

const FIXTURES = path.join(__dirname, 'fixtures')
const REPO = path.join(__dirname, '..', '..')

function fixture (name) {
  return fs.readFileSync(path.join(FIXTURES, name))
}

function reference () {
  return JSON.parse(fs.readFileSync(path.join(FIXTURES, 'reference.json'), 'utf8'))
}

/** max |a - b| / max(|b|, floor) over two arrays */
function maxRel (a, b, floor = 1e-6) {
  let m = 0
  for (let i = 0; i < b.length; i++) m = Math.max(m, Math.abs(a[i] - b[i]) / Math.max(Math.abs(b[i]), floor))
  return m
}

module.exports = { FIXTURES, REPO, fixture, reference, maxRel }
