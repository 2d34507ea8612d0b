'use strict'
/**
 * Execution of a Program: one linear memory holding every buffer, the kernels compiled per call site,
 * entrypoints run as lists of steps.
 *
 * Stage: execution. Input: a Program (manifest.js). Output: an Executor with run(entry, env).
 * - Memory plan (`planMemory`): persistent buffers (everything but temporaries) get their own 64-byte
 *   aligned region; temporaries share space when no entrypoint has both alive at once (first-fit over
 *   their live call ranges). The memory is sized once, at load; calls never allocate. (Configuring a new
 *   optimizer appends its state and grows the memory once, before the first step.)
 * - Compilation (`compileSites`): each distinct (kernel, buffers) call is lowered (compile.js) and emitted
 *   into one WebAssembly module (wasm/module.js) whose functions have their buffers' addresses baked in;
 *   or, with backend 'js' or without wasm SIMD, compiled to closures (jsexec.js).
 * - Packed weights (pack.js): the few-rows variant of a call whose arguments include model parameters
 *   has a second form reading them through copies in its loop order, and so has every variant for the
 *   parameters it reads across their rows (x @ W: GPT-2's weights in decode and prompt), placed after the
 *   other buffers when the call is first compiled (a copy of one layout is shared); entrypoints that write no parameter (forward, loss, decode) run it,
 *   training steps keep the unpacked one. Every step counts the parameter slots it writes (its kernel's
 *   stores, a copy's destination); before a step reads a copy, the copy is refilled if its slot was
 *   written since it was made (after training, the next batch-1 forward repacks once).
 * - Threads (`threads` > 1, wasm only): the memory is a shared WebAssembly.Memory; a kernel that
 *   lower.threadable admits is compiled as phases (compile.js), one per block, each over a slice of its first
 *   loop, and a call whose work (lower.kernelWork) reaches THREAD_MIN_WORK (THREAD_HOT_WORK while the
 *   workers are awake from the call before) runs every phase on the pool's
 *   threads (threads/pool.js), this thread included; smaller calls, and synchronous calls where this thread
 *   cannot block (a browser's main thread), run the phases whole here (slice 0 of 1). The same instructions
 *   compute every element either way, so results are bit for bit those of one thread.
 */

const { BundleError, KernelError, ModelError } = require('./errors')
const { lowerKernel, prepareKernel } = require('./compile')
const { chooseOpts, fewRowsOpts, kernelWork, THREAD_MIN_WORK, THREAD_HOT_WORK } = require('./lower')
const { Pool } = require('./threads/pool')
const { MAX_ARGS } = require('./threads/control')
const { validateKernel } = require('./manifest')
const { buildModule, importObject, simdSupported, relaxedSimdSupported, relaxedDotSupported } = require('./wasm/module')
const { JSKernel } = require('./jsexec')
const { repack } = require('./pack')
const { toposort } = require('./ir')

const ALIGN = 64
// the memory's first bytes hold zeros, never a buffer (planMemory starts after them; the executor clears them):
// a gated load whose gate is off reads address 0 and gets 0 without a select (wasm/emit.js emitLoad)
const ZERO_BYTES = ALIGN
const PAGE = 65536
const up = (n, a = ALIGN) => Math.ceil(n / a) * a

function nbytes (s) {
  return Math.max(s.size * s.dtype.size, 1)
}

