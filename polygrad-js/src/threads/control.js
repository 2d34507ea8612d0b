'use strict'
/**
 * The control block a pool and its workers share (an Int32Array over a SharedArrayBuffer): what to run and
 * who has finished. The pool writes a call's fields, then increments SEQ (a sequentially consistent write,
 * so a worker that reads the new SEQ sees the fields) and wakes the workers.
 */

module.exports = {
  SEQ: 0, // incremented per call; workers wait for it to change
  DONE: 1, // workers that finished the current call
  MODULE: 2, // which compiled module (-1: the session ends, workers return to their event loop)
  EXPORT: 3, // which of its functions (k<EXPORT>)
  PARTS: 4, // slices of the call (the main thread runs slice 0, worker i slice i)
  NARGS: 5, // Variable values after PART and PARTS
  FAILED: 6, // 0, or TRAP / ERROR when a worker's slice stopped
  ASYNC: 7, // 1 when the caller waits for a 'done' message instead of on DONE
  WORKERS: 8, // workers in the pool
  READY: 16, // READY + i: worker i has its memory and control block (16 workers at most)
  ARGS: 32, // the Variable values (32 at most)
  MAX_ARGS: 32,
  MAX_WORKERS: 16, // threads in all: READY + 1 .. READY + 15
  SIZE: 64,
  TRAP: 1,
  ERROR: 2
}
