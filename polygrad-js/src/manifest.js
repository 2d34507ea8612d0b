'use strict'
/**
 * The bundle manifest (docs/bundle-format.md section 2) read into a Program, every field checked, and a
 * Program written back. A port of polygrad's model/format.py.
 *
 * Stage: import / export. readProgram(manifest, body, opts) -> Program, or BundleError naming the field;
 * nothing is allocated before the whole manifest passed (sizes are checked against `maxBytes`).
 * writeManifest(program, blobs) builds the manifest of save() (bundle.js lays out the bytes).
 *
 * A Program refers to buffers by Slot objects (not numbers), so adding or dropping an optimizer renumbers
 * nothing: a slot's index is its position in `program.slots` when written.
 */

const { BundleError, KernelError, ModelError } = require('./errors')
const { show } = require('./json')
const { DTYPES } = require('./dtypes')
const ir = require('./ir')
const bundle = require('./bundle')
const { checkKernel, checkSizeExpr, kernelWork, isPlainName, NAME_RULE } = require('./validate')
const { MAX_ELEMENTS, MAX_SLOTS, MAX_CALLS, MAX_NAME, MAX_DIMS, MAX_SPECS, defaultMaxBytes, defaultMaxWork } = require('./limits')
const { checkHyperparameters } = require('./optim')
const BUNDLE = require('./generated/bundle')
const { HYPER_KINDS } = require('./generated/optimizer')

// roles, entrypoints and optimizer kinds: polygrad-core's polygrad/definitions/ (as Python's modelformat.py)
const ROLES = BUNDLE.ROLES
const STORED = new Set(BUNDLE.STORED)
const IDENT = /^[A-Za-z_][A-Za-z0-9_]*$/
const TRAINING_OR_FORWARD = new Set(BUNDLE.SIGNATURE_ENTRYPOINTS)
const OPTIMIZER_HYPER = HYPER_KINDS
const JSON_KIND = { number: 'number', bool: 'boolean', pair: 'pair' } // a hyperparameter kind -> its typeof test

function need (cond, msg) {
  if (!cond) throw new BundleError(`bundle manifest: ${msg}`)
}

const isObj = (v) => v !== null && typeof v === 'object' && !Array.isArray(v)
const isInt = (v) => Number.isInteger(v)

function get (obj, key, kind, where) {
  need(isObj(obj), `${where} must be an object`)
  need(Object.prototype.hasOwnProperty.call(obj, key), `${where} lacks '${key}'`)
  const v = obj[key]
  const ok = kind === 'list' ? Array.isArray(v) : kind === 'object' ? isObj(v) : kind === 'int' ? isInt(v) : typeof v === kind
  need(ok, `${where}.${key} must be ${{ list: 'a list', object: 'an object', int: 'an integer', string: 'a string' }[kind] || kind}, got ${Array.isArray(v) ? 'list' : v === null ? 'null' : typeof v}`)
  return v
}

function getInt (obj, key, where, lo = 0, hi = MAX_ELEMENTS) {
  const v = get(obj, key, 'int', where)
  need(v >= lo && v <= hi, `${where}.${key} = ${v} is outside [${lo}, ${hi}]`)
  return v
}

function name (v, where) {
  need(typeof v === 'string' && v.length > 0 && v.length <= MAX_NAME, `${where} must be a non-empty string of at most ${MAX_NAME} characters`)
  return v
}

function dtype (v, where) {
  need(typeof v === 'string' && Object.prototype.hasOwnProperty.call(DTYPES, v), `${where} = ${show(v)} is not a known dtype (${Object.keys(DTYPES).join(', ')})`)
  return DTYPES[v]
}

