'use strict'
// The package as published: no runtime dependencies, no wasm files, nothing evaluated, size limits.
const test = require('node:test')
const assert = require('node:assert')
const fs = require('fs')
const path = require('path')

const ROOT = path.join(__dirname, '..')

function sources (dir = path.join(ROOT, 'src'), out = []) {
  for (const f of fs.readdirSync(dir)) {
    const p = path.join(dir, f)
    if (fs.statSync(p).isDirectory()) sources(p, out)
    else out.push(p)
  }
  return out
}

test('no runtime dependencies and no wasm blobs', () => {
  const pkg = JSON.parse(fs.readFileSync(path.join(ROOT, 'package.json'), 'utf8'))
  assert.deepStrictEqual(pkg.dependencies || {}, {})
  for (const f of sources()) assert.ok(!f.endsWith('.wasm'), f)
  for (const f of pkg.files) assert.ok(!f.endsWith('.wasm'), f)
})

test('no eval or Function constructor anywhere in the package source', () => {
  for (const f of [...sources(), path.join(ROOT, 'index.js')]) {
    const text = fs.readFileSync(f, 'utf8')
    assert.ok(!/\beval\s*\(/.test(text), `${f} calls eval`)
    assert.ok(!/new\s+Function\s*\(/.test(text), `${f} builds a Function from a string`)
  }
})

test('the minified browser build stays under 300 KB', { skip: !fs.existsSync(path.join(ROOT, 'node_modules', 'esbuild')) && 'esbuild is not installed' }, () => {
  const { build } = require('../tools/build')
  const r = build()
  assert.ok(r.minified !== null && r.minified < 300 * 1024, `${r.minified} bytes`)
})