/** Assign `slot.base` (a byte address) to every slot; returns the bytes used. */
function planMemory (prog, start = ZERO_BYTES) {
  let pos = start
  for (const s of prog.slots) {
    if (s.role === 'temporary' || s.base !== undefined) continue
    s.base = pos
    pos = up(pos + nbytes(s))
  }
  const temps = prog.slots.filter((s) => s.role === 'temporary' && s.base === undefined)
  const live = new Map(temps.map((t) => [t, []]))
  for (const e of Object.values(prog.entries)) {
    e.calls.forEach((c, i) => {
      for (const s of c.copy || c.args) {
        const iv = live.get(s)
        if (!iv) continue
        const last = iv.find((v) => v.entry === e)
        if (last) last.hi = i
        else iv.push({ entry: e, lo: i, hi: i })
      }
    })
  }
  const conflict = (a, b) => live.get(a).some((x) => live.get(b).some((y) => x.entry === y.entry && x.lo <= y.hi && y.lo <= x.hi))
  const placed = []
  const arena = pos
  let top = pos
  for (const t of temps.sort((a, b) => nbytes(b) - nbytes(a))) {
    const busy = placed.filter((p) => conflict(p, t)).map((p) => [p.base, p.base + up(nbytes(p))]).sort((a, b) => a[0] - b[0])
    let at = arena
    for (const [lo, hi] of busy) {
      if (at + nbytes(t) <= lo) break
      at = Math.max(at, hi)
    }
    t.base = at
    placed.push(t)
    top = Math.max(top, up(at + nbytes(t)))
  }
  return top
}

const MAX_PAGES = 65536 // a WebAssembly (32-bit) memory holds at most 4 GiB
// the columns of an int8-activation block-sum tile where the engine has relaxed SIMD (Executor dotCols)
const DOT_COLS = 4

/** A WebAssembly.Memory of at least `bytes` bytes (grown if it exists); Error (BundleError at load) if it
 * cannot be that large. A new `shared` memory (threads) has the 4 GiB maximum a shared memory must declare:
 * address space reserved, not memory used. */
function ensureMemory (memory, bytes, Error = ModelError, shared = false) {
  const pages = Math.ceil(bytes / PAGE) + 1
  if (pages > MAX_PAGES) throw new Error(`this model needs ${bytes} bytes of memory; a WebAssembly memory holds at most 4 GiB, so polygrad-js cannot run it (Python's polygrad can)`)
  if (!memory && shared) return new WebAssembly.Memory({ initial: pages, maximum: MAX_PAGES, shared: true })
  if (!memory) return new WebAssembly.Memory({ initial: pages })
  const have = memory.buffer.byteLength / PAGE
  if (have < pages) memory.grow(pages - have)
  return memory
}

/**
 * What both executors share (this module's wasm/js one and webgpu/runtime.js's): the Program laid out in one
 * byte space (planMemory), the per-kernel caches, typed views of the memory, call-site keys, and placing slots
 * added after load. A subclass sets `memory` ({buffer}) and gives `grow()` (room for bytesUsed) and
 * `hostWrote(slots)` (the host put values in these slots).
 */
class BaseExecutor {
  constructor (prog, verify) {
    this.verify = verify
    this.prog = prog
    this.lowered = new Map() // kernel UOp -> program
    this.prepared = new Map() // kernel UOp -> prepareKernel's result
    this.bytesUsed = planMemory(prog)
    this.scratchBase = this.bytesUsed
    this.scratchSize = 0
    this.entries = {}
    this.stats = { kernels: 0, checks: 0, sites: 0, repacks: 0 }
  }

  prepare1 (ast) {
    let p = this.prepared.get(ast)
    if (!p) {
      p = prepareKernel(this.prog.graph, ast)
      this.prepared.set(ast, p)
    }
    return p
  }

  siteKey (c) {
    return this.prog.kernels[c.kernel].id + ':' + c.args.map((s) => s.base).join(',')
  }

  /** Bytes of scratch call `c`'s kernel needs (its split-off prologues' buffers, placed one after another). */
  callScratch (c) {
    return this.prepare1(this.prog.kernels[c.kernel]).scratch.reduce((a, s) => a + up(s.size * s.dtype.size), 0)
  }

  /** Scratch of at least `need` bytes, after every buffer: reserved (memory grown) when the current is smaller.
   * Sites compiled before keep the region they were given; it is never reused for anything else. */
  reserveScratch (need) {
    if (need <= this.scratchSize) return
    this.scratchBase = this.bytesUsed
    this.scratchSize = need
    this.bytesUsed += need
    this.grow()
  }

  /** Where a call site's kernel finds its buffers: its arguments' slots, then its scratch slots in the scratch. */
  siteLayout (c, prog) {
    const layout = new Map(c.args.map((s, i) => [i, { base: s.base, size: s.size }]))
    let at = this.scratchBase
    for (const s of prog.scratch) {
      layout.set(s.slot, { base: at, size: s.size })
      at += up(s.size * s.dtype.size)
    }
    return layout
  }

