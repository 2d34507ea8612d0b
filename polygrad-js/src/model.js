'use strict'
/**
 * Model: a bundle (.pgb) loaded for running and fine-tuning: forward, call, trainStep, fit, save, summary.
 *
 * Stage: user API over the runtime. Input: bundle bytes. Output: a Model whose entrypoints run the
 * bundle's kernels, rendered to WebAssembly at load (runtime.js), with Python's rules for inputs,
 * Variables, minibatches and optimizer configuration (polygrad/model/, docs/bundle-format.md).
 */

const { BundleError, ModelError, ModelInputError, EntrypointError, PolygradError } = require('./errors')
const bundle = require('./bundle')
const { programSteps, dataSteps, runSync, runAsync } = require('./bundlefile')
const { readProgram, writeManifest, STORED } = require('./manifest')
const { Executor } = require('./runtime')
const { readInput, writeValues, readOutput } = require('./data')
const { buildOptimizer, checkHyperparameters, optimizerConfigOf, sameConfig } = require('./optim')
const { simdSupported } = require('./wasm/module')
const threads = require('./threads/pool')
const { MAX_WORKERS } = require('./threads/control')
const webgpu = require('./webgpu/device')
const { GPUExecutor } = require('./webgpu/runtime')

const VERSION = '0.1.0'

// Model.load / fetch / fromBytes options (index.d.ts LoadOptions) and the backends they may name
const LOAD_OPTIONS = ['backend', 'maxBytes', 'maxWork', 'validate', 'verify', 'threads', 'fma', 'int8Dot']
const MAX_THREADS = MAX_WORKERS // the control block's worker slots (threads/control.js), this thread's included
const BACKENDS = ['auto', 'webgpu', 'wasm', 'js']

/** The load options, checked before anything is read: an unknown option or backend is a ModelError, never
 * silently another path; 'wasm' where WebAssembly SIMD is missing is one too. Returns them with `backend` set. */
function loadOptions (opts) {
  if (opts === null || typeof opts !== 'object' || Array.isArray(opts)) throw new ModelError('load options must be an object, e.g. { backend: \'auto\' }')
  for (const k of Object.keys(opts)) {
    if (!LOAD_OPTIONS.includes(k)) throw new ModelError(`unknown load option ${JSON.stringify(k)}; the options are ${LOAD_OPTIONS.join(', ')}`)
  }
  const backend = opts.backend === undefined ? 'auto' : opts.backend
  if (!BACKENDS.includes(backend)) {
    throw new ModelError(`unknown backend ${JSON.stringify(backend)}; polygrad-js runs 'webgpu' (asynchronous loads only), 'wasm' (WebAssembly SIMD), 'js' (plain JavaScript) or 'auto' (wasm where the runtime has SIMD, else js; an asynchronous load given { backend: 'auto' } explicitly takes webgpu first on a hardware adapter)`)
  }
  if (backend === 'wasm' && !simdSupported()) throw new ModelError("backend 'wasm' needs WebAssembly SIMD, which this runtime lacks; load with { backend: 'auto' } or { backend: 'js' }")
  if (opts.validate !== undefined && opts.validate !== 'all' && opts.validate !== 'forward') {
    throw new ModelError(`validate must be 'all' or 'forward', not ${JSON.stringify(opts.validate)}`)
  }
  if (opts.verify !== undefined && typeof opts.verify !== 'boolean') throw new ModelError(`verify must be true or false, not ${JSON.stringify(opts.verify)}`)
  if (opts.fma !== undefined && typeof opts.fma !== 'boolean') throw new ModelError(`fma must be true or false, not ${JSON.stringify(opts.fma)}`)
  if (opts.int8Dot !== undefined && typeof opts.int8Dot !== 'boolean') throw new ModelError(`int8Dot must be true or false, not ${JSON.stringify(opts.int8Dot)}`)
  if (opts.threads !== undefined && !(Number.isInteger(opts.threads) && opts.threads >= 1 && opts.threads <= MAX_THREADS)) {
    throw new ModelError(`threads must be an integer from 1 to ${MAX_THREADS}, not ${typeof opts.threads === 'string' ? JSON.stringify(opts.threads) : String(opts.threads)}; leave it out for the default (the cores, at most 8, where SharedArrayBuffer is available)`)
  }
  // only an explicit 'auto' may pick webgpu (asynchronous loads): without a backend, a model keeps the
  // synchronous calls (forward, trainStep, save) that existing code makes after `await Model.fetch(url)`
  return Object.assign({}, opts, { backend, gpuAuto: opts.backend === 'auto' }, threadPlan(backend, opts.threads))
}

