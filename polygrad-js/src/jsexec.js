'use strict'
/**
 * The plain-JavaScript executor: a linearized kernel (scalar: one lane) compiled into nested closures.
 *
 * Stage: emitting, the fallback and reference beside the WebAssembly emitter. Input: a Program from
 * linearize.js (built with width 1). Output: run(memory, offsets, vars), which executes the kernel over
 * buffers at byte offsets of an ArrayBuffer. No source text is generated or evaluated: each instruction
 * becomes a closure over typed-array views and the per-op functions of scalar.js.
 */

const { aluFn, toStore, fromStore } = require('./scalar')
const { roundFloat } = require('./dtypes')
const { KernelError } = require('./errors')

function constValue (x) {
  const d = x.dtype
  const v = x.value
  if (d.isBool) return v ? 1 : 0
  if (d.isFloat) return roundFloat(Number(v), d)
  if (d.bits === 64) return d.isUnsigned ? BigInt.asUintN(64, BigInt(v)) : BigInt.asIntN(64, BigInt(v))
  return Number(v)
}

function zeroOf (d) {
  return d.bits === 64 && !d.isFloat ? 0n : 0
}

class JSKernel {
  constructor (prog) {
    this.prog = prog
    this.name = prog.name
    this.size = prog.count
    this.ctx = null
    this.head = this.block(prog.head)
    this.body = this.block(prog.body)
  }

  block (insts) {
    const fns = insts.map((x) => this.compile(x)).filter(Boolean)
    return fns
  }

  compile (x) {
    const id = x.id
    const self = this
    switch (x.k) {
      case 'const': {
        if (x.lanes !== 1) throw new KernelError('the JavaScript executor runs scalar programs only')
        const v = constValue(x)
        return (R) => { R[id] = v }
      }
      case 'var': {
        const name = x.name
        return (R) => { R[id] = self.ctx.vars[name] }
      }
      case 'alu': {
        const fn = aluFn(x.op, x.dtype, x.src[0].dtype)
        if (!fn) throw new KernelError(`no JavaScript rule for ${x.op} on ${x.dtype.name}`)
        const s = x.src.map((v) => v.id)
        if (s.length === 1) { const a = s[0]; return (R) => { R[id] = fn(R[a]) } }
        if (s.length === 2) { const a = s[0]; const b = s[1]; return (R) => { R[id] = fn(R[a], R[b]) } }
        const [a, b, c] = s
        return (R) => { R[id] = fn(R[a], R[b], R[c]) }
      }
      case 'load': {
        const d = x.dtype
        const slot = x.buf
        const idx = x.idx.id
        const gate = x.gate ? x.gate.id : -1
        const check = x.check
        const zero = zeroOf(d)
        const plain = !d.half && !d.isBool
        return (R) => {
          if (gate >= 0 && !R[gate]) { R[id] = zero; return }
          const b = self.ctx.bufs[slot]
          const i = Number(R[idx])
          if (check && !(i >= 0 && i < b.size)) throw new KernelError(`kernel ${self.name} read element ${i} of a ${b.size}-element buffer (parameter ${slot})`)
          R[id] = plain ? b.view[b.start + i] : fromStore(b.view[b.start + i], d)
        }
      }
      case 'store': {
        const d = x.dtype
        const slot = x.buf
        const idx = x.idx.id
        const val = x.src[0].id
        const check = x.check
        return (R) => {
          const b = self.ctx.bufs[slot]
          const i = Number(R[idx])
          if (check && !(i >= 0 && i < b.size)) throw new KernelError(`kernel ${self.name} wrote element ${i} of a ${b.size}-element buffer (parameter ${slot})`)
          b.view[b.start + i] = toStore(R[val], d)
        }
      }
      case 'loop': {
        const pre = this.block(x.pre)
        const body = this.block(x.body)
        const start = x.start.id
        const end = x.end.id
        return (R) => {
          run(pre, R)
          const e = R[end]
          for (let i = R[start]; i < e; i++) {
            R[id] = i
            run(body, R)
          }
        }
      }
      case 'if': {
        const body = this.block(x.body)
        const cond = x.cond.id
        return (R) => { if (R[cond]) run(body, R) }
      }
      case 'acc': {
        const init = x.src[0].id
        return (R) => { R[id] = R[init] }
      }
      case 'update': {
        if (x.fold || x.lanes !== 1) throw new KernelError('the JavaScript executor runs scalar programs only')
        const fn = aluFn(x.op, x.acc.dtype, x.acc.dtype)
        const acc = x.acc.id
        const val = x.src[0].id
        return (R) => { R[acc] = fn(R[acc], R[val]) }
      }
      case 'read': {
        const acc = x.acc.id
        return (R) => { R[id] = R[acc] }
      }
      default:
        throw new KernelError(`the JavaScript executor has no rule for ${x.k}`)
    }
  }

  /** Run over `bufs` (per parameter: {view, start (element), size (elements)}) with Variable values `vars`. */
  run (bufs, vars) {
    const R = new Array(this.size)
    this.ctx = { bufs, vars }
    try {
      run(this.head, R)
      run(this.body, R)
    } finally {
      this.ctx = null
    }
  }
}

function run (fns, R) {
  for (let i = 0; i < fns.length; i++) fns[i](R)
}

module.exports = { JSKernel }
