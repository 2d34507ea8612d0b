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
const util = require('util')
const zlib = require('zlib')

const readAt = util.promisify(fs.read)

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

/** A failed open or read of the bundle at `path` as a BundleError naming the file. */
function cannotRead (path, e) {
  return new BundleError(`cannot read bundle ${JSON.stringify(String(path))}: ${e.code === 'ENOENT' ? 'no such file' : e.message}`)
}

/** The bundle file `path` opened for a load a piece at a time (src/bundlefile.js): { size, read(into, at), close }
 * with read synchronous (fs.readSync), or returning a Promise with `async` (fs.read). null for a file
 * that is not a regular one (a pipe: its size is unknown until it is read whole). */
function openBundle (path, async) {
  let fd
  try {
    fd = fs.openSync(path, 'r')
    const stat = fs.fstatSync(fd)
    if (!stat.isFile()) {
      fs.closeSync(fd)
      return null
    }
    const size = stat.size
    const short = (at) => new BundleError(`bundle ${JSON.stringify(String(path))} ended at byte ${at}, not at the ${size} bytes it had when it was opened: it changed while it was read`)
    const readSync = (into, at) => {
      for (let done = 0; done < into.length;) {
        let n
        try {
          n = fs.readSync(fd, into, done, Math.min(into.length - done, 1 << 30), at + done)
        } catch (e) {
          throw cannotRead(path, e)
        }
        if (n === 0) throw short(at + done)
        done += n
      }
    }
    const readAsync = async (into, at) => {
      for (let done = 0; done < into.length;) {
        let n
        try {
          n = (await readAt(fd, into, done, Math.min(into.length - done, 1 << 30), at + done)).bytesRead
        } catch (e) {
          throw cannotRead(path, e)
        }
        if (n === 0) throw short(at + done)
        done += n
      }
    }
    return { size, read: async ? readAsync : readSync, close: () => fs.closeSync(fd) }
  } catch (e) {
    if (fd !== undefined) fs.closeSync(fd)
    throw cannotRead(path, e)
  }
}

/** A Model from a .pgb file, loaded and compiled synchronously. opts: {backend: 'wasm' | 'js', maxBytes, maxWork,
 * validate, verify, threads} (src/limits.js has the caps' defaults). The file is read a piece at a time, each
 * stored buffer straight into the model's memory: the load holds about the model's memory, not the file's bytes
 * beside it. */
Model.load = function load (path, opts = {}) {
  const file = openBundle(path, false)
  if (file === null) return Model.fromBytesSync(readWhole(path), opts)
  try {
    return Model._fromFileSync(file, opts)
  } finally {
    file.close()
  }
}

/** Model.load's asynchronous twin: the file read a piece at a time, compiled as Model.fromBytes compiles (every
 * backend, 'webgpu' included; 'auto' takes webgpu on a hardware adapter). */
Model.loadAsync = async function loadAsync (path, opts = {}) {
  const file = openBundle(path, true)
  if (file === null) return Model.fromBytes(await fs.promises.readFile(path).catch((e) => { throw cannotRead(path, e) }), opts)
  try {
    return await Model._fromFile(file, opts)
  } finally {
    file.close()
  }
}

/** The whole file (a pipe or another file that is not a regular one). */
function readWhole (path) {
  try {
    return fs.readFileSync(path)
  } catch (e) {
    throw cannotRead(path, e)
  }
}

module.exports = api