/**
 * {threads, threadReason}: how many threads the kernels run on and, when that is 1 or fewer than asked, why
 * (backendInfo reports both). Threads need the wasm backend, SharedArrayBuffer (Node; in a browser a
 * cross-origin isolated page) and a worker platform.
 */
function threadPlan (backend, asked) {
  if (backend === 'webgpu') return { threads: 1, threadReason: null }
  const wasm = backend === 'wasm' || (backend === 'auto' && simdSupported())
  if (asked === 1) return { threads: 1, threadReason: 'threads: 1 was asked' }
  if (!wasm) return { threads: 1, threadReason: "the 'js' backend runs on one thread" }
  const why = threads.unavailable()
  if (why) return { threads: 1, threadReason: why }
  if (asked !== undefined) return { threads: asked, threadReason: null }
  const d = threads.defaultThreads()
  return { threads: d.threads, threadReason: d.reason }
}

function loadProgram (bytes, opts) {
  let data
  try {
    data = bundle.asBytes(bytes)
  } catch (e) {
    throw new BundleError(e.message)
  }
  const { manifest, body } = bundle.read(data)
  return readProgram(manifest, body, Object.assign({}, opts, { fileBytes: data.length }))
}

/**
 * Run a load step so that every failure is a PolygradError: the checks before it raise BundleError for
 * anything a file can get wrong; an engine error past them (a stack or a WebAssembly limit) still
 * becomes a BundleError, the last line of defence, never a RangeError or CompileError.
 */
function asLoadError (e) {
  if (e instanceof PolygradError) return e
  const what = e && e.constructor ? e.constructor.name : typeof e
  return new BundleError(`this bundle cannot be loaded here (${what}: ${String(e && e.message).slice(0, 200)}); it passed the checks of docs/bundle-format.md, so please report it with the file`)
}

/** loadOptions for a synchronous load, which cannot take webgpu (ModelError). */
function syncLoadOptions (opts) {
  opts = loadOptions(opts)
  if (opts.backend === 'webgpu') throw new ModelError("WebGPU is asynchronous: load with await Model.fromBytes(bytes, { backend: 'webgpu' }) (in Node, await Model.loadAsync(path, ...); in a browser, await Model.fetch(url, ...))")
  return opts
}

/** { device, opts } of an asynchronous load: the WebGPU device where the options take webgpu (an explicit 'auto'
 * on a hardware adapter), else device null and opts.gpuReason saying why not. */
async function asyncBackend (opts) {
  if (opts.backend === 'webgpu') return { device: await webgpu.device(), opts }
  if (!opts.gpuAuto) return { device: null, opts }
  const found = await webgpu.adapterInfo()
  if (found.adapter && !found.fallback) {
    return { device: await webgpu.device(), opts: Object.assign({}, opts, { backend: 'webgpu', threads: 1, threadReason: null }) }
  }
  const why = found.adapter ? "WebGPU has only a fallback (software) adapter; load with { backend: 'webgpu' } to use it anyway" : found.reason
  return { device: null, opts: Object.assign({}, opts, { gpuReason: why }) }
}

/** Write the stored buffers' bytes into memory and zero the caches (a loaded model starts with empty ones). */
function fillStored (prog, exec) {
  const u8 = exec.bytes()
  for (const s of prog.slots) {
    if (s.stored) {
      u8.set(s.stored, s.base)
      s.stored = null // the bundle bytes are not kept alive
    } else if (s.role === 'cache') {
      u8.fill(0, s.base, s.base + s.size * s.dtype.size)
    }
  }
}

/** The Executor for a load's options; its worker threads end with the Model, or when a Model that was
 * never disposed is garbage collected. */
function executor (prog, opts) {
  const p = threads.platform()
  return new Executor(prog, Object.assign({}, opts, { canBlock: !p || p.canBlock }))
}

const unreached = typeof FinalizationRegistry === 'function' ? new FinalizationRegistry((exec) => exec.dispose()) : null

