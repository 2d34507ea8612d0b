'use strict'
/**
 * JSON for bundle manifests: integers beyond 2**53 must survive (int64 constants in kernels), NaN and
 * Infinity are refused (they are not JSON), nesting deeper than MAX_JSON_DEPTH is refused (as Python
 * does), and nothing is evaluated.
 *
 * parse(text): JSON.parse when no integer literal can exceed 2**53 (the common case, fast), else a small
 * strict parser that returns such integers as BigInt. stringify(value): JSON text with BigInts as integers.
 */

const { BundleError } = require('./errors')
const { MAX_JSON_DEPTH } = require('./limits')

const LONG_INT = /[,:[]\s*-?\d{16,}/ // an integer literal of 16+ digits (strings start with a quote)

function parse (text, what = 'bundle manifest') {
  if (!LONG_INT.test(text)) {
    let v
    try {
      v = JSON.parse(text)
    } catch (e) {
      throw new BundleError(`${what} is not valid JSON: ${e.message}`)
    }
    if (depth(v) > MAX_JSON_DEPTH) tooDeep(what)
    return v
  }
  return new Parser(text, what).document()
}

function tooDeep (what) {
  throw new BundleError(`${what} nests JSON deeper than ${MAX_JSON_DEPTH} levels (a damaged or crafted file)`)
}

/** The nesting depth of a parsed JSON value (a scalar is 0, [] is 1), walked without recursion. */
function depth (value) {
  if (value === null || typeof value !== 'object') return 0
  let deepest = 1
  const stack = [[value, 1]]
  while (stack.length) {
    const [v, d] = stack.pop()
    if (d > deepest) deepest = d
    for (const x of Array.isArray(v) ? v : Object.values(v)) if (x !== null && typeof x === 'object') stack.push([x, d + 1])
  }
  return deepest
}

class Parser {
  constructor (text, what) {
    this.s = text
    this.i = 0
    this.what = what
  }

  fail (msg) {
    throw new BundleError(`${this.what} is not valid JSON: ${msg} at position ${this.i}`)
  }

  ws () {
    const s = this.s
    while (this.i < s.length) {
      const c = s.charCodeAt(this.i)
      if (c === 32 || c === 9 || c === 10 || c === 13) this.i++
      else break
    }
  }

  document () {
    const v = this.value()
    this.ws()
    if (this.i !== this.s.length) this.fail('unexpected text after the value')
    return v
  }

  // iterative over containers: a deeply nested document cannot exhaust the stack
  value () {
    const stack = [] // frames: {kind: 'a'|'o', val, key}
    let cur
    for (;;) {
      this.ws()
      const c = this.s[this.i]
      let done = true
      if ((c === '{' || c === '[') && stack.length >= MAX_JSON_DEPTH) tooDeep(this.what)
      if (c === '{') {
        this.i++
        this.ws()
        if (this.s[this.i] === '}') {
          this.i++
          cur = {}
        } else {
          stack.push({ kind: 'o', val: {}, key: this.key() })
          done = false
        }
      } else if (c === '[') {
        this.i++
        this.ws()
        if (this.s[this.i] === ']') {
          this.i++
          cur = []
        } else {
          stack.push({ kind: 'a', val: [] })
          done = false
        }
      } else {
        cur = this.scalar()
      }
      if (!done) continue
      // attach cur to enclosing containers, closing those that end
      for (;;) {
        if (!stack.length) return cur
        const top = stack[stack.length - 1]
        if (top.kind === 'a') top.val.push(cur)
        else top.val[top.key] = cur
        this.ws()
        const d = this.s[this.i++]
        if (d === ',') {
          if (top.kind === 'o') top.key = this.key()
          break
        }
        if ((d === ']' && top.kind === 'a') || (d === '}' && top.kind === 'o')) {
          stack.pop()
          cur = top.val
          continue
        }
        this.i--
        this.fail(`expected ',' or '${top.kind === 'a' ? ']' : '}'}'`)
      }
    }
  }

  key () {
    this.ws()
    if (this.s[this.i] !== '"') this.fail('expected a string key')
    const k = this.string()
    this.ws()
    if (this.s[this.i++] !== ':') this.fail("expected ':'")
    return k
  }

  string () {
    const s = this.s
    const start = this.i
    this.i++
    while (this.i < s.length) {
      const c = s[this.i]
      if (c === '"') {
        this.i++
        try {
          return JSON.parse(s.slice(start, this.i))
        } catch (e) {
          this.fail('bad string')
        }
      }
      this.i += c === '\\' ? 2 : 1
    }
    this.fail('unterminated string')
  }

  scalar () {
    const s = this.s
    const c = s[this.i]
    if (c === '"') return this.string()
    for (const [word, v] of [['true', true], ['false', false], ['null', null]]) {
      if (s.startsWith(word, this.i)) {
        this.i += word.length
        return v
      }
    }
    const m = /^-?(0|[1-9]\d*)(\.\d+)?([eE][+-]?\d+)?/.exec(s.slice(this.i, this.i + 400))
    if (!m) this.fail('unexpected character')
    this.i += m[0].length
    if (!m[2] && !m[3]) {
      const n = Number(m[0])
      return Number.isSafeInteger(n) ? n : BigInt(m[0])
    }
    return Number(m[0])
  }
}

/** JSON text (no whitespace) of a value made of objects, arrays, strings, finite numbers, BigInts, bools, null. */
function stringify (v) {
  if (typeof v === 'bigint') return v.toString()
  if (v === null || typeof v !== 'object') {
    if (typeof v === 'number' && !Number.isFinite(v)) throw new TypeError(`cannot write ${v} in JSON`)
    return JSON.stringify(v)
  }
  if (Array.isArray(v)) return '[' + v.map(stringify).join(',') + ']'
  const parts = []
  for (const k of Object.keys(v)) {
    if (v[k] === undefined) continue
    parts.push(JSON.stringify(k) + ':' + stringify(v[k]))
  }
  return '{' + parts.join(',') + '}'
}

module.exports = { parse, stringify }

/** A short readable rendering of any decoded JSON value, for error messages. */
function show (v, n = 60) {
  let s
  try {
    s = stringify(v)
  } catch (e) {
    s = String(v)
  }
  return s === undefined ? String(v) : s.length > n ? s.slice(0, n) + '...' : s
}

module.exports.show = show
