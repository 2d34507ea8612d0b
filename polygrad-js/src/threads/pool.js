'use strict'
/**
 * A pool of worker threads that run slices of kernels beside the calling thread, over one shared
 * WebAssembly.Memory.
 *
 * Stage: execution (threads). Input: the compiled modules (each posted to every worker, which instantiates
 * it over the shared memory) and calls {module, export, Variable values}. Output: the call run as chunks of
 * its kernel's outermost loop, taken by the calling thread and the workers that are awake (control.js),
 * joined before it returns.
 * - Workers start at the first call that is worth threads (a model that never runs a big kernel starts none)
 *   and wait in their event loop between entrypoint calls; during one (a session) they wait on the control
 *   block (control.js waitWhile: a bounded spin, then Atomics.wait), so a call costs no message, and no
 *   futex wake when it comes within the spin.
 * - Synchronous calls (Node) wait on the control block; asynchronous ones (browsers' main thread, which
 *   cannot block) spin a while, then wait for a 'done' message from the thread that finished last.
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
// a call is cut into this many chunks per thread: a worker that starts late, or is descheduled, leaves
// chunks to the others instead of holding them all up for its fixed slice
const CHUNKS_PER_THREAD = 4

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
    Atomics.store(this.ctl, C.CLAIM, C.CLOSED)
    Atomics.store(this.ctl, C.MODULE, -1)
    Atomics.add(this.ctl, C.SEQ, 1)
    Atomics.notify(this.ctl, C.SEQ)
  }

  /** Whether every worker is in a session and awake (running chunks or spinning), so a call reaches them
   * without a futex wake: the executor then shares smaller calls too (lower.THREAD_HOT_WORK). */
  hot () {
    return this.session && Atomics.load(this.ctl, C.AWAKE) === this.threads - 1
  }

  /** How many chunks the workers have run, in all calls so far. */
  workerChunks () {
    return Atomics.load(this.ctl, C.BY_WORKERS)
  }

  /** Publish a call (control.js: CLAIM closed while its fields are written) and wake the workers; returns
   * its sequence number. */
  dispatch (site, args, async) {
    const ctl = this.ctl
    this.begin()
    this.calls++
    Atomics.store(ctl, C.CLAIM, C.CLOSED)
    Atomics.store(ctl, C.MODULE, site.module)
    Atomics.store(ctl, C.EXPORT, site.export)
    Atomics.store(ctl, C.PARTS, this.threads * CHUNKS_PER_THREAD)
    Atomics.store(ctl, C.NARGS, args.length)
    for (let i = 0; i < args.length; i++) Atomics.store(ctl, C.ARGS + i, args[i])
    Atomics.store(ctl, C.FAILED, 0)
    Atomics.store(ctl, C.ASYNC, async ? 1 : 0)
    Atomics.store(ctl, C.FINISHED, 0)
    const seq = Atomics.load(ctl, C.SEQ) + 1
    Atomics.store(ctl, C.CLAIM, C.tagOf(seq) << 16)
    Atomics.store(ctl, C.SEQ, seq)
    Atomics.notify(ctl, C.SEQ)
    return seq
  }

  /** This thread's share of call `seq`: chunks of `own` (the kernel's function here) until none is left;
   * returns whether every chunk has finished, and the error of the first chunk here that failed. */
  ownChunks (seq, own, args) {
    const parts = this.threads * CHUNKS_PER_THREAD
    let error = null
    const ran = C.claimChunks(this.ctl, C.tagOf(seq), parts, (chunk) => {
      try {
        own(chunk, parts, ...args)
        return true
      } catch (e) {
        error = e
        return false
      }
    })
    const done = (ran ? Atomics.add(this.ctl, C.FINISHED, ran) + ran : Atomics.load(this.ctl, C.FINISHED)) === parts
    return { done, error }
  }

  /** Run `own` (the kernel's function on this thread) and the workers on the chunks of `site` ({module,
   * export}); blocks until every chunk has finished. */
  call (site, own, args) {
    const seq = this.dispatch(site, args, false)
    const { error } = this.ownChunks(seq, own, args)
    const ctl = this.ctl
    const parts = this.threads * CHUNKS_PER_THREAD
    for (let f = Atomics.load(ctl, C.FINISHED); f < parts; f = Atomics.load(ctl, C.FINISHED)) C.waitWhile(ctl, C.FINISHED, f)
    this.check(error)
  }

  /** call() for a thread that cannot block: after a spin, the workers' last chunks are awaited (a message). */
  async callAsync (site, own, args) {
    const seq = this.dispatch(site, args, true)
    const { error } = this.ownChunks(seq, own, args)
    const ctl = this.ctl
    const parts = this.threads * CHUNKS_PER_THREAD
    let f = Atomics.load(ctl, C.FINISHED)
    while (f < parts && C.waitWhile(ctl, C.FINISHED, f, false)) f = Atomics.load(ctl, C.FINISHED)
    if (f < parts) {
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
