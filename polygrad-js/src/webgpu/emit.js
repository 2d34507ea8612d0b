'use strict'
/**
 * The WGSL emitter: a linearized kernel (linearize.js, scalar: width 1) -> one WebGPU compute shader.
 *
 * Stage: emitting, beside wasm/emit.js, from the same Program. Input: a Program and its buffers' layout
 * (parameter slot -> {base (byte address), size (elements)}) in the model's one memory. Output:
 * {code, params, workgroup}: WGSL source whose storage binding 0 is that memory as 32-bit words (every
 * buffer's address baked in, as wasm's memarg offsets), binding 1 (when `params`) the Variables' values.
 *
 * A threaded phase (linearize's `split`: its first loop runs part PART of PARTS) is run one part per
 * invocation, 64 invocations per workgroup: PART is the invocation's index, PARTS the loop's trip count.
 * Any other program runs on one invocation. Semantics are the IR's, as the wasm emitter's: division by
 * zero divides by 1, MAX propagates NaN (tested by bits: a shader compiler may assume no NaN in
 * comparisons), float -> int casts truncate and wrap (non-finite: 0), float16/bfloat16 are stored as
 * 16-bit words and computed in f32, every result rounded to 16 bits by integer code (nearest even, as
 * dtypes.js), so results match wasm's without the shader-f16 feature. Narrow stores (8 and 16 bits) share
 * their word with neighbours another invocation may write: such a kernel sees the memory as atomic words
 * and updates only its bits (atomicAnd, atomicOr). WebGPU has no 64-bit types: a kernel with one is a
 * KernelError. A bounds-checked access (`check`) that fails sets word 0 (the memory's first 64 bytes hold
 * no buffer) and is skipped; the runtime reports it.
 */

const { KernelError } = require('../errors')
const { PART, PARTS } = require('../linearize')

const WORKGROUP = 64

// float32 <-> 16-bit formats, ports of dtypes.js (the C renderer's pg_f2h/pg_h2f/pg_f2b/pg_b2f)
const HELPERS = `
var<private> pg_zero: u32 = 0u;
fn pg_isnan(x: f32) -> bool { return (bitcast<u32>(x) & 0x7fffffffu) > 0x7f800000u; }
fn pg_f2h(x: f32) -> u32 {
  var u = bitcast<u32>(x);
  let sign = u & 0x80000000u;
  u = u ^ sign;
  var o: u32;
  if (u >= (143u << 23u)) {
    o = select(0x7c00u, 0x7e00u, u > (255u << 23u));
  } else if (u < (113u << 23u)) {
    o = (bitcast<u32>(bitcast<f32>(u) + 0.5) - (126u << 23u)) & 0xffffu;
  } else {
    let odd = (u >> 13u) & 1u;
    o = ((u + 0xc8000fffu + odd) >> 13u) & 0xffffu;
  }
  return (o | (sign >> 16u)) & 0xffffu;
}
fn pg_h2f(h: u32) -> f32 {
  var o = (h & 0x7fffu) << 13u;
  let e = o & (0x7c00u << 13u);
  o = o + ((127u - 15u) << 23u);
  if (e == (0x7c00u << 13u)) {
    o = o + ((128u - 16u) << 23u);
  } else if (e == 0u) {
    o = bitcast<u32>(bitcast<f32>(o + (1u << 23u)) - 6.103515625e-05);
  }
  return bitcast<f32>(o | ((h & 0x8000u) << 16u));
}
fn pg_f2b(x: f32) -> u32 {
  let u = bitcast<u32>(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) { return ((u >> 16u) | 0x40u) & 0xffffu; }
  return ((u + 0x7fffu + ((u >> 16u) & 1u)) >> 16u) & 0xffffu;
}
fn pg_b2f(h: u32) -> f32 { return bitcast<f32>(h << 16u); }
fn pg_f2u(x: f32) -> u32 {
  let a = abs(x);
  if (pg_isnan(x) || a >= 9223372036854775808.0) { return 0u; }
  let t = trunc(x);
  if (a < 2147483648.0) { return bitcast<u32>(i32(t)); }
  return u32(t - floor(t / 4294967296.0) * 4294967296.0);
}
`

