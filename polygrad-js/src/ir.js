'use strict'
/**
 * The kernel IR in JavaScript: `UOp` nodes (op, dtype, src, arg), hash-consed per `Graph`, and the
 * serialised kernel table of docs/kernel-ir.md ("Serialised form") read and written.
 *
 * Stage: import. Input: the manifest's "kernels" object. Output: one SINK per root, built through
 * Graph.node so equal sub-graphs are one object (common sub-expressions are shared for free). Reading is
 * table look-ups over a flat node list (sources always earlier), never evaluation; anything unexpected
 * raises KernelError naming the node.
 *
 * Args in JS: CONST a number (floats keep their float64 value; rounding to the dtype happens when
 * rendered), an integer Number/BigInt or a boolean; RANGE [axis id, kind]; DEFINE_GLOBAL [slot, shape]
 * (shape entries integers or size UOps); DEFINE_VAR [name, min, max]; REDUCE the op name; STORE null or the
 * op name of an accumulating store; SINK
 * {name, opts} (opts kept in their encoded form); VECTORIZE the lane count; everything else null.
 */

const { KernelError } = require('./errors')
const { show, stringify } = require('./json')
const { DTYPES, wrapInt, intRange } = require('./dtypes')
const { MAX_ARG_DEPTH, MAX_NODES } = require('./limits')
const OP_TABLE = require('./generated/ops')
const { KERNEL_FORMAT, KERNEL_SUPPORTED_VERSIONS, KERNEL_FIELDS } = require('./generated/bundle')

// the kernel table's format and the op table (polygrad-core's polygrad/definitions/, generated/)
const FORMAT = KERNEL_FORMAT
const SUPPORTED_VERSIONS = KERNEL_SUPPORTED_VERSIONS
const ALL_OPS = OP_TABLE.NAMES // every Ops member of polygrad (decode knows them all; validation allows only the kernel-IR ones)
const OP_SET = new Set(ALL_OPS)
const UNARY = new Set(OP_TABLE.UNARY)
const BINARY = new Set(OP_TABLE.BINARY)
const COMPARISONS = new Set(OP_TABLE.COMPARISONS)
const ALU = new Set(OP_TABLE.ALU)
const AXIS_KINDS = OP_TABLE.AXIS_KINDS

const f64 = new Float64Array(1)
const u32of64 = new Uint32Array(f64.buffer)

function floatHex (x) {
  f64[0] = x
  return u32of64[1].toString(16).padStart(8, '0') + u32of64[0].toString(16).padStart(8, '0')
}

function hexFloat (hex) {
  u32of64[1] = parseInt(hex.slice(0, 8), 16)
  u32of64[0] = parseInt(hex.slice(8), 16)
  return f64[0]
}

class UOp {
  constructor (op, dtype, src, arg, id, key) {
    this.op = op
    this.dtype = dtype
    this.src = src
    this.arg = arg
    this.id = id
    this.key = key
  }

  toString () {
    return `${this.op}(${this.dtype ? this.dtype.name : '-'}, #${this.id}${this.arg !== null ? ', ' + argText(this.arg) : ''})`
  }
}

function argText (a) {
  if (a instanceof UOp) return `#${a.id}`
  if (Array.isArray(a)) return '[' + a.map(argText).join(',') + ']'
  if (typeof a === 'bigint') return a.toString()
  if (a !== null && typeof a === 'object') return stringify(a)
  return String(a)
}

function argKey (op, dtype, arg) {
  if (arg === null || arg === undefined) return ''
  if (op === 'CONST') {
    if (dtype && dtype.isFloat) return 'f' + floatHex(arg)
    if (typeof arg === 'boolean') return arg ? 'T' : 'F'
    return 'i' + arg.toString()
  }
  if (op === 'SINK') return 'k' + stringify(arg)
  return keyOf(arg)
}

function keyOf (a) {
  if (a instanceof UOp) return '#' + a.id
  if (Array.isArray(a)) return '[' + a.map(keyOf).join(',') + ']'
  if (typeof a === 'string') return stringify(a)
  if (typeof a === 'number') return Object.is(a, -0) ? '-0' : String(a)
  return String(a)
}

/** A hash-consing table: node(op, dtype, src, arg) returns the one UOp with those fields. */
class Graph {
  constructor () {
    this.table = new Map()
    this.count = 0
  }

  node (op, dtype, src, arg = null) {
    let key = op + '|' + (dtype ? dtype.name : '') + '|'
    for (let i = 0; i < src.length; i++) key += (i ? ',' : '') + src[i].id
    key += '|' + argKey(op, dtype, arg)
    let u = this.table.get(key)
    if (u === undefined) {
      u = new UOp(op, dtype, src, arg, this.count++, key)
      this.table.set(key, u)
    }
    return u
  }

