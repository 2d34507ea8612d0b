'use strict'
/**
 * What a bundle may ask of the loader: the caps that polygrad-js and Python (polygrad/limits.py) share,
 * with the same names and values, so both accept and reject the same files (the differential corpus of
 * tests/test_bundle_differential.py checks it). docs/bundle-format.md ("Trust model") is the contract.
 *
 * Stage: import (bundle loading). Input: nothing, or a file's length. Output: the limits bundle.js,
 * json.js, manifest.js, ir.js and validate.js check before they allocate or compile anything.
 *
 * Two caps grow with the file, because a real model's memory and work grow with its weights:
 *   maxBytes = max(BYTES_FLOOR, BYTES_PER_FILE_BYTE * file length)   all buffers together
 *   maxWork  = max(WORK_FLOOR, WORK_PER_FILE_BYTE * file length)     node evaluations of one call
 * (validate.kernelWork: each block of a kernel evaluates each of its nodes at most once per point of all its
 * loops). A GPT-2 small saved by polygrad.hf with max_seq_len 1024 (502 MB) needs 2.5 GB of buffers and
 * 9.9e12 node evaluations per forward. The caller raises either cap: Model.load(path, { maxBytes, maxWork }).
 */

const LIMITS = Object.freeze({
  MAX_MANIFEST: 256 * 1024 * 1024, // bytes of manifest JSON
  MAX_JSON_DEPTH: 256, // nesting of the manifest JSON (a kernel arg nests at most 2 * MAX_ARG_DEPTH + 6)
  MAX_NAME: 256, // characters of a manifest name (buffer, spec, Variable, entrypoint)
  MAX_SLOTS: 1 << 20, // buffers in the table
  MAX_CALLS: 1 << 20, // calls of all entrypoints together
  MAX_ELEMENTS: 2 ** 31 - 1, // elements of one buffer (kernel indices are int32)
  MAX_NODES: 1 << 18, // nodes in the kernel table, checked before any is decoded (so in any one kernel)
  MAX_ARG_DEPTH: 64, // nested tuples in one kernel arg
  MAX_RANGE: 2n ** 48n, // a loop's largest trip count
  MAX_UPCAST: 256, // points of a block's upcast (unrolled) RANGEs together: their ends multiplied
  MAX_STEPS: 1 << 22, // node evaluations of one kernel's interval analysis
  MAX_NARROW_DEPTH: 6, // WHEREs nested inside an index that still narrow their arms
  BYTES_FLOOR: 256 * 1024 * 1024, // what any bundle may allocate, however small the file
  BYTES_PER_FILE_BYTE: 16,
  WORK_FLOOR: 2 ** 36, // node evaluations one entrypoint call may run, however small the file
  WORK_PER_FILE_BYTE: 2 ** 16
})

/** The memory a bundle of `fileBytes` bytes may ask for when the caller does not say. */
function defaultMaxBytes (fileBytes) {
  return Math.max(LIMITS.BYTES_FLOOR, LIMITS.BYTES_PER_FILE_BYTE * fileBytes)
}

/** The node evaluations one entrypoint call of such a bundle may run when the caller does not say. */
function defaultMaxWork (fileBytes) {
  return Math.max(LIMITS.WORK_FLOOR, LIMITS.WORK_PER_FILE_BYTE * fileBytes)
}

module.exports = Object.assign({ defaultMaxBytes, defaultMaxWork }, LIMITS)
