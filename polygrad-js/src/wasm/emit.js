'use strict'
/**
 * The WebAssembly emitter: a linearized kernel (linearize.js) -> one wasm function body with 128-bit SIMD.
 *
 * Stage: emitting. Input: a Program and the call's buffer layout (each parameter's byte address in linear
 * memory and its capacity in elements). Buffers never move after load, so their addresses are memarg
 * offsets baked into the code (one function per call site) and the function's parameters are only the
 * Variables' values (i32). Output: {params, locals, body} for encode.moduleBytes.
 *
 * Values live in locals, reused once a value is dead (after its last use, or after the outermost loop that
 * uses it without defining it), so a kernel needs as many locals as values are live at once, never one per
 * instruction (engines cap a function's locals; the engine's register allocator takes it from there):
 * floats of 16 bits as float32 rounded to their format, 8/16-bit integers as canonical i32 (sign- or
 * zero-extended), bool as i32 0/1, a value with lanes as v128 (bool lanes as i32x4 masks 0/-1).
 * Semantics follow docs/kernel-ir.md exactly: no contraction (mul and add stay separate; the one exception,
 * asked for with `fma` where the engine has relaxed SIMD: a float32 x4 reduction step acc + a * b becomes one
 * relaxed_madd, see fusedProducts), NaN-propagating
 * MAX as a select, integer division by zero dividing by 1 (and INT_MIN / -1 wrapping instead of trapping),
 * float-to-int conversions saturating instead of trapping. A load or store the validator could not prove
 * in bounds gets an explicit check that traps (`unreachable`), which the runtime reports as KernelError.
 */

const { Code, T } = require('./encode')
const { KernelError } = require('../errors')
const { roundFloat } = require('../dtypes')

const SCALAR = (d) => (d.wasm === 'i32' ? T.i32 : d.wasm === 'i64' ? T.i64 : d.wasm === 'f32' ? T.f32 : T.f64)
const LOG2 = { 1: 0, 2: 1, 4: 2, 8: 3 }
// a loop body with at most this many accumulator chains of a broadcast value times a vector keeps mul + add
// (fusedProducts)
const FEW_CHAINS = 4

// scalar load/store opcodes by dtype name
const LOAD = { bool: 0x2d, int8: 0x2c, uint8: 0x2d, int16: 0x2e, uint16: 0x2f, float16: 0x2f, bfloat16: 0x2f, int32: 0x28, uint32: 0x28, int64: 0x29, uint64: 0x29, float32: 0x2a, float64: 0x2b }
const STORE = { bool: 0x3a, int8: 0x3a, uint8: 0x3a, int16: 0x3b, uint16: 0x3b, float16: 0x3b, bfloat16: 0x3b, int32: 0x36, uint32: 0x36, int64: 0x37, uint64: 0x37, float32: 0x38, float64: 0x39 }

class KernelEmitter {
  /**
   * layout: Map slot -> {base (bytes), size (elements)}; helpers: {h2f, f2h, ...} function indices;
   * imports: {fmod, pow, fma32, fma64} function indices.
   */
  constructor (prog, layout, helpers, imports, { fma = false } = {}) {
    this.prog = prog
    this.fma = fma
    this.layout = layout
    this.h = helpers
    this.imp = imports
    this.c = new Code()
    this.params = prog.vars.map(() => T.i32)
    this.locals = []
    this.val = new Map() // inst id -> {local} | {konst: fn(code)}
    this.stats = { pointerExits: 0, bitSelects: 0, fusedMadds: 0, gatedPointers: 0, int8Dots: 0, laneDots: 0, unpacks: 0, extends: 0, spreads: 0, byteSplats: 0, halfLoads: 0, wholeGatedStores: 0, clampSelects: 0 } // what the speed guards (tests) look for
    this.addrOf = new Map() // 'index inst id|slot' -> {local, size, offset}: a strength-reduced address (see loop)
    this.gatedAddr = new Map() // load inst id -> local: a gated pointer (strengthReduce), 0 where the gate is off
    this.free = new Map() // wasm type -> locals no live value holds
    this.pooled = new Map() // value id -> its reusable local
    this.scratch = [] // [type, local] taken by the instruction being emitted, freed after it
  }

  newLocal (t) {
    this.locals.push(t)
    return this.params.length + this.locals.length - 1
  }

  /** A local of type t that no live value holds (reused, or a new one). */
  alloc (t) {
    const list = this.free.get(t)
    return list && list.length ? list.pop() : this.newLocal(t)
  }

  /** A local for the current instruction's own use only (a temporary inside its code). */
  temp (t) {
    const l = this.alloc(t)
    this.scratch.push([t, l])
    return l
  }

  release (t, l) {
    if (!this.free.has(t)) this.free.set(t, [])
    this.free.get(t).push(l)
  }

  /** x's local holds its value from now on: reusable after releaseAfter says x is dead. */
  hold (x, l) {
    this.pooled.set(x.id, [this.typeOf(x), l])
    this.val.set(x.id, { local: l })
    return l
  }

  typeOf (x) {
    return x.lanes > 1 ? T.v128 : SCALAR(x.dtype)
  }

  push (x) {
    const v = this.val.get(x.id)
    if (v === undefined) throw new KernelError(`internal: value ${x.k} #${x.id} used before it is defined`)
    if (v.konst) v.konst(this.c)
    else this.c.get(v.local)
    return this.c
  }

  define (x) {
    // the value on the stack becomes x's local
    const l = this.hold(x, this.alloc(this.typeOf(x)))
    this.c.set(l)
    return l
  }

  // ---- constants
  scalarConst (d, v) {
    if (d.isBool) return (c) => c.i32(v ? 1 : 0)
    if (d.isFloat) {
      const r = roundFloat(Number(v), d)
      return d.wasm === 'f64' ? (c) => c.f64c(r) : (c) => c.f32c(r)
    }
    if (d.wasm === 'i64') return (c) => c.i64(BigInt(v))
    const n = Number(v) | 0
    return (c) => c.i32(n)
  }

  laneBytes (d, values) {
    const buf = new ArrayBuffer(16)
    const dv = new DataView(buf)
    values.forEach((v, i) => {
      if (d.isBool) dv.setInt32(i * 4, v ? -1 : 0, true)
      else if (d.isFloat) dv.setFloat32(i * 4, roundFloat(Number(v), d), true)
      else dv.setInt32(i * 4, Number(v) | 0, true)
    })
    return new Uint8Array(buf)
  }

  emitConst (x) {
    if (x.lanes === 1) {
      this.val.set(x.id, { konst: this.scalarConst(x.dtype, x.value) })
      return
    }
    const bytes = this.laneBytes(x.dtype, x.value)
    this.val.set(x.id, { konst: (c) => c.v128const(bytes) })
  }

  // ---- addresses
  buf (slot) {
    const b = this.layout.get(slot)
    if (!b) throw new KernelError(`internal: no buffer bound to parameter ${slot}`)
    return b
  }

  /** Push the byte address of element idx of buffer `slot` (without the buffer's base); returns a constant
   * byte offset the access adds to its memarg offset (for a strength-reduced address, whose pointer holds
   * the base: the offset minus the base). */
  address (idx, d, slot) {
    const reduced = this.addrOf.get(`${idx.id}|${slot}`)
    if (reduced !== undefined && reduced.size === d.size) {
      this.c.get(reduced.local)
      return reduced.offset
    }
    this.push(idx)
    if (idx.dtype.wasm === 'i64') this.c.op(0xa7) // i32.wrap_i64 (the validator bounds it)
    const s = LOG2[d.size]
    if (s) this.c.i32(s).op(0x74)
    return 0
  }

  boundsCheck (idx, slot, lanes) {
    const b = this.buf(slot)
    const limit = b.size - lanes + 1
    this.push(idx)
    if (idx.dtype.wasm === 'i64') {
      this.c.i64(limit).op(0x5a) // i64.ge_u
    } else {
      this.c.i32(limit).op(0x4f) // i32.ge_u
    }
    if (limit <= 0) this.c.op(0x1a).i32(1) // an empty buffer: every access is out of bounds
    this.c.byte(0x04, 0x40, 0x00, 0x0b) // if unreachable end
  }

