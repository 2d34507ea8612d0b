'use strict'
/**
 * A bundle read from a file a piece at a time, never whole: Node's Model.load(path) and Model.loadAsync(path).
 *
 * Stage: import. Input: the file's size and a reader of its bytes (index.js: `read(into, at)` fills the
 * Uint8Array `into` from byte `at` of the file). Output: the Program (`programSteps`: the header and the
 * manifest read and checked with bundle.js's checks), then the stored buffers' bytes read straight into the
 * model's memory at their slots (`dataSteps`), the data section's CRC-32 computed over the bytes as they are
 * read and checked before the model is usable. bundle.read(bytes) checks that CRC before parsing the manifest;
 * here it comes after the manifest's checks and the memory they size, so a file with a bad data checksum and
 * a bad manifest is refused for its manifest: refused all the same. The steps are generators that yield the
 * reads ({ into, at }); runSync and runAsync perform them, so one sequence of checks serves both loads.
 *
 * Where Model.fromBytesSync(fs.readFileSync(path)) holds the file's bytes beside the model's memory until the
 * garbage collector frees them (GPT-2 small: 1.1 GB resident after loading its 498 MB bundle), this holds the
 * model's memory and a GAP_CHUNK scratch.
 */

const bundle = require('./bundle')
const { BundleError } = require('./errors')
const { crc32 } = require('./crc32')
const { readProgram } = require('./manifest')

// the data section's bytes that no buffer stores (the padding between buffers) are read this many at a time
const GAP_CHUNK = 1 << 20

/** The steps that read and check a file's header and manifest; they return { prog, h } (h: bundle.header's). */
function * programSteps (size, opts) {
  const head = new Uint8Array(Math.min(size, bundle.HEADER))
  yield { into: head, at: 0 }
  const h = bundle.header(head, size)
  const text = new Uint8Array(h.manifestLength)
  yield { into: text, at: bundle.HEADER }
  bundle.checkManifestCrc(text, h)
  const manifest = bundle.parseManifest(text, h)
  const prog = readProgram(manifest, { length: h.dataLength }, Object.assign({}, opts, { fileBytes: size }))
  return { prog, h }
}

/**
 * The steps that read every stored buffer's bytes into `u8` (the executor's memory) at its slot's base, in the
 * order of the file, the padding between them into a scratch, and check the data section's CRC-32 (BundleError).
 * Slots whose bytes overlap (a crafted file may point two at one range) read the overlap again.
 */
function * dataSteps (prog, u8, h) {
  const slots = prog.slots.filter((s) => typeof s.dataOffset === 'number').sort((a, b) => a.dataOffset - b.dataOffset)
  let crc = 0
  let pos = 0 // the data section's bytes before pos are in crc
  let scratch = null
  function * skipTo (end) {
    while (pos < end) {
      if (scratch === null) scratch = new Uint8Array(Math.min(GAP_CHUNK, h.dataLength))
      const into = scratch.subarray(0, Math.min(scratch.length, end - pos))
      yield { into, at: h.start + pos }
      crc = crc32(into, crc)
      pos += into.length
    }
  }
  for (const s of slots) {
    const off = s.dataOffset
    const end = off + s.size * s.dtype.size
    yield * skipTo(off)
    if (off < pos) yield { into: u8.subarray(s.base, s.base + Math.min(end, pos) - off), at: h.start + off }
    if (end > pos) {
      const into = u8.subarray(s.base + pos - off, s.base + end - off)
      yield { into, at: h.start + pos }
      crc = crc32(into, crc)
      pos = end
    }
  }
  yield * skipTo(h.dataLength)
  if (crc !== h.dataCrc) throw new BundleError(bundle.DATA_CRC_MISMATCH)
}

/** Perform the reads of `steps` with `read(into, at)`; the steps' result. */
function runSync (steps, read) {
  let r = steps.next()
  while (!r.done) {
    read(r.value.into, r.value.at)
    r = steps.next()
  }
  return r.value
}

/** runSync with an asynchronous `read`. */
async function runAsync (steps, read) {
  let r = steps.next()
  while (!r.done) {
    await read(r.value.into, r.value.at)
    r = steps.next()
  }
  return r.value
}

module.exports = { programSteps, dataSteps, runSync, runAsync, GAP_CHUNK }