class Model {
  constructor (prog, exec, opts) {
    this._p = prog
    this._x = exec
    this._opts = opts
    this._disposed = false
    this._busy = false
    if (unreached && exec.pool) unreached.register(this, exec, this)
  }

  /** A Model from bundle bytes (Uint8Array or ArrayBuffer), compiled synchronously ('auto': wasm, else js). */
  static fromBytesSync (bytes, opts = {}) {
    opts = syncLoadOptions(opts)
    try {
      const prog = loadProgram(bytes, opts)
      const exec = executor(prog, opts)
      fillStored(prog, exec)
      exec.compileSync(['forward'])
      return new Model(prog, exec, opts)
    } catch (e) {
      throw asLoadError(e)
    }
  }

  /**
   * fromBytesSync of a file read a piece at a time (Node's Model.load(path), index.js): `file` is { size, read }
   * where read(into, at) fills the Uint8Array `into` from byte `at`. The stored buffers are read straight into
   * the model's memory (bundlefile.js), so the file's bytes are never held beside it.
   */
  static _fromFileSync (file, opts = {}) {
    opts = syncLoadOptions(opts)
    let exec = null
    try {
      const { prog, h } = runSync(programSteps(file.size, opts), file.read)
      exec = executor(prog, opts)
      runSync(dataSteps(prog, exec.bytes(), h), file.read)
      fillStored(prog, exec)
      exec.compileSync(['forward'])
      return new Model(prog, exec, opts)
    } catch (e) {
      if (exec) exec.dispose()
      throw asLoadError(e)
    }
  }

  /**
   * A Model from bundle bytes, every entrypoint compiled asynchronously (the browser path). An explicit
   * backend 'auto' here is webgpu on a hardware adapter (not a fallback, software one: the CPU backends beat
   * it), else as fromBytesSync, and backendInfo.reason says why webgpu was not taken; without a backend
   * option it is as fromBytesSync (a webgpu model has only the async calls).
   */
  static async fromBytes (bytes, opts = {}) {
    const { device, opts: chosen } = await asyncBackend(loadOptions(opts))
    try {
      const prog = loadProgram(bytes, chosen)
      const exec = device ? new GPUExecutor(prog, device, chosen) : executor(prog, chosen)
      fillStored(prog, exec)
      await exec.compileAsync(Object.keys(prog.entries))
      return new Model(prog, exec, chosen)
    } catch (e) {
      throw asLoadError(e)
    }
  }

  /** fromBytes of a file read a piece at a time (Node's Model.loadAsync(path)): `file` as _fromFileSync's, its
   * read returning a Promise. */
  static async _fromFile (file, opts = {}) {
    const { device, opts: chosen } = await asyncBackend(loadOptions(opts))
    let exec = null
    try {
      const { prog, h } = await runAsync(programSteps(file.size, chosen), file.read)
      exec = device ? new GPUExecutor(prog, device, chosen) : executor(prog, chosen)
      await runAsync(dataSteps(prog, exec.bytes(), h), file.read)
      fillStored(prog, exec)
      await exec.compileAsync(Object.keys(prog.entries))
      return new Model(prog, exec, chosen)
    } catch (e) {
      if (exec) exec.dispose()
      throw asLoadError(e)
    }
  }

  // ---- inspection
  _alive () {
    if (this._disposed) throw new ModelError('this Model was disposed; load the bundle again')
  }

  get signature () {
    const rows = (specs) => specs.map((s) => ({ name: s.name, dtype: s.dtype.name, shape: s.shape.slice() }))
    return { inputs: rows(this._p.inputs), targets: rows(this._p.targets), outputs: rows(this._p.outputs) }
  }

  get entrypoints () {
    return Object.keys(this._p.entries)
  }

  get variables () {
    return Object.fromEntries([...this._p.variables].map(([n, [lo, hi]]) => [n, { min: lo, max: hi }]))
  }

  get backend () {
    return this._x.backend
  }

  /**
   * {name, threads, reason}: the backend ('webgpu', 'wasm' or 'js'), the threads its kernels run on, and why
   * (or null) an asynchronous 'auto' load did not take webgpu and why threads is 1: e.g. a browser page that
   * is not cross-origin isolated has no SharedArrayBuffer. In a browser,
   * synchronous calls run on one thread whatever this says; the async twins (forwardAsync, ...) use them all.
   */
  get backendInfo () {
    this._alive()
    const x = this._x
    const threadReason = x.pool && x.pool.broken ? x.pool.broken : this._opts.threadReason
    const reason = [this._opts.gpuReason, threadReason].filter(Boolean).join('; ') || null
    return { name: x.backend, threads: x.pool && !x.pool.broken ? x.threads : 1, reason, fma: !!x.fma }
  }