  /** A CONST of dtype d, its value wrapped to the dtype as Python's normalize_const does. */
  const (d, value) {
    let v = value
    if (d.isBool) v = Boolean(v)
    else if (d.isInt) v = wrapInt(typeof v === 'boolean' ? Number(v) : v, d)
    else v = Number(v)
    return this.node('CONST', d, [], v)
  }

  alu (op, ...src) {
    const d = COMPARISONS.has(op) ? DTYPES.bool : op === 'WHERE' ? src[1].dtype : src[0].dtype
    return this.node(op, d, src)
  }

  /** `root` with nodes replaced by `mapping` (Map old -> new), rebuilt bottom-up. */
  substitute (root, mapping, memo = new Map(mapping)) {
    for (const n of toposort(root)) {
      if (memo.has(n)) continue
      let changed = false
      const src = n.src.map((s) => {
        const t = memo.get(s)
        if (t !== s) changed = true
        return t
      })
      let arg = n.arg
      if (n.op === 'DEFINE_GLOBAL' && n.arg[1].some((d) => d instanceof UOp && memo.get(d) !== d)) {
        arg = [n.arg[0], n.arg[1].map((d) => (d instanceof UOp ? memo.get(d) || d : d))]
        changed = true
      }
      memo.set(n, changed ? this.node(n.op, n.dtype, src, arg) : n)
    }
    return memo.get(root)
  }
}

const TOPO = new WeakMap()

/** Every node reachable from root, sources before users (iterative; cached per root). */
function toposort (root) {
  const hit = TOPO.get(root)
  if (hit) return hit
  const out = []
  const seen = new Set()
  const stack = [root, false]
  while (stack.length) {
    const visited = stack.pop()
    const node = stack.pop()
    if (visited) {
      out.push(node)
      continue
    }
    if (seen.has(node)) continue
    seen.add(node)
    stack.push(node, true)
    for (let i = node.src.length - 1; i >= 0; i--) if (!seen.has(node.src[i])) stack.push(node.src[i], false)
    if (node.op === 'DEFINE_GLOBAL') for (const d of node.arg[1]) if (d instanceof UOp && !seen.has(d)) stack.push(d, false)
  }
  TOPO.set(root, out)
  return out
}

// ---------------------------------------------------------------------------------------------------
// reading

function fail (where, msg) {
  return new KernelError(`${where}: ${msg}`)
}

function decodeArg (obj, where, depth, built) {
  if (depth > MAX_ARG_DEPTH) throw fail(where, `nested deeper than ${MAX_ARG_DEPTH} levels`)
  if (obj === null) return null
  if (!Array.isArray(obj) || obj.length !== 2 || typeof obj[0] !== 'string') {
    throw fail(where, `expected null or a [tag, payload] pair, got ${show(obj, 80)}`)
  }
  const [tag, val] = obj
  switch (tag) {
    case 'int':
      if (!(typeof val === 'bigint' || Number.isInteger(val))) throw fail(where, `an int arg needs a JSON integer, got ${String(val).slice(0, 40)}`)
      return { int: val }
    case 'float':
      if (typeof val !== 'string' || !/^[0-9a-fA-F]{16}$/.test(val)) throw fail(where, `a float arg is 16 hex digits of float64 bits, got ${String(val).slice(0, 40)}`)
      return { float: hexFloat(val) }
    case 'bool':
      if (typeof val !== 'boolean') throw fail(where, 'a bool arg needs true or false')
      return val
    case 'str':
      if (typeof val !== 'string') throw fail(where, 'a str arg needs a JSON string')
      return val
    case 'tuple':
      if (!Array.isArray(val)) throw fail(where, 'a tuple arg needs a JSON list')
      return { tuple: val.map((v, i) => decodeArg(v, `${where}[${i}]`, depth + 1, built)) }
    case 'uop':
      if (!built || !Number.isInteger(val) || val < 0 || val >= built.length) throw fail(where, `a uop arg needs the index of an earlier node, got ${String(val).slice(0, 20)}`)
      return built[val]
    case 'op':
      if (!OP_SET.has(val)) throw fail(where, `unknown op ${show(val, 40)}; upgrade the polygrad package or regenerate the file`)
      return { op: val }
    case 'dtype':
      if (!Object.prototype.hasOwnProperty.call(DTYPES, val)) throw fail(where, `unknown dtype ${show(val, 40)}`)
      return { dtype: val }
    case 'axis_kind':
      if (!AXIS_KINDS.includes(val)) throw fail(where, `unknown axis kind ${show(val, 40)}; use one of ${AXIS_KINDS.join(', ')}`)
      return { axis: val }
    case 'kernel_info':
      if (val === null || typeof val !== 'object' || Array.isArray(val) || Object.keys(val).sort().join() !== 'name,opts' || typeof val.name !== 'string') {
        throw fail(where, "kernel_info needs exactly {'name': str, 'opts': tuple}")
      }
      if (!(decodeArg(val.opts, `${where}.opts`, depth + 1) || {}).tuple) throw fail(where, 'kernel_info opts must be a tuple arg')
      return { kernel_info: { name: val.name, opts: val.opts } }
    default:
      throw fail(where, `unknown arg tag ${show(tag, 40)}; data from a newer polygrad needs a newer reader`)
  }
}

