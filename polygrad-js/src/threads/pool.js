'use strict'
/**
 * A pool of worker threads that run slices of kernels beside the calling thread, over one shared
 * WebAssembly.Memory.
 *
 * Stage: execution (threads). Input: the compiled modules (each posted to every worker, which instantiates
 * it over the shared memory) and calls {module, export, Variable values}. Output: the call run as `parts`
 * slices, slice 0 on the calling thread, slice i on worker i, joined before it returns.
 * - Workers start at the first call that is worth threads (a model that never runs a big kernel starts none)
 *   and wait in their event loop between entrypoint calls; during one (a session) they wait on the control
 *   block (control.js) with Atomics.wait, so a call costs a futex wake and no message.
 * - Synchronous calls (Node) wait on the control block; asynchronous ones (browsers' main thread, which
 *   cannot block) wait for a 'done' message from the last worker to finish.
 * - The platform (setPlatform: Node's worker_threads from index.js, Web Workers from the browser build) says
 *   how to start a worker and how many cores there are; without one there are no threads.
 */

const C = require('./control')

let platform = null

/** Install the platform: {name, cores, sharedMemory: null | reason it is missing, canBlock, spawn()}. */
function setPlatform (p) {
  platform = p
}

/** The installed platform, or null. */
function currentPlatform () {
  return platform
}

/** {threads, reason}: the thread count a load without `threads` gets, and why when it is 1. */
function defaultThreads () {
  const why = unavailable()
  if (why) return { threads: 1, reason: why }
  return { threads: Math.max(1, Math.min(8, platform.cores)), reason: platform.cores <= 1 ? 'this machine has one core' : null }
}

/** Why threads cannot run here (a sentence), or null. */
function unavailable () {
  if (!platform) return 'no worker platform (threads run in Node.js and in browsers)'
  if (platform.sharedMemory) return platform.sharedMemory
  if (typeof SharedArrayBuffer !== 'function' || typeof Atomics !== 'object') return 'SharedArrayBuffer is not available'
  return null
}

const START_TIMEOUT_MS = 10000

class Pool {
  constructor (threads, memory) {
    this.platform = platform
    this.threads = threads
    this.memory = memory
    this.ctl = new Int32Array(new SharedArrayBuffer(C.SIZE * 4))
    this.ctl[C.WORKERS] = threads - 1
    this.workers = null
    this.modules = []
    this.session = false
    this.waiting = null
    this.broken = null // why the workers could not start: calls then run on one thread
    this.readyCount = 0
    this.calls = 0 // calls shared with the workers
  }

  /** Record a compiled module (posted to the workers now, or when they start); returns its id. */
  addModule (module) {
    const id = this.modules.length
    this.modules.push(module)
    if (this.workers) {
      this.end()
      for (const w of this.workers) w.post({ type: 'module', id, module })
    }
    return id
  }

  spawn () {
    this.workers = []
    for (let i = 1; i < this.threads; i++) {
      const w = this.platform.spawn()
      w.onMessage((m) => this.message(m))
      if (w.unref) w.unref()
      w.post({ type: 'init', memory: this.memory, ctl: this.ctl, index: i })
      this.modules.forEach((module, id) => w.post({ type: 'module', id, module }))
      this.workers.push(w)
    }
  }

  message (m) {
    if (m.type === 'ready') {
      this.readyCount++
      if (this.onReady && this.readyCount === this.threads - 1) this.onReady()
    } else if (m.type === 'done' && this.waiting && this.waiting.seq === m.seq) {
      const { resolve } = this.waiting
      this.waiting = null
      resolve()
    }
  }

  /** Start the workers if they are not running, waiting (blocking) until each has its memory; false when
   * they did not start (the pool is then broken and calls run on one thread). */
  readySync () {
    if (this.broken) return false
    if (!this.workers) {
      this.spawn()
      const deadline = Date.now() + START_TIMEOUT_MS
      for (let i = 1; i < this.threads; i++) {
        while (Atomics.load(this.ctl, C.READY + i) === 0) {
          const left = deadline - Date.now()
          if (left <= 0) return this.fail(`worker threads did not start within ${START_TIMEOUT_MS / 1000} s`)
          Atomics.wait(this.ctl, C.READY + i, 0, left)
        }
      }
    }
    return true
  }

