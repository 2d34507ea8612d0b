'use strict'
/**
 * Optimizers built in JavaScript when the bundle lacks the requested one: SGD (momentum, nesterov,
 * weight decay), Adam and AdamW, as kernel IR that runs through the same lowering as the bundle's kernels
 * and is written into save()'s bundle as the `optimizer_step` / `train_step` entrypoints.
 *
 * Stage: training setup. Input: a Program with a `loss` entrypoint and an optimizer configuration.
 * Output: the Program with that optimizer's state buffers (role `optimizer`, laid out as polygrad's
 * nn/optim.py lays them out: lr, then beta powers and betas, then moment buffers: one per parameter
 * over 16384 elements, flat ones of up to 16 smaller parameters each), its update kernels and the two
 * entrypoints. The update formulas are polygrad's, op for op (m = b1*m + (1-b1)*g;
 * p = p - lr * (m/(1-b1^t)) / (sqrt(v/(1-b2^t)) + eps); ...), so a JS fine-tune follows a Python one step
 * for step. A bundle's own optimizer (when the configuration matches) is used as it is.
 */

const { ModelError } = require('./errors')
const { DTYPES } = require('./dtypes')

// defaults, value rules and the flat state layout: polygrad-core's polygrad/definitions/optimizer.py, as
// Python's nn/optim.py reads them (a parameter over SOLO_NUMEL elements keeps moment buffers of its own)
const { DEFAULTS, RULES, REQUIRES, FLOAT32_MAX, GROUP_SIZE, SOLO_NUMEL } = require('./generated/optimizer')

/** A number that stays finite as the float32 the update kernels compute with. */
const isReal = (v) => typeof v === 'number' && Number.isFinite(v) && Math.abs(v) <= FLOAT32_MAX

/** v is a real number inside a rule's bounds. */
function within (rule, v) {
  if (!isReal(v)) return false
  if (rule.low !== null && (rule.low_open ? v <= rule.low : v < rule.low)) return false
  return rule.high === null || (rule.high_open ? v < rule.high : v <= rule.high)
}

/**
 * What is wrong with hyperparameter `name` = v (null when nothing), by the rule table Python's
 * nn.optim.check_hyperparameters reads: rates, decays and momentum are numbers >= 0 finite as float32, eps
 * is > 0, betas lie in [0, 1) (a pair of them for `betas`), flags are booleans.
 */
function hyperProblem (name, v) {
  const rule = Object.prototype.hasOwnProperty.call(RULES, name) ? RULES[name] : null
  if (rule === null) return null
  let ok
  if (rule.kind === 'bool') ok = typeof v === 'boolean'
  else if (rule.kind === 'pair') ok = Array.isArray(v) && v.length === 2 && v.every((b) => within(rule, b))
  else ok = within(rule, v)
  return ok ? null : rule.want
}

function shown (v) {
  if (typeof v !== 'object') return String(v) // NaN, Infinity, 10n, 'fast', true
  try {
    return JSON.stringify(v)
  } catch {
    return String(v) // a cycle
  }
}

/** ModelError naming the first hyperparameter an optimizer cannot use (a NaN or negative rate would train to NaN). */
function checkHyperparameters (values) {
  for (const [k, v] of Object.entries(values)) {
    const want = hyperProblem(k, v)
    if (want) throw new ModelError(`optimizer hyperparameter ${k} must be ${want}, got ${shown(v).slice(0, 60)}`)
  }
  for (const [flag, number, message] of REQUIRES) if (values[flag] && !(values[number] > 0)) throw new ModelError(message)
}

/** The full configuration {name, lr, hyperparameters} of an optimizer request (Python's names). */
function optimizerConfigOf (name, lr, hyper) {
  const key = typeof name === 'string' ? name.toLowerCase() : name
  if (!Object.prototype.hasOwnProperty.call(DEFAULTS, key)) throw new ModelError(`optimizer must be one of ${JSON.stringify(Object.keys(DEFAULTS))}, got ${JSON.stringify(name)}`)
  const allowed = DEFAULTS[key]
  const bad = Object.keys(hyper).filter((k) => !(k in allowed) || k === 'lr').sort()
  if (bad.length) throw new ModelError(`optimizer '${key}' takes ${JSON.stringify(Object.keys(allowed).filter((k) => k !== 'lr'))}; unknown ${JSON.stringify(bad)}`)
  const cfg = { name: key }
  for (const [k, v] of Object.entries(allowed)) {
    const x = k === 'lr' ? (lr === undefined ? v : lr) : (k in hyper ? hyper[k] : v)
    cfg[k] = Array.isArray(x) ? x.slice() : x
  }
  checkHyperparameters(cfg)
  return cfg
}

function sameConfig (a, b) {
  const keys = new Set([...Object.keys(a), ...Object.keys(b)])
  keys.delete('lr')
  for (const k of keys) {
    const x = a[k]
    const y = b[k]
    if (Array.isArray(x) || Array.isArray(y)) {
      if (!Array.isArray(x) || !Array.isArray(y) || x.length !== y.length || x.some((v, i) => v !== y[i])) return false
    } else if (x !== y) {
      return false
    }
  }
  return true
}

