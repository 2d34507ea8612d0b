'use strict'
/**
 * polygrad for Node.js (CommonJS): `const { Model } = require('polygrad')`.
 *
 * Model.load(path) reads a .pgb bundle synchronously and compiles its kernels to WebAssembly;
 * Model.fromBytes(bytes) does the same asynchronously (as in browsers), Model.fromBytesSync(bytes)
 * synchronously.
 */

const fs = require('fs')
const zlib = require('zlib')
const api = require('./src/index')
const { useNative } = require('./src/crc32')

if (typeof zlib.crc32 === 'function') useNative(zlib.crc32)
const { Model, BundleError } = api

/** A Model from a .pgb file, loaded and compiled synchronously. opts: {backend: 'wasm' | 'js', maxBytes}. */
Model.load = function load (path, opts = {}) {
  let bytes
  try {
    bytes = fs.readFileSync(path)
  } catch (e) {
    throw new BundleError(`cannot read bundle ${JSON.stringify(String(path))}: ${e.code === 'ENOENT' ? 'no such file' : e.message}`)
  }
  return Model.fromBytesSync(bytes, opts)
}

module.exports = api
