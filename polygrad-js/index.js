'use strict'
/**
 * polygrad for Node.js (CommonJS): `const { Model } = require('polygrad')`.
 *
 * Model.load(path) reads a .pgb bundle synchronously and compiles its kernels to WebAssembly;
 * Model.fromBytes(bytes) does the same asynchronously (as in browsers), Model.fromBytesSync(bytes)
 * synchronously.
 */

const fs = require('fs')
const path = require('path')
const zlib = require('zlib')

/** The API from dist/polygrad.node.cjs (all of src/ in one file: a faster start) when it is at least as
 * new as every source file, else from src/ (a checkout that was not built, or sources edited since). */
function loadApi () {
  const bundled = path.join(__dirname, 'dist', 'polygrad.node.cjs')
  try {
    const built = fs.statSync(bundled).mtimeMs
    const stale = (dir) => fs.readdirSync(dir, { withFileTypes: true }).some((e) =>
      e.isDirectory() ? stale(path.join(dir, e.name)) : fs.statSync(path.join(dir, e.name)).mtimeMs > built)
    if (!stale(path.join(__dirname, 'src'))) return require(bundled)
  } catch (e) {
    if (e.code !== 'ENOENT') throw e
  }
  return require('./src/index')
}

const api = loadApi()
if (typeof zlib.crc32 === 'function') api._internals.crc32.useNative(zlib.crc32)
// worker threads for the kernels (src/threads/node.js, always from src/: its workers run src/threads/worker_node.js)
api._internals.threads.setPlatform(require('./src/threads/node'))
// WebGPU through the optional `webgpu` package (Dawn), imported only when a load asks for the GPU
api._internals.webgpu.setProvider(async () => {
  let mod
  try {
    mod = await import('webgpu')
  } catch (e) {
    throw new Error('the optional package webgpu is not installed (npm install webgpu)')
  }
  return mod.create([])
})
const { Model, BundleError } = api

/** A Model from a .pgb file, loaded and compiled synchronously. opts: {backend: 'wasm' | 'js', maxBytes, maxWork,
 * validate, verify, threads} (src/limits.js has the caps' defaults). */
Model.load = function load (path, opts = {}) {
  let bytes
  try {
    bytes = fs.readFileSync(path)
  } catch (e) {
    throw new BundleError(`cannot read bundle ${JSON.stringify(String(path))}: ${e.code === 'ENOENT' ? 'no such file' : e.message}`)
  }
  return Model.fromBytesSync(bytes, opts)
}

/** Model.load's asynchronous twin: the file read, then Model.fromBytes (every backend, 'webgpu' included;
 * 'auto' takes webgpu on a hardware adapter). */
Model.loadAsync = async function loadAsync (path, opts = {}) {
  let bytes
  try {
    bytes = await fs.promises.readFile(path)
  } catch (e) {
    throw new BundleError(`cannot read bundle ${JSON.stringify(String(path))}: ${e.code === 'ENOENT' ? 'no such file' : e.message}`)
  }
  return Model.fromBytes(bytes, opts)
}

module.exports = api
