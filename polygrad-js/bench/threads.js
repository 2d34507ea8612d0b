#!/usr/bin/env node
'use strict'
/**
 * polygrad-js on 1, 2, ... threads (issue 31): the benchmark MLP 784-512-512-10 forward at batch 128 and 1, and
 * an Adam training step at batch 128, best of N after warm-up, with the CPU model. Timings on a machine shared
 * with other processes are noisy (a second thread needs a second idle core): read them beside `uptime`.
 *
 *   python polygrad-js/bench/make_mlp.py          # writes bench/mlp784.pgb (once)
 *   node polygrad-js/bench/threads.js [max threads, default 2] [--rounds N]
 */

const fs = require('fs')
const os = require('os')
const path = require('path')
const { Model } = require('..')

const BUNDLE = path.join(__dirname, 'mlp784.pgb')
const MAX = Number(process.argv[2]) > 0 ? Number(process.argv[2]) : 2
const ROUNDS = process.argv.includes('--rounds') ? Number(process.argv[process.argv.indexOf('--rounds') + 1]) : 40

function best (fn, rounds = ROUNDS) {
  for (let i = 0; i < 3; i++) fn()
  let b = Infinity
  for (let i = 0; i < rounds; i++) {
    const t0 = process.hrtime.bigint()
    fn()
    b = Math.min(b, Number(process.hrtime.bigint() - t0) / 1e6)
  }
  return b
}

const bytes = fs.readFileSync(BUNDLE)
const x128 = new Float32Array(128 * 784).map((_, i) => Math.sin(i))
const y128 = Int32Array.from({ length: 128 }, (_, i) => i % 10)
const x1 = x128.subarray(0, 784)
console.log(`CPU: ${os.cpus()[0].model}, ${os.cpus().length} cores; load average ${os.loadavg().map((v) => v.toFixed(2)).join(' ')}`)
console.log('threads | forward b128 ms | forward b1 ms | train step b128 ms')
for (let t = 1; t <= MAX; t++) {
  const m = Model.fromBytesSync(bytes, { threads: t })
  const f128 = best(() => m.forward({ x: x128 }))
  const f1 = best(() => m.forward({ x: x1 }))
  m.trainStep({ x: x128, y: y128 }, { optimizer: 'adam', lr: 1e-3 })
  const step = best(() => m.trainStep({ x: x128, y: y128 }), Math.max(5, ROUNDS >> 2))
  console.log(`${String(m.backendInfo.threads).padStart(7)} | ${f128.toFixed(3).padStart(15)} | ${f1.toFixed(3).padStart(13)} | ${step.toFixed(3).padStart(18)}`)
  m.dispose()
}