  // ---- loads and stores
  emitLoad (x) {
    if (!this.uses.get(x.id) && !x.check) return // only broadcast loads read it (v128.load32_splat)
    const d = x.dtype
    const b = this.buf(x.buf)
    if (x.check) {
      if (x.gate && x.gate.lanes === 1) {
        // a gated load is only checked where its gate is on
        this.push(x.gate).byte(0x04, 0x40)
        this.boundsCheck(x.idx, x.buf, x.mode === 'contiguous' ? x.lanes : 1)
        this.c.byte(0x0b)
      } else if (!x.gate && x.mode !== 'gather') {
        this.boundsCheck(x.idx, x.buf, x.mode === 'contiguous' ? x.lanes : 1)
      }
    }
    if (x.lanes === 1) {
      if (x.gate && this.gatedAddr.has(x.id)) {
        this.c.get(this.gatedAddr.get(x.id))
        this.loadScalar(d, 0)
      } else if (x.gate) {
        // where the gate is off, address 0: the memory's first bytes, which hold zeros (runtime.js ZERO_BYTES),
        // so the value read is 0 with no select after the load (ResNet-18's padded 7x7 layers: their border)
        const extra = this.address(x.idx, d, x.buf) + b.base
        if (extra) this.c.i32(extra).op(0x6a)
        this.c.i32(0)
        this.push(x.gate).op(0x1b)
        this.loadScalar(d, 0)
      } else {
        this.loadScalar(d, b.base + this.address(x.idx, d, x.buf))
      }
      return this.define(x)
    }
    if (x.mode === 'contiguous' && d.isBool && !x.gate) {
      // 4 bool bytes -> 4 lanes of 0 or -1 (a lane mask): load32_zero, widen u8 -> u16 -> u32, negate
      this.c.vmem(0x5c, 0, b.base + this.address(x.idx, d, x.buf))
      this.c.simd(0x89).simd(0xa9).simd(0xa1)
      return this.define(x)
    }
    if (x.mode === 'contiguous' && d.size === 1) {
      // 8-bit lanes (linearize.js NARROW_LANE_DTYPES; never gated): 4 bytes, widened to one i32 per lane
      const signed = !d.isUnsigned
      this.c.vmem(0x5c, 0, b.base + this.address(x.idx, d, x.buf)) // v128.load32_zero
      this.c.simd(signed ? 0x87 : 0x89) // i16x8.extend_low_i8x16_s/u
      this.c.simd(signed ? 0xa7 : 0xa9) // i32x4.extend_low_i16x8_s/u
      return this.define(x)
    }
    if (x.mode === 'contiguous' && (!x.gate || x.gate.lanes === 1)) {
      if (x.gate && this.gatedAddr.has(x.id)) {
        this.c.get(this.gatedAddr.get(x.id))
        this.c.vmem(0x00, 0, 0)
      } else if (x.gate) {
        // as a scalar's: 16 zero bytes at address 0 where the gate is off
        const extra = this.address(x.idx, d, x.buf) + b.base
        if (extra) this.c.i32(extra).op(0x6a)
        this.c.i32(0)
        this.push(x.gate).op(0x1b)
        this.c.vmem(0x00, 0, 0)
      } else {
        const extra = this.address(x.idx, d, x.buf)
        this.c.vmem(0x00, 0, b.base + extra)
      }
      return this.define(x)
    }
    if (x.mode === 'strided' && !x.gate) {
      this.stridedLoad(x)
      return this.define(x)
    }
    // a gather (or a contiguous or strided load with lane gates): lane by lane
    const out = this.hold(x, this.alloc(T.v128))
    // a contiguous or strided load whose lanes' gates all hold (a padded window's interior, along the output
    // row) is one vector load (or two and a shuffle); only the border's loads go lane by lane
    const whole = (x.mode === 'contiguous' || x.mode === 'strided') && !x.check
    if (whole) {
      this.push(x.gate).simd(0xa3).byte(0x04, 0x40) // i32x4.all_true; if
      if (x.mode === 'strided') {
        this.stridedLoad(x)
      } else {
        const extra = this.address(x.idx, d, x.buf)
        this.c.vmem(0x00, 0, b.base + extra)
      }
      this.c.set(out)
      this.c.byte(0x05) // else
    }
    this.c.v128const(new Uint8Array(16)).set(out)
    for (let lane = 0; lane < x.lanes; lane++) {
      const gated = !!x.gate
      if (gated) this.laneOf(x.gate, lane, true).byte(0x04, 0x40)
      if (x.check) {
        this.laneIdx(x, lane)
        this.c.i32(b.size).op(0x4f).byte(0x04, 0x40, 0x00, 0x0b)
      }
      this.c.get(out)
      this.laneIdx(x, lane)
      const s = LOG2[d.size]
      if (s) this.c.i32(s).op(0x74)
      this.loadScalar(d, b.base)
      this.c.simd(d.isFloat ? 0x20 : 0x1c).byte(lane) // replace_lane
      this.c.set(out)
      if (gated) this.c.byte(0x0b)
    }
    if (whole) this.c.byte(0x0b)
    return out
  }

  /** Push the 4 lanes of a stride-2 load of 32-bit elements idx, idx+2, idx+4, idx+6: lanes 0 and 2 of the
   * vector at idx, then lanes 1 and 3 of the one at idx+3 (so no element past idx+6 is read). */
  stridedLoad (x) {
    const b = this.buf(x.buf)
    const extra = this.address(x.idx, x.dtype, x.buf)
    const at = this.temp(T.i32)
    this.c.tee(at).vmem(0x00, 0, b.base + extra)
    this.c.get(at).vmem(0x00, 0, b.base + extra + 3 * 4)
    this.c.simd(0x0d)
    for (const lane of [0, 2, 5, 7]) for (let k = 0; k < 4; k++) this.c.byte(lane * 4 + k)
  }

  laneIdx (x, lane) {
    // the element index of a lane of an access: idx + lane (contiguous), idx + 2 lane (strided) or lane
    // `lane` of idx (gather)
    if (x.mode === 'contiguous' || x.mode === 'strided') {
      this.push(x.idx)
      if (x.idx.dtype.wasm === 'i64') this.c.op(0xa7)
      if (lane) this.c.i32(x.mode === 'strided' ? 2 * lane : lane).op(0x6a)
    } else {
      this.push(x.idx).simd(0x1b).byte(lane)
    }
  }

  laneOf (v, lane, asBool) {
    // push lane `lane` of vector v as a scalar (bool lanes: 0/1 when asBool)
    this.push(v)
    const d = v.dtype
    if (d.isBool) {
      this.c.simd(0x1b).byte(lane)
      if (asBool) this.c.i32(0).op(0x47)
    } else {
      this.c.simd(d.isFloat ? 0x1f : 0x1b).byte(lane)
    }
    return this.c
  }

  loadScalar (d, base) {
    this.c.mem(LOAD[d.name], LOG2[d.size], base)
    if (d.name === 'float16') this.halfToFloat()
    else if (d.name === 'bfloat16') this.call(this.h.b2f)
    else if (d.isBool) this.c.i32(0).op(0x47) // bytes other than 0/1 still read as a bool
  }

  storeScalar (d, base) {
    if (d.name === 'float16') this.call(this.h.f2h)
    else if (d.name === 'bfloat16') this.call(this.h.f2b)
    this.c.mem(STORE[d.name], LOG2[d.size], base)
  }

  call (f) {
    this.c.byte(0x10).u32(f)
  }

  /**
   * float16 bits (an i32 on the stack) -> float32, in line and without branches (the h2f helper's values: a
   * quantized block's scale is one per 32 weights, a call and two branches each): the exponent and mantissa
   * shifted into a float32's, times 2^112 (exact: a normal rebased, a subnormal's float32 denormal made the
   * normal it stands for), an exponent of 31 (inf, NaN: payload kept) selected to 255, then the sign.
   */
  halfToFloat () {
    const c = this.c
    const h = this.temp(T.i32)
    const m = this.temp(T.i32)
    c.tee(h).i32(0x7fff).op(0x71).i32(13).op(0x74).tee(m) // (h & 0x7fff) << 13
    c.i32(0x7f800000).op(0x72) // inf or NaN: exponent 255, the payload kept
    c.get(m).op(0xbe).f32c(2 ** 112).op(0x94).op(0xbc) // f32.reinterpret, * 2^112, i32.reinterpret
    c.get(m).i32(0x7c00 << 13).op(0x4f) // i32.ge_u: an exponent of 31
    c.op(0x1b) // select
    c.get(h).i32(0x8000).op(0x71).i32(16).op(0x74).op(0x72).op(0xbe) // | sign << 16, f32.reinterpret
  }