/** The WGSL type a register of dtype d has (16-bit floats: f32; narrow ints: i32/u32 holding the value). */
function wgslType (d) {
  if (d.bits === 64) throw new KernelError(`WebGPU has no ${d.name}: this kernel needs the wasm backend (load with { backend: 'wasm' })`)
  if (d.isFloat) return 'f32'
  if (d.isBool) return 'bool'
  return d.isUnsigned ? 'u32' : 'i32'
}

/** An expression rounding f32 `x` to dtype d's precision. */
function round (x, d) {
  if (d.name === 'float16') return `pg_h2f(pg_f2h(${x}))`
  if (d.name === 'bfloat16') return `pg_b2f(pg_f2b(${x}))`
  return x
}

/** An expression wrapping an integer `x` (held in i32/u32) to dtype d's width. */
function wrap (x, d) {
  if (!d.isInt || d.bits === 32) return x
  if (d.isUnsigned) return `(${x} & ${d.bits === 8 ? '0xffu' : '0xffffu'})`
  const s = 32 - d.bits
  return `((${x} << ${s}u) >> ${s}u)`
}

const f32 = new Float32Array(1)
const u32 = new Uint32Array(f32.buffer)

function literal (d, v) {
  if (d.isBool) return v ? 'true' : 'false'
  if (d.isFloat) {
    f32[0] = Number(v)
    // a constant expression must not be infinite or NaN: those are read through a runtime zero
    return Number.isFinite(f32[0]) ? `bitcast<f32>(${u32[0]}u)` : `bitcast<f32>(${u32[0]}u | pg_zero)`
  }
  const n = Number(v)
  if (d.isUnsigned) return `${n >>> 0}u`
  return n === -2147483648 ? 'bitcast<i32>(0x80000000u)' : `${n}i`
}

/** A value of dtype `from` as dtype `to` (CAST), as scalar.js cast. */
function cast (a, from, to) {
  if (to.isBool) return from.isBool ? a : from.isFloat ? `(${a} != 0.0)` : `(${a} != ${from.isUnsigned ? '0u' : '0i'})`
  if (to.isFloat) {
    if (from.isBool) return `select(0.0, 1.0, ${a})`
    return round(`f32(${a})`, to)
  }
  const T = wgslType(to)
  let bits
  if (from.isBool) bits = `select(0u, 1u, ${a})`
  else if (from.isFloat) bits = `pg_f2u(${a})`
  else bits = `bitcast<u32>(${a})`
  return wrap(`bitcast<${T}>(${bits})`, to)
}

function bitcast (a, from, to) {
  if (from.bits !== to.bits) throw new KernelError(`BITCAST from ${from.name} to ${to.name} changes the size`)
  let bits // the value's bits as u32 (low `bits` bits)
  if (from.name === 'float16') bits = `pg_f2h(${a})`
  else if (from.name === 'bfloat16') bits = `pg_f2b(${a})`
  else if (from.isBool) bits = `select(0u, 1u, ${a})`
  else bits = `bitcast<u32>(${a})`
  if (to.name === 'float16') return `pg_h2f(${bits} & 0xffffu)`
  if (to.name === 'bfloat16') return `pg_b2f(${bits} & 0xffffu)`
  if (to.isBool) return `((${bits} & 0xffu) != 0u)`
  if (to.isFloat) return `bitcast<f32>(${bits})`
  return wrap(`bitcast<${wgslType(to)}>(${bits})`, to)
}

