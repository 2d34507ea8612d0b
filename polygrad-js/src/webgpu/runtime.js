'use strict'
/**
 * Execution on WebGPU: the model's memory as one GPU storage buffer, each call site a compute pipeline per
 * phase, entrypoints as one command buffer each; only outputs are read back.
 *
 * Stage: execution (the webgpu backend), beside runtime.js's Executor, with the same memory plan
 * (runtime.planMemory: every slot at its byte address, temporaries sharing space) and the same lowering
 * (compile.js, width 1: one output point per invocation needs no lanes or register tiles). Input: a Program
 * (manifest.js) and a GPUDevice (device.js). Output: a GPUExecutor with compileAsync(names) and
 * runAsync(name, env).
 * - The host keeps a mirror of the memory (`memory.buffer`, an ArrayBuffer) that Model reads and writes as
 *   it does wasm's memory: stored weights and caches at load, an entrypoint's inputs and random keys before
 *   each call, a new optimizer's state and learning rate; what was written is uploaded before the next call.
 *   After a call only the entrypoint's outputs come back (readBack fetches other slots: save, parameters).
 * - A kernel lower.threadable admits runs each block as a phase (linearize's `split`) dispatched over its
 *   first loop, one point per invocation (emit.js); other kernels (an accumulating store) run on one
 *   invocation. Copies between buffers are a copy shader (a buffer cannot be copied into itself).
 * - Limits: the memory must fit one storage binding (the adapter's maxStorageBufferBindingSize, asked for
 *   at device creation); a kernel uses 2 bindings and 1..64 invocations per workgroup, within WebGPU's
 *   guaranteed defaults.
 */

const { BundleError, KernelError, ModelError } = require('../errors')
const { lowerKernel } = require('../compile')
const { sizeValue } = require('../lower')
const { validateKernel } = require('../manifest')
const { BaseExecutor, countChecks } = require('../runtime')
const { PART, PARTS } = require('../linearize')
const { emitWGSL, WORKGROUP } = require('./emit')

// GPUBufferUsage and GPUMapMode values (the globals are not defined in Node)
const STORAGE = 0x80
const COPY_SRC = 0x04
const COPY_DST = 0x08
const MAP_READ = 0x01
const READ = 0x01

const ALIGN = 64
const PARAM_STRIDE = 256 // minStorageBufferOffsetAlignment: each step's Variables at its own offset
const MAX_PARAMS = PARAM_STRIDE / 4
const MAX_GROUPS = 65535 // maxComputeWorkgroupsPerDimension
const up = (n, a = ALIGN) => Math.ceil(n / a) * a

const COPY_WGSL = `
@group(0) @binding(0) var<storage, read_write> M: array<u32>;
@group(0) @binding(1) var<storage, read> P: array<i32>;
@compute @workgroup_size(${WORKGROUP})
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
  let i = gid.x + gid.y * groups.x * ${WORKGROUP}u;
  if (i >= u32(P[2])) { return; }
  M[u32(P[0]) + i] = M[u32(P[1]) + i];
}
`

class GPUExecutor extends BaseExecutor {
  constructor (prog, device, { verify = false } = {}) {
    super(prog, verify)
    this.backend = 'webgpu'
    this.threads = 1
    this.pool = null
    this.device = device
    this.memory = { buffer: new ArrayBuffer(up(this.bytesUsed)) }
    this.checkSize(BundleError)
    this.gpu = null // the GPU buffer of the memory (made, and remade larger, by flush)
    this.generation = 0 // bumped when `gpu` is replaced: bind groups are remade
    this.dirty = [[0, this.bytesUsed]]
    this.sites = new Map()
    this.plans = new Map() // entry -> {generation, steps with bind groups, params buffer}
    this.copyPipeline = null
  }

  checkSize (Err = ModelError) {
    const most = Math.min(this.device.limits.maxStorageBufferBindingSize, this.device.limits.maxBufferSize)
    if (up(this.bytesUsed) > most) {
      throw new Err(`this model needs ${this.bytesUsed} bytes of GPU memory in one storage buffer; this WebGPU adapter binds at most ${most}. Load it with { backend: 'wasm' }`)
    }
  }

  /** Mark slots written on the host (uploaded before the next call). */
  touched (slots) {
    for (const s of slots) this.dirty.push([s.base, s.base + s.size * s.dtype.size])
  }

  /** Grow the host mirror to bytesUsed (the GPU buffer follows at the next flush). */
  grow () {
    this.checkSize()
    const need = up(this.bytesUsed)
    if (this.memory.buffer.byteLength >= need) return
    const next = new ArrayBuffer(need)
    new Uint8Array(next).set(new Uint8Array(this.memory.buffer))
    this.memory = { buffer: next }
  }

  /** Values the host put in slots: uploaded before the next call. */
  hostWrote (slots) {
    this.touched(slots)
  }

