'use strict'
/**
 * The control block a pool and its workers share (an Int32Array over a SharedArrayBuffer), and the two
 * protocols on it: handing out a call's chunks, and waiting for a word to change.
 *
 * A call (pool.dispatch): the pool closes CLAIM, writes the call's fields, opens CLAIM for the new call
 * (its tag: SEQ's next value, 15 bits, and chunk 0), then increments SEQ and wakes the workers. The call is
 * cut into PARTS chunks of its kernel's outermost loop, more than there are threads; the calling thread and
 * every worker that is awake take chunks one at a time (claimChunks: a compare-and-swap on CLAIM that holds
 * only while CLAIM still carries the call's tag) and add what they ran to FINISHED. So no thread waits for
 * a worker that has not started: a late worker finds nothing left, and the calling thread ran its share.
 *
 * Waiting (waitWhile): spin on the word for up to SPIN_MS, then sleep on it (Atomics.wait). A sleeping
 * thread is woken by a futex, and on a VM an idle virtual CPU halts (the 2-vCPU EPYC test VM polls not at
 * all: haltpoll.guest_halt_poll_ns=0), so each wake waits on the host; a spinning worker sees the next call
 * at once. GPT-2 small's decode shares a call every 20 us (median; 90% within 110-220 us, measured on that VM
 * under load), so 0.25 ms keeps the worker awake through a token. The spin is bounded, so a worker whose
 * caller stopped sending calls sleeps after SPIN_MS; between entrypoint calls (no session) workers wait in
 * their event loop and do not spin at all.
 */

const SEQ = 0 // incremented per call; workers wait for it to change
const FINISHED = 1 // chunks of the current call run to the end
const CLAIM = 10 // (the call's tag << 16) | the next chunk to hand out; CLOSED while the pool writes a call
const CLOSED = -1
const TAG_MASK = 0x7fff

const SPIN_MS = 0.25

// performance.now() in Node's and browsers' workers alike; Date.now() (whole milliseconds) elsewhere
const clock = typeof performance !== 'undefined' && typeof performance.now === 'function' ? () => performance.now() : () => Date.now()

/**
 * Return once ctl[at] is not `value`: spin for up to SPIN_MS, then sleep on the word (Atomics.wait) unless
 * `canSleep` is false (a browser's main thread), in which case false says the spin ended without a change.
 */
function waitWhile (ctl, at, value, canSleep = true) {
  for (let i = 0; ; i++) {
    if (Atomics.load(ctl, at) !== value) return true
    if ((i & 63) === 63) break // 64 loads first: most waits end there, before the clock is read
  }
  const deadline = clock() + SPIN_MS
  for (let i = 0; ; i++) {
    if (Atomics.load(ctl, at) !== value) return true
    if ((i & 63) === 63 && clock() > deadline) break
  }
  if (!canSleep) return false
  Atomics.wait(ctl, at, value)
  return true
}

/** The tag of the call that makes SEQ `seq`. */
function tagOf (seq) {
  return seq & TAG_MASK
}

/**
 * Take chunks of the call tagged `tag` (of `parts`) one at a time, calling run(chunk) for each, until none
 * is left; returns how many this thread took. run(chunk) returns false to stop running (a failed chunk):
 * the rest are still taken and counted, unrun, so the call ends.
 */
function claimChunks (ctl, tag, parts, run) {
  let n = 0
  let ok = true
  for (;;) {
    const v = Atomics.load(ctl, CLAIM)
    if (v === CLOSED || (v >>> 16) !== tag || (v & 0xffff) >= parts) return n
    if (Atomics.compareExchange(ctl, CLAIM, v, v + 1) !== v) continue
    n++
    if (ok) ok = run(v & 0xffff)
  }
}

module.exports = {
  SEQ,
  FINISHED,
  MODULE: 2, // which compiled module (-1: the session ends, workers return to their event loop)
  EXPORT: 3, // which of its functions (k<EXPORT>)
  PARTS: 4, // chunks of the call
  NARGS: 5, // Variable values after PART and PARTS
  FAILED: 6, // 0, or TRAP / ERROR when a worker's chunk stopped
  ASYNC: 7, // 1 when the caller waits for a 'done' message instead of on FINISHED
  WORKERS: 8, // workers in the pool
  AWAKE: 9, // workers in a session that are not asleep in Atomics.wait (running chunks or spinning)
  CLAIM,
  CLOSED,
  BY_WORKERS: 11, // chunks the workers ran, in all calls (a statistic: pool.workerChunks)
  READY: 16, // READY + i: worker i has its memory and control block (16 workers at most)
  ARGS: 32, // the Variable values (32 at most)
  MAX_ARGS: 32,
  MAX_WORKERS: 16, // threads in all: READY + 1 .. READY + 15
  SIZE: 64,
  TRAP: 1,
  ERROR: 2,
  SPIN_MS,
  waitWhile,
  tagOf,
  claimChunks
}