/** Remove the current optimizer: its entrypoints, its state buffers and the kernels nothing calls. */
function dropOptimizer (prog) {
  delete prog.entries.optimizer_step
  delete prog.entries.train_step
  const used = new Set()
  for (const e of Object.values(prog.entries)) {
    for (const c of e.calls) for (const s of c.copy || c.args) used.add(s)
    for (const s of [...Object.values(e.inputs), ...Object.values(e.outputs), ...e.rng]) used.add(s)
  }
  prog.slots = prog.slots.filter((s) => s.role !== 'optimizer' || used.has(s))
  const usedKernels = [...new Set(Object.values(prog.entries).flatMap((e) => e.calls.filter((c) => !c.copy).map((c) => c.kernel)))].sort((a, b) => a - b)
  const renumber = new Map(usedKernels.map((k, i) => [k, i]))
  prog.kernels = usedKernels.map((k) => prog.kernels[k])
  for (const e of Object.values(prog.entries)) for (const c of e.calls) if (!c.copy) c.kernel = renumber.get(c.kernel)
  prog.kernelTable = null
  prog.optimizer = null
  prog.lrSlot = null
  prog.gradScaleSlot = null
  prog.optimizerState = null
}

class KernelBuilder {
  constructor (g, name) {
    this.g = g
    this.name = name
    this.params = []
  }

  param (slot) {
    let i = this.params.indexOf(slot)
    if (i < 0) {
      i = this.params.length
      this.params.push(slot)
    }
    return this.g.node('DEFINE_GLOBAL', slot.dtype, [], [i, [slot.size]])
  }

  index (slot, idx) {
    return this.g.node('INDEX', slot.dtype, [this.param(slot), idx])
  }

  load (slot, idx) {
    const ix = this.index(slot, idx)
    return this.g.node('LOAD', slot.dtype, [ix])
  }

  /** the kernel `slot[off + i] = value(i)` for i < n, and its argument list */
  elementwise (slot, n, off, value) {
    const g = this.g
    const i = g.node('RANGE', DTYPES.int32, [g.const(DTYPES.int32, n)], [0, 'global'])
    const at = off ? g.alu('ADD', i, g.const(DTYPES.int32, off)) : i
    const v = value(i, at)
    const st = g.node('STORE', null, [this.index(slot, at), v])
    const end = g.node('END', null, [st, i])
    const sink = g.node('SINK', null, [end], { name: `${this.name}_${n}`, opts: ['tuple', []] })
    return { ast: sink, args: this.params.slice() }
  }
}