  /** Inputs, outputs, entrypoints, parameters and bytes; runs nothing, reads no weights. */
  summary () {
    this._alive()
    const p = this._p
    const tensors = (role) => p.slots.filter((s) => s.role === role).map((s) => ({ name: s.name, dtype: s.dtype.name, shape: s.shape.slice(), count: s.size }))
    const bytes = {}
    for (const s of p.slots) bytes[s.role] = (bytes[s.role] || 0) + s.size * s.dtype.size
    const parameters = tensors('parameter')
    const sig = this.signature
    const out = {
      inputs: sig.inputs, targets: sig.targets, outputs: sig.outputs, entrypoints: this.entrypoints,
      parameters, state: tensors('state'), parameterCount: parameters.reduce((a, t) => a + t.count, 0), bytes,
      memoryBytes: this._x.memory.buffer.byteLength, backend: this._x.backend, optimizer: p.optimizer ? Object.assign({}, p.optimizer) : null
    }
    Object.defineProperty(out, 'toString', { enumerable: false, value: () => summaryText(out) })
    return out
  }

  /** {name: {data, shape, dtype}} copies of the parameters and state. */
  parameters () {
    this._alive()
    this._sync('parameters', 'parametersAsync')
    return this._parameters()
  }

  /** parameters() of any backend (webgpu: read back from the GPU first). */
  async parametersAsync () {
    return this._exclusive(async () => {
      await this._readBack()
      return this._parameters()
    })
  }

  /** Bring the parameters and state (what save and parameters read) back from the GPU (webgpu only). */
  async _readBack () {
    if (this._x.readBack) await this._x.readBack(this._p.slots.filter((s) => s.role === 'parameter' || s.role === 'state'))
  }

  /** A synchronous call on a webgpu model is a ModelError naming its async twin. */
  _sync (what, twin) {
    if (this._x.backend === 'webgpu') throw new ModelError(`the webgpu backend is asynchronous: use await model.${twin}(...) instead of model.${what}(...)`)
  }

  _parameters () {
    const out = {}
    for (const s of this._p.slots) {
      if (s.role !== 'parameter' && s.role !== 'state') continue
      const data = readOutput(this._x.view(s.dtype), s.base / s.dtype.size, s.dtype, s.size, s.shape.slice())
      out[s.name] = { data, shape: s.shape.slice(), dtype: s.dtype.name }
    }
    return out
  }

  // ---- execution
  /** Throws unless the model can take a call now: not disposed, no asynchronous call in flight. */
  _idle () {
    this._alive()
    if (this._busy) throw new ModelError('an asynchronous call (forwardAsync, callAsync, trainStepAsync, fitAsync) is still running on this model; await it before the next call')
  }

  /** Run `work` (an async function) as this model's only call until it settles. */
  async _exclusive (work) {
    this._idle()
    this._busy = true
    try {
      const out = await work()
      this._alive() // disposed while it ran: its results are gone
      return out
    } finally {
      this._busy = false
    }
  }

  _ensure (names) {
    const missing = names.filter((n) => !this._x.entries[n])
    if (missing.length) this._x.compileSync(missing)
  }

  async _ensureAsync (names) {
    const missing = names.filter((n) => !this._x.entries[n])
    if (missing.length) await this._x.compileAsync(missing)
  }

  /** {name: spec} of an entrypoint's tensor inputs: their buffers' dtype and shape (for forward, loss and
   * train_step these are the signature's). */
  _entrySpecs (entry) {
    const e = this._p.entries[entry]
    if (!e.specs) {
      e.specs = Object.entries(e.inputs).map(([name, s]) => ({ name, dtype: s.dtype, shape: s.shape }))
      e.names = [...e.specs.map((s) => s.name), ...(e.args || [])]
      e.nameSet = new Set(e.names)
    }
    return e.specs
  }