  view (dtype) {
    if (!this.views || this.views.buffer !== this.memory.buffer) this.views = { buffer: this.memory.buffer }
    let v = this.views[dtype.name]
    if (!v) v = this.views[dtype.name] = new dtype.store(this.memory.buffer)
    return v
  }

  bytes () {
    return new Uint8Array(this.memory.buffer)
  }

  /** Place slots added since load (a new optimizer's state), grow the memory once, write their values. */
  extend () {
    this.bytesUsed = planMemory(this.prog, this.bytesUsed)
    this.grow()
    for (const s of this.prog.slots) {
      if (s.init) {
        this.view(s.dtype).set(s.init, s.base / s.dtype.size)
        s.init = null
        this.hostWrote([s])
      }
    }
  }
}

class Executor extends BaseExecutor {
  constructor (prog, { backend = 'auto', memory = null, verify = false, threads = 1, canBlock = true, fma = true, int8Dot = true } = {}) {
    super(prog, verify)
    this.backend = backend === 'auto' ? (simdSupported() ? 'wasm' : 'js') : backend
    this.width = this.backend === 'wasm' ? 4 : 1
    // reduction steps as one relaxed multiply-add where the engine has relaxed SIMD (wasm/emit.js fusedProducts)
    this.fma = this.backend === 'wasm' && fma !== false && relaxedSimdSupported()
    // int32 sums of byte products as relaxed SIMD's int8 dot product where the engine computes it (linearize.js
    // dotReduce): exact, so results equal the plain path's; the load option int8Dot: false keeps the plain path
    this.dot = this.backend === 'wasm' && int8Dot !== false && relaxedDotSupported()
    // elsewhere (Node 20: no relaxed SIMD; Q8_0's 8-bit weights everywhere) as standard SIMD's 16-bit dot
    // product, still exact (linearize.js dotOf)
    this.dotLanes = this.backend === 'wasm' && int8Dot !== false
    // columns a tile of a block sum on 8-bit activations (lower.js chooseOpts): 4 where the engine has relaxed
    // SIMD (a V8 whose register allocator holds the tile: Chromium 156's GPT-2 decode matvecs about 0.83x the
    // time of 2 columns), else 2 (Node 20's V8 spilled 55 values a block step with 4: 1.07x the time)
    this.dotCols = this.backend === 'wasm' && relaxedSimdSupported() ? DOT_COLS : 2
    this.threads = this.backend === 'wasm' ? threads : 1
    this.canBlock = canBlock // whether this thread may wait on the workers (not a browser's main thread)
    this.memory = ensureMemory(memory, this.bytesUsed, BundleError, this.threads > 1)
    new Uint8Array(this.memory.buffer, 0, ZERO_BYTES).fill(0) // a memory passed in may hold anything there
    this.pool = this.threads > 1 ? new Pool(this.threads, this.memory) : null
    this.minWork = THREAD_MIN_WORK // a call with less work runs on this thread alone (tests lower it)
    this.minHotWork = THREAD_HOT_WORK // ... unless it has this much and the workers are awake (pool.hot)
    // packed copies of parameters (pack.js), by source slot and layout, and how many times each slot was
    // written by a call (a copy made at another count is stale)
    this.packed = new Map()
    this.writes = new Map()
  }

  /** Bytes of scratch the kernels of `names` need at once (fission prologues; shared by all kernels). */
  scratchBytes (names) {
    let most = 0
    for (const n of names) {
      for (const c of this.prog.entries[n].calls) {
        if (!c.copy) most = Math.max(most, this.callScratch(c))
      }
    }
    return most
  }

