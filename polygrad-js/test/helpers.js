'use strict'
// Shared helpers for the node --test suite.
const fs = require('fs')
const path = require('path')
const bundle = require('../src/bundle')
const { crc32 } = require('../src/crc32')

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

/** {text, data, version}: a bundle's manifest bytes, data section and header version. */
function split (bytes) {
  const v = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength)
  const mlen = v.getUint32(16, true)
  const start = 64 + Math.ceil(mlen / 64) * 64
  return { text: bytes.slice(64, 64 + mlen), data: bytes.slice(start), version: v.getUint32(8, true) }
}

/** A bundle of manifest bytes and a data section with a consistent header (lengths, checksums). */
function pack (text, data, version = 1) {
  const start = 64 + Math.ceil(text.length / 64) * 64
  const out = new Uint8Array(start + data.length)
  out.set(bundle.MAGIC, 0)
  const v = new DataView(out.buffer)
  v.setUint32(8, version, true)
  v.setUint32(16, text.length, true)
  v.setUint32(24, data.length, true)
  v.setUint32(32, crc32(text), true)
  v.setUint32(36, crc32(data), true)
  out.set(text, 64)
  out.set(data, start)
  return out
}

module.exports = { FIXTURES, REPO, fixture, reference, maxRel, split, pack }
