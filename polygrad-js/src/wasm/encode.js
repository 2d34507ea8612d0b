'use strict'
/**
 * A WebAssembly binary writer: LEB128 numbers, function bodies (`Code`) and modules (`moduleBytes`).
 * Only what the kernel emitter needs: one imported memory, imported and defined functions, exports.
 */

const T = { i32: 0x7f, i64: 0x7e, f32: 0x7d, f64: 0x7c, v128: 0x7b }

const f32buf = new Float32Array(1)
const f64buf = new Float64Array(1)
const f32bytes = new Uint8Array(f32buf.buffer)
const f64bytes = new Uint8Array(f64buf.buffer)

class Code {
  constructor () {
    this.buf = new Uint8Array(256)
    this.n = 0
  }

  get b () {
    return this.buf.subarray(0, this.n)
  }

  push (x) {
    if (this.n === this.buf.length) {
      const bigger = new Uint8Array(this.buf.length * 2)
      bigger.set(this.buf)
      this.buf = bigger
    }
    this.buf[this.n++] = x
  }

  byte (...xs) {
    for (let i = 0; i < xs.length; i++) this.push(xs[i])
    return this
  }

  u32 (v) {
    v >>>= 0
    do {
      let c = v & 0x7f
      v >>>= 7
      if (v) c |= 0x80
      this.push(c)
    } while (v)
    return this
  }

  s32 (v) {
    v |= 0
    for (;;) {
      const c = v & 0x7f
      v >>= 7
      if ((v === 0 && (c & 0x40) === 0) || (v === -1 && (c & 0x40) !== 0)) {
        this.push(c)
        return this
      }
      this.push(c | 0x80)
    }
  }

  s64 (v) {
    v = BigInt.asIntN(64, BigInt(v))
    for (;;) {
      const c = Number(v & 0x7fn)
      v >>= 7n
      if ((v === 0n && (c & 0x40) === 0) || (v === -1n && (c & 0x40) !== 0)) {
        this.push(c)
        return this
      }
      this.push(c | 0x80)
    }
  }

  f32 (x) {
    f32buf[0] = x
    for (const c of f32bytes) this.push(c)
    return this
  }

  f64 (x) {
    f64buf[0] = x
    for (const c of f64bytes) this.push(c)
    return this
  }

  name (s) {
    const bytes = new TextEncoder().encode(s)
    this.u32(bytes.length)
    for (const c of bytes) this.push(c)
    return this
  }

  vec (items, write) {
    this.u32(items.length)
    for (const it of items) write(this, it)
    return this
  }

  append (other) {
    const b = other.b
    for (let i = 0; i < b.length; i++) this.push(b[i])
    return this
  }

  // ---- instructions
  op (code) { return this.byte(code) }
  simd (code) { return this.byte(0xfd).u32(code) }
  sat (code) { return this.byte(0xfc).u32(code) }
  get (i) { return this.byte(0x20).u32(i) }
  set (i) { return this.byte(0x21).u32(i) }
  tee (i) { return this.byte(0x22).u32(i) }
  i32 (v) { return this.byte(0x41).s32(v) }
  i64 (v) { return this.byte(0x42).s64(v) }
  f32c (v) { return this.byte(0x43).f32(v) }
  f64c (v) { return this.byte(0x44).f64(v) }
  mem (code, align, offset) { return this.byte(code).u32(align).u32(offset) }
  vmem (code, align, offset) { return this.simd(code).u32(align).u32(offset) }
  v128const (bytes) { this.simd(0x0c); for (const c of bytes) this.push(c); return this }
}

function section (out, id, body) {
  out.byte(id).u32(body.b.length).append(body)
}

/**
 * Module bytes. `types`: [{params: [T], results: [T]}]; `imports`: [{module, name, kind: 'memory'|'func',
 * type (func) | min pages (memory), max pages (a shared memory)}]; `funcs`: [{type, locals: [T], body: Code}]; `exports`: [{name, func}].
 */
function moduleBytes ({ types, imports, funcs, exports }) {
  const out = new Code().byte(0x00, 0x61, 0x73, 0x6d, 0x01, 0x00, 0x00, 0x00)
  section(out, 1, new Code().vec(types, (c, t) => c.byte(0x60).vec(t.params, (cc, p) => cc.byte(p)).vec(t.results, (cc, r) => cc.byte(r))))
  section(out, 2, new Code().vec(imports, (c, im) => {
    c.name(im.module).name(im.name)
    if (im.kind === 'memory' && im.max !== undefined) c.byte(0x02).byte(0x03).u32(im.min).u32(im.max) // shared, with a maximum
    else if (im.kind === 'memory') c.byte(0x02).byte(0x00).u32(im.min)
    else c.byte(0x00).u32(im.type)
  }))
  section(out, 3, new Code().vec(funcs, (c, f) => c.u32(f.type)))
  const nImportedFuncs = imports.filter((im) => im.kind === 'func').length
  section(out, 7, new Code().vec(exports, (c, e) => c.name(e.name).byte(0x00).u32(e.func + nImportedFuncs)))
  section(out, 10, new Code().vec(funcs, (c, f) => {
    const body = new Code()
    // locals, run-length grouped by type
    const groups = []
    for (const t of f.locals) {
      if (groups.length && groups[groups.length - 1][1] === t) groups[groups.length - 1][0]++
      else groups.push([1, t])
    }
    body.vec(groups, (cc, [n, t]) => cc.u32(n).byte(t))
    body.append(f.body).byte(0x0b)
    c.u32(body.b.length).append(body)
  }))
  return out.b.slice()
}

module.exports = { Code, moduleBytes, T }