  /** {feeds: Map slot -> values, env: Map Variable -> int} of `given` for entrypoint `entry`, every name,
   * shape, dtype and Variable checked (docs/bundle-format.md section 3, step 1). */
  _feeds (entry, given) {
    const e = this._p.entries[entry]
    const args = e.args || []
    const specs = this._entrySpecs(entry)
    const names = e.names
    if (given === null || typeof given !== 'object' || Array.isArray(given) || ArrayBuffer.isView(given)) {
      throw new ModelInputError(`entrypoint '${entry}' takes an object {name: data}; names: ${names.join(', ')}`)
    }
    const keys = Object.keys(given)
    if (keys.length !== names.length || !keys.every((k) => e.nameSet.has(k))) {
      // not exactly the entrypoint's names (distinct keys, all known, as many as the names: an exact match)
      const unknown = keys.filter((k) => !e.nameSet.has(k)).sort()
      const missing = names.filter((k) => !(k in given))
      if (unknown.length || missing.length) {
        throw new ModelInputError(`entrypoint '${entry}' takes ${JSON.stringify(names)}` + (unknown.length ? `; unknown ${JSON.stringify(unknown)}` : '') + (missing.length ? `; missing ${JSON.stringify(missing)}` : ''))
      }
    }
    const env = new Map()
    for (const v of args) env.set(v, this._argument(v, given[v]))
    const feeds = new Map()
    for (const spec of specs) {
      const r = readInput(spec, given[spec.name], this._p.variables)
      for (const [v, n] of r.dims) {
        if (env.has(v) && env.get(v) !== n) throw new ModelInputError(`input '${spec.name}' gives Variable '${v}' the value ${n}, while another input or argument gives it ${env.get(v)}`)
        env.set(v, n)
      }
      feeds.set(e.inputs[spec.name], r.values)
    }
    for (const [v, [, hi]] of this._p.variables) if (!env.has(v)) env.set(v, hi)
    return { feeds, env }
  }

  /** The int a Variable argument (`pos` of a decode entrypoint) takes, within its bounds. */
  _argument (name, value) {
    const [lo, hi] = this._p.variables.get(name)
    const n = typeof value === 'bigint' ? Number(value) : value
    if (typeof n !== 'number' || !Number.isInteger(n)) {
      throw new ModelInputError(`argument '${name}' is a Variable and takes an integer in ${lo}..${hi}, got ${value === null ? 'null' : typeof value === 'number' ? value : typeof value}`)
    }
    if (n < lo || n > hi) throw new ModelInputError(`argument '${name}' = ${n} is outside Variable '${name}' bounds ${lo}..${hi}`)
    return n
  }

  _run (entry, feeds, env) {
    this._write(entry, feeds)
    this._x.run(entry, env)
  }

  async _runAsync (entry, feeds, env) {
    this._write(entry, feeds)
    await this._x.runAsync(entry, env)
  }

  /** Copy the inputs in and refill the entrypoint's random keys. */
  _write (entry, feeds) {
    const x = this._x
    for (const [slot, values] of feeds) writeValues(x.view(slot.dtype), slot.base / slot.dtype.size, slot.dtype, values)
    const rngSlots = this._p.entries[entry].rng
    if (rngSlots.length) {
      const u32 = x.view(rngSlots[0].dtype)
      for (const s of rngSlots) {
        u32[s.base / 4] = this._p.rng[0]
        u32[s.base / 4 + 1] = this._p.rng[1]
        this._p.rng[1] = (this._p.rng[1] + 1) >>> 0
      }
    }
  }

  _results (entry, env) {
    const e = this._p.entries[entry]
    if (!e.outList) e.outList = Object.entries(e.outputs).map(([name, slot]) => ({ name, slot, symbolic: slot.shape.some((d) => typeof d === 'string') }))
    const out = {}
    for (const { name, slot, symbolic } of e.outList) {
      const shape = symbolic ? slot.shape.map((d) => (typeof d === 'string' ? env.get(d) : d)) : slot.shape.slice()
      let count = 1
      for (const d of shape) count *= d
      out[name] = readOutput(this._x.view(slot.dtype), slot.base / slot.dtype.size, slot.dtype, count, shape)
    }
    return out
  }

  _entrypoint (entrypoint) {
    if (!Object.prototype.hasOwnProperty.call(this._p.entries, entrypoint)) {
      throw new EntrypointError(`no entrypoint ${JSON.stringify(entrypoint)}; this model has ${JSON.stringify(this.entrypoints)}`)
    }
  }