  lower (k) {
    const ast = this.prog.kernels[k]
    let p = this.lowered.get(ast)
    if (!p) {
      validateKernel(this.prog, k)
      const prepared = this.prepare1(ast)
      const opts = chooseOpts(prepared.ast, this.width, { dotCols: this.dotCols })
      const threaded = this.pool !== null
      p = lowerKernel(this.prog.graph, ast, { width: this.width, prepared, opts, verify: this.verify, threaded, dot: this.dot, dotLanes: this.dotLanes })
      p.scratch = prepared.scratch
      p.kernelIndex = k
      p.work = threaded ? kernelWork(prepared.ast) : null
      // a row tile over a Variable's size recomputes the clamped last rows: below the tile's height a
      // variant without that tile runs instead (batch 1 does one row of work, not four)
      const sym = opts.filter((o) => o.kind === 'UPCAST' && o.range.src[0].op === 'DEFINE_VAR')
      if (sym.length === 1) {
        p.small = lowerKernel(this.prog.graph, ast, { width: this.width, prepared, opts: fewRowsOpts(opts, sym[0]), verify: this.verify, threaded, dot: this.dot, dotLanes: this.dotLanes })
        p.small.scratch = prepared.scratch
        // its epilogue's ReLUs keep wasm's select (a branch in V8): at batch 1 the bit select of the tiled
        // kernels (wasm/emit.js selectF32) measured about 10 us slower per call on the bench MLP
        p.small.selectBranches = true
        p.smallVar = sym[0].range.src[0].arg[0]
        p.smallBelow = sym[0].amount
        p.smallOpts = fewRowsOpts(opts, sym[0])
        p.prepared = prepared
        p.packedSmall = new Map()
      }
      if (opts.length) {
        // a variant reading weights across their rows (x @ W) through packed copies, as the few-rows variant
        // does: a tile of 8 columns otherwise reads 32 bytes of each 9 KB row of a 768 x 2304 weight per
        // step, where the copy is one stream (GPT-2 small's decode: 9-12 GB/s per kernel become 23-29;
        // its prompt's x @ W kernels about 2x faster)
        p.prepared = prepared
        p.packOpts = opts
        p.packedMain = new Map()
      }
      this.lowered.set(ast, p)
    }
    return p
  }

  /**
   * The few-rows variant for call `c`: where some of its parameter buffers are model parameters, a variant
   * reading them through packed copies in its loop order (pack.js; one per set of such buffers), else p.small.
   */
  smallFor (p, c) {
    return this.packedFor(c, p.small, p.smallOpts, p.packedSmall, false)
  }

  /**
   * The variant of `base` (lowered with `opts`) for call `c` that reads c's parameter buffers through packed
   * copies (pack.js; one per set of such buffers, cached in `cache`), or `base` where none packs; `main`:
   * the kernel's full-size variant (pack.js packLoads's rule for it).
   */
  packedFor (c, base, opts, cache, main) {
    const params = c.args.map((s) => s.role === 'parameter')
    const key = params.map(Number).join('')
    if (!params.some(Boolean)) return base
    let q = cache.get(key)
    if (!q) {
      const eligible = (i) => (params[i] ? c.args[i].size : 0)
      const p = this.lowered.get(this.prog.kernels[c.kernel])
      q = lowerKernel(this.prog.graph, this.prog.kernels[c.kernel], { width: this.width, prepared: p.prepared, opts, verify: this.verify, pack: eligible, packMain: main, threaded: this.pool !== null, dot: this.dot, dotLanes: this.dotLanes })
      if (!q.packs.length) q = base
      else Object.assign(q, { scratch: base.scratch, selectBranches: base.selectBranches })
      cache.set(key, q)
    }
    return q
  }

  /** The site of `packed` (a variant reading packed copies) for call `c` whose own buffers lie at `layout`:
   * each copy's region placed (packRegion), the copies' parameters pointing at them. */
  packedSite (c, layout, packed) {
    const packs = packed.packs.map((pk) => this.packRegion(c.args[pk.from], pk))
    const packedLayout = new Map(layout)
    packed.packs.forEach((pk, i) => packedLayout.set(pk.slot, { base: packs[i].base, size: pk.size }))
    return { prog: packed, layout: packedLayout, call: c, packs }
  }

