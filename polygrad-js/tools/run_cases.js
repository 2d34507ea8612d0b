#!/usr/bin/env node
'use strict'
/**
 * Run a plan of cases against the package and write the results: the Node half of the cross-language
 * tests (tests/test_js.py). Usage: node tools/run_cases.js plan.json results.json
 *
 * plan.json: {"cases": [{"name", "bundle" (path), "backend"?, "forward"?: {input: Array}, "fit"?: {
 *   "data": {name: Array}, "options": {...}}, "trainStep"?: ..., "save"?: path}]}; arrays are {dtype, shape,
 * data (base64, little-endian)}. results.json: {name: {"outputs": {name: array}, "losses": [...], "error"?}}.
 */

const fs = require('fs')
const path = require('path')
const { Model } = require(path.join(__dirname, '..'))
const { DTYPES } = require('../src/dtypes')

function decode (a) {
  const raw = Buffer.from(a.data, 'base64')
  const ab = new ArrayBuffer(raw.length)
  new Uint8Array(ab).set(raw)
  const T = DTYPES[a.dtype].store
  return { data: new T(ab), shape: a.shape }
}

function encode (arr) {
  const dtype = arr instanceof Float32Array ? 'float32' : arr instanceof Int32Array ? 'int32' : arr instanceof Float64Array ? 'float64'
    : arr instanceof BigInt64Array ? 'int64' : arr instanceof Uint8Array ? 'uint8' : arr instanceof Uint32Array ? 'uint32' : 'float32'
  return { dtype, shape: arr.shape, data: Buffer.from(arr.buffer, arr.byteOffset, arr.byteLength).toString('base64') }
}

function main () {
  const plan = JSON.parse(fs.readFileSync(process.argv[2], 'utf8'))
  const out = {}
  for (const c of plan.cases) {
    const r = out[c.name] = {}
    let m
    try {
      const t0 = performance.now()
      m = Model.load(c.bundle, Object.assign({ verify: true }, c.backend ? { backend: c.backend } : {}))
      r.load_ms = performance.now() - t0
      const inputs = (src) => Object.fromEntries(Object.entries(src).map(([k, v]) => [k, decode(v)]))
      if (c.fit) r.losses = m.fit(inputs(c.fit.data), c.fit.options || {})
      if (c.forward) r.outputs = Object.fromEntries(Object.entries(m.forward(inputs(c.forward))).map(([k, v]) => [k, encode(v)]))
      if (c.save) fs.writeFileSync(c.save, m.save())
      r.summary = m.summary()
      r.stats = m._x.stats
    } catch (e) {
      r.error = `${e.constructor.name}: ${e.message}`
    } finally {
      if (m) m.dispose()
    }
  }
  fs.writeFileSync(process.argv[3], JSON.stringify(out))
}

main()