  /** Run one entrypoint; returns its outputs as typed arrays (each with a `.shape`). */
  call (entrypoint, inputs = {}) {
    this._idle()
    this._sync(entrypoint === 'forward' ? 'forward' : 'call', entrypoint === 'forward' ? 'forwardAsync' : 'callAsync')
    this._entrypoint(entrypoint)
    const { feeds, env } = this._feeds(entrypoint, inputs)
    this._ensure([entrypoint])
    this._run(entrypoint, feeds, env)
    return this._results(entrypoint, env)
  }

  /** call() without blocking: kernels compile asynchronously and worker threads are awaited, so a browser's
   * main thread uses every thread (its synchronous calls run on one). Resolves to the same outputs. */
  async callAsync (entrypoint, inputs = {}) {
    this._idle()
    this._entrypoint(entrypoint)
    const { feeds, env } = this._feeds(entrypoint, inputs)
    return this._exclusive(async () => {
      await this._ensureAsync([entrypoint])
      await this._runAsync(entrypoint, feeds, env)
      return this._results(entrypoint, env)
    })
  }

  /** The evaluation forward: model.forward({x: ...}) -> {output name: typed array}. */
  forward (inputs) {
    return this.call('forward', inputs)
  }

  /** forward() without blocking (callAsync). */
  forwardAsync (inputs) {
    return this.callAsync('forward', inputs)
  }

  // ---- training
  _needTraining () {
    if (!this._p.entries.loss) throw new ModelError('this model has no training entrypoint: build it in Python with targets= and loss=')
  }

  /**
   * One optimizer step on one batch (inputs and targets together in `data`); returns that step's loss,
   * computed before the update. opts: {optimizer, lr, ...hyperparameters}, as fit().
   */
  trainStep (data, opts = {}) {
    this._idle()
    this._sync('trainStep', 'trainStepAsync')
    this._needTraining()
    const compile = this._configure(opts)
    if (compile) this._x.compileSync(compile)
    const { feeds, env } = this._feeds('loss', data)
    return this._step(feeds, env)
  }

  /** trainStep() without blocking (callAsync); resolves to the loss. */
  async trainStepAsync (data, opts = {}) {
    this._idle()
    this._needTraining()
    return this._exclusive(async () => {
      const compile = this._configure(opts)
      if (compile) await this._x.compileAsync(compile)
      const { feeds, env } = this._feeds('loss', data)
      return this._stepAsync(feeds, env)
    })
  }

  _step (feeds, env) {
    this._ensure(['train_step'])
    this._run('train_step', feeds, env)
    return this._loss()
  }

  async _stepAsync (feeds, env) {
    await this._ensureAsync(['train_step'])
    await this._runAsync('train_step', feeds, env)
    return this._loss()
  }

  _loss () {
    const slot = this._p.entries.train_step.outputs.loss
    return this._x.view(slot.dtype)[slot.base / slot.dtype.size]
  }

  /** Set up the optimizer `opts` asks for; returns the entrypoints to compile again (null: none). */
  _configure (opts) {
    const { optimizer, lr, hyper } = splitOptions(opts)
    const current = this._p.optimizer
    if (optimizer === undefined && !Object.keys(hyper).length) {
      if (current) {
        if (lr !== undefined) checkHyperparameters({ lr })
        if (lr !== undefined && lr !== current.lr) this._setLr(lr)
        return null
      }
    }
    const cfg = optimizerConfigOf(optimizer === undefined ? 'sgd' : optimizer, lr, hyper)
    if (current && sameConfig(cfg, current)) {
      if (cfg.lr !== current.lr) this._setLr(cfg.lr)
      return null
    }
    buildOptimizer(this._p, cfg)
    this._x.extend()
    return ['optimizer_step', 'train_step']
  }

  _setLr (lr) {
    this._p.optimizer.lr = lr
    const s = this._p.lrSlot
    this._x.view(s.dtype)[s.base / 4] = lr
    this._x.touched([s])
  }

