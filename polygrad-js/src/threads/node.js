'use strict'
/**
 * The Node.js thread platform (pool.setPlatform, installed by the package's index.js): worker_threads
 * running worker_node.js. Workers are unref'd, so an idle pool never keeps a process alive; the pool refs
 * them while an asynchronous call waits for their message.
 */

const os = require('os')
const path = require('path')
const { Worker } = require('worker_threads')

const SCRIPT = path.join(__dirname, 'worker_node.js')

function spawn () {
  const w = new Worker(SCRIPT)
  return {
    post: (m) => w.postMessage(m),
    onMessage: (fn) => w.on('message', fn),
    terminate: () => w.terminate(),
    ref: () => w.ref(),
    unref: () => w.unref()
  }
}

const cores = typeof os.availableParallelism === 'function' ? os.availableParallelism() : os.cpus().length

module.exports = { name: 'node', cores, sharedMemory: null, canBlock: true, spawn }