  emitStore (x) {
    const d = x.dtype
    const b = this.buf(x.buf)
    const v = x.src[0]
    if (x.lanes === 1) {
      if (x.check) this.boundsCheck(x.idx, x.buf, 1)
      const extra = this.address(x.idx, d, x.buf)
      this.push(v)
      this.storeScalar(d, b.base + extra)
      return
    }
    if (x.mode === 'contiguous' && !x.gate) {
      if (x.check) this.boundsCheck(x.idx, x.buf, x.lanes)
      const extra = this.address(x.idx, d, x.buf)
      this.push(v)
      this.c.vmem(0x0b, 0, b.base + extra)
      return
    }
    // a contiguous store whose lanes' gates all hold (every tile but the last of lanes over a Variable's range,
    // lower.js symbolicTiles) is one vector store; only the last tile's lanes go one by one
    const whole = x.mode === 'contiguous' && x.gate && !x.check
    if (whole) {
      this.push(x.gate).simd(0xa3).byte(0x04, 0x40) // i32x4.all_true; if
      const extra = this.address(x.idx, d, x.buf)
      this.push(v)
      this.c.vmem(0x0b, 0, b.base + extra)
      this.c.byte(0x05) // else
      this.stats.wholeGatedStores++
    }
    for (let lane = 0; lane < x.lanes; lane++) {
      if (x.gate) this.laneOf(x.gate, lane, true).byte(0x04, 0x40)
      if (x.check) {
        this.laneIdx(x, lane)
        this.c.i32(b.size).op(0x4f).byte(0x04, 0x40, 0x00, 0x0b)
      }
      this.laneIdx(x, lane)
      const s = LOG2[d.size]
      if (s) this.c.i32(s).op(0x74)
      this.laneOf(v, lane, true)
      this.storeScalar(d, b.base)
      if (x.gate) this.c.byte(0x0b)
    }
    if (whole) this.c.byte(0x0b)
  }

  // ---- arithmetic
  emitBcast (x) {
    const s = x.src[0]
    const d = x.dtype
    if (this.splattable(x)) {
      const extra = this.address(s.idx, d, s.buf)
      this.c.vmem(0x09, 2, this.buf(s.buf).base + extra) // v128.load32_splat
      return this.define(x)
    }
    if (d.isBool) {
      this.c.i32(0)
      this.push(s)
      this.c.op(0x6b).simd(0x11)
    } else {
      this.push(s)
      this.c.simd(d.isFloat ? 0x13 : 0x11)
    }
    return this.define(x)
  }

  emitAlu (x) {
    this.emitting = x.id
    if (x.lanes > 1) this.vectorAlu(x.op, x.dtype, x.src[0].dtype, x.src)
    else this.scalarAlu(x.op, x.dtype, x.src[0].dtype, x.src)
    return this.define(x)
  }

  roundHalf (d) {
    if (d.name === 'float16') this.call(this.h.roundH)
    else if (d.name === 'bfloat16') this.call(this.h.roundB)
  }

  wrapNarrow (d) {
    if (d.isBool || d.bits >= 32) return
    if (d.isUnsigned) this.c.i32(d.bits === 8 ? 0xff : 0xffff).op(0x71)
    else this.c.op(d.bits === 8 ? 0xc0 : 0xc1)
  }

  scalarAlu (op, d, s, src) {
    const c = this.c
    const P = (i) => this.push(src[i])
    if (op === 'CAST') return this.cast(s, d, () => P(0))
    if (op === 'BITCAST') return this.bitcast(s, d, () => P(0))
    if (op === 'WHERE') {
      if (d.wasm === 'f32' && !this.prog.selectBranches) return this.selectF32(() => P(1), () => P(2), () => P(0))
      P(1); P(2); P(0)
      c.op(0x1b)
      return
    }
    const t = s.wasm
    if (op === 'CMPLT' || op === 'CMPLE' || op === 'CMPNE' || op === 'CMPEQ') {
      P(0); P(1)
      const u = s.isUnsigned || s.isBool
      const codes = {
        i32: { CMPLT: u ? 0x49 : 0x48, CMPLE: u ? 0x4d : 0x4c, CMPNE: 0x47, CMPEQ: 0x46 },
        i64: { CMPLT: u ? 0x54 : 0x53, CMPLE: u ? 0x58 : 0x57, CMPNE: 0x52, CMPEQ: 0x51 },
        f32: { CMPLT: 0x5d, CMPLE: 0x5f, CMPNE: 0x5c, CMPEQ: 0x5b },
        f64: { CMPLT: 0x63, CMPLE: 0x65, CMPNE: 0x62, CMPEQ: 0x61 }
      }
      c.op(codes[t][op])
      return
    }
    if (d.isBool) {
      switch (op) {
        case 'ADD': case 'OR': case 'MAX': P(0); P(1); c.op(0x72); return
        case 'MUL': case 'AND': P(0); P(1); c.op(0x71); return
        case 'XOR': P(0); P(1); c.op(0x73); return
        case 'NEG': P(0); c.op(0x45); return
        case 'TRUNC': P(0); return
      }
      throw new KernelError(`no rule for ${op} on bool`)
    }
    if (d.isFloat) {
      const w = d.wasm === 'f64'
      switch (op) {
        case 'ADD': P(0); P(1); c.op(w ? 0xa0 : 0x92); break
        case 'MUL': P(0); P(1); c.op(w ? 0xa2 : 0x94); break
        case 'FDIV': P(0); P(1); c.op(w ? 0xa3 : 0x95); break
        case 'NEG': P(0); c.op(w ? 0x9a : 0x8c); return
        case 'SQRT': P(0); c.op(w ? 0x9f : 0x91); break
        case 'TRUNC': P(0); c.op(w ? 0x9d : 0x8f); return
        case 'RECIPROCAL': if (w) c.f64c(1); else c.f32c(1); P(0); c.op(w ? 0xa3 : 0x95); break
        case 'MAX':
          // (a != a || a > b) ? a : b
          if (!w && !this.prog.selectBranches) {
            this.selectF32(() => P(0), () => P(1), () => { P(0); P(0); c.op(0x5c); P(0); P(1); c.op(0x5e); c.op(0x72) })
            return
          }
          P(0); P(1); P(0); P(0); c.op(w ? 0x62 : 0x5c); P(0); P(1); c.op(w ? 0x64 : 0x5e); c.op(0x72).op(0x1b) // ne, gt
          return
        case 'MOD': case 'POW': {
          const f = op === 'MOD' ? this.imp.fmod : this.imp.pow
          P(0); if (!w) c.op(0xbb); P(1); if (!w) c.op(0xbb)
          this.call(f)
          if (!w) c.op(0xb6)
          break
        }
        case 'FMA':
          for (let i = 0; i < 3; i++) { P(i); if (!w) c.op(0xbb) }
          this.call(w ? this.imp.fma64 : this.imp.fma32)
          if (!w) c.op(0xb6)
          break
        default:
          throw new KernelError(`no rule for ${op} on ${d.name}`)
      }
      this.roundHalf(d)
      return
    }
    const w = d.wasm === 'i64'
    const u = d.isUnsigned
    const I = (a, b) => (w ? b : a)
    const one = () => (w ? c.i64(1) : c.i32(1))
    const zero = () => (w ? c.i64(0) : c.i32(0))
    switch (op) {
      case 'ADD': P(0); P(1); c.op(I(0x6a, 0x7c)); break
      case 'MUL': P(0); P(1); c.op(I(0x6c, 0x7e)); break
      case 'NEG': zero(); P(0); c.op(I(0x6b, 0x7d)); break
      case 'AND': P(0); P(1); c.op(I(0x71, 0x83)); return
      case 'OR': P(0); P(1); c.op(I(0x72, 0x84)); return
      case 'XOR': P(0); P(1); c.op(I(0x73, 0x85)); return
      case 'SHL': P(0); P(1); c.op(I(0x74, 0x86)); break
      case 'SHR': P(0); P(1); c.op(u ? I(0x76, 0x88) : I(0x75, 0x87)); return
      case 'TRUNC': P(0); return
      case 'MAX': P(0); P(1); P(0); P(1); c.op(u ? I(0x4b, 0x56) : I(0x4a, 0x55)).op(0x1b); return
      case 'FMA': P(0); P(1); c.op(I(0x6c, 0x7e)); P(2); c.op(I(0x6a, 0x7c)); break
      case 'IDIV': case 'MOD': {
        // divisor 0 -> 1; a signed quotient by -1 is the negation (no INT_MIN / -1 trap)
        const eq = I(0x46, 0x51)
        const minus1 = () => (w ? c.i64(-1) : c.i32(-1))
        const divisor = (signedDiv) => {
          one(); P(1); P(1); zero(); c.op(eq)
          if (signedDiv) { P(1); minus1(); c.op(eq); c.op(0x72) }
          c.op(0x1b)
        }
        if (op === 'IDIV' && !u) {
          zero(); P(0); c.op(I(0x6b, 0x7d))
          P(0); divisor(true); c.op(I(0x6d, 0x7f))
          P(1); minus1(); c.op(eq)
          c.op(0x1b)
          break
        }
        P(0); divisor(false)
        c.op(op === 'IDIV' ? I(0x6e, 0x80) : (u ? I(0x70, 0x82) : I(0x6f, 0x81)))
        break
      }
      default:
        throw new KernelError(`no rule for ${op} on ${d.name}`)
    }
    this.wrapNarrow(d)
  }

