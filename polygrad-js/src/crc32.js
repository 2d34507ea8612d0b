'use strict'
/** CRC-32 (IEEE 802.3, the zlib.crc32 of the bundle header), table-driven. */

let TABLE = null

function table () {
  if (TABLE) return TABLE
  TABLE = new Int32Array(256)
  for (let n = 0; n < 256; n++) {
    let c = n
    for (let k = 0; k < 8; k++) c = c & 1 ? 0xedb88320 ^ (c >>> 1) : c >>> 1
    TABLE[n] = c
  }
  return TABLE
}

/** The CRC-32 of bytes (a Uint8Array), as an unsigned 32-bit number. */
function crc32 (bytes) {
  const t = table()
  let c = -1
  for (let i = 0; i < bytes.length; i++) c = t[(c ^ bytes[i]) & 0xff] ^ (c >>> 8)
  return (c ^ -1) >>> 0
}

module.exports = { crc32 }
