'use strict'
/** CRC-32 (IEEE 802.3, the zlib.crc32 of the bundle header), slicing by 8 bytes at a time. */

let TABLES = null

function tables () {
  if (TABLES) return TABLES
  TABLES = new Int32Array(256 * 8)
  for (let n = 0; n < 256; n++) {
    let c = n
    for (let k = 0; k < 8; k++) c = c & 1 ? 0xedb88320 ^ (c >>> 1) : c >>> 1
    TABLES[n] = c
  }
  for (let n = 0; n < 256; n++) {
    let c = TABLES[n]
    for (let k = 1; k < 8; k++) {
      c = TABLES[c & 0xff] ^ (c >>> 8)
      TABLES[k * 256 + n] = c
    }
  }
  return TABLES
}

let native = null

/** Use a native implementation (Node's zlib.crc32) when the environment has one. */
function useNative (fn) {
  native = fn
}

/** The CRC-32 of bytes (a Uint8Array), as an unsigned 32-bit number; `value`: the CRC-32 of the bytes before
 * them (a stream checked a piece at a time). */
function crc32 (bytes, value = 0) {
  if (native !== null) return native(bytes, value) >>> 0
  const t = tables()
  let c = ~value
  let i = 0
  const n = bytes.length
  const end8 = n - (n % 8)
  for (; i < end8; i += 8) {
    const a = (bytes[i] | (bytes[i + 1] << 8) | (bytes[i + 2] << 16) | (bytes[i + 3] << 24)) ^ c
    const b = bytes[i + 4] | (bytes[i + 5] << 8) | (bytes[i + 6] << 16) | (bytes[i + 7] << 24)
    c = t[1792 + (a & 0xff)] ^ t[1536 + ((a >>> 8) & 0xff)] ^ t[1280 + ((a >>> 16) & 0xff)] ^ t[1024 + (a >>> 24)] ^
      t[768 + (b & 0xff)] ^ t[512 + ((b >>> 8) & 0xff)] ^ t[256 + ((b >>> 16) & 0xff)] ^ t[b >>> 24]
  }
  for (; i < n; i++) c = t[(c ^ bytes[i]) & 0xff] ^ (c >>> 8)
  return (c ^ -1) >>> 0
}

module.exports = { crc32, useNative }