/** The WGSL expression of ALU op `op` on operands `a` (names) with result dtype d and operand dtype s. */
function alu (op, d, s, [a, b, c]) {
  if (op === 'CAST') return cast(a, s, d)
  if (op === 'BITCAST') return bitcast(a, s, d)
  if (op === 'WHERE') return `select(${c}, ${b}, ${a})`
  const cmp = { CMPLT: '<', CMPLE: '<=', CMPNE: '!=', CMPEQ: '==' }[op]
  if (cmp) {
    if (s.isBool && op === 'CMPLT') return `(!${a} && ${b})`
    if (s.isBool && op === 'CMPLE') return `(!${a} || ${b})`
    return `(${a} ${cmp} ${b})`
  }
  if (d.isBool) {
    switch (op) {
      case 'ADD': case 'OR': case 'MAX': return `(${a} || ${b})`
      case 'MUL': case 'AND': return `(${a} && ${b})`
      case 'XOR': return `(${a} != ${b})`
      case 'NEG': return `(!${a})`
      case 'TRUNC': return a
    }
  } else if (d.isFloat) {
    const r = (x) => round(x, d)
    switch (op) {
      case 'ADD': return r(`(${a} + ${b})`)
      case 'MUL': return r(`(${a} * ${b})`)
      case 'NEG': return `(-${a})`
      case 'FDIV': return r(`(${a} / ${b})`)
      case 'MOD': return r(`(${a} % ${b})`)
      case 'MAX': return `select(${b}, ${a}, pg_isnan(${a}) || ${a} > ${b})`
      case 'RECIPROCAL': return r(`(1.0 / ${a})`)
      case 'SQRT': return r(`sqrt(${a})`)
      case 'TRUNC': return r(`trunc(${a})`)
      case 'POW': return r(`pow(${a}, ${b})`)
      case 'FMA': return r(`fma(${a}, ${b}, ${c})`)
    }
  } else {
    const w = (x) => wrap(x, d)
    const zero = d.isUnsigned ? '0u' : '0i'
    const one = d.isUnsigned ? '1u' : '1i'
    switch (op) {
      case 'ADD': return w(`(${a} + ${b})`)
      case 'MUL': return w(`(${a} * ${b})`)
      case 'NEG': return w(`(${zero} - ${a})`)
      case 'IDIV': return w(`(${a} / select(${b}, ${one}, ${b} == ${zero}))`)
      case 'MOD': return w(`(${a} % select(${b}, ${one}, ${b} == ${zero}))`)
      case 'MAX': return `max(${a}, ${b})`
      case 'AND': return `(${a} & ${b})`
      case 'OR': return `(${a} | ${b})`
      case 'XOR': return `(${a} ^ ${b})`
      case 'SHL': return w(`(${a} << u32(${b}))`)
      case 'SHR': return w(`(${a} >> u32(${b}))`)
      case 'TRUNC': return a
      case 'FMA': return w(`(${a} * ${b} + ${c})`)
    }
  }
  throw new KernelError(`the WebGPU emitter has no rule for ${op} on ${d.name}; load with { backend: 'wasm' }`)
}

class WGSLEmitter {
  constructor (prog, layout) {
    this.prog = prog
    this.layout = layout
    this.split = prog.vars[0] === PART
    this.atomic = hasNarrowStore(prog.body)
    this.params = prog.vars.some((v) => v !== PART)
    this.lines = []
  }

  name (x) {
    return `v${x.id}`
  }

  word (i) {
    return this.atomic ? `atomicLoad(&M[${i}])` : `M[${i}]`
  }

  /** {base (word), size} of parameter `slot`. */
  region (slot) {
    const L = this.layout.get(slot)
    if (!L) throw new KernelError(`internal: kernel ${this.prog.name} has no buffer for parameter ${slot}`)
    return L
  }