  /** The region of the packed copy of call argument `src` with layout `pk` (one per slot and layout). */
  packRegion (src, pk) {
    const key = `${src.index}|${pk.sizes}|${pk.src}`
    let r = this.packed.get(key)
    if (!r) {
      r = { source: src, base: up(this.bytesUsed), size: pk.size, dtype: pk.dtype, layout: pk, written: -1, wanted: -1 }
      this.bytesUsed = up(r.base + pk.size * pk.dtype.size)
      this.memory = ensureMemory(this.memory, this.bytesUsed)
      this.packed.set(key, r)
    }
    return r
  }

  /**
   * Whether a packed copy holds its slot's current values. A copy behind its slot (written since, by a call
   * or at load) is refilled when a second call asks for it with no write in between; the first call runs the
   * unpacked variant (a fresh process's first result and a forward between training steps pay no refill).
   */
  ready (r) {
    const n = this.writes.get(r.source) || 0
    if (r.written === n) return true
    if (r.wanted !== n) {
      r.wanted = n
      return false
    }
    repack(this.view(r.dtype), r.source.base / r.dtype.size, r.base / r.dtype.size, r.layout)
    r.written = n
    this.stats.repacks++
    return true
  }

  /** The parameter slots call `c` writes (its kernel's stores, or a copy's destination). */
  writtenBy (c) {
    if (c.copy) return c.copy[0].role === 'parameter' ? [c.copy[0]] : []
    const stored = new Set(toposort(this.prog.kernels[c.kernel]).filter((n) => n.op === 'STORE').map((n) => n.src[0].src[0].arg[0]))
    return [...stored].map((i) => c.args[i]).filter((s) => s && s.role === 'parameter')
  }

  /** Room for bytesUsed in the memory (grown in place: the threads' shared memory stays the same object). */
  grow () {
    this.memory = ensureMemory(this.memory, this.bytesUsed)
  }

  /** Values the host put in slots: their packed copies are stale. */
  hostWrote (slots) {
    this.wrote(slots)
  }

  /** The call sites of `names` not compiled yet, as {key, call} (one per distinct kernel and buffers). */
  pendingSites (names) {
    const sites = new Map()
    for (const n of names) {
      for (const c of this.prog.entries[n].calls) {
        if (c.copy) continue
        const key = this.siteKey(c)
        if (!this.siteFns || !this.siteFns.has(key)) sites.set(key, c)
      }
    }
    return sites
  }

  /** {bytes, sites} of a module for the pending call sites of `names` (null when none are pending). */
  prepare (names) {
    const pending = this.pendingSites(names)
    if (!pending.size) return null
    // scratch for split-off prologues: reserved when the kernels that need it are first compiled
    this.reserveScratch(this.scratchBytes(names))
    const sites = []
    const keys = []
    for (const [key, c] of pending) {
      const prog = this.lower(c.kernel)
      const layout = this.siteLayout(c, prog)
      sites.push({ prog, layout, call: c, packs: [] })
      keys.push(key)
      if (prog.small) {
        sites.push({ prog: prog.small, layout, call: c, packs: [] })
        keys.push(key + '|small')
        const packed = this.smallFor(prog, c)
        if (packed !== prog.small) {
          sites.push(this.packedSite(c, layout, packed))
          keys.push(key + '|packed')
        }
      }
      if (prog.packedMain) {
        const packed = this.packedFor(c, prog, prog.packOpts, prog.packedMain, true)
        if (packed !== prog) {
          sites.push(this.packedSite(c, layout, packed))
          keys.push(key + '|packed-main')
        }
      }
    }
    // a threaded program is emitted as its phases (key@i), not whole
    const emitted = []
    const emittedKeys = []
    sites.forEach((site, i) => {
      if (!site.prog.phases) {
        emitted.push(site)
        emittedKeys.push(keys[i])
        return
      }
      site.prog.phases.forEach((phase, j) => {
        emitted.push(Object.assign({}, site, { prog: phase }))
        emittedKeys.push(`${keys[i]}@${j}`)
      })
    })
    const out = { bytes: null, sites, keys, emitted, emittedKeys }
    if (this.backend === 'wasm') out.bytes = buildModule(emitted, this.memory.buffer.byteLength / PAGE, this.pool ? MAX_PAGES : undefined, { fma: this.fma })
    return out
  }

