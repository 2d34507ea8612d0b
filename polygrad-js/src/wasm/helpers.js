'use strict'
/**
 * WebAssembly helper functions every kernel module carries: the float16/bfloat16 conversions (ports of
 * the C renderer's pg_h2f/pg_f2h/pg_b2f/pg_f2b) and their round trips, plus the JavaScript imports for
 * the few ops wasm has no instruction for (float MOD, POW, FMA), which are rare in model kernels.
 */

const { Code, T } = require('./encode')
const { fma32, fma64 } = require('../scalar')

const IF_I32 = [0x04, T.i32]
const ELSE = 0x05
const END = 0x0b

// i32 locals: index 0 is the parameter
function h2f () {
  const c = new Code()
  // locals: 0 h, 1 o, 2 e
  c.get(0).i32(0x7fff).op(0x71).i32(13).op(0x74).set(1)
  c.get(1).i32(0x7c00 << 13).op(0x71).set(2)
  c.get(1).i32((127 - 15) << 23).op(0x6a).set(1)
  c.get(2).i32(0x7c00 << 13).op(0x46).byte(0x04, 0x40)
  c.get(1).i32((128 - 16) << 23).op(0x6a).set(1)
  c.byte(ELSE)
  c.get(2).op(0x45).byte(0x04, 0x40)
  c.get(1).i32(1 << 23).op(0x6a).op(0xbe).f32c(6.103515625e-05).op(0x93).op(0xbc).set(1)
  c.byte(END, END)
  c.get(1).get(0).i32(0x8000).op(0x71).i32(16).op(0x74).op(0x72).op(0xbe)
  return { params: [T.i32], results: [T.f32], locals: [T.i32, T.i32], body: c }
}

function f2h () {
  const c = new Code()
  // locals: 0 x (f32), 1 u, 2 sign, 3 o
  c.get(0).op(0xbc).set(1)
  c.get(1).i32(0x80000000 | 0).op(0x71).set(2)
  c.get(1).get(2).op(0x73).set(1)
  c.get(1).i32(143 << 23).op(0x4f).byte(...IF_I32) // u >= 143<<23 (unsigned)
  c.i32(0x7e00).i32(0x7c00).get(1).i32(255 << 23).op(0x4b).op(0x1b)
  c.byte(ELSE)
  c.get(1).i32(113 << 23).op(0x49).byte(...IF_I32) // u < 113<<23
  c.get(1).op(0xbe).f32c(0.5).op(0x92).op(0xbc).i32(126 << 23).op(0x6b).i32(0xffff).op(0x71)
  c.byte(ELSE)
  c.get(1).i32(0xc8000fff | 0).op(0x6a).get(1).i32(13).op(0x76).i32(1).op(0x71).op(0x6a).i32(13).op(0x76).i32(0xffff).op(0x71)
  c.byte(END, END).set(3)
  c.get(3).get(2).i32(16).op(0x76).op(0x72).i32(0xffff).op(0x71)
  return { params: [T.f32], results: [T.i32], locals: [T.i32, T.i32, T.i32], body: c }
}

function b2f () {
  const c = new Code().get(0).i32(16).op(0x74).op(0xbe)
  return { params: [T.i32], results: [T.f32], locals: [], body: c }
}

function f2b () {
  const c = new Code()
  // locals: 0 x, 1 u
  c.get(0).op(0xbc).set(1)
  c.get(1).i32(0x7fffffff).op(0x71).i32(0x7f800000).op(0x4b).byte(...IF_I32)
  c.get(1).i32(16).op(0x76).i32(0x40).op(0x72).i32(0xffff).op(0x71)
  c.byte(ELSE)
  c.get(1).i32(0x7fff).op(0x6a).get(1).i32(16).op(0x76).i32(1).op(0x71).op(0x6a).i32(16).op(0x76).i32(0xffff).op(0x71)
  c.byte(END)
  return { params: [T.f32], results: [T.i32], locals: [T.i32], body: c }
}

function roundVia (to, from) {
  // f32 -> bits -> f32, calling two earlier helpers by function index
  const c = new Code().get(0).byte(0x10).u32(to).byte(0x10).u32(from)
  return { params: [T.f32], results: [T.f32], locals: [], body: c }
}

/** JavaScript functions a kernel module imports (module "pg"), with their wasm signatures. */
const IMPORTS = [
  { name: 'fmod', params: [T.f64, T.f64], results: [T.f64], fn: (a, b) => a % b },
  { name: 'pow', params: [T.f64, T.f64], results: [T.f64], fn: Math.pow },
  { name: 'fma32', params: [T.f64, T.f64, T.f64], results: [T.f64], fn: fma32 },
  { name: 'fma64', params: [T.f64, T.f64, T.f64], results: [T.f64], fn: fma64 }
]

/** The helper functions, in order; `base` is the function index of the first (after the imports). */
function helperFuncs (base) {
  const idx = { h2f: base, f2h: base + 1, b2f: base + 2, f2b: base + 3, roundH: base + 4, roundB: base + 5 }
  const funcs = [h2f(), f2h(), b2f(), f2b(), roundVia(idx.f2h, idx.h2f), roundVia(idx.f2b, idx.b2f)]
  return { funcs, idx }
}

module.exports = { helperFuncs, IMPORTS }