function shape (v, where, variables, version) {
  need(Array.isArray(v) && v.length <= MAX_DIMS, `${where} must be a list of at most ${MAX_DIMS} dimensions`)
  return v.map((d, k) => {
    if (typeof d === 'string') {
      need(variables.has(d), `${where}[${k}] = ${show(d)} is not a declared Variable`)
      need(k === 0 || version >= 2, `${where}[${k}] = ${show(d)}: in a version-1 bundle only the leading dimension may name a Variable`)
      return d
    }
    need(isInt(d) && d >= 0 && d <= MAX_ELEMENTS, `${where}[${k}] must be an integer in [0, ${MAX_ELEMENTS}]`)
    return d
  })
}

function elements (sh, variables) {
  let n = 1
  for (const d of sh) {
    n *= typeof d === 'string' ? variables.get(d)[1] : d
    if (n > MAX_ELEMENTS) return n
  }
  return n
}

function specs (sig, key, variables, version) {
  const rows = get(sig, key, 'list', 'signature')
  need(rows.length <= MAX_SPECS, `signature.${key} has too many entries`)
  const seen = new Set()
  return rows.map((r, i) => {
    const where = `signature.${key}[${i}]`
    const n = name(get(r, 'name', 'string', where), `${where}.name`)
    need(IDENT.test(n) && !seen.has(n), `${where}.name ${show(n)} must be a distinct identifier`)
    seen.add(n)
    return { name: n, dtype: dtype(get(r, 'dtype', 'string', where), `${where}.dtype`), shape: shape(get(r, 'shape', 'list', where), `${where}.shape`, variables, version) }
  })
}

// a JSON number (an integer past 2**53 is read as a BigInt: still a number, as in Python)
const isNumber = (v) => typeof v === 'number' || typeof v === 'bigint'
const asNumber = (v) => (Array.isArray(v) ? v.map(asNumber) : typeof v === 'bigint' ? Number(v) : v)

/** The optimizer configuration of a manifest (name, lr, hyperparameters by their Python names). */
function optimizerConfig (opt, where = 'training.optimizer') {
  need(isObj(opt) && typeof opt.name === 'string', `${where} must be an object with a name`)
  const known = OPTIMIZER_HYPER[opt.name]
  need(known !== undefined, `${where}.name ${show(opt.name)} is not one of ${Object.keys(OPTIMIZER_HYPER).join(', ')}`)
  need(isNumber(opt.lr), `${where}.lr must be a number`)
  const out = {}
  for (const [k, v] of Object.entries(opt)) {
    out[k] = asNumber(v)
    if (k === 'name' || k === 'lr') continue
    const kind = JSON_KIND[known[k]]
    need(kind !== undefined, `${where}: optimizer ${opt.name} has no hyperparameter ${show(k)}`)
    const ok = kind === 'pair' ? Array.isArray(v) && v.length === 2 && v.every(isNumber) : kind === 'number' ? isNumber(v) : typeof v === kind
    need(ok, `${where}.${k} must be ${kind === 'pair' ? 'a pair of numbers' : 'a ' + kind}`)
  }
  try { // the values Model.fit would refuse (optim.js, as Python's model/format.py through nn/optim.py)
    checkHyperparameters(out)
  } catch (e) {
    if (e instanceof ModelError) throw new BundleError(`bundle manifest: ${where}: ${e.message}`)
    throw e
  }
  return out
}

/** A load option that caps what a bundle may ask for: a non-negative number, or undefined for the default. */
function cap (opts, key, fallback) {
  const v = opts[key]
  if (v === undefined || v === null) return fallback
  if (typeof v !== 'number' || !(v >= 0)) throw new ModelError(`the ${key} load option takes a non-negative number, got ${show(v)}`)
  return v
}

/**
 * The Program of a manifest read by bundle.read. opts.maxBytes bounds the memory all buffers need, opts.maxWork
 * the node evaluations of one entrypoint call; by default those of limits.js for a file of opts.fileBytes bytes.
 * `body` is the data section's bytes (a stored slot's `stored` views them), or `{ length }` when they are read
 * later, straight into the slots' memory (bundlefile.js: `stored` is null, `dataOffset` says where).
 */
