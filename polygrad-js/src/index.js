'use strict'
/**
 * The package's environment-independent API: Model, the error classes, and the format constants.
 * index.js (Node, CommonJS) adds Model.load(path); the browser build adds Model.fetch(url).
 */

const { Model, VERSION } = require('./model')
const errors = require('./errors')
const { simdSupported } = require('./wasm/module')

module.exports = Object.assign({ Model, VERSION, simdSupported }, errors)
// for the Node entry (index.js): a native CRC-32 (zlib.crc32) where the runtime has one
// and the thread platform: Node's worker_threads (index.js) or Web Workers (the browser build)
// and the lowering's stages, for tests that lower a kernel by hand in a browser page (test/int8dot.test.js)
Object.defineProperty(module.exports, '_internals', {
  value: {
    crc32: require('./crc32'),
    threads: require('./threads/pool'),
    webgpu: require('./webgpu/device'),
    lowering: { ...require('./lower'), ...require('./compile'), ...require('./wasm/module') }
  },
  enumerable: false
})