  lower (k) {
    const ast = this.prog.kernels[k]
    let p = this.lowered.get(ast)
    if (!p) {
      validateKernel(this.prog, k)
      const prepared = this.prepare1(ast)
      p = lowerKernel(this.prog.graph, ast, { width: 1, prepared, opts: [], verify: this.verify, threaded: true })
      p.scratch = prepared.scratch
      // each phase's first loop: its trip count is the phase's PARTS (one point per invocation)
      p.trips = prepared.ast.src.map((b) => (b.op === 'END' ? b.src.slice(1).find((r) => r.arg[1] !== 'upcast') : null))
      this.lowered.set(ast, p)
    }
    return p
  }

  /** Compile the call sites of `names` not compiled yet: WGSL, then a compute pipeline per phase. */
  async compileAsync (names) {
    const pending = new Map()
    for (const n of names) {
      for (const c of this.prog.entries[n].calls) {
        if (!c.copy && !this.sites.has(this.siteKey(c))) pending.set(this.siteKey(c), c)
      }
    }
    let need = 0
    for (const c of pending.values()) {
      need = Math.max(need, this.callScratch(c))
    }
    this.reserveScratch(need)
    const jobs = []
    for (const [key, c] of pending) {
      const prog = this.lower(c.kernel)
      const layout = this.siteLayout(c, prog)
      const programs = prog.phases ? prog.phases.map((ph, i) => [ph, prog.trips[i]]) : [[prog, null]]
      const dispatches = programs.map(([ph, trip]) => {
        if (ph.vars.length > MAX_PARAMS) throw new KernelError(`kernel ${prog.name} takes ${ph.vars.length} Variables; the webgpu backend passes at most ${MAX_PARAMS}`)
        const shader = emitWGSL(ph, layout)
        return { shader, vars: ph.vars, trip: ph.vars[0] === PART ? trip : null, pipeline: null, checks: countChecks(ph) }
      })
      for (const d of dispatches) jobs.push(this.pipeline(d.shader.code, prog.name).then((p) => { d.pipeline = p }))
      this.sites.set(key, { name: prog.name, dispatches })
      this.stats.sites++
    }
    if (!this.copyPipeline) jobs.push(this.pipeline(COPY_WGSL, 'copy').then((p) => { this.copyPipeline = p }))
    try {
      await Promise.all(jobs)
    } catch (e) {
      for (const key of pending.keys()) this.sites.delete(key)
      throw e
    }
    for (const n of names) {
      this.entries[n] = this.prog.entries[n].calls.map((c) => {
        if (c.copy) {
          const [dst, src] = c.copy
          return { copy: true, dst: dst.base, src: src.base, n: Math.min(dst.size, src.size) * src.dtype.size }
        }
        return { copy: false, site: this.sites.get(this.siteKey(c)) }
      })
      this.plans.delete(n)
    }
  }

  async pipeline (code, name) {
    const module = this.device.createShaderModule({ code })
    try {
      return await this.device.createComputePipelineAsync({ layout: 'auto', compute: { module, entryPoint: 'main' } })
    } catch (e) {
      let detail = e.message
      if (module.getCompilationInfo) {
        const info = await module.getCompilationInfo()
        const errs = info.messages.filter((m) => m.type === 'error').map((m) => `line ${m.lineNum}: ${m.message}`)
        if (errs.length) detail = errs.slice(0, 3).join('; ')
      }
      throw new KernelError(`WebGPU could not compile kernel ${name}: ${detail}; load with { backend: 'wasm' } and please report it with the bundle`)
    }
  }

  /** Upload what the host wrote since the last call (growing the GPU buffer first when the plan grew). */
  flush () {
    const size = up(this.bytesUsed)
    if (!this.gpu || this.gpu.size < size) {
      const next = this.device.createBuffer({ size, usage: STORAGE | COPY_SRC | COPY_DST })
      if (this.gpu) {
        const enc = this.device.createCommandEncoder()
        enc.copyBufferToBuffer(this.gpu, 0, next, 0, this.gpu.size)
        this.device.queue.submit([enc.finish()])
        this.gpu.destroy()
      }
      this.gpu = next
      this.generation++
    }
    const u8 = this.bytes()
    for (const [lo, hi] of this.dirty) {
      const a = lo & ~3
      const b = Math.min(up(hi, 4), u8.length)
      if (b > a) this.device.queue.writeBuffer(this.gpu, a, u8, a, b - a)
    }
    this.dirty = []
  }