  /** Bind the functions of a prepared module (instance: a WebAssembly.Instance, or null for js; module: the
   * WebAssembly.Module, which the workers instantiate too when there are threads). */
  bind (prepared, instance, module = null) {
    if (!this.siteFns) this.siteFns = new Map()
    const moduleId = this.pool && module ? this.pool.addModule(module) : -1
    const exportOf = new Map(prepared.emittedKeys.map((k, i) => [k, i]))
    prepared.sites.forEach((site, i) => {
      let fn = null
      let phases = null
      if (site.prog.phases) {
        phases = site.prog.phases.map((phase, j) => {
          const e = exportOf.get(`${prepared.keys[i]}@${j}`)
          return { fn: instance.exports[`k${e}`], site: { module: moduleId, export: e } }
        })
      } else if (instance) {
        fn = instance.exports[`k${exportOf.get(prepared.keys[i])}`]
      } else {
        const kern = new JSKernel(site.prog)
        const params = site.prog.params
        fn = (...vals) => {
          const vars = {}
          site.prog.vars.forEach((n, j) => { vars[n] = vals[j] })
          const bufs = {}
          for (const p of params) {
            const L = site.layout.get(p.slot)
            bufs[p.slot] = { view: this.view(p.dtype), start: L.base / p.dtype.size, size: L.size }
          }
          kern.run(bufs, vars)
        }
      }
      this.siteFns.set(prepared.keys[i], { fn, phases, prog: site.prog, packs: site.packs })
      this.stats.sites++
      this.stats.checks += countChecks(site.prog)
    })
  }

  /** Compile what `names` need, synchronously (Node; small modules in browsers). */
  compileSync (names) {
    const prepared = this.prepare(names)
    if (prepared) {
      const module = prepared.bytes ? new WebAssembly.Module(prepared.bytes) : null
      const instance = module ? new WebAssembly.Instance(module, importObject(this.memory)) : null
      this.bind(prepared, instance, module)
    }
    this.link(names)
  }

  /** Compile what `names` need, asynchronously (browsers). */
  async compileAsync (names) {
    const prepared = this.prepare(names)
    if (prepared) {
      let instance = null
      let mod = null
      if (prepared.bytes) {
        mod = await WebAssembly.compile(prepared.bytes)
        instance = await WebAssembly.instantiate(mod, importObject(this.memory))
      }
      this.bind(prepared, instance, mod)
    }
    this.link(names)
  }

  link (names) {
    for (const n of names) {
      // an entrypoint that writes parameters (a training step) reads them unpacked: a packed copy would be
      // refilled at every one of its steps
      const training = this.prog.entries[n].calls.some((c) => this.writtenBy(c).length)
      this.entries[n] = this.prog.entries[n].calls.map((c) => {
        const writes = this.writtenBy(c)
        if (c.copy) {
          const [dst, src] = c.copy
          return { copy: true, dst: dst.base, src: src.base, n: Math.min(dst.size, src.size) * src.dtype.size, writes }
        }
        const site = this.siteFns.get(this.siteKey(c))
        const step = { copy: false, main: runner(site), name: site.prog.name, small: null, packed: null, packedMain: null, writes, work: site.prog.work }
        const small = this.siteFns.get(this.siteKey(c) + '|small')
        const packed = !training && this.siteFns.get(this.siteKey(c) + '|packed')
        const packedMain = !training && this.siteFns.get(this.siteKey(c) + '|packed-main')
        if (small) Object.assign(step, { small: runner(small), smallVar: site.prog.smallVar, smallBelow: site.prog.smallBelow })
        if (packed) Object.assign(step, { packed: runner(packed), packs: packed.packs })
        if (packedMain) Object.assign(step, { packedMain: runner(packedMain), mainPacks: packedMain.packs })
        return step
      })
    }
  }

  /** Count a write of each of these slots (their packed copies are stale until refilled). */
  wrote (slots) {
    for (const s of slots) this.writes.set(s, (this.writes.get(s) || 0) + 1)
  }

  /** Slots written on the host: nothing to do, the memory is this one (the webgpu backend uploads them). */
  touched () {}