  /**
   * cond ? a : b for float32 without a branch: V8 compiles a float `select` to a compare and jump, which a
   * ReLU over mixed signs (a tile's epilogue) mispredicts about half the time. The bits instead:
   * b ^ ((a ^ b) & -cond). pushCond pushes an i32 0/1. A program with `selectBranches` (the few-rows
   * variant, runtime.js) keeps wasm's select: measured at batch 1, its branch is the faster one there.
   */
  selectF32 (pushA, pushB, pushCond) {
    const c = this.c
    this.stats.bitSelects++
    const bb = this.temp(T.i32)
    pushB(); c.op(0xbc).set(bb) // i32.reinterpret_f32
    c.get(bb)
    pushA(); c.op(0xbc).get(bb).op(0x73) // a ^ b
    c.i32(0); pushCond(); c.op(0x6b) // -cond
    c.op(0x71).op(0x73).op(0xbe) // & , ^ , f32.reinterpret_i32
  }

  cast (s, d, pushSrc) {
    const c = this.c
    pushSrc()
    if (d.isBool) {
      if (s.isBool) return
      if (s.wasm === 'i32') c.i32(0).op(0x47)
      else if (s.wasm === 'i64') c.i64(0).op(0x52)
      else if (s.wasm === 'f32') c.f32c(0).op(0x5c)
      else c.f64c(0).op(0x62)
      return
    }
    if (d.isFloat) {
      const to64 = d.wasm === 'f64'
      if (s.isFloat) {
        if (s.wasm === 'f64' && !to64) c.op(0xb6)
        else if (s.wasm === 'f32' && to64) c.op(0xbb)
      } else if (s.wasm === 'i64') {
        c.op(to64 ? (s.isUnsigned ? 0xba : 0xb9) : (s.isUnsigned ? 0xb5 : 0xb4))
      } else {
        const unsigned = s.isUnsigned || s.isBool
        c.op(to64 ? (unsigned ? 0xb8 : 0xb7) : (unsigned ? 0xb3 : 0xb2))
      }
      this.roundHalf(d)
      return
    }
    // to an integer
    if (s.isFloat) {
      if (d.wasm === 'i32' && d.bits === 32 && !d.isUnsigned) {
        c.sat(s.wasm === 'f64' ? 2 : 0) // i32.trunc_sat_fXX_s
      } else {
        c.sat(s.wasm === 'f64' ? 6 : 4) // i64.trunc_sat_fXX_s
        if (d.wasm === 'i32') c.op(0xa7)
      }
    } else if (s.wasm === 'i32' && d.wasm === 'i64') {
      c.op(s.isUnsigned || s.isBool ? 0xad : 0xac)
    } else if (s.wasm === 'i64' && d.wasm === 'i32') {
      c.op(0xa7)
    }
    this.wrapNarrow(d)
  }

  bitcast (s, d, pushSrc) {
    const c = this.c
    pushSrc()
    if (s.half) this.call(s.name === 'float16' ? this.h.f2h : this.h.f2b)
    else if (s.isFloat) c.op(s.wasm === 'f64' ? 0xbd : 0xbc)
    // now the bits are an integer of the source width
    if (d.half) {
      if (d.name === 'float16') this.halfToFloat()
      else this.call(this.h.b2f)
    } else if (d.isFloat) {
      c.op(d.wasm === 'f64' ? 0xbf : 0xbe)
    } else {
      this.wrapNarrow(d)
    }
  }

  vectorAlu (op, d, s, src) {
    const c = this.c
    const P = (i) => this.push(src[i])
    if (op === 'WHERE') {
      const clamp = this.clamps && this.clamps.get(this.emitting)
      if (clamp) { // a < b ? a : b  is  pmin(b, a);  a < b ? b : a  is  pmax(a, b) (clampSelects)
        const [a, b] = src[0].src
        if (clamp === 0xea) { this.push(b); this.push(a) } else { this.push(a); this.push(b) }
        c.simd(clamp)
        this.stats.clampSelects++
        return
      }
      const zero = (v) => v.k === 'bcast' && v.src[0].k === 'const' && Object.is(Number(v.src[0].value), 0) && !v.dtype.isBool
      if (zero(src[1])) { P(2); P(0); c.simd(0x4f); return } // cond ? +0 : x  is  x & ~cond
      if (zero(src[2])) { P(1); P(0); c.simd(0x4e); return } // cond ? x : +0  is  x & cond
      P(1); P(2); P(0); c.simd(0x52)
      return
    }
    if (op === 'CAST') {
      P(0)
      if (d.isBool) {
        if (s.isBool) return
        c.v128const(new Uint8Array(16)).simd(s.isFloat ? 0x42 : 0x38) // ne 0
        return
      }
      if (s.isBool) {
        c.v128const(this.laneBytes(d.isFloat ? { isBool: false, isFloat: false } : d, [1, 1, 1, 1])).simd(0x4e)
        if (d.isFloat) c.simd(0xfa)
        return
      }
      if (d.isFloat && !s.isFloat) c.simd(s.isUnsigned ? 0xfb : 0xfa)
      else if (!d.isFloat && s.isFloat) c.simd(0xf8) // i32x4.trunc_sat_f32x4_s
      return
    }
    if (op === 'BITCAST') {
      P(0)
      // 8-bit lanes hold their value extended to 32 bits: uint8 -> int8 sign-extends the low byte, int8 -> uint8
      // keeps it
      if (d.size === 1 && d.isUnsigned) c.v128const(this.laneBytes({ isBool: false, isFloat: false }, [255, 255, 255, 255])).simd(0x4e)
      else if (d.size === 1) c.i32(24).simd(0xab).i32(24).simd(0xac) // i32x4.shl, i32x4.shr_s
      return
    }
    if (op === 'CMPLT' || op === 'CMPLE' || op === 'CMPNE' || op === 'CMPEQ') {
      if (s.isBool) {
        if (op === 'CMPLT') { P(1); P(0); c.simd(0x4f); return } // b & ~a
        if (op === 'CMPLE') { P(0); P(1); c.simd(0x4f).simd(0x4d); return } // ~(a & ~b)
        P(0); P(1); c.simd(0x51)
        if (op === 'CMPEQ') c.simd(0x4d)
        return
      }
      P(0); P(1)
      if (s.isFloat) c.simd({ CMPLT: 0x43, CMPLE: 0x45, CMPNE: 0x42, CMPEQ: 0x41 }[op])
      else c.simd({ CMPLT: s.isUnsigned ? 0x3a : 0x39, CMPLE: s.isUnsigned ? 0x3e : 0x3d, CMPNE: 0x38, CMPEQ: 0x37 }[op])
      return
    }
    if (d.isBool) {
      switch (op) {
        case 'ADD': case 'OR': case 'MAX': P(0); P(1); c.simd(0x50); return
        case 'MUL': case 'AND': P(0); P(1); c.simd(0x4e); return
        case 'XOR': P(0); P(1); c.simd(0x51); return
        case 'NEG': P(0); c.simd(0x4d); return
      }
      throw new KernelError(`no lane rule for ${op} on bool`)
    }
    if (d.isFloat) {
      switch (op) {
        case 'ADD': P(0); P(1); c.simd(0xe4); return
        case 'MUL': P(0); P(1); c.simd(0xe6); return
        case 'FDIV': P(0); P(1); c.simd(0xe7); return
        case 'NEG': P(0); c.simd(0xe1); return
        case 'SQRT': P(0); c.simd(0xe3); return
        case 'TRUNC': P(0); c.simd(0x69); return
        case 'RECIPROCAL': c.v128const(this.laneBytes(d, [1, 1, 1, 1])); P(0); c.simd(0xe7); return
        case 'MAX':
          P(0); P(1)
          P(0); P(0); c.simd(0x42); P(0); P(1); c.simd(0x44); c.simd(0x50)
          c.simd(0x52)
          return
      }
      throw new KernelError(`no lane rule for ${op} on ${d.name}`)
    }
    if (op === 'ADD' && d.size === 1) {
      // 8-bit lanes hold their value extended to 32 bits (linearize.js narrowAlu): the sum wrapped to 8 bits
      P(0); P(1); c.simd(0xae)
      if (d.isUnsigned) c.v128const(this.laneBytes({ isBool: false, isFloat: false }, [255, 255, 255, 255])).simd(0x4e)
      else c.i32(24).simd(0xab).i32(24).simd(0xac) // i32x4.shl, i32x4.shr_s
      return
    }
    switch (op) {
      case 'ADD': P(0); P(1); c.simd(0xae); return
      case 'MUL': P(0); P(1); c.simd(0xb5); return
      case 'NEG': P(0); c.simd(0xa1); return
      case 'AND': P(0); P(1); c.simd(0x4e); return
      case 'OR': P(0); P(1); c.simd(0x50); return
      case 'XOR': P(0); P(1); c.simd(0x51); return
      case 'SHL': P(0); P(1); c.simd(0xab); return
      case 'SHR': P(0); P(1); c.simd(d.isUnsigned ? 0xad : 0xac); return
      case 'TRUNC': P(0); return
      case 'MAX': P(0); P(1); P(0); P(1); c.simd(d.isUnsigned ? 0x3c : 0x3b); c.simd(0x52); return
    }
    throw new KernelError(`no lane rule for ${op} on ${d.name}`)
  }