function readProgram (manifest, body, opts = {}) {
  const fileBytes = opts.fileBytes === undefined ? bundle.HEADER + body.length : opts.fileBytes
  const maxBytes = cap(opts, 'maxBytes', defaultMaxBytes(fileBytes))
  const maxWork = BigInt(Math.floor(cap(opts, 'maxWork', defaultMaxWork(fileBytes))))
  const version = manifest.version
  const variables = new Map()
  get(manifest, 'variables', 'list', 'manifest').forEach((v, i) => {
    const where = `variables[${i}]`
    const n = name(get(v, 'name', 'string', where), `${where}.name`)
    const lo = getInt(v, 'min', where)
    const hi = getInt(v, 'max', where)
    need(isPlainName(n), `${where}: Variable name ${show(n)} must be ${NAME_RULE}`)
    need(lo <= hi, `${where}: Variable ${show(n)} needs min <= max`)
    need(!variables.has(n), `${where}: Variable ${show(n)} declared twice`)
    variables.set(n, [lo, hi])
  })
  const sig = get(manifest, 'signature', 'object', 'manifest')
  const inputs = specs(sig, 'inputs', variables, version)
  const targets = specs(sig, 'targets', variables, version)
  const outputs = specs(sig, 'outputs', variables, version)

  const rows = get(manifest, 'buffers', 'list', 'manifest')
  need(rows.length <= MAX_SLOTS, `${rows.length} buffers exceed the limit of ${MAX_SLOTS}`)
  let total = 0
  const slots = rows.map((r, s) => {
    const where = `buffers[${s}]`
    const role = get(r, 'role', 'string', where)
    need(ROLES.includes(role), `${where}.role ${show(role)} is not one of ${ROLES.join(', ')}`)
    const since = BUNDLE.ROLES_SINCE[role] || 1
    need(version >= since, `${where}.role '${role}' needs bundle version ${since}`)
    const dt = dtype(get(r, 'dtype', 'string', where), `${where}.dtype`)
    const sh = shape(get(r, 'shape', 'list', where), `${where}.shape`, variables, version)
    const size = getInt(r, 'size', where)
    need(elements(sh, variables) === size, `${where}: size ${size} does not match shape ${show(sh)}`)
    total += size * dt.size
    need(total <= maxBytes, `the buffers need more than ${maxBytes} bytes, the limit for this file; if you trust it, load it with Model.load(path, { maxBytes: N })`)
    const data = r.data
    let stored = null
    let dataOffset = null
    if (STORED.has(role)) {
      need(isObj(data), `${where} (${role}) must have stored data`)
      const off = getInt(data, 'offset', `${where}.data`, 0, body.length)
      const nbytes = getInt(data, 'nbytes', `${where}.data`, 0, body.length)
      need(nbytes === size * dt.size, `${where}.data.nbytes ${nbytes} != size ${size} x ${dt.size} bytes`)
      need(off % bundle.ALIGN === 0 && off + nbytes <= body.length, `${where}.data [${off}, ${off + nbytes}) is misaligned or outside the ${body.length}-byte data section`)
      dataOffset = off
      stored = body instanceof Uint8Array ? body.subarray(off, off + nbytes) : null
    } else {
      need(data === undefined || data === null, `${where} (${role}) must not store data`)
    }
    return { index: s, name: name(get(r, 'name', 'string', where), `${where}.name`), role, dtype: dt, shape: sh, size, stored, dataOffset }
  })

  const kernelTable = get(manifest, 'kernels', 'object', 'manifest')
  const graph = new ir.Graph()
  let kernels
  try {
    kernels = ir.decode(kernelTable, graph)
  } catch (e) {
    if (e instanceof KernelError) throw new BundleError(`bundle manifest: kernels: ${e.message}`)
    throw e
  }
  kernels.forEach((k, i) => need(k.op === 'SINK', `kernels root ${i} is a ${k.op}, expected SINK`))
  const globalsOf = kernels.map((k, i) => kernelGlobals(i, k, variables))

  const slotNo = (v, where, roles) => {
    need(slots.length > 0, `${where}: there are no buffers`)
    need(isInt(v) && v >= 0 && v < slots.length, `${where} must be a buffer index in [0, ${slots.length - 1}]`)
    if (roles) need(roles.includes(slots[v].role), `${where}: buffer ${v} is a ${slots[v].role}, expected ${roles.join('/')}`)
    return slots[v]
  }

  const entries = {}
  const workOf = new Map()
  const eps = get(manifest, 'entrypoints', 'object', 'manifest')
  for (const required of BUNDLE.REQUIRED_ENTRYPOINTS) need(Object.prototype.hasOwnProperty.call(eps, required), `entrypoints lack '${required}'`)
  let nCalls = 0
  for (const [ename, e] of Object.entries(eps)) {
    const where = `entrypoints.${name(ename, 'entrypoint name')}`
    const ins = {}
    for (const [k, v] of Object.entries(get(e, 'inputs', 'object', where))) ins[name(k, `${where}.inputs key`)] = slotNo(v, `${where}.inputs.${k}`, ['input'])
    const outs = {}
    for (const [k, v] of Object.entries(get(e, 'outputs', 'object', where))) outs[name(k, `${where}.outputs key`)] = slotNo(v, `${where}.outputs.${k}`, ['output'])
    const rng = get(e, 'rng', 'list', where).map((v, i) => slotNo(v, `${where}.rng[${i}]`, ['rng']))
    for (const s of rng) need(s.size === 2 && s.dtype === DTYPES.uint32, `${where}: rng buffer ${s.index} must be 2 x uint32`)
    const raw = get(e, 'calls', 'list', where)
    nCalls += raw.length
    need(nCalls <= MAX_CALLS, `more than ${MAX_CALLS} calls`)
    const calls = raw.map((c, i) => {
      const cw = `${where}.calls[${i}]`
      need(isObj(c), `${cw} must be an object`)
      if (Object.prototype.hasOwnProperty.call(c, 'copy')) {
        const pair = get(c, 'copy', 'list', cw)
        need(pair.length === 2, `${cw}.copy must be [destination, source]`)
        const [dst, src] = pair.map((v) => slotNo(v, `${cw}.copy`))
        need(dst.dtype === src.dtype, `${cw}: copy between ${src.dtype.name} and ${dst.dtype.name}`)
        checkDistinct(cw, [dst, src])
        return { copy: [dst, src] }
      }
      const k = getInt(c, 'kernel', cw, 0, Math.max(kernels.length - 1, 0))
      need(k < kernels.length, `${cw}.kernel ${k}: there are ${kernels.length} kernels`)
      const args = get(c, 'args', 'list', cw).map((v, j) => slotNo(v, `${cw}.args[${j}]`))
      checkDistinct(cw, args)
      checkCall(cw, k, globalsOf[k], args)
      return { kernel: k, args }
    })
    checkWork(where, calls, kernels, workOf, maxWork)
    const args = []
    if (Object.prototype.hasOwnProperty.call(e, 'arguments')) {
      need(version >= 2, `${where}.arguments needs bundle version 2`)
      get(e, 'arguments', 'list', where).forEach((v, i) => {
        need(typeof v === 'string' && variables.has(v) && !args.includes(v) && !Object.prototype.hasOwnProperty.call(ins, v),
          `${where}.arguments[${i}] must name a declared Variable once, distinct from the inputs`)
        args.push(v)
      })
    }
    entries[ename] = { inputs: ins, outputs: outs, calls, rng, args }
  }
  const fwd = entries.forward
  const sameSet = (a, b) => a.length === b.length && a.every((x) => b.includes(x))
  need(sameSet(Object.keys(fwd.inputs), inputs.map((s) => s.name)), 'entrypoints.forward.inputs do not match signature.inputs')
  need(sameSet(Object.keys(fwd.outputs), outputs.map((s) => s.name)), 'entrypoints.forward.outputs do not match signature.outputs')
  const sameShape = (a, b) => a.length === b.length && a.every((x, i) => x === b[i])
  for (const spec of [...inputs, ...targets]) {
    for (const [ename, e] of Object.entries(entries)) {
      const s = TRAINING_OR_FORWARD.has(ename) ? e.inputs[spec.name] : undefined // others: their buffers describe them
      if (s) need(s.dtype === spec.dtype && sameShape(s.shape, spec.shape), `entrypoints.${ename}.inputs.${spec.name}: buffer does not match the signature`)
    }
  }
  for (const spec of outputs) {
    const s = fwd.outputs[spec.name]
    need(s.dtype === spec.dtype && sameShape(s.shape, spec.shape), `output ${show(spec.name)}: buffer does not match`)
  }

  checkDataflow(kernels, entries)

  const tr = get(manifest, 'training', 'object', 'manifest')
  const gradients = new Map()
  get(tr, 'gradients', 'list', 'training').forEach((pair, i) => {
    need(Array.isArray(pair) && pair.length === 2, `training.gradients[${i}] must be [parameter, gradient]`)
    const a = slotNo(pair[0], `training.gradients[${i}]`, ['parameter'])
    const b = slotNo(pair[1], `training.gradients[${i}]`, ['gradient'])
    need(sameShape(a.shape, b.shape), `training.gradients[${i}]: shapes differ`)
    gradients.set(a, b)
  })
  let optimizer = tr.optimizer === undefined ? null : tr.optimizer
  let lrSlot = null
  let gradScaleSlot = null // the update's gradient multiplier (Python's distributed fit); 1.0 in a bundle
  let optimizerState = null
  if (optimizer !== null) {
    optimizer = optimizerConfig(optimizer)
    need(BUNDLE.OPTIMIZER_ENTRYPOINTS.every((k) => entries[k]), 'an optimizer without train_step/optimizer_step')
    lrSlot = slotNo(tr.lr_buffer, 'training.lr_buffer', ['optimizer'])
    need(lrSlot.size === 1 && lrSlot.dtype === DTYPES.float32, 'training.lr_buffer must be a one-element float32 buffer')
    if (tr.grad_scale_buffer !== undefined && tr.grad_scale_buffer !== null) {
      gradScaleSlot = slotNo(tr.grad_scale_buffer, 'training.grad_scale_buffer', ['optimizer'])
      need(gradScaleSlot.size === 1 && gradScaleSlot.dtype === DTYPES.float32 && gradScaleSlot !== lrSlot,
        'training.grad_scale_buffer must be a one-element float32 optimizer buffer other than lr_buffer')
    }
    optimizerState = tr.optimizer_state
    need(BUNDLE.OPTIMIZER_STATES.includes(optimizerState), "training.optimizer_state must be 'kept' or 'initial'")
  } else {
    need(!BUNDLE.OPTIMIZER_ENTRYPOINTS.some((k) => entries[k]), 'train_step without an optimizer')
    need(tr.grad_scale_buffer === undefined || tr.grad_scale_buffer === null,
      'training.grad_scale_buffer without an optimizer')
  }
  const rngObj = get(manifest, 'rng', 'object', 'manifest')
  const rng = [getInt(rngObj, 'seed', 'rng', 0, 0xffffffff), getInt(rngObj, 'counter', 'rng', 0, 0xffffffff)]
  const prog = {
    slots, graph, kernels, kernelTable, entries, inputs, targets, outputs, variables, rng, gradients, optimizer,
    lrSlot, gradScaleSlot, optimizerState, producer: typeof manifest.producer === 'string' ? manifest.producer : '',
    validated: new Set()
  }
  // the index analysis of every kernel before anything runs, as Python does, so both accept and reject the
  // same files; with opts.validate === 'forward', only the kernels `forward` calls, the others' when their
  // entrypoint is first compiled (validateKernel, before lowering)
  const first = opts.validate === 'forward' ? [...new Set(entries.forward.calls.filter((c) => !c.copy).map((c) => c.kernel))] : kernels.map((_, i) => i)
  for (const k of first) validateKernel(prog, k)
  return prog
}

