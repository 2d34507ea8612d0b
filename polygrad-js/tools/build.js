#!/usr/bin/env node
'use strict'
/**
 * Build the browser ES module: dist/polygrad.browser.mjs (every src/ module in one file, CommonJS wrapped in a
 * small module table, Model.fetch(url) added) and dist/polygrad.browser.min.mjs (minified with esbuild when
 * the dev dependency is installed). No wasm files: kernels are rendered to WebAssembly at load.
 *
 *   node tools/build.js
 */

const fs = require('fs')
const path = require('path')

const ROOT = path.join(__dirname, '..')
const SRC = path.join(ROOT, 'src')
const DIST = path.join(ROOT, 'dist')

// Node's thread platform: index.js loads it from src/ (its workers run src/threads/worker_node.js)
const NODE_ONLY = new Set(['threads/node.js', 'threads/worker_node.js'])

function files (dir, out = []) {
  for (const f of fs.readdirSync(dir).sort()) {
    const p = path.join(dir, f)
    if (fs.statSync(p).isDirectory()) files(p, out)
    else if (f.endsWith('.js') && !NODE_ONLY.has(path.relative(SRC, p).replace(/\\/g, '/'))) out.push(p)
  }
  return out
}

/** Every src/ module in one script: a module table and a small require (`load`) inside one function,
 * polygradModules (the browser's worker threads start from its source text), ending with `api`. */
function moduleTable () {
  const mods = files(SRC).map((p) => {
    const id = './' + path.relative(SRC, p).replace(/\\/g, '/').replace(/\.js$/, '')
    return `${JSON.stringify(id)}: function (module, exports, require) {\n${fs.readFileSync(p, 'utf8')}\n}`
  })
  return `function polygradModules () {
const modules = {
${mods.join(',\n')}
}
const cache = {}
function resolve (from, name) {
  const parts = from.split('/').slice(0, -1)
  for (const p of name.split('/')) {
    if (p === '..') parts.pop()
    else if (p !== '.') parts.push(p)
  }
  return parts.join('/')
}
function load (id) {
  if (cache[id]) return cache[id].exports
  if (!modules[id]) throw new Error('polygrad: no module ' + id)
  const module = cache[id] = { exports: {} }
  modules[id](module, module.exports, (name) => load(resolve(id, name)))
  return module.exports
}
return load
}
const load = polygradModules()
const api = load('./index')
`
}

function build () {
  const pkg = JSON.parse(fs.readFileSync(path.join(ROOT, 'package.json'), 'utf8'))
  const table = moduleTable()
  const text = `// polygrad ${pkg.version} for browsers (ES module), built by tools/build.js from src/: do not edit.
// Load and fine-tune .pgb bundles; kernels are rendered to WebAssembly SIMD at load, nothing is evaluated.
${table}/** A Model from a bundle URL: fetch, then Model.fromBytes (asynchronous compilation). */
api.Model.fetch = async function (url, opts = {}) {
  const res = await fetch(url)
  if (!res.ok) throw new api.BundleError('cannot fetch bundle ' + url + ': HTTP ' + res.status)
  return api.Model.fromBytes(new Uint8Array(await res.arrayBuffer()), opts)
}
// worker threads: Web Workers running this module table (from a Blob URL of its source)
api._internals.threads.setPlatform(load('./threads/browser').browserPlatform(polygradModules.toString()))
api.Model.load = function () {
  throw new api.ModelError('Model.load(path) reads files in Node; in a browser use await Model.fetch(url) or Model.fromBytes(bytes)')
}
export const { Model, VERSION, simdSupported, PolygradError, BundleError, KernelError, ModelError, ModelInputError, EntrypointError } = api
export default api
`
  fs.mkdirSync(DIST, { recursive: true })
  fs.writeFileSync(path.join(DIST, 'polygrad.browser.mjs'), text)
  // the same modules in one CommonJS file for Node (index.js loads it when it is current)
  const cjs = `'use strict'
// polygrad ${pkg.version} for Node.js, all of src/ in one file (built by tools/build.js: do not edit)
${table}module.exports = api
`
  fs.writeFileSync(path.join(DIST, 'polygrad.node.cjs'), cjs)
  let minified = null
  try {
    const esbuild = require('esbuild')
    minified = esbuild.transformSync(text, { minify: true, format: 'esm', target: 'es2020' }).code
    fs.writeFileSync(path.join(DIST, 'polygrad.browser.min.mjs'), minified)
  } catch (e) {
    if (e.code !== 'MODULE_NOT_FOUND') throw e
  }
  return { bytes: text.length, minified: minified === null ? null : minified.length }
}

if (require.main === module) {
  const r = build()
  console.log(`dist/polygrad.browser.mjs ${(r.bytes / 1024).toFixed(1)} KB` + (r.minified !== null ? `, minified ${(r.minified / 1024).toFixed(1)} KB` : ' (esbuild not installed: no minified copy)'))
}

module.exports = { build }