  // ---- accumulators
  emitUpdate (x) {
    const acc = this.val.get(x.acc.id).local
    const d = x.acc.dtype
    const v = x.src[0]
    const accRef = { id: -1 - x.acc.id, dtype: d, lanes: x.acc.lanes, k: 'accref' }
    this.val.set(accRef.id, { local: acc })
    if (x.fold) {
      for (let lane = 0; lane < v.lanes; lane++) {
        const laneRef = { id: -1000000 - x.id * 8 - lane, dtype: d, lanes: 1 }
        this.laneOf(v, lane, true)
        const l = this.temp(SCALAR(d))
        this.c.set(l)
        this.val.set(laneRef.id, { local: l })
        this.scalarAlu(x.op, d, d, [accRef, laneRef])
        this.c.set(acc)
      }
      return
    }
    if (this.fused.has(v.id)) {
      // acc + a * b in one relaxed multiply-add (fused or not, as the engine's hardware does it)
      this.push(v.src[0])
      this.push(v.src[1])
      this.c.get(acc).simd(0x105) // f32x4.relaxed_madd
      this.stats.fusedMadds++
    } else if (x.lanes > 1) {
      this.vectorAlu(x.op, d, d, [accRef, v])
    } else {
      this.scalarAlu(x.op, d, d, [accRef, v])
    }
    this.c.set(acc)
  }

  /**
   * The float32 x4 products that an accumulator's ADD update alone reads (a matrix product's or a
   * convolution's step), each emitted inside its update as one relaxed_madd: only with `fma`, and only where
   * the update follows its product in the same block (both run equally often).
   */
  fusedProducts () {
    const fused = new Set()
    if (!this.fma) return fused
    const walk = (insts) => {
      const here = new Set()
      const products = []
      for (const x of insts) {
        here.add(x.id)
        if (x.k === 'loop') { walk(x.pre); walk(x.body) }
        if (x.k === 'if') walk(x.body)
        if (x.k !== 'update' || x.fold || x.op !== 'ADD' || x.lanes !== 4 || x.acc.dtype.name !== 'float32') continue
        const v = x.src[0]
        if (v.k === 'alu' && v.op === 'MUL' && v.lanes === 4 && v.dtype.name === 'float32' && here.has(v.id) &&
            this.uses.get(v.id) === 1) products.push(v)
      }
      // a one-row x @ W tile (a decode step's: a broadcast row value times FEW_CHAINS column vectors or fewer)
      // waits on each accumulator's chain, and a multiply-add's latency is longer than an add's: unfused,
      // GPT-2 small's decode matvecs took 0.9x the time in Chromium (3072 columns 48.5 us against 54.0 a cache-
      // resident slice, Zen 4; the head's x @ W.T, two streamed vectors a step, keeps its multiply-adds)
      const rowTimesColumns = products.length <= FEW_CHAINS && products.every((v) => v.src.some((s) => s.k === 'bcast'))
      if (!rowTimesColumns) for (const v of products) fused.add(v.id)
    }
    walk(this.prog.head)
    walk(this.prog.body)
    return fused
  }

  /**
   * A scalar uint16 `lo | hi << 8` of two byte loads of one buffer, hi's address lo's + 1, each read only there (a
   * quantized block's float16 scale from its two bytes, nn/quant.py): one i32.load16_u at lo's address
   * (emitHalfBits; both bytes in bounds as the two loads were), the byte loads, widenings and shift not emitted.
   * Sets this.halves (OR id -> lo's load) and this.skipped (the instructions it replaces).
   */
  halfBits () {
    this.halves = new Map()
    this.skipped = new Set()
    const once = (v) => this.uses.get(v.id) === 1
    const byteLoad = (v) => {
      if (v.k !== 'alu' || v.op !== 'CAST' || v.lanes !== 1 || v.dtype.name !== 'uint16' || !once(v)) return null
      const l = v.src[0]
      return l.k === 'load' && l.lanes === 1 && l.dtype.name === 'uint8' && !l.gate && !l.check && once(l) && l.idx.lanes === 1 && l.idx.dtype.wasm === 'i32' ? l : null
    }
    const next = (a, b) => b.k === 'alu' && b.op === 'ADD' && b.lanes === 1 && b.src.some((v) => v === a) &&
      b.src.some((v) => v.k === 'const' && Number(v.value) === 1)
    const walk = (insts) => {
      for (const x of insts) {
        if (x.k === 'loop') { walk(x.pre); walk(x.body) }
        if (x.k === 'if') walk(x.body)
        if (x.k !== 'alu' || x.op !== 'OR' || x.lanes !== 1 || x.dtype.name !== 'uint16') continue
        const [a, b] = x.src
        const lo = byteLoad(a)
        if (!lo || b.k !== 'alu' || b.op !== 'SHL' || !once(b) || b.src[1].k !== 'const' || Number(b.src[1].value) !== 8) continue
        const hi = byteLoad(b.src[0])
        if (!hi || hi.buf !== lo.buf || !next(lo.idx, hi.idx)) continue
        this.halves.set(x.id, lo)
        for (const v of [a, b, b.src[0]]) this.skipped.add(v.id)
        this.uses.set(lo.id, 0)
        this.uses.set(hi.id, 0)
      }
    }
    walk(this.prog.head)
    walk(this.prog.body)
  }

  /**
   * A float32 lane select on a comparison of its own two values, the comparison read only there: `a < b ? a : b`
   * becomes f32x4.pmin(b, a) and `a < b ? b : a` f32x4.pmax(a, b), which wasm defines as exactly those selects
   * (NaNs and signed zeros included: bits unchanged), one instruction (minps, maxps on x64) where the comparison
   * and v128.bitselect took four or five. The exp2 decomposition's range clamps are such selects (GPT-2's tanh
   * GELU holds four an element). Sets this.clamps (WHERE id -> pmin or pmax opcode); the comparisons join
   * this.skipped (call after halfBits).
   */
  clampSelects () {
    this.clamps = new Map()
    const walk = (insts) => {
      for (const x of insts) {
        if (x.k === 'loop') { walk(x.pre); walk(x.body) }
        if (x.k === 'if') walk(x.body)
        if (x.k !== 'alu' || x.op !== 'WHERE' || x.lanes !== 4 || x.dtype.name !== 'float32') continue
        const cmp = x.src[0]
        if (cmp.k !== 'alu' || cmp.op !== 'CMPLT' || cmp.lanes !== 4 || cmp.src[0].dtype.name !== 'float32') continue
        if (this.uses.get(cmp.id) !== 1 || this.fused.has(cmp.id) || this.halves.has(cmp.id)) continue
        const [a, b] = cmp.src
        const op = x.src[1] === a && x.src[2] === b ? 0xea : x.src[1] === b && x.src[2] === a ? 0xeb : 0
        if (!op) continue
        this.clamps.set(x.id, op)
        this.skipped.add(cmp.id)
      }
    }
    walk(this.prog.head)
    walk(this.prog.body)
  }

  emitHalfBits (x) {
    const lo = this.halves.get(x.id)
    const extra = this.address(lo.idx, lo.dtype, lo.buf)
    this.c.mem(0x2f, 0, this.buf(lo.buf).base + extra) // i32.load16_u
    this.stats.halfLoads++
    return this.define(x)
  }