/** One call of the entrypoint evaluates at most maxWork kernel nodes, its Variables at their maxima (a copy
 * counts its elements): Python's model/format.py _check_work. */
function checkWork (where, calls, kernels, workOf, maxWork) {
  let work = 0n
  for (const c of calls) {
    if (c.copy) {
      work += BigInt(c.copy[1].size)
      continue
    }
    if (!workOf.has(c.kernel)) {
      try {
        workOf.set(c.kernel, kernelWork(kernels[c.kernel], `kernel ${c.kernel}`))
      } catch (e) {
        if (e instanceof KernelError) throw new BundleError(`bundle manifest: ${e.message}`)
        throw e
      }
    }
    work += workOf.get(c.kernel)
  }
  need(work <= maxWork, `${where} evaluates up to ${work} kernel nodes per call (its Variables at their maxima); the limit for this file is ${maxWork}. If you trust it, load it with Model.load(path, { maxWork: N })`)
}

/** Check kernel k of a Program once (validate.checkKernel); a failure is a BundleError. */
function validateKernel (prog, k) {
  const ast = prog.kernels[k]
  if (prog.validated.has(ast)) return
  try {
    checkKernel(ast, `kernel ${k}`)
  } catch (e) {
    if (e instanceof KernelError) throw new BundleError(`bundle manifest: ${e.message}`)
    throw e
  }
  prog.validated.add(ast)
}

