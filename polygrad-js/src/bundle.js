'use strict'
/**
 * The `.pgb` container (docs/bundle-format.md section 1): header, manifest JSON, aligned data section.
 *
 * Stage: import / export. read(bytes) -> {manifest, body} after the header, length, checksum and JSON
 * checks (the manifest's contents are checked by manifest.js); write(manifest, blobs) -> bytes, filling in
 * each stored buffer's data offset. Nothing is allocated from a size before it is checked against the file.
 */

const { BundleError } = require('./errors')
const { crc32 } = require('./crc32')
const json = require('./json')
const { MAX_MANIFEST } = require('./limits')

// the layout's names, versions and header (polygrad-core's polygrad/definitions/bundle.py, as Python's bundle.py)
const { MAGIC, FORMAT, VERSION, SUPPORTED_VERSIONS, ALIGN, HEADER_SIZE: HEADER, HEADER_OFFSETS: AT } = require('./generated/bundle')

const pad = (n) => Math.ceil(n / ALIGN) * ALIGN

function asBytes (data) {
  if (data instanceof Uint8Array) return data
  if (data instanceof ArrayBuffer) return new Uint8Array(data)
  if (ArrayBuffer.isView(data)) return new Uint8Array(data.buffer, data.byteOffset, data.byteLength)
  throw new TypeError(`a bundle is a Uint8Array or an ArrayBuffer, got ${data === null ? 'null' : typeof data}`)
}

function u64 (view, off, what) {
  const lo = view.getUint32(off, true)
  const hi = view.getUint32(off + 4, true)
  if (hi >= 0x200000) throw new BundleError(`bundle header ${what} is impossibly large (corrupted file?)`)
  return hi * 0x100000000 + lo
}

/** {manifest, body} of bundle bytes: the parsed manifest JSON and a view of the data section. */
function read (data) {
  const bytes = asBytes(data)
  const h = header(bytes, bytes.length)
  const text = bytes.subarray(HEADER, HEADER + h.manifestLength)
  checkManifestCrc(text, h)
  const body = bytes.subarray(h.start, h.start + h.dataLength)
  if (crc32(body) !== h.dataCrc) throw new BundleError(DATA_CRC_MISMATCH)
  return { manifest: parseManifest(text, h), body }
}

const DATA_CRC_MISMATCH = 'bundle data checksum mismatch: the file is corrupted'

/**
 * The header of a bundle of `size` bytes whose first bytes are `head` (all 64, or the whole file when it is
 * shorter), checked against the size: {version, manifestLength, dataLength, start (of the data section),
 * manifestCrc, dataCrc}. read() and a file read piece by piece (bundlefile.js) check the same things in one order.
 */
function header (head, size) {
  if (size < HEADER) {
    throw new BundleError(`not a polygrad bundle: ${size} bytes is shorter than the ${HEADER}-byte header (truncated file?)`)
  }
  for (let i = 0; i < MAGIC.length; i++) {
    if (head[AT.magic + i] !== MAGIC[i]) throw new BundleError('not a polygrad bundle (wrong magic bytes); .pgb files are written by Model.save()')
  }
  const view = new DataView(head.buffer, head.byteOffset, HEADER)
  const version = view.getUint32(AT.version, true)
  if (!SUPPORTED_VERSIONS.includes(version)) {
    throw new BundleError(`bundle format version ${version} is not supported by this polygrad package (it reads ${JSON.stringify(SUPPORTED_VERSIONS)}); save it again with a matching polygrad`)
  }
  const flags = view.getUint32(AT.flags, true)
  if (flags !== 0) throw new BundleError(`bundle header flags 0x${flags.toString(16)} are unknown to this reader (expected 0)`)
  const mlen = u64(view, AT.manifest_len, 'manifest length')
  const dlen = u64(view, AT.data_len, 'data length')
  if (mlen > MAX_MANIFEST) throw new BundleError(`bundle manifest length ${mlen} exceeds the ${MAX_MANIFEST}-byte limit`)
  const start = HEADER + pad(mlen)
  if (start + dlen !== size) {
    throw new BundleError(`bundle size mismatch: header declares ${start + dlen} bytes (manifest ${mlen}, data ${dlen}), the file has ${size} (truncated or padded file?)`)
  }
  return { version, manifestLength: mlen, dataLength: dlen, start, manifestCrc: view.getUint32(AT.manifest_crc, true), dataCrc: view.getUint32(AT.data_crc, true) }
}

function checkManifestCrc (text, h) {
  if (crc32(text) !== h.manifestCrc) throw new BundleError('bundle manifest checksum mismatch: the file is corrupted')
}

/** The manifest JSON of `text` (its checksum checked), an object of this format and of the header's version. */
function parseManifest (text, h) {
  let str
  try {
    str = new TextDecoder('utf-8', { fatal: true }).decode(text)
  } catch (e) {
    throw new BundleError('bundle manifest is not valid UTF-8')
  }
  const manifest = json.parse(str)
  if (manifest === null || typeof manifest !== 'object' || Array.isArray(manifest)) throw new BundleError('bundle manifest must be a JSON object')
  if (manifest.format !== FORMAT) throw new BundleError(`bundle manifest format is ${JSON.stringify(manifest.format)}, expected ${JSON.stringify(FORMAT)}`)
  if (manifest.version !== h.version) throw new BundleError(`bundle manifest version ${JSON.stringify(manifest.version)} differs from the header's ${h.version}`)
  return manifest
}

/** Bundle bytes of a manifest and the stored buffers' bytes: blob k goes to the k-th buffer whose `data` is true.
 * The header's version is the manifest's. */
function write (manifest, blobs) {
  if (!SUPPORTED_VERSIONS.includes(manifest.version)) throw new Error(`internal: cannot write bundle version ${manifest.version}`)
  const offsets = []
  let pos = 0
  for (const b of blobs) {
    offsets.push(pos)
    pos = pad(pos + b.length)
  }
  let k = 0
  for (const buf of manifest.buffers || []) {
    if (buf.data === true) {
      buf.data = { offset: offsets[k], nbytes: blobs[k].length }
      k++
    }
  }
  if (k !== blobs.length) throw new Error(`internal: ${blobs.length} blobs for ${k} stored buffers`)
  const text = new TextEncoder().encode(json.stringify(manifest))
  const start = HEADER + pad(text.length)
  const out = new Uint8Array(start + pos)
  out.set(text, HEADER)
  for (let i = 0; i < blobs.length; i++) out.set(blobs[i], start + offsets[i])
  out.set(MAGIC, AT.magic)
  const view = new DataView(out.buffer)
  view.setUint32(AT.version, manifest.version, true)
  view.setUint32(AT.flags, 0, true)
  view.setUint32(AT.manifest_len, text.length, true)
  view.setUint32(AT.data_len, pos % 0x100000000, true)
  view.setUint32(AT.data_len + 4, Math.floor(pos / 0x100000000), true)
  view.setUint32(AT.manifest_crc, crc32(text), true)
  view.setUint32(AT.data_crc, crc32(out.subarray(start)), true)
  return out
}

module.exports = { read, write, asBytes, header, checkManifestCrc, parseManifest, DATA_CRC_MISMATCH, FORMAT, VERSION, SUPPORTED_VERSIONS, ALIGN, HEADER, MAGIC }