  async readyAsync () {
    if (this.broken) return false
    if (!this.workers) {
      const started = new Promise((resolve) => { this.onReady = resolve })
      this.spawn()
      this.refAll(true)
      let timer
      const timeout = new Promise((resolve) => { timer = setTimeout(() => resolve(false), START_TIMEOUT_MS) })
      const ok = await Promise.race([started.then(() => true), timeout])
      clearTimeout(timer)
      this.refAll(false)
      if (!ok) return this.fail(`worker threads did not start within ${START_TIMEOUT_MS / 1000} s`)
    }
    return true
  }

  fail (reason) {
    this.broken = reason
    this.dispose()
    return false
  }

  refAll (on) {
    for (const w of this.workers || []) if (on ? w.ref : w.unref) on ? w.ref() : w.unref()
  }

  /** Post the workers into a session (they wait on the control block until end()). */
  begin () {
    if (this.session) return
    this.session = true
    const seq = Atomics.load(this.ctl, C.SEQ)
    for (const w of this.workers) w.post({ type: 'session', seq })
  }

  /** End the session: workers return to their event loop (to receive modules, or to be idle). */
  end () {
    if (!this.session) return
    this.session = false
    this.ctl[C.MODULE] = -1
    Atomics.add(this.ctl, C.SEQ, 1)
    Atomics.notify(this.ctl, C.SEQ)
  }

  dispatch (site, args, async) {
    const ctl = this.ctl
    this.begin()
    this.calls++
    ctl[C.MODULE] = site.module
    ctl[C.EXPORT] = site.export
    ctl[C.PARTS] = this.threads
    ctl[C.NARGS] = args.length
    for (let i = 0; i < args.length; i++) ctl[C.ARGS + i] = args[i]
    ctl[C.FAILED] = 0
    ctl[C.ASYNC] = async ? 1 : 0
    Atomics.store(ctl, C.DONE, 0)
    const seq = Atomics.add(ctl, C.SEQ, 1) + 1
    Atomics.notify(ctl, C.SEQ)
    return seq
  }

  /** Run `own` (slice 0, this thread) and the workers' slices of `site` ({module, export}); blocks. */
  call (site, own, args) {
    this.dispatch(site, args, false)
    let error = null
    try {
      own(0, this.threads, ...args)
    } catch (e) {
      error = e
    }
    const ctl = this.ctl
    const workers = this.threads - 1
    for (let d = Atomics.load(ctl, C.DONE); d < workers; d = Atomics.load(ctl, C.DONE)) Atomics.wait(ctl, C.DONE, d)
    this.check(error)
  }

  /** call() for a thread that cannot block: the workers' join is awaited. */
  async callAsync (site, own, args) {
    const seq = this.dispatch(site, args, true)
    let error = null
    try {
      own(0, this.threads, ...args)
    } catch (e) {
      error = e
    }
    if (Atomics.load(this.ctl, C.DONE) < this.threads - 1) {
      this.refAll(true)
      try {
        await new Promise((resolve) => { this.waiting = { seq, resolve } })
      } finally {
        this.refAll(false)
      }
    }
    this.check(error)
  }

  check (error) {
    if (error) throw error
    const failed = this.ctl[C.FAILED]
    if (failed === C.TRAP) throw new WebAssembly.RuntimeError('a worker thread trapped')
    if (failed) throw new Error('a worker thread failed running a kernel')
  }

  /** End the workers (idempotent). */
  dispose () {
    this.end()
    for (const w of this.workers || []) w.terminate()
    this.workers = null
    if (this.waiting) {
      this.waiting.resolve()
      this.waiting = null
    }
  }
}

module.exports = { Pool, setPlatform, platform: currentPlatform, defaultThreads, unavailable }