  /** hsum: lane j = init + ((a_j[0] + a_j[1]) + (a_j[2] + a_j[3])) of the four vectors a_0..a_3 (a 4 x 4
   * transpose folded with adds: six two-input shuffles and four adds for four sums). `init` is a scalar
   * constant (the reduce's identity), emitted in place as a v128.const rather than kept in a local. */
  emitHsum (x) {
    const [init, ...parts] = x.src
    if (parts.length !== 4) throw new KernelError(`internal: hsum of ${parts.length} vectors`)
    const add = x.dtype.isFloat ? 0xe4 : 0xae
    const EVEN = [0, 2, 4, 6]
    const ODD = [1, 3, 5, 7]
    const shuffle = (lanes) => {
      this.c.simd(0x0d)
      for (const l of lanes) for (let b = 0; b < 4; b++) this.c.byte(l * 4 + b)
    }
    // pairs[i] = [a_2i even + odd, a_2i+1 even + odd]: lanes (a_2i[01], a_2i[23], a_2i+1[01], a_2i+1[23])
    const pair = (a, b) => {
      this.push(a); this.push(b); shuffle(EVEN)
      this.push(a); this.push(b); shuffle(ODD)
      this.c.simd(add)
      const l = this.temp(T.v128)
      this.c.set(l)
      return l
    }
    const lo = pair(parts[0], parts[1])
    const hi = pair(parts[2], parts[3])
    if (init.k !== 'const' || init.lanes !== 1) throw new KernelError('internal: hsum starts from a scalar constant')
    this.c.v128const(this.laneBytes(x.dtype, [init.value, init.value, init.value, init.value]))
    this.c.get(lo).get(hi); shuffle(EVEN)
    this.c.get(lo).get(hi); shuffle(ODD)
    this.c.simd(add).simd(add)
    return this.define(x)
  }

  // ---- int8 dot products (linearize.js dotReduce)
  /**
   * A dot4 operand's 16 bytes, lane j's 4 points together (byte 4j + k): a load's 4 bytes at each point k
   * (v128.load32_zero, then load32_lane into lane k: exactly the bytes the loop reads), or 4 points' values in
   * 32-bit lanes narrowed (in range: no saturation); then transposed from point-major (4k + j) by one shuffle.
   */
  emitBytes (x) {
    const c = this.c
    const v = this.temp(T.v128)
    if (x.buf !== null) {
      const b = this.buf(x.buf)
      const at = this.temp(T.i32)
      const extra = this.address(x.src[0], { size: 1 }, x.buf)
      c.set(at)
      x.offsets.forEach((off, k) => {
        c.get(at)
        if (k === 0) c.vmem(0x5c, 0, b.base + extra + off) // v128.load32_zero
        else c.get(v).vmem(0x56, 0, b.base + extra + off).byte(k) // v128.load32_lane k
        c.set(v)
      })
    } else {
      const [p0, p1, p2, p3] = x.src
      this.push(p0); this.push(p1); c.simd(0x85) // i16x8.narrow_i32x4_s
      this.push(p2); this.push(p3); c.simd(0x85)
      c.simd(x.dtype.isUnsigned ? 0x66 : 0x65).set(v) // i8x16.narrow_i16x8_u/s
    }
    // from point-major (4k + j) to lane j at point k in byte 4j + k (relaxed SIMD's dot), or in byte 8h + 2j + m
    // for k = 2h + m (the standard-SIMD one's pairs, x.pairs)
    const order = new Array(16)
    for (let k = 0; k < 4; k++) for (let j = 0; j < 4; j++) order[x.pairs ? 8 * (k >> 1) + 2 * j + (k & 1) : 4 * j + k] = 4 * k + j
    c.get(v).get(v).simd(0x0d)
    for (const i of order) c.byte(i)
    // an offset on every byte (in range: linearize.js dotOf), i8x16.add
    if (x.add) c.v128const(new Uint8Array(16).fill(x.add & 255)).simd(0x6e)
    return this.define(x)
  }

  /** 16 bytes at a byte address (linearize.js pairOperand), v128.load. */
  emitRaw16 (x) {
    const b = this.buf(x.buf)
    const extra = this.address(x.src[0], { size: 1 }, x.buf)
    this.c.vmem(0x00, 0, b.base + extra + x.off)
    return this.define(x)
  }

  /**
   * Lane j = the sum of the products of a's and b's bytes 4j..4j+3 (a signed, b in [0, 127]: exact on x86's
   * unsigned and Arm's signed readings of the second operand alike): i32x4.relaxed_dot_i8x16_i7x16_add_s. An
   * offset c of b (a Q4_0 nibble's -8) adds c x the sum of a's bytes (a dot with ones).
   */
  emitDot4 (x) {
    const c = this.c
    const [a, b] = x.src
    if (x.signs) return this.emitDot4Lanes(x)
    const zero = () => c.v128const(new Uint8Array(16))
    const dot = () => { c.simd(0x113); this.stats.int8Dots++ }
    this.push(a); this.push(b); zero(); dot()
    if (x.offset) {
      this.push(a); c.v128const(new Uint8Array(16).fill(1)); zero(); dot()
      c.v128const(this.laneBytes({ isBool: false, isFloat: false }, [x.offset, x.offset, x.offset, x.offset]))
      c.simd(0xb5).simd(0xae) // i32x4.mul, add
    }
    return this.define(x)
  }

  /**
   * A rowDotReduce operand's bytes (linearize.js rowBytes): lane j's 4 bytes at byte 4j, one 4-byte load a
   * lane at the lane's address (v128.load32_zero, then load32_lane; load32_splat where the lanes share it).
   */
  emitRowBytes (x) {
    const c = this.c
    const b = this.buf(x.buf)
    const extra = b.base + this.address(x.src[0], { size: 1 }, x.buf)
    if (x.lane === 0) {
      c.vmem(0x09, 0, extra) // v128.load32_splat
      return this.define(x)
    }
    const at = this.temp(T.i32)
    const v = this.temp(T.v128)
    c.set(at)
    for (let j = 0; j < 4; j++) {
      c.get(at)
      if (j === 0) c.vmem(0x5c, 0, extra) // v128.load32_zero
      else c.get(v).vmem(0x56, 0, extra + j * x.lane).byte(j) // v128.load32_lane j
      c.set(v)
    }
    c.get(v)
    return this.define(x)
  }

  /** 16-bit lanes of one half of 16 bytes (linearize.js pairHalves): i16x8.extend_low/high_i8x16_s/u, or
   * (x.spread) the same values by an interleave and a shift (widen16). */
  emitWiden (x) {
    this.widen16(x.src[0], x.signed, x.high, x.spread)
    return this.define(x)
  }

  /**
   * One half of v's 16 bytes as 16-bit lanes, extended by sign (signed) or with zeros, on the stack. `spread`:
   * each byte interleaved with itself (i8x16.shuffle, one unpack instruction) and shifted right by 8 in its
   * 16-bit lane (i16x8.shr_s/u), the same values as i16x8.extend_*_i8x16. Every i32x4.dot_i16x8_s of two
   * bytes vectors takes one operand this way: V8 in Chromium (not Node 20's) rewrites a dot of two extends as
   * a 16-bit multiply and a pairwise add (an extra multiply and a constant load per dot, the activations
   * widened again for each column): GPT-2 small's Q4_0 decode block loop 148 x86 instructions against 128
   * (Node 20's: 124), 1.2x the time (Chromium 156, Zen 4).
   */
  widen16 (v, signed, high, spread) {
    const c = this.c
    if (!spread) {
      this.push(v)
      c.simd(signed ? (high ? 0x88 : 0x87) : (high ? 0x8a : 0x89)) // i16x8.extend_low/high_i8x16_s/u
      this.stats.extends++
      return
    }
    this.push(v); this.push(v)
    c.simd(0x0d)
    const from = high ? 8 : 0
    for (let i = 0; i < 8; i++) c.byte(from + i, from + i)
    c.i32(8).simd(signed ? 0x8c : 0x8d) // i16x8.shr_s/u
    this.stats.spreads++
  }

  /** The first (or second) halves of two 16-byte vectors interleaved byte by byte (linearize.js pairOperand): a
   * shuffle engines make one unpack instruction of. */
  emitUnpack (x) {
    this.push(x.src[0]); this.push(x.src[1])
    this.c.simd(0x0d)
    const from = x.high ? 8 : 0
    for (let i = 0; i < 8; i++) this.c.byte(from + i, 16 + from + i)
    this.stats.unpacks++
    return this.define(x)
  }