/** Add optimizer `cfg` to the program (after removing any current one). */
function buildOptimizer (prog, cfg) {
  if (!prog.entries.loss) throw new ModelError('this model has no training entrypoint')
  if (cfg.name === 'lamb') throw new ModelError("the 'lamb' update runs only from a bundle that holds it; use 'sgd', 'adam' or 'adamw'")
  dropOptimizer(prog)
  const g = prog.graph
  const f32 = DTYPES.float32
  const params = prog.slots.filter((s) => s.role === 'parameter')
  const newSlots = []
  const slot = (size, init) => {
    const s = { name: `optimizer.${newSlots.length}`, role: 'optimizer', dtype: f32, shape: [size], size, stored: null, init: Float32Array.from(init.length === size ? init : new Array(size).fill(init[0] || 0)) }
    newSlots.push(s)
    return s
  }
  const lr = slot(1, [cfg.lr])
  // nn/optim.py's _flat_groups: per dtype, a parameter over SOLO_NUMEL elements alone, the others in flat
  // groups of up to 16, ordered by their first parameter
  const byDtype = new Map()
  for (const p of params) {
    if (!byDtype.has(p.dtype)) byDtype.set(p.dtype, [])
    byDtype.get(p.dtype).push(p)
  }
  const groups = []
  const position = new Map(params.map((p, i) => [p, i]))
  for (const list of byDtype.values()) {
    const small = list.filter((p) => p.size <= SOLO_NUMEL)
    const kind = list.filter((p) => p.size > SOLO_NUMEL).map((p) => [p])
    for (let k = 0; k < small.length; k += GROUP_SIZE) kind.push(small.slice(k, k + GROUP_SIZE))
    kind.sort((a, b) => position.get(a[0]) - position.get(b[0]))
    groups.push(...kind)
  }
  const groupSize = (grp) => grp.reduce((a, p) => a + p.size, 0)
  const calls = []
  const kernel = (built) => {
    prog.kernels.push(built.ast)
    calls.push({ kernel: prog.kernels.length - 1, args: built.args })
  }
  const C = (v) => g.const(f32, v)
  const mul = (a, b) => g.alu('MUL', a, b)
  const add = (a, b) => g.alu('ADD', a, b)
  const neg = (a) => g.alu('NEG', a)
  const unsupported = params.find((p) => p.dtype !== f32)
  if (unsupported) throw new ModelError(`the JavaScript optimizers update float32 parameters; '${unsupported.name}' is ${unsupported.dtype.name}`)
  // every parameter with a gradient: fn(parameter, gradient, group index, offset in the group's flat state)
  const eachParam = (fn) => groups.forEach((grp, gi) => {
    let off = 0
    for (const p of grp) {
      const grad = prog.gradients.get(p)
      if (grad) fn(p, grad, gi, off)
      off += p.size
    }
  })

  if (cfg.name === 'sgd') {
    const bufs = cfg.momentum ? groups.map((grp) => slot(groupSize(grp), [0])) : []
    eachParam((p, grad, gi, o) => {
      const n = p.size
      const decayed = (kb, i) => {
        const gv = kb.load(grad, i)
        return cfg.weight_decay ? add(gv, mul(C(cfg.weight_decay), kb.load(p, i))) : gv
      }
      if (cfg.momentum) {
        const b = bufs[gi]
        const kb = new KernelBuilder(g, 'sgd_momentum')
        kernel(kb.elementwise(b, n, o, (i, at) => add(mul(C(cfg.momentum), kb.load(b, at)), decayed(kb, i))))
      }
      const kb = new KernelBuilder(g, 'sgd')
      kernel(kb.elementwise(p, n, 0, (i) => {
        let step = decayed(kb, i)
        if (cfg.momentum) {
          const bv = kb.load(bufs[gi], o ? add(i, g.const(DTYPES.int32, o)) : i)
          step = cfg.nesterov ? add(step, mul(C(cfg.momentum), bv)) : bv
        }
        return add(kb.load(p, i), neg(mul(kb.load(lr, g.const(DTYPES.int32, 0)), step)))
      }))
    })
  } else {
    const [b1, b2] = cfg.betas
    const betaT = slot(2, [1, 1])
    const betas = slot(2, [b1, b2])
    const ms = groups.map((grp) => slot(groupSize(grp), [0]))
    const vs = groups.map((grp) => slot(groupSize(grp), [0]))
    const kb0 = new KernelBuilder(g, 'adam_beta')
    kernel(kb0.elementwise(betaT, 2, 0, (i) => mul(kb0.load(betaT, i), kb0.load(betas, i))))
    const l2 = cfg.name === 'adam' ? cfg.weight_decay : 0
    const wd = cfg.name === 'adamw' ? cfg.weight_decay : 0
    eachParam((p, grad, gi, o) => {
      const n = p.size
      const gradOf = (kb, i) => {
        const gv = kb.load(grad, i)
        return l2 ? add(gv, mul(C(l2), kb.load(p, i))) : gv
      }
      const km = new KernelBuilder(g, 'adam_m')
      kernel(km.elementwise(ms[gi], n, o, (i, at) => add(mul(C(b1), km.load(ms[gi], at)), mul(C(1.0 - b1), gradOf(km, i)))))
      const kv = new KernelBuilder(g, 'adam_v')
      kernel(kv.elementwise(vs[gi], n, o, (i, at) => {
        const gv = gradOf(kv, i)
        return add(mul(C(b2), kv.load(vs[gi], at)), mul(C(1.0 - b2), mul(gv, gv)))
      }))
      const kp = new KernelBuilder(g, 'adam_p')
      kernel(kp.elementwise(p, n, 0, (i) => {
        const at = o ? add(i, g.const(DTYPES.int32, o)) : i
        const zero = g.const(DTYPES.int32, 0)
        const one = g.const(DTYPES.int32, 1)
        const mhat = g.alu('FDIV', kp.load(ms[gi], at), add(C(1.0), neg(kp.load(betaT, zero))))
        const vhat = g.alu('FDIV', kp.load(vs[gi], at), add(C(1.0), neg(kp.load(betaT, one))))
        let up = g.alu('FDIV', mhat, add(g.node('SQRT', f32, [vhat]), C(cfg.eps)))
        if (wd) up = add(up, mul(C(wd), kp.load(p, i)))
        return add(kp.load(p, i), neg(mul(kp.load(lr, zero), up)))
      }))
    })
  }
  prog.slots.push(...newSlots)
  const loss = prog.entries.loss
  prog.entries.optimizer_step = { inputs: {}, outputs: {}, calls, rng: [] }
  prog.entries.train_step = { inputs: Object.assign({}, loss.inputs), outputs: Object.assign({}, loss.outputs), calls: [...loss.calls, ...calls], rng: loss.rng.slice() }
  prog.optimizer = cfg
  prog.lrSlot = lr
  prog.gradScaleSlot = null // the update reads plain gradients (Python's distributed fit adds a multiplier)
  prog.optimizerState = 'kept'
  prog.kernelTable = null
  return newSlots
}

module.exports = { buildOptimizer, checkHyperparameters, optimizerConfigOf, sameConfig, dropOptimizer, DEFAULTS }