  /** Statements for a load or store's bounds check (empty without one); sets `ok`. */
  checked (x, ind, i) {
    if (!x.check) return null
    const size = this.region(x.buf).size
    this.lines.push(`${ind}let ok${x.id} = ${i} >= 0i && ${i} < ${size}i;`)
    this.lines.push(`${ind}if (!ok${x.id}) { ${this.atomic ? 'atomicStore(&M[0], 1u)' : 'M[0] = 1u'}; }`)
    return `ok${x.id}`
  }

  /** The expression reading element `i` (an i32 expression) of parameter `slot` as dtype d. */
  read (slot, d, i) {
    const base = this.region(slot).base
    if (d.bits === 32) {
      const w = this.word(`${base / 4}u + u32(${i})`)
      return d.isFloat ? `bitcast<f32>(${w})` : `bitcast<${wgslType(d)}>(${w})`
    }
    const per = 32 / d.bits
    const shift = per === 2 ? 1 : 2
    const mask = d.bits === 16 ? '0xffffu' : '0xffu'
    const bits = `((${this.word(`${base / 4}u + (u32(${i}) >> ${shift}u)`)} >> ((u32(${i}) & ${per - 1}u) * ${d.bits}u)) & ${mask})`
    if (d.name === 'float16') return `pg_h2f(${bits})`
    if (d.name === 'bfloat16') return `pg_b2f(${bits})`
    if (d.isBool) return `(${bits} != 0u)`
    return wrap(`bitcast<${wgslType(d)}>(${bits})`, d)
  }

  /** Statements writing value `v` of dtype d to element `i` of parameter `slot`. */
  write (slot, d, i, v, ind) {
    const base = this.region(slot).base
    if (d.bits === 32) {
      const bits = d.isFloat || d.isInt ? `bitcast<u32>(${v})` : v
      const at = `${base / 4}u + u32(${i})`
      this.lines.push(this.atomic ? `${ind}atomicStore(&M[${at}], ${bits});` : `${ind}M[${at}] = ${bits};`)
      return
    }
    let bits
    if (d.name === 'float16') bits = `pg_f2h(${v})`
    else if (d.name === 'bfloat16') bits = `pg_f2b(${v})`
    else if (d.isBool) bits = `select(0u, 1u, ${v})`
    else bits = `(bitcast<u32>(${v}) & ${d.bits === 16 ? '0xffffu' : '0xffu'})`
    const per = 32 / d.bits
    const at = `${base / 4}u + (u32(${i}) >> ${per === 2 ? 1 : 2}u)`
    const sh = `((u32(${i}) & ${per - 1}u) * ${d.bits}u)`
    const mask = d.bits === 16 ? '0xffffu' : '0xffu'
    this.lines.push(`${ind}atomicAnd(&M[${at}], ~(${mask} << ${sh}));`)
    this.lines.push(`${ind}atomicOr(&M[${at}], ${bits} << ${sh});`)
  }

  emit (insts, depth) {
    const ind = '  '.repeat(depth)
    for (const x of insts) this.inst(x, ind, depth)
  }