  /**
   * Train on `data` ({input/target name: samples on the leading axis}) as Python's Model.fit: samples in
   * order, `batchSize` at a time (default: all as one batch); an incomplete final batch is an error unless
   * remainder 'drop' (skip it) or 'keep' (run it smaller, within every input's bounds). Returns one loss
   * per step. opts: {epochs = 1, batchSize, remainder, optimizer ('sgd' | 'adam' | 'adamw'), lr, ...}.
   */
  fit (data, opts = {}) {
    this._idle()
    this._sync('fit', 'fitAsync')
    const plan = this._fitPlan(data, opts)
    const compile = this._configure(plan.rest)
    if (compile) this._x.compileSync(compile)
    const losses = []
    for (const { feeds, env } of this._batches(plan)) {
      const loss = this._step(feeds, env)
      losses.push(loss)
      if (plan.onStep) plan.onStep(loss, losses.length - 1)
    }
    return losses
  }

  /** fit() without blocking (callAsync): resolves to the losses; onStep is called after each step. */
  async fitAsync (data, opts = {}) {
    this._idle()
    const plan = this._fitPlan(data, opts)
    return this._exclusive(async () => {
      const compile = this._configure(plan.rest)
      if (compile) await this._x.compileAsync(compile)
      const losses = []
      for (const { feeds, env } of this._batches(plan)) {
        const loss = await this._stepAsync(feeds, env)
        losses.push(loss)
        if (plan.onStep) plan.onStep(loss, losses.length - 1)
      }
      return losses
    })
  }

  /** fit's data and options checked and cut into batches: {columns, batches, epochs, onStep, rest, leadingVars}. */
  _fitPlan (data, opts) {
    this._needTraining()
    const { epochs = 1, batchSize, remainder = null, onStep, ...rest } = opts
    if (!Number.isInteger(epochs) || epochs < 0) throw new ModelError(`epochs must be a non-negative integer, got ${epochs}`)
    if (![null, undefined, 'drop', 'keep'].includes(remainder)) throw new ModelError(`remainder must be null, 'drop' or 'keep', got ${JSON.stringify(remainder)}`)
    if (data === null || typeof data !== 'object' || Array.isArray(data)) throw new ModelError('fit(data) takes an object {name: samples} of every input and target')
    const specs = [...this._p.inputs, ...this._p.targets]
    const inner = specs.filter((s) => s.shape.slice(1).some((d) => typeof d === 'string')).map((s) => s.name)
    if (inner.length) throw new ModelError(`fit() slices samples on the leading axis; inputs ${JSON.stringify(inner)} have a Variable in another dimension. Call trainStep() per batch instead`)
    const names = specs.map((s) => s.name)
    const unknown = Object.keys(data).filter((k) => !names.includes(k)).sort()
    const missing = names.filter((k) => !(k in data))
    if (unknown.length || missing.length) {
      throw new ModelInputError(`fit data needs ${JSON.stringify(names)}` + (unknown.length ? `; unknown ${JSON.stringify(unknown)}` : '') + (missing.length ? `; missing ${JSON.stringify(missing)}` : ''))
    }
    let count = null
    const columns = new Map()
    for (const spec of specs) {
      if (!spec.shape.length) throw new ModelInputError(`input '${spec.name}' is a scalar; fit() needs a leading sample axis`)
      const col = readInput(spec, data[spec.name], this._p.variables, { leading: true, what: `fit data '${spec.name}'` })
      if (count === null) count = col.rows
      else if (col.rows !== count) throw new ModelInputError(`fit data '${spec.name}' has ${col.rows} samples, others have ${count}`)
      columns.set(spec, col)
    }
    const bs = batchSize === undefined || batchSize === null ? count : batchSize
    if (!Number.isInteger(bs) || bs < 1) throw new ModelError(`batchSize must be a positive integer, got ${batchSize}`)
    this._admits(specs, bs, 'batchSize')
    const full = Math.floor(count / bs)
    const rest0 = count - full * bs
    const batches = []
    for (let i = 0; i < full; i++) batches.push([i * bs, bs])
    if (rest0) {
      if (!remainder) throw new ModelInputError(`${count} samples do not split into batches of ${bs}: the last batch would have ${rest0}. Pass remainder: 'drop' to skip it or remainder: 'keep' to run it smaller`)
      if (remainder === 'keep') {
        this._admits(specs, rest0, "the final batch (remainder: 'keep')")
        batches.push([full * bs, rest0])
      }
    }
    const leadingVars = new Set(specs.filter((s) => typeof s.shape[0] === 'string').map((s) => s.shape[0]))
    return { columns, batches, epochs, onStep, rest, leadingVars }
  }

