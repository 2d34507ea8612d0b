'use strict'
// A Node.js worker thread of a polygrad pool (node.js starts it): the loop of worker.js over parentPort.
const { parentPort } = require('worker_threads')
require('./worker').start({ post: (m) => parentPort.postMessage(m), onMessage: (fn) => parentPort.on('message', fn) })
