'use strict'
/**
 * The loop a worker thread runs: the same kernels as the main thread, over the same shared memory, each
 * call on the chunks of the kernel's outermost loop it takes (control.js claimChunks).
 *
 * Stage: execution (threads). Input: messages from the pool (pool.js): `init` (the shared memory, the control
 * block, this worker's index), `module` (a compiled WebAssembly.Module, instantiated here over the shared
 * memory), `session` (wait for calls through the control block until the pool ends the session). Output:
 * chunks of kernels run, counted in the control block. Platform-independent: `port` is {post(msg),
 * onMessage(fn)} over Node's parentPort or a Web Worker's self.
 */

const { importObject } = require('../wasm/module')
const C = require('./control')

function start (port) {
  let memory = null
  let ctl = null
  let index = 0
  const modules = [] // module id -> exports of its instance here

  /** Run calls until the pool ends the session (MODULE = -1); `seen` is the sequence number at its start.
   * Each call: take chunks while there are any (control.js claimChunks), count them in FINISHED; the thread
   * that finishes the last chunk tells an asynchronous caller (which cannot sleep on the counter) by message.
   * Between calls: spin a while, then sleep (waitWhile), counted in AWAKE while not asleep. */
  const session = (seen) => {
    Atomics.add(ctl, C.AWAKE, 1)
    for (;;) {
      if (!C.waitWhile(ctl, C.SEQ, seen, false)) {
        Atomics.sub(ctl, C.AWAKE, 1)
        Atomics.wait(ctl, C.SEQ, seen)
        Atomics.add(ctl, C.AWAKE, 1)
      }
      seen = Atomics.load(ctl, C.SEQ)
      const mod = Atomics.load(ctl, C.MODULE)
      if (mod < 0) {
        Atomics.sub(ctl, C.AWAKE, 1)
        return
      }
      // the fields are read before a chunk is claimed; a claim succeeds only if they were this call's
      const parts = Atomics.load(ctl, C.PARTS)
      const args = [0, parts]
      for (let i = 0, n = Atomics.load(ctl, C.NARGS); i < n; i++) args.push(Atomics.load(ctl, C.ARGS + i))
      const name = `k${Atomics.load(ctl, C.EXPORT)}`
      const ran = C.claimChunks(ctl, C.tagOf(seen), parts, (chunk) => {
        args[0] = chunk
        try {
          modules[mod][name](...args)
          return true
        } catch (e) {
          Atomics.store(ctl, C.FAILED, e instanceof WebAssembly.RuntimeError ? C.TRAP : C.ERROR)
          return false
        }
      })
      if (ran) Atomics.add(ctl, C.BY_WORKERS, ran)
      if (ran && Atomics.add(ctl, C.FINISHED, ran) + ran === parts) {
        if (Atomics.load(ctl, C.ASYNC)) port.post({ type: 'done', seq: seen })
        Atomics.notify(ctl, C.FINISHED)
      }
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