  inst (x, ind, depth) {
    const L = this.lines
    if (x.lanes !== 1) throw new KernelError('internal: the WebGPU emitter takes scalar programs (width 1)')
    const v = this.name(x)
    switch (x.k) {
      case 'const':
        L.push(`${ind}let ${v}: ${wgslType(x.dtype)} = ${literal(x.dtype, x.value)};`)
        return
      case 'var': {
        const T = wgslType(x.dtype)
        if (x.name === PART) L.push(`${ind}let ${v}: ${T} = ${T}(part);`)
        else L.push(`${ind}let ${v}: ${T} = ${T}(P[${this.prog.vars.indexOf(x.name)}]);`)
        return
      }
      case 'alu':
        L.push(`${ind}let ${v}: ${wgslType(x.dtype)} = ${alu(x.op, x.dtype, x.src[0].dtype, x.src.map((s) => this.name(s)))};`)
        return
      case 'load': {
        const T = wgslType(x.dtype)
        const zero = literal(x.dtype, 0)
        const i = this.name(x.idx)
        if (!x.gate && !x.check) {
          L.push(`${ind}let ${v}: ${T} = ${this.read(x.buf, x.dtype, i)};`)
          return
        }
        L.push(`${ind}var ${v}: ${T} = ${zero};`)
        const ok = this.checked(x, ind, i)
        const cond = [x.gate ? this.name(x.gate) : null, ok].filter(Boolean).join(' && ')
        L.push(`${ind}if (${cond}) { ${v} = ${this.read(x.buf, x.dtype, i)}; }`)
        return
      }
      case 'store': {
        if (x.gate) throw new KernelError('internal: a lane-gated store in a scalar program')
        const i = this.name(x.idx)
        const ok = this.checked(x, ind, i)
        if (ok) L.push(`${ind}if (${ok}) {`)
        this.write(x.buf, x.dtype, i, this.name(x.src[0]), ok ? ind + '  ' : ind)
        if (ok) L.push(`${ind}}`)
        return
      }
      case 'loop': {
        this.emit(x.pre, depth)
        const T = wgslType(x.dtype)
        L.push(`${ind}for (var ${v}: ${T} = ${this.name(x.start)}; ${v} < ${this.name(x.end)}; ${v} = ${v} + ${T === 'u32' ? '1u' : '1i'}) {`)
        this.emit(x.body, depth + 1)
        L.push(`${ind}}`)
        return
      }
      case 'if':
        L.push(`${ind}if (${this.name(x.cond)}) {`)
        this.emit(x.body, depth + 1)
        L.push(`${ind}}`)
        return
      case 'acc':
        L.push(`${ind}var ${v}: ${wgslType(x.dtype)} = ${this.name(x.src[0])};`)
        return
      case 'update': {
        if (x.fold) throw new KernelError('internal: a lane fold in a scalar program')
        const d = x.acc.dtype
        const a = this.name(x.acc)
        L.push(`${ind}${a} = ${alu(x.op, d, d, [a, this.name(x.src[0])])};`)
        return
      }
      case 'read':
        L.push(`${ind}let ${v}: ${wgslType(x.dtype)} = ${this.name(x.acc)};`)
        return
      default:
        throw new KernelError(`internal: the WebGPU emitter has no rule for ${x.k}`)
    }
  }

  run () {
    this.emit(this.prog.head, 1)
    this.emit(this.prog.body, 1)
    const mem = this.atomic ? 'array<atomic<u32>>' : 'array<u32>'
    const head = [
      `// polygrad kernel ${this.prog.name}`,
      `@group(0) @binding(0) var<storage, read_write> M: ${mem};`,
      this.params ? '@group(0) @binding(1) var<storage, read> P: array<i32>;' : '',
      HELPERS
    ]
    const workgroup = this.split ? WORKGROUP : 1
    const entry = this.split
      ? [`@compute @workgroup_size(${WORKGROUP})`,
          'fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {',
          `  let part = gid.x + gid.y * groups.x * ${WORKGROUP}u;`,
          `  if (part >= u32(P[${this.prog.vars.indexOf(PARTS)}])) { return; }`]
      : ['@compute @workgroup_size(1)', 'fn main() {']
    return { code: [...head, ...entry, ...this.lines, '}', ''].join('\n'), params: this.params, workgroup }
  }
}

function hasNarrowStore (insts) {
  return insts.some((x) => (x.k === 'store' && x.dtype.bits < 32) ||
    (x.k === 'loop' && (hasNarrowStore(x.pre) || hasNarrowStore(x.body))) || (x.k === 'if' && hasNarrowStore(x.body)))
}

/** WGSL for one linearized program: {code, params (whether binding 1 holds Variables), workgroup}. */
function emitWGSL (prog, layout) {
  return new WGSLEmitter(prog, layout).run()
}

module.exports = { emitWGSL, WORKGROUP }