  /** Byte ops on 16 bytes in place: XOR or AND with a constant splat, a shift right by a scalar count
   * (i8x16.shr_u/s: each byte shifted as the scalar code shifts it; by a constant k, unsigned: i16x8.shr_u and
   * a mask of 255 >> k a byte, the same bytes). Their constants are byteSplat's locals. */
  emitByteOps (x) {
    const c = this.c
    const [raw, ...ys] = x.src
    this.push(raw)
    const konst = (y) => (y.k === 'const' ? Number(y.value) : null)
    x.ops.forEach((op, i) => {
      // a shift by a constant 0, and a mask that keeps every bit an unsigned shift by a constant left, do nothing
      // (a Q4_0 byte's low nibble at shift 0, its high one's & 15 after >> 4)
      if (op === 'SHR' && konst(ys[i]) === 0) return
      const prev = i > 0 && x.ops[i - 1] === 'SHR' && x.dtype.isUnsigned ? konst(ys[i - 1]) : null
      if (op === 'AND' && prev !== null && prev >= 0 && prev < 8 && ((255 >> prev) & ~konst(ys[i])) === 0) return
      if (op === 'SHR' && x.dtype.isUnsigned && konst(ys[i]) > 0 && konst(ys[i]) < 8) {
        c.i32(konst(ys[i])).simd(0x8d) // i16x8.shr_u: each byte's top bits then hold the next byte's low ones
        c.get(this.byteSplat(255 >> konst(ys[i]))).simd(0x4e) // v128.and: cleared
      } else if (op === 'SHR') {
        this.push(ys[i])
        c.simd(x.dtype.isUnsigned ? 0x6d : 0x6c)
      } else if (op === 'ADD') {
        // an offset (linearize.js pairOperand; every sum stays a byte)
        c.get(this.byteSplat(Number(ys[i].value) & 255)).simd(0x6e) // i8x16.add
      } else {
        c.get(this.byteSplat(Number(ys[i].value) & 255)).simd(op === 'XOR' ? 0x51 : 0x4e) // v128.xor / v128.and
      }
    })
    return this.define(x)
  }

  /**
   * The local holding byte b in all 16 lanes, set once at the function's start (prologue) from the zero bytes
   * at address 0 or'ed with the constant: a value V8 cannot see is constant, so it stays in a register (or one
   * spill slot) across the loops, where a v128.const is built again at each use inside a loop (3 x86
   * instructions: GPT-2's Q4_0 decode block loop built its nibble mask and -8 three times a column).
   */
  byteSplat (b) {
    let l = this.splats.get(b)
    if (l === undefined) {
      l = this.newLocal(T.v128)
      this.splats.set(b, l)
      this.prologue.i32(0).vmem(0x00, 4, 0).v128const(new Uint8Array(16).fill(b)).simd(0x50).set(l) // load, or
      this.stats.byteSplats++
    }
    return l
  }

  /**
   * A rowDotReduce's dot4 in standard SIMD: lane j = the sum of the products of a's and b's bytes 4j..4j+3,
   * each byte extended to 16 bits by its sign (signs), products summed in pairs (i32x4.dot_i16x8_s: at most
   * 2 x 128 x 255, exact), then adjacent pairs added (two shuffles and an add): exact int32 sums.
   */
  emitDot4Lanes (x) {
    const c = this.c
    const [a, b] = x.src
    this.stats.laneDots++
    if (x.wide) {
      // [a0, a1, b0, b1] in 16-bit lanes, each pair one lane's two points (linearize.js pairHalves)
      const [a0, a1, b0, b1] = x.src
      this.push(a0); this.push(b0); c.simd(0xba) // i32x4.dot_i16x8_s
      this.push(a1); this.push(b1); c.simd(0xba)
      c.simd(0xae) // i32x4.add
      return this.define(x)
    }
    if (x.pairs) {
      // bytes 8h + 2j + m (linearize.js dotBytes): each half's 16-bit pairs are one lane's two points, so the
      // two halves' products summed in pairs are the lanes' sums of points 0, 1 and of 2, 3: add them
      for (const high of [false, true]) {
        this.widen16(a, x.signs[0], high, false)
        this.widen16(b, x.signs[1], high, true)
        c.simd(0xba) // i32x4.dot_i16x8_s
      }
      c.simd(0xae) // i32x4.add
      return this.define(x)
    }
    const lo = this.temp(T.v128)
    const hi = this.temp(T.v128)
    for (const [high, out] of [[false, lo], [true, hi]]) {
      this.widen16(a, x.signs[0], high, false)
      this.widen16(b, x.signs[1], high, true)
      c.simd(0xba).set(out) // i32x4.dot_i16x8_s
    }
    const pick = (first) => {
      c.get(lo).get(hi).simd(0x0d)
      for (const lane of [0, 2, 4, 6]) for (let k = 0; k < 4; k++) c.byte(4 * (lane + first) + k)
    }
    pick(0); pick(1)
    c.simd(0xae) // i32x4.add
    return this.define(x)
  }

  // ---- structure
  block (insts) {
    for (const x of insts) {
      const mark = this.scratch.length
      this.inst(x)
      for (const [t, l] of this.scratch.splice(mark)) this.release(t, l)
      for (const id of this.dead.get(x.id) || []) {
        const held = this.pooled.get(id)
        if (held === undefined) continue
        this.pooled.delete(id)
        this.val.delete(id) // a use after this point is an internal error, never a stale read
        this.release(held[0], held[1])
      }
    }
  }

  inst (x) {
    const c = this.c
    switch (x.k) {
      case 'const': return this.emitConst(x)
      case 'var': {
        const i = this.prog.vars.indexOf(x.name)
        this.val.set(x.id, { local: i })
        return
      }
      case 'bcast': return this.emitBcast(x)
      case 'alu':
        if (this.halves.has(x.id)) return this.emitHalfBits(x)
        return this.fused.has(x.id) || this.skipped.has(x.id) ? undefined : this.emitAlu(x) // emitted by its update
      case 'load': return this.emitLoad(x)
      case 'store': return this.emitStore(x)
      case 'acc': // updated inside loops and read after them: its own local, never reused
        this.push(x.src[0])
        this.val.set(x.id, { local: this.newLocal(this.typeOf(x)) })
        c.set(this.val.get(x.id).local)
        return
      case 'update': return this.emitUpdate(x)
      case 'hsum': return this.emitHsum(x)
      case 'bytes': return this.emitBytes(x)
      case 'rowbytes': return this.emitRowBytes(x)
      case 'raw16': return this.emitRaw16(x)
      case 'widen': return this.emitWiden(x)
      case 'unpack': return this.emitUnpack(x)
      case 'byteops': return this.emitByteOps(x)
      case 'dot4': return this.emitDot4(x)
      case 'read':
        this.val.set(x.id, { local: this.val.get(x.acc.id).local })
        return
      case 'if':
        this.push(x.cond)
        c.byte(0x04, 0x40)
        this.block(x.body)
        c.byte(0x0b)
        return
      case 'loop': {
        this.block(x.pre)
        const wide = x.dtype.wasm === 'i64'
        const i = this.newLocal(wide ? T.i64 : T.i32)
        this.val.set(x.id, { local: i })
        this.push(x.start)
        c.set(i)
        const all = wide ? [] : this.strengthReduce(x)
        // a gated pointer's step is a local (0 where its gate is off): it advances, but never ends the loop
        const steps = all.filter(([, step]) => typeof step === 'number')
        // with a strength-reduced address, the loop ends when that pointer reaches its last value (one
        // compare, no separate counter: the counter's increment is dead code when nothing else reads it)
        let last = null
        if (steps.length) {
          this.stats.pointerExits++
          last = this.newLocal(T.i32)
          this.push(x.end)
          this.push(x.start)
          c.op(0x6b).i32(steps[0][1]).op(0x6c).get(steps[0][0]).op(0x6a).set(last)
        }
        // block { if (i >= end) break; loop { body; i++; if (i < end) continue } }
        c.byte(0x02, 0x40)
        c.get(i)
        this.push(x.end)
        c.op(wide ? 0x59 : 0x4e).byte(0x0d, 0x00)
        c.byte(0x03, 0x40)
        this.block(x.body)
        for (const [local, step] of all) {
          c.get(local)
          if (typeof step === 'number') c.i32(step)
          else c.get(step.local)
          c.op(0x6a).set(local)
        }
        c.get(i)
        if (wide) c.i64(1).op(0x7c)
        else c.i32(1).op(0x6a)
        if (last !== null) {
          c.set(i)
          c.get(steps[0][0]).get(last).op(0x47).byte(0x0d, 0x00) // i32.ne
        } else {
          c.tee(i)
          this.push(x.end)
          c.op(wide ? 0x53 : 0x48).byte(0x0d, 0x00)
        }
        c.byte(0x0b, 0x0b)
        return
      }
      default:
        throw new KernelError(`the WebAssembly emitter has no rule for ${x.k}`)
    }
  }

