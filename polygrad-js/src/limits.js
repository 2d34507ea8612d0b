'use strict'
/**
 * What a bundle may ask of the loader: the caps that polygrad-js and Python (polygrad/limits.py) share,
 * with the same names and values (both from polygrad/definitions/limits.py), so both accept and reject the
 * same files (the differential corpus of tests/test_bundle_differential.py checks it). docs/bundle-format.md ("Trust model") is the contract.
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

// the caps themselves: polygrad-core's polygrad/definitions/limits.py, generated into generated/limits.js
const LIMITS = require('./generated/limits')

/** The memory a bundle of `fileBytes` bytes may ask for when the caller does not say. */
function defaultMaxBytes (fileBytes) {
  return Math.max(LIMITS.BYTES_FLOOR, LIMITS.BYTES_PER_FILE_BYTE * fileBytes)
}

/** The node evaluations one entrypoint call of such a bundle may run when the caller does not say. */
function defaultMaxWork (fileBytes) {
  return Math.max(LIMITS.WORK_FLOOR, LIMITS.WORK_PER_FILE_BYTE * fileBytes)
}

module.exports = Object.assign({ defaultMaxBytes, defaultMaxWork }, LIMITS)