function kernelGlobals (k, ast, variables) {
  const out = new Map()
  for (const n of ir.toposort(ast)) {
    if (n.op === 'DEFINE_GLOBAL') {
      need(n.dtype !== null && Array.isArray(n.arg) && n.arg.length === 2 && Number.isInteger(n.arg[0]) && Array.isArray(n.arg[1]), `kernel ${k}: malformed DEFINE_GLOBAL ${n}`)
      for (const d of n.arg[1]) {
        if (!(d instanceof ir.UOp)) continue
        try {
          checkSizeExpr(`kernel ${k}`, d, `buffer ${n.arg[0]}'s shape`, new Map())
        } catch (e) {
          if (e instanceof KernelError) throw new BundleError(`bundle manifest: ${e.message}`)
          throw e
        }
      }
      const prev = out.get(n.arg[0])
      if (prev === undefined) out.set(n.arg[0], n)
      else need(prev.dtype === n.dtype && prev.arg[1].length === n.arg[1].length && prev.arg[1].every((d, i) => d === n.arg[1][i]), `kernel ${k}: parameter ${n.arg[0]} declared twice differently`)
    } else if (n.op === 'DEFINE_VAR') {
      const decl = variables.get(n.arg[0])
      need(decl && BigInt(decl[0]) === BigInt(n.arg[1]) && BigInt(decl[1]) === BigInt(n.arg[2]), `kernel ${k}: Variable ${show(n.arg)} is not declared in the manifest's variables`)
    } else if (n.op === 'BIND') {
      need(false, `kernel ${k}: a kernel cannot hold a bound value (BIND)`)
    }
  }
  return out
}