  /**
   * Strength reduction: an access in the loop's body whose index is affine in the loop variable
   * (invariant + i * stride) gets a byte-address local set before the loop and advanced by stride * size
   * each iteration, instead of a multiply, add and shift per access per iteration. Returns the
   * [local, byte step] pairs the loop's latch adds.
   */
  strengthReduce (loop) {
    const memo = new Map()
    const affine = (x) => {
      if (memo.has(x)) return memo.get(x)
      let r = null
      if (x === loop) r = { terms: [], c: 0, s: 1 }
      else if (x.k === 'const' && x.lanes === 1 && x.dtype === loop.dtype) r = { terms: [], c: Number(x.value), s: 0 }
      else if (x.k === 'alu' && x.lanes === 1 && x.dtype === loop.dtype && (x.op === 'ADD' || x.op === 'MUL')) {
        // invariant sums too (row r of a tile is j0 + r: one pointer with offsets for the rows)
        const [a, b] = x.src.map((v) => (v ? affine(v) : null))
        if (x.op === 'ADD' && a && b) r = { terms: [...a.terms, ...b.terms], c: a.c + b.c, s: a.s + b.s }
        else if (x.op === 'MUL' && a && b && (a.terms.length === 0 && a.s === 0)) r = { terms: b.terms.map(([t, k]) => [t, k * a.c]), c: b.c * a.c, s: b.s * a.c }
        else if (x.op === 'MUL' && a && b && (b.terms.length === 0 && b.s === 0)) r = { terms: a.terms.map(([t, k]) => [t, k * b.c]), c: a.c * b.c, s: a.s * b.c }
      }
      if (r === null && x.level < loop.level && x.lanes === 1 && x.dtype === loop.dtype && this.val.has(x.id)) r = { terms: [[x, 1]], c: 0, s: 0 }
      memo.set(x, r)
      return r
    }
    const steps = []
    const byKey = new Map()
    // a scalar gate defined outside the loop, on a load that no bounds check guards (those keep their code)
    const invariantGate = (x) => x.k === 'load' && !x.check && x.gate && x.gate.lanes === 1 && x.gate.level < loop.level &&
      this.val.has(x.gate.id) && (x.lanes === 1 || x.mode === 'contiguous')
    const visit = (insts) => {
      for (const x of insts) {
        if (x.k === 'if') visit(x.body)
        if ((x.k !== 'load' && x.k !== 'store') || x.idx.lanes !== 1 || x.idx.dtype !== loop.dtype) continue
        if (this.addrOf.has(`${x.idx.id}|${x.buf}`) && !invariantGate(x)) continue
        const a = affine(x.idx)
        if (!a || a.s === 0 || Math.abs(a.s * x.dtype.size) > 2 ** 30 || a.terms.some(([t]) => !this.val.has(t.id))) continue
        const size = x.dtype.size
        if (invariantGate(x) && !this.gatedAddr.has(x.id)) {
          // a load behind a gate the loop does not change (a padded convolution's border: the gate is the
          // pixel's, the loop runs over channels): a pointer of its own that starts at its address, or at 0
          // (runtime.js ZERO_BYTES) where the gate is off, and advances by its stride, or by 0; so the load is
          // one plain load per iteration, no address select
          const local = this.newLocal(T.i32)
          const step = this.newLocal(T.i32)
          this.c.i32((a.c * size + this.buf(x.buf).base) | 0)
          for (const [t, k] of a.terms) {
            this.push(t)
            this.c.i32((k * size) | 0).op(0x6c).op(0x6a)
          }
          this.push(loop.start)
          this.c.i32((a.s * size) | 0).op(0x6c).op(0x6a)
          this.c.i32(0)
          this.push(x.gate).op(0x1b).set(local)
          this.c.i32((a.s * size) | 0).i32(0)
          this.push(x.gate).op(0x1b).set(step)
          this.gatedAddr.set(x.id, local)
          this.stats.gatedPointers++
          steps.push([local, { local: step }])
          continue
        }
        if (this.addrOf.has(`${x.idx.id}|${x.buf}`)) continue
        // accesses that differ by a constant share one pointer; the difference goes into the memarg offset
        const merged = new Map()
        for (const [t, k] of a.terms) merged.set(t, (merged.get(t) || 0) + k)
        a.terms = [...merged].filter(([, k]) => k !== 0).sort((p, q) => p[0].id - q[0].id)
        // the buffer's base goes into the pointer (short displacements in the machine code's addresses)
        const base = this.buf(x.buf).base
        const key = a.terms.map(([t, k]) => `${t.id}*${k}`).join('+') + `|${a.s}|${size}|${base}`
        let entry = byKey.get(key)
        if (entry === undefined || a.c < entry.c) {
          if (entry !== undefined) continue // keep the first pointer; a smaller offset would go negative
          const local = this.newLocal(T.i32)
          entry = { local, c: a.c }
          this.c.i32((a.c * size + base) | 0)
          for (const [t, k] of a.terms) {
            this.push(t)
            this.c.i32((k * size) | 0).op(0x6c).op(0x6a)
          }
          this.push(loop.start)
          this.c.i32((a.s * size) | 0).op(0x6c).op(0x6a)
          this.c.set(local)
          byKey.set(key, entry)
          steps.push([local, (a.s * size) | 0])
        }
        this.addrOf.set(`${x.idx.id}|${x.buf}`, { local: entry.local, size, offset: (a.c - entry.c) * size - base })
      }
    }
    visit(loop.body)
    return steps
  }

  /**
   * Map inst id -> ids of the values that are dead once that instruction is emitted: a value dies after its
   * last use in emission order, or, when a use sits in a loop that does not hold the value's definition,
   * after the outermost such loop (the loop runs that use again). A value nobody reads dies at once.
   */
  deadAfter () {
    const place = new Map() // inst id -> [position, loops around it]
    const last = new Map() // value id -> [position, inst id after which it dies]
    const uses = [] // [value, user inst]
    let n = 0
    const walk = (insts, loops) => {
      for (const x of insts) {
        if (x.k === 'loop') walk(x.pre, loops)
        place.set(x.id, [n++, loops])
        last.set(x.id, [n - 1, x.id])
        for (const v of operands(x)) uses.push([v, x])
        // a fused product's operands are read by its update (fusedProducts)
        if (x.k === 'update' && this.fused.has(x.src[0].id)) for (const v of x.src[0].src) uses.push([v, x])
        // a float16's bits read as one 16-bit load (halfBits) read its first byte's address
        if (this.halves.has(x.id)) uses.push([this.halves.get(x.id).idx, x])
        if (x.k === 'loop') {
          walk(x.body, [...loops, x])
          place.get(x.id)[0] = n++ // a loop's operands (its end, read by the latch) die after its body
        }
        if (x.k === 'if') walk(x.body, loops)
      }
    }
    walk(this.prog.head, [])
    walk(this.prog.body, [])
    for (const [v, user] of uses) {
      const def = place.get(v.id)
      if (def === undefined) continue // a parameter (var) or an accumulator reference
      const [pos, loops] = place.get(user.id)
      let k = 0
      while (k < loops.length && k < def[1].length && loops[k] === def[1][k]) k++
      const after = k < loops.length ? loops[k] : user
      const at = after === user ? pos : place.get(after.id)[0]
      if (at > last.get(v.id)[0]) last.set(v.id, [at, after.id])
    }
    const dead = new Map()
    for (const [id, [, after]] of last) {
      if (!dead.has(after)) dead.set(after, [])
      dead.get(after).push(id)
    }
    return dead
  }

  /** How many instructions read each value (a load nobody reads is not emitted: wasm keeps loads alive). */
  countUses () {
    const uses = new Map()
    const use = (v) => { if (v) uses.set(v.id, (uses.get(v.id) || 0) + 1) }
    const walk = (insts) => {
      for (const x of insts) {
        for (const v of x.src || []) use(v)
        use(x.idx)
        use(x.gate)
        use(x.cond)
        use(x.start)
        use(x.end)
        if (x.k === 'bcast' && this.splattable(x)) uses.set(x.src[0].id, uses.get(x.src[0].id) - 1)
        if (x.k === 'loop') { walk(x.pre); walk(x.body) }
        if (x.k === 'if') walk(x.body)
      }
    }
    walk(this.prog.head)
    walk(this.prog.body)
    return uses
  }

  splattable (x) {
    const s = x.src[0]
    return s.k === 'load' && !s.gate && !s.check && s.lanes === 1 && x.dtype.size === 4 && !x.dtype.isBool
  }

  emit () {
    this.uses = this.countUses()
    this.fused = this.fusedProducts()
    this.halfBits()
    this.clampSelects()
    this.dead = this.deadAfter()
    this.splats = new Map()
    this.prologue = new Code()
    this.block(this.prog.head)
    this.block(this.prog.body)
    // the byte splats' settings (byteSplat) run first
    const body = this.splats.size ? new Code().append(this.prologue).append(this.c) : this.c
    return { params: this.params, locals: this.locals, body, stats: this.stats }
  }
}

/** The values an instruction reads (a broadcast load reads its load's address; a loop its start and end). */
function operands (x) {
  const out = []
  for (const v of x.src || []) if (v) out.push(v)
  for (const v of [x.idx, x.gate, x.cond, x.start, x.end, x.acc]) if (v) out.push(v)
  if (x.k === 'bcast' && x.src[0].k === 'load') out.push(x.src[0].idx)
  return out
}

module.exports = { KernelEmitter }