const isInt = (a) => a !== null && typeof a === 'object' && 'int' in a
const intVal = (a) => a.int

/** A decoded generic arg in the form the node of this op keeps (see the module docstring). */
function opArg (op, dtype, a, where) {
  const bad = (what) => fail(where, `${op} needs ${what}, got ${argText(a === null ? 'null' : show(a, (k, v) => (typeof v === 'bigint' ? v.toString() : v instanceof UOp ? `#${v.id}` : v)).slice(0, 80))}`)
  switch (op) {
    case 'CONST':
      if (!dtype) throw bad('a dtype')
      if (dtype.isBool) {
        if (typeof a !== 'boolean') throw bad('a bool value')
        return a
      }
      if (dtype.isInt) {
        if (!isInt(a)) throw bad('an int value')
        const [lo, hi] = intRange(dtype)
        if (BigInt(a.int) < lo || BigInt(a.int) > hi) throw bad(`a ${dtype.name} value (constants are wrapped to their dtype when built)`)
        return wrapInt(a.int, dtype)
      }
      if (a === null || typeof a !== 'object' || !('float' in a)) throw bad('a float value')
      return a.float
    case 'RANGE':
      if (!a || !a.tuple || a.tuple.length !== 2 || !isInt(a.tuple[0]) || !a.tuple[1] || (!a.tuple[1].axis && typeof a.tuple[1] !== 'string')) throw bad('(axis id, axis kind)')
      return [Number(intVal(a.tuple[0])), a.tuple[1].axis || a.tuple[1]]
    case 'DEFINE_GLOBAL': {
      if (!a || !a.tuple || a.tuple.length !== 2 || !isInt(a.tuple[0])) throw bad('(slot, shape)')
      const sh = a.tuple[1]
      const dims = sh && sh.tuple ? sh.tuple : [sh]
      return [Number(intVal(a.tuple[0])), dims.map((d) => {
        if (d instanceof UOp) return d
        if (!isInt(d)) throw bad('a shape of ints or size expressions')
        return d.int
      })]
    }
    case 'DEFINE_VAR':
      if (!a || !a.tuple || a.tuple.length !== 3 || typeof a.tuple[0] !== 'string' || !isInt(a.tuple[1]) || !isInt(a.tuple[2])) throw bad('(name, min, max)')
      return [a.tuple[0], a.tuple[1].int, a.tuple[2].int]
    case 'REDUCE':
      if (!a || !a.op) throw bad('a reduce op')
      return a.op
    case 'STORE':
      // an accumulating store (docs/kernel-ir.md "Accumulating stores") keeps its op's name; validation
      // allows ADD, MUL and MAX
      if (a === null) return null
      if (!a.op) throw bad('no arg or an op')
      return a.op
    case 'SINK':
      if (a === null) return null
      if (!a.kernel_info) throw bad('a KernelInfo')
      return a.kernel_info
    case 'VECTORIZE':
      if (!isInt(a)) throw bad('a lane count')
      return Number(a.int)
    default:
      if (a !== null) return { unexpected: a } // kept so that validation can name it
      return null
  }
}

/** The kernels (one UOp per root) of a serialised kernel table, built in graph `g`. */
function decode (obj, g) {
  if (obj === null || typeof obj !== 'object' || Array.isArray(obj)) throw new KernelError('serialised kernels must be a JSON object')
  if (obj.format !== FORMAT) throw new KernelError(`not a polygrad kernel table: format is ${show(obj.format)}, expected ${show(FORMAT)}`)
  const version = obj.version
  if (!Number.isInteger(version)) throw new KernelError("serialised kernels have no integer 'version'; the file is damaged")
  if (!SUPPORTED_VERSIONS.includes(version)) {
    throw new KernelError(`serialised kernels are format version ${version}; this package reads versions ${SUPPORTED_VERSIONS.join(', ')}. ` +
      (version > Math.max(...SUPPORTED_VERSIONS) ? 'Upgrade the polygrad package to read it.' : 'Regenerate it with this polygrad.'))
  }
  const extra = Object.keys(obj).filter((k) => !KERNEL_FIELDS.includes(k))
  if (extra.length) throw new KernelError(`serialised kernels have unknown fields ${show(extra.sort())} for version ${version}`)
  const { nodes, roots } = obj
  if (!Array.isArray(nodes) || !Array.isArray(roots)) throw new KernelError("serialised kernels need a 'nodes' list and a 'roots' list")
  if (nodes.length > MAX_NODES || roots.length > MAX_NODES) {
    throw new KernelError(`serialised kernels have ${nodes.length} nodes and ${roots.length} roots; the limit is ${MAX_NODES} (generated kernel tables have thousands)`)
  }
  const built = []
  for (let i = 0; i < nodes.length; i++) {
    const where = `node #${i}`
    const node = nodes[i]
    if (!Array.isArray(node) || node.length !== 4) throw fail(where, 'expected [op, dtype, [src indices], arg]')
    const [opName, dtName, src, arg] = node
    if (typeof opName !== 'string' || !OP_SET.has(opName)) throw fail(where, `unknown op ${show(opName, 40)}; upgrade the polygrad package or regenerate the file`)
    let dtype = null
    if (dtName !== null) {
      if (typeof dtName !== 'string' || !Object.prototype.hasOwnProperty.call(DTYPES, dtName)) throw fail(where, `unknown dtype ${show(dtName, 40)}`)
      dtype = DTYPES[dtName]
    }
    if (!Array.isArray(src)) throw fail(where, 'src must be a list of node indices')
    for (const s of src) {
      if (!Number.isInteger(s) || s < 0 || s >= i) throw fail(where, `src index ${String(s).slice(0, 20)} is not an earlier node (0..${i - 1}); nodes must be listed sources first`)
    }
    const generic = decodeArg(arg, `${where} (${opName}) arg`, 0, version >= 2 ? built : null)
    const value = opArg(opName, dtype, generic, `${where} (${opName})`)
    built.push(g.node(opName, dtype, src.map((s) => built[s]), value))
  }
  return roots.map((r) => {
    if (!Number.isInteger(r) || r < 0 || r >= built.length) throw new KernelError(`root ${String(r).slice(0, 20)} is not a node index (0..${built.length - 1})`)
    return built[r]
  })
}

// ---------------------------------------------------------------------------------------------------
// writing (kernels the package builds itself, e.g. optimizer updates)

function encodeOpArg (n, index) {
  const a = n.arg
  switch (n.op) {
    case 'CONST':
      if (n.dtype.isBool) return ['bool', a]
      if (n.dtype.isInt) return ['int', a]
      return ['float', floatHex(a)]
    case 'RANGE':
      return ['tuple', [['int', a[0]], ['axis_kind', a[1]]]]
    case 'DEFINE_GLOBAL':
      return ['tuple', [['int', a[0]], ['tuple', a[1].map((d) => (d instanceof UOp ? ['uop', index.get(d)] : ['int', d]))]]]
    case 'DEFINE_VAR':
      return ['tuple', [['str', a[0]], ['int', a[1]], ['int', a[2]]]]
    case 'REDUCE':
      return ['op', a]
    case 'STORE':
      return a === null ? null : ['op', a]
    case 'SINK':
      return a === null ? null : ['kernel_info', { name: a.name, opts: a.opts }]
    case 'VECTORIZE':
      return ['int', a]
    default:
      if (a !== null) throw new KernelError(`cannot serialise the arg of ${n}`)
      return null
  }
}

/** The serialised table of several kernels (shared nodes written once). */
function encode (roots) {
  const index = new Map()
  const nodes = []
  let refs = false
  for (const root of roots) {
    for (const n of toposort(root)) {
      if (index.has(n)) continue
      if (n.op === 'DEFINE_GLOBAL' && n.arg[1].some((d) => d instanceof UOp)) refs = true
      index.set(n, nodes.length)
      nodes.push([n.op, n.dtype ? n.dtype.name : null, n.src.map((s) => index.get(s)), encodeOpArg(n, index)])
    }
  }
  return { format: FORMAT, version: refs ? 2 : 1, nodes, roots: roots.map((r) => index.get(r)) }
}

module.exports = {
  UOp, Graph, toposort, decode, encode, floatHex, hexFloat, ALL_OPS, UNARY, BINARY, COMPARISONS, ALU, AXIS_KINDS
}