/** The largest value of a size expression (ints, DEFINE_VARs at their max, ADD/MUL/...). */
function sizeMax (d) {
  if (!(d instanceof ir.UOp)) return Number(d)
  const { bounds } = require('./simplify')
  return bounds(d)[1]
}

function checkCall (where, k, globals, args) {
  const slotsOk = [...globals.keys()].sort((a, b) => a - b)
  need(slotsOk.length === args.length && slotsOk.every((s, i) => s === i), `${where}: kernel ${k} takes ${globals.size} buffers, the call passes ${args.length}`)
  args.forEach((s, i) => {
    const g = globals.get(i)
    need(g.dtype === s.dtype, `${where}: kernel ${k} parameter ${i} is ${g.dtype.name}, buffer ${s.index} is ${s.dtype.name}`)
    let n = 1
    for (const d of g.arg[1]) n *= sizeMax(d)
    need(n >= 0 && n <= s.size, `${where}: kernel ${k} parameter ${i} spans ${n} elements, buffer ${s.index} holds ${s.size}`)
  })
}

/** One buffer is never two parameters of a call (through two pointers the order of reads and writes is not
 * defined, so backends would disagree); as model/format.py _check_distinct. */
function checkDistinct (where, args) {
  args.forEach((s, j) => {
    const i = args.indexOf(s)
    need(i === j, `${where}: buffer ${s.index} is passed as parameters ${i} and ${j}; the buffers of one call must be distinct (a kernel reads and writes one buffer through one parameter)`)
  })
}

