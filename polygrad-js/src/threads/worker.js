'use strict'
/**
 * The loop a worker thread runs: the same kernels as the main thread, over the same shared memory, each
 * call on its own slice (part `index` of `parts`) of the kernel's outermost loop.
 *
 * Stage: execution (threads). Input: messages from the pool (pool.js): `init` (the shared memory, the control
 * block, this worker's index), `module` (a compiled WebAssembly.Module, instantiated here over the shared
 * memory), `session` (wait for calls through the control block until the pool ends the session). Output:
 * slices of kernels run, counted in the control block. Platform-independent: `port` is {post(msg),
 * onMessage(fn)} over Node's parentPort or a Web Worker's self.
 */

const { importObject } = require('../wasm/module')
const C = require('./control')

function start (port) {
  let memory = null
  let ctl = null
  let index = 0
  const modules = [] // module id -> exports of its instance here

  /** Run calls until the pool ends the session (MODULE = -1); `seen` is the sequence number at its start. */
  const session = (seen) => {
    for (;;) {
      Atomics.wait(ctl, C.SEQ, seen)
      seen = Atomics.load(ctl, C.SEQ)
      const mod = ctl[C.MODULE]
      if (mod < 0) return
      const parts = ctl[C.PARTS]
      if (index < parts) {
        const args = [index, parts]
        for (let i = 0; i < ctl[C.NARGS]; i++) args.push(ctl[C.ARGS + i])
        try {
          modules[mod][`k${ctl[C.EXPORT]}`](...args)
        } catch (e) {
          Atomics.store(ctl, C.FAILED, e instanceof WebAssembly.RuntimeError ? C.TRAP : C.ERROR)
        }
      }
      // the last worker to finish tells an asynchronous caller (which cannot wait on the counter) by message
      if (Atomics.add(ctl, C.DONE, 1) === ctl[C.WORKERS] - 1 && ctl[C.ASYNC]) port.post({ type: 'done', seq: seen })
      Atomics.notify(ctl, C.DONE)
    }
  }

  port.onMessage((m) => {
    if (m.type === 'init') {
      ({ memory, ctl, index } = m)
      Atomics.store(ctl, C.READY + index, 1)
      Atomics.notify(ctl, C.READY + index)
      port.post({ type: 'ready', index })
    } else if (m.type === 'module') {
      modules[m.id] = new WebAssembly.Instance(m.module, importObject(memory)).exports
    } else if (m.type === 'session') {
      session(m.seq)
    }
  })
}

module.exports = { start }