  /** Run entrypoint `name` with Variable values `env` (a Map name -> int); with threads, this thread
   * waits on the workers (Atomics.wait). */
  run (name, env) {
    const steps = this.steps(name, env, false)
    let r = steps.next()
    try {
      while (!r.done) {
        const [site, own, args] = r.value
        try {
          if (this.pool.readySync()) this.pool.call(site, own, args)
          else own(0, 1, ...args)
        } catch (e) {
          r = steps.throw(e)
          continue
        }
        r = steps.next()
      }
    } finally {
      if (this.pool) this.pool.end()
    }
  }

  /** run() for a thread that cannot block (a browser's main thread): the workers' slices are awaited. */
  async runAsync (name, env) {
    const steps = this.steps(name, env, true)
    let r = steps.next()
    try {
      while (!r.done) {
        const [site, own, args] = r.value
        try {
          if (await this.pool.readyAsync()) await this.pool.callAsync(site, own, args)
          else own(0, 1, ...args)
        } catch (e) {
          r = steps.throw(e)
          continue
        }
        r = steps.next()
      }
    } finally {
      if (this.pool) this.pool.end()
    }
  }

  /**
   * The steps of entrypoint `name`, run here, except a phase worth threads, which is yielded as [site, own
   * function, Variable values] for run/runAsync to share with the pool (an error from it is thrown back in).
   */
  * steps (name, env, async) {
    const steps = this.entries[name]
    if (!steps) throw new KernelError(`internal: entrypoint ${name} is not compiled`)
    const pool = this.pool && !this.pool.broken && (async || this.canBlock) ? this.pool : null
    let u8 = null
    for (const st of steps) {
      if (st.copy) {
        if (!u8) u8 = this.bytes()
        u8.copyWithin(st.dst, st.src, st.src + st.n)
        this.wrote(st.writes)
        continue
      }
      try {
        let run = st.main
        if (st.small !== null && env.get(st.smallVar) < st.smallBelow) {
          let packed = st.packed !== null
          if (packed) for (const r of st.packs) packed = this.ready(r) && packed // every copy asked (no short cut)
          run = packed ? st.packed : st.small
        } else if (st.packedMain !== null) {
          let packed = true
          for (const r of st.mainPacks) packed = this.ready(r) && packed
          if (packed) run = st.packedMain
        }
        if (run.phases === null) {
          if (run.vars.length === 0) run.fn()
          else run.fn(...run.vars.map((v) => env.get(v)))
        } else {
          const args = run.vars.map((v) => env.get(v))
          const work = pool !== null && args.length <= MAX_ARGS ? st.work(env) : -1
          const shared = work >= 0 && (work >= this.minWork || (work >= this.minHotWork && pool.hot()))
          for (const ph of run.phases) {
            if (shared) yield [ph.site, ph.fn, args]
            else ph.fn(0, 1, ...args)
          }
        }
        this.wrote(st.writes)
      } catch (e) {
        if (e instanceof WebAssembly.RuntimeError) {
          throw new KernelError(`kernel ${st.name} stopped: ${e.message} (an access outside its buffers was caught; the bundle's kernel is malformed)`)
        }
        throw e
      }
      this.stats.kernels++
    }
  }

  /** End the worker threads (idempotent). */
  dispose () {
    if (this.pool) this.pool.dispose()
  }
}

/** How a step calls a compiled variant: one function, or phases (threads). */
function runner (site) {
  return { fn: site.fn, phases: site.phases, vars: site.prog.vars }
}

/** The run-time bounds checks a linearized program holds (verify: accesses it could not prove). */
function countChecks (prog) {
  let n = 0
  const walk = (insts) => {
    for (const x of insts) {
      if ((x.k === 'load' || x.k === 'store') && x.check) n++
      if (x.k === 'loop') { walk(x.pre); walk(x.body) }
      if (x.k === 'if') walk(x.body)
    }
  }
  walk(prog.head)
  walk(prog.body)
  return n
}

module.exports = { BaseExecutor, Executor, planMemory, ensureMemory, countChecks, ZERO_BYTES }