/** The DEFINE_GLOBAL position an INDEX addresses, or null for a malformed node. */
function paramOf (index) {
  const g = index && index.op === 'INDEX' ? index.src[0] : null
  return g && g.op === 'DEFINE_GLOBAL' && Array.isArray(g.arg) && Number.isInteger(g.arg[0]) ? g.arg[0] : null
}

/** {reads: parameter -> first block that reads it (a LOAD or an accumulating STORE), writes: parameter -> first
 * block that STOREs to it}, blocks numbered in the SINK's order (polygrad/uop/dataflow.py kernel_access). */
function kernelAccess (ast) {
  const first = new Map() // node -> the first block it belongs to
  ast.src.forEach((block, b) => {
    const stack = [block]
    while (stack.length) {
      const n = stack.pop()
      if (first.has(n)) continue
      first.set(n, b)
      for (const s of n.src) stack.push(s)
    }
  })
  const reads = new Map()
  for (const [n, b] of first) {
    if (n.op !== 'LOAD' && !(n.op === 'STORE' && n.arg !== null)) continue
    const p = paramOf(n.src[0])
    if (p !== null && !(reads.get(p) <= b)) reads.set(p, b)
  }
  const writes = new Map()
  ast.src.forEach((block, b) => {
    let store = block
    while (store.op === 'END' && store.src.length) store = store.src[0]
    const p = store.op === 'STORE' ? paramOf(store.src[0]) : null
    if (p !== null && !writes.has(p)) writes.set(p, b)
  })
  return { reads, writes }
}

const TRACKED = new Set(BUNDLE.TRACKED) // roles that hold nothing until a call of the entrypoint writes them

/**
 * Every temporary or output an entrypoint reads, and every output it returns, is written by an earlier call of
 * that entrypoint, and no call writes an input (docs/bundle-format.md section 4.1; model/format.py _check_dataflow).
 * Within a call, blocks run in order, each block's reads before its write.
 */
function checkDataflow (kernels, entries) {
  const access = new Map()
  for (const [ename, e] of Object.entries(entries)) {
    const written = new Set()
    const tracked = (s) => s !== undefined && TRACKED.has(s.role) && !written.has(s)
    const unwritten = (i, what, s) => `entrypoints.${ename}.calls[${i}]: ${what} reads buffer ${s.index} (${s.role} ${show(s.name)}) before any earlier call of ${show(ename)} writes it; a bundle reads only what it stores, is given or wrote itself`
    const write = (i, what, s) => {
      need(s.role !== 'input', `entrypoints.${ename}.calls[${i}]: ${what} writes buffer ${s.index} (input ${show(s.name)}); a bundle never writes its inputs (they may be the caller's own tensors)`)
      written.add(s)
    }
    e.calls.forEach((c, i) => {
      if (c.copy) {
        const [dst, src] = c.copy
        need(!tracked(src), unwritten(i, 'the copy', src))
        write(i, 'the copy', dst)
        return
      }
      if (!access.has(c.kernel)) access.set(c.kernel, kernelAccess(kernels[c.kernel]))
      const { reads, writes } = access.get(c.kernel)
      for (const [p, b] of reads) need(!tracked(c.args[p]) || writes.get(p) < b, unwritten(i, `kernel ${c.kernel} (parameter ${p})`, c.args[p]))
      for (const p of writes.keys()) if (c.args[p]) write(i, `kernel ${c.kernel} (parameter ${p})`, c.args[p])
    })
    for (const [k, s] of Object.entries(e.outputs)) need(written.has(s), `entrypoints.${ename}.outputs.${k}: buffer ${s.index} (${show(s.name)}) is never written by the calls of ${show(ename)}`)
  }
}

