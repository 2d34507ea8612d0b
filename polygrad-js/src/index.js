'use strict'
/**
 * The package's environment-independent API: Model, the error classes, and the format constants.
 * index.js (Node, CommonJS) adds Model.load(path); the browser build adds Model.fetch(url).
 */

const { Model, VERSION } = require('./model')
const errors = require('./errors')
const { simdSupported } = require('./wasm/module')

module.exports = Object.assign({ Model, VERSION, simdSupported }, errors)