  /** Every step's {feeds, env} of a fit plan, epoch after epoch. */
  * _batches ({ columns, batches, epochs, leadingVars }) {
    const e = this._p.entries.loss
    for (let ep = 0; ep < epochs; ep++) {
      for (const [start, size] of batches) {
        const feeds = new Map()
        for (const [spec, col] of columns) {
          const from = start * col.perRow
          const n = size * col.perRow
          feeds.set(e.inputs[spec.name], ArrayBuffer.isView(col.values) ? col.values.subarray(from, from + n) : col.values.slice(from, from + n))
        }
        const env = new Map([...this._p.variables].map(([v, [, hi]]) => [v, leadingVars.has(v) ? size : hi]))
        yield { feeds, env }
      }
    }
  }

  _admits (specs, n, what) {
    for (const spec of specs) {
      const d = spec.shape[0]
      if (typeof d === 'string') {
        const [lo, hi] = this._p.variables.get(d)
        if (n < lo || n > hi) throw new ModelInputError(`${what} ${n} is outside Variable '${d}' bounds ${lo}..${hi} of input '${spec.name}'`)
      } else if (d !== n) {
        throw new ModelInputError(`${what} ${n} does not fit input '${spec.name}', whose leading dimension is fixed at ${d}; use batchSize: ${d} or save the model with a Variable batch dimension`)
      }
    }
  }

  // ---- saving
  /** The bundle bytes (Uint8Array) of the model as it is now: Python's Model.load reads them. */
  save () {
    this._idle()
    this._sync('save', 'saveAsync')
    return this._save()
  }

  /** save() of any backend (webgpu: the weights are read back from the GPU first). */
  async saveAsync () {
    return this._exclusive(async () => {
      await this._readBack()
      return this._save()
    })
  }

  _save () {
    const x = this._x
    const u8 = x.bytes()
    const { manifest, blobs } = writeManifest(this._p, (s) => u8.slice(s.base, s.base + s.size * s.dtype.size), `polygrad-js ${VERSION}`)
    return bundle.write(manifest, blobs)
  }

  /** Release the model's memory and compiled code; later calls raise ModelError. Idempotent. */
  dispose () {
    if (this._disposed) return
    this._disposed = true
    this._x.dispose()
    if (unreached) unreached.unregister(this)
    this._x = null
    this._p = null
  }

  toString () {
    if (this._disposed) return '<Model disposed>'
    return `<Model (${this._p.inputs.map((s) => `${s.name}[${s.shape.join(', ')}]`).join(', ')}) -> (${this._p.outputs.map((s) => s.name).join(', ')})>`
  }
}

const HYPER_NAMES = { weightDecay: 'weight_decay' }

function splitOptions (opts) {
  if (opts === null || typeof opts !== 'object') throw new ModelError('options must be an object')
  const { optimizer, lr, ...hyper } = opts
  const out = {}
  for (const [k, v] of Object.entries(hyper)) if (v !== undefined) out[HYPER_NAMES[k] || k] = v
  return { optimizer, lr, hyper: out }
}

function summaryText (s) {
  const sig = (rows) => rows.map((r) => `${r.name}: ${r.dtype}[${r.shape.join(', ')}]`).join(', ') || '-'
  const lines = [`Model (${s.backend})`, `  inputs:      ${sig(s.inputs)}`, `  targets:     ${sig(s.targets)}`,
    `  outputs:     ${sig(s.outputs)}`, `  entrypoints: ${s.entrypoints.join(', ')}`,
    `  parameters:  ${s.parameterCount.toLocaleString('en-US')} in ${s.parameters.length} tensors`]
  for (const p of [...s.parameters, ...s.state]) lines.push(`    ${p.name.padEnd(32)} ${p.dtype.padEnd(9)} ${('[' + p.shape.join(', ') + ']').padEnd(18)} ${String(p.count).padStart(10)}`)
  lines.push('  bytes:       ' + Object.entries(s.bytes).filter(([, v]) => v).map(([k, v]) => `${k} ${v.toLocaleString('en-US')}`).join(', '))
  if (s.optimizer) lines.push(`  optimizer:   ${JSON.stringify(s.optimizer)}`)
  return lines.join('\n')
}

module.exports = { Model, PolygradError, VERSION, STORED }