// ---------------------------------------------------------------------------------------------------
// writing

/** The oldest bundle version that holds a Program (docs/bundle-format.md section 5): 2 when it has a cache
 * buffer, a Variable outside a leading dimension or a Variable argument, else 1 (as Python writes). */
function formatVersion (prog) {
  const inner = prog.slots.some((s) => s.shape.slice(1).some((d) => typeof d === 'string'))
  if (inner || prog.slots.some((s) => s.role === 'cache') || Object.values(prog.entries).some((e) => e.args && e.args.length)) return 2
  return 1
}

/** (manifest, blobs) of a Program: blob k holds the k-th buffer whose "data" is true. `read(slot)` gives a
 * slot's current bytes (little-endian). */
function writeManifest (prog, read, producer) {
  const index = new Map(prog.slots.map((s, i) => [s, i]))
  const blobs = []
  const buffers = prog.slots.map((s) => {
    const d = { name: s.name, role: s.role, dtype: s.dtype.name, shape: s.shape.slice(), size: s.size }
    if (STORED.has(s.role)) {
      blobs.push(read(s))
      d.data = true
    }
    return d
  })
  const spec = (s) => ({ name: s.name, dtype: s.dtype.name, shape: s.shape.slice() })
  const mapSlots = (o) => Object.fromEntries(Object.entries(o).map(([k, s]) => [k, index.get(s)]))
  const entrypoints = {}
  for (const [n, e] of Object.entries(prog.entries)) {
    entrypoints[n] = {
      inputs: mapSlots(e.inputs),
      outputs: mapSlots(e.outputs),
      calls: e.calls.map((c) => (c.copy ? { copy: c.copy.map((s) => index.get(s)) } : { kernel: c.kernel, args: c.args.map((s) => index.get(s)) })),
      rng: e.rng.map((s) => index.get(s))
    }
    if (e.args && e.args.length) entrypoints[n].arguments = e.args.slice()
  }
  const manifest = {
    format: bundle.FORMAT,
    version: formatVersion(prog),
    producer,
    signature: { inputs: prog.inputs.map(spec), targets: prog.targets.map(spec), outputs: prog.outputs.map(spec) },
    variables: [...prog.variables].map(([n, [lo, hi]]) => ({ name: n, min: lo, max: hi })),
    buffers,
    kernels: prog.kernelTable || ir.encode(prog.kernels),
    entrypoints,
    training: {
      gradients: [...prog.gradients].map(([a, b]) => [index.get(a), index.get(b)]),
      optimizer: prog.optimizer,
      optimizer_state: prog.optimizer ? prog.optimizerState || 'kept' : null,
      lr_buffer: prog.lrSlot ? index.get(prog.lrSlot) : null,
      ...(prog.optimizer && prog.gradScaleSlot ? { grad_scale_buffer: index.get(prog.gradScaleSlot) } : {})
    },
    rng: { seed: prog.rng[0], counter: prog.rng[1] }
  }
  return { manifest, blobs }
}

module.exports = { readProgram, writeManifest, formatVersion, optimizerConfig, validateKernel, ROLES, STORED, IDENT }