  /** The steps of entrypoint `name` with their bind groups (made again when the GPU buffer was replaced). */
  plan (name) {
    let p = this.plans.get(name)
    if (p && p.generation === this.generation) return p
    const steps = this.entries[name]
    if (!steps) throw new KernelError(`internal: entrypoint ${name} is not compiled`)
    if (p) p.params.destroy()
    const dispatches = []
    for (const st of steps) {
      if (st.copy) dispatches.push({ copy: st, pipeline: this.copyPipeline, shader: { params: true } })
      else for (const d of st.site.dispatches) dispatches.push(Object.assign({ name: st.site.name }, d))
    }
    const params = this.device.createBuffer({ size: Math.max(dispatches.length, 1) * PARAM_STRIDE, usage: STORAGE | COPY_DST })
    dispatches.forEach((d, i) => {
      const entries = [{ binding: 0, resource: { buffer: this.gpu } }]
      if (d.shader.params) entries.push({ binding: 1, resource: { buffer: params, offset: i * PARAM_STRIDE, size: PARAM_STRIDE } })
      d.group = this.device.createBindGroup({ layout: d.pipeline.getBindGroupLayout(0), entries })
    })
    const e = this.prog.entries[name]
    const uploads = [...Object.values(e.inputs), ...e.rng]
    const checks = dispatches.some((d) => d.checks)
    p = { generation: this.generation, dispatches, params, uploads, outputs: Object.values(e.outputs), checks }
    this.plans.set(name, p)
    return p
  }

  /** Run entrypoint `name` with Variable values `env` (a Map name -> int); its outputs are then in the mirror. */
  async runAsync (name, env) {
    const e = this.prog.entries[name]
    this.touched([...Object.values(e.inputs), ...e.rng])
    this.flush()
    const p = this.plan(name)
    const values = new Int32Array(p.dispatches.length * MAX_PARAMS)
    const counts = p.dispatches.map((d, i) => {
      const at = i * MAX_PARAMS
      if (d.copy) {
        const words = Math.ceil(d.copy.n / 4)
        values.set([d.copy.dst / 4, d.copy.src / 4, words], at)
        return words
      }
      let n = 1
      d.vars.forEach((v, j) => {
        if (v === PART) return
        if (v === PARTS) {
          n = Math.min(sizeValue(d.trip.src[0], env), 2 ** 31 - 1)
          values[at + j] = n
        } else {
          values[at + j] = env.get(v)
        }
      })
      return d.trip ? n : 1
    })
    const dev = this.device
    dev.queue.writeBuffer(p.params, 0, values)
    dev.pushErrorScope('validation')
    const enc = dev.createCommandEncoder()
    const pass = enc.beginComputePass()
    p.dispatches.forEach((d, i) => {
      const n = counts[i]
      if (n <= 0) return
      pass.setPipeline(d.pipeline)
      pass.setBindGroup(0, d.group)
      const groups = d.copy || d.trip ? Math.ceil(n / WORKGROUP) : 1
      const x = Math.min(groups, MAX_GROUPS)
      pass.dispatchWorkgroups(x, Math.ceil(groups / x))
    })
    pass.end()
    const ranges = p.outputs.map((s) => [s.base, s.size * s.dtype.size])
    if (p.checks) ranges.push([0, 4])
    await this.read(enc, ranges)
    const err = await dev.popErrorScope()
    if (err) throw new KernelError(`WebGPU rejected entrypoint ${name}: ${err.message}`)
    this.stats.kernels += p.dispatches.length
    if (p.checks && new Uint32Array(this.memory.buffer, 0, 1)[0]) {
      new Uint32Array(this.memory.buffer, 0, 1)[0] = 0
      this.dirty.push([0, 4])
      throw new KernelError(`a kernel of entrypoint ${name} accessed an element outside its buffers (the access was skipped); the bundle's kernel is malformed`)
    }
  }

  /** Copy byte ranges [[start, length]] of the GPU memory back into the mirror, after the commands of `enc`
   * (a command encoder, or null) run. */
  async read (enc, ranges) {
    const dev = this.device
    if (!enc) enc = dev.createCommandEncoder()
    ranges = ranges.filter(([, n]) => n > 0).map(([a, n]) => [a, up(n, 4)])
    const total = ranges.reduce((s, [, n]) => s + n, 0)
    const staging = total ? dev.createBuffer({ size: total, usage: MAP_READ | COPY_DST }) : null
    let at = 0
    for (const [a, n] of ranges) {
      enc.copyBufferToBuffer(this.gpu, a, staging, at, n)
      at += n
    }
    dev.queue.submit([enc.finish()])
    if (!staging) return dev.queue.onSubmittedWorkDone()
    try {
      await staging.mapAsync(READ)
      const got = new Uint8Array(staging.getMappedRange())
      const u8 = this.bytes()
      at = 0
      for (const [a, n] of ranges) {
        u8.set(got.subarray(at, at + Math.min(n, u8.length - a)), a)
        at += n
      }
      staging.unmap()
    } finally {
      staging.destroy()
    }
  }

  /** Bring slots back from the GPU into the mirror (parameters, state: before save or parameters()). */
  async readBack (slots) {
    this.flush()
    await this.read(null, slots.map((s) => [s.base, s.size * s.dtype.size]))
  }

  dispose () {
    for (const p of this.plans.values()) p.params.destroy()
    this.plans.clear()
    if (this.gpu) this.gpu.destroy()
    this.gpu = null
  }
}

module.exports = { GPUExecutor }
