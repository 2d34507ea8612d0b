'use strict'
// Kernels split across worker threads (issue 31): results bit for bit those of one thread, the load option and
// backendInfo, the async twins, and worker lifetime (dispose ends them; a process never waits on them).
const test = require('node:test')
const assert = require('node:assert')
const os = require('os')
const path = require('path')
const { spawnSync } = require('child_process')
const { Model, ModelError } = require('..')
const { FIXTURES, fixture, reference } = require('./helpers')
const { relaxedSimdSupported } = require('../src/wasm/module')

const ref = reference()
const ROOT = path.join(__dirname, '..')

/** A model on `threads` threads whose every threadable call is shared with the workers (the fixtures are far
 * below the work threshold that keeps small calls on one thread). */
function load (name, threads, opts = {}) {
  const m = Model.fromBytesSync(fixture(name), Object.assign({ threads }, opts))
  m._x.minWork = 0
  return m
}

/** The same bits; any NaN matches any NaN (WebAssembly leaves a NaN's sign and payload to the engine). */
function sameBits (a, b, what) {
  assert.strictEqual(a.length, b.length, what)
  const ua = new Uint8Array(a.buffer, a.byteOffset, a.byteLength)
  const ub = new Uint8Array(b.buffer, b.byteOffset, b.byteLength)
  for (let i = 0; i < a.length; i++) {
    if (Number.isNaN(a[i]) && Number.isNaN(b[i])) continue
    const s = i * a.BYTES_PER_ELEMENT
    for (let j = 0; j < a.BYTES_PER_ELEMENT; j++) assert.strictEqual(ua[s + j], ub[s + j], `${what}: element ${i}: ${a[i]} vs ${b[i]}`)
  }
}

function params (m) {
  return Object.fromEntries(Object.entries(m.parameters()).map(([k, v]) => [k, v.data]))
}

const cases = [
  ['mlp_untrained.pgb', (m) => m.forward({ x: ref.mlp.x }).logits],
  ['mlp_wide.pgb', (m) => m.forward({ x: ref.wide.x }).logits],
  ['mlp_wide.pgb', (m) => m.forward({ x: ref.wide.x.slice(0, 1) }).logits], // the few-rows variant
  ['linear.pgb', (m) => m.forward({ x: ref.linear.x }).prediction],
  ['decoder.pgb', (m) => {
    const cols = (a, b) => ref.decoder.ids.map((r) => r.slice(a, b))
    const out = [m.forward({ ids: cols(0, 3) }).logits]
    for (let p = 3; p < 5; p++) out.push(m.call('decode', { ids: cols(p, p + 1), pos: p }).logits)
    return Float32Array.from(out.flatMap((o) => Array.from(o)))
  }]
]

for (const [name, run] of cases) {
  test(`${name}: 2 and 3 threads give the bits of one thread`, () => {
    const one = load(name, 1)
    const want = run(one)
    one.dispose()
    for (const threads of [2, 3]) {
      const m = load(name, threads)
      assert.deepStrictEqual(m.backendInfo, { name: 'wasm', threads, reason: null, fma: relaxedSimdSupported() })
      sameBits(run(m), want, `${name} on ${threads} threads`)
      sameBits(run(m), want, `${name} on ${threads} threads, again`)
      assert.ok(m._x.pool.calls > 0, 'the workers ran slices')
      m.dispose()
    }
  })
}

test('a training trajectory (fit, then trainStep) on 2 threads is the one of 1 thread, bit for bit', () => {
  const trajectory = (threads) => {
    const m = load('mlp_adam.pgb', threads)
    const losses = m.fit({ x: ref.mlp.x, y: ref.mlp.y }, { epochs: 3, batchSize: 4, optimizer: 'adam', lr: 0.01 })
    losses.push(m.trainStep({ x: ref.mlp.x.slice(0, 4), y: ref.mlp.y.slice(0, 4) }, { optimizer: 'sgd', lr: 0.1, momentum: 0.9 }))
    const out = { losses: Float32Array.from(losses), params: params(m), logits: m.forward({ x: ref.mlp.x }).logits, calls: m._x.pool ? m._x.pool.calls : 0 }
    m.dispose()
    return out
  }
  const a = trajectory(1)
  const b = trajectory(2)
  assert.ok(b.calls > 0, 'the workers ran slices')
  sameBits(b.losses, a.losses, 'losses')
  for (const k of Object.keys(a.params)) sameBits(b.params[k], a.params[k], k)
  sameBits(b.logits, a.logits, 'logits after training')
})

test('an embedding (a scatter-add gradient: not split) trains on 2 threads as on 1', () => {
  const losses = (threads) => {
    const m = load('embedding_sgd.pgb', threads)
    const out = m.fit({ ids: ref.embedding.ids, y: ref.embedding.y }, { epochs: 3, batchSize: 4, optimizer: 'sgd', lr: 0.5 })
    m.dispose()
    return Float32Array.from(out)
  }
  sameBits(losses(2), losses(1), 'losses')
})

test('threads is a positive integer up to 16; anything else is a ModelError that says what to pass', async () => {
  const bytes = fixture('linear.pgb')
  for (const threads of [0, -1, 1.5, '2', 17, null, NaN, true]) {
    assert.throws(() => Model.fromBytesSync(bytes, { threads }), (e) => e instanceof ModelError && /threads must be an integer from 1 to 16/.test(e.message), String(threads))
    await assert.rejects(Model.fromBytes(bytes, { threads }), ModelError)
  }
  assert.throws(() => Model.load(path.join(FIXTURES, 'linear.pgb'), { threads: 0 }), ModelError)
})

test('backendInfo: the backend, its threads, and why there is one', () => {
  const bytes = fixture('linear.pgb')
  const dflt = Model.fromBytesSync(bytes)
  const cores = typeof os.availableParallelism === 'function' ? os.availableParallelism() : os.cpus().length
  assert.deepStrictEqual(dflt.backendInfo, { name: 'wasm', threads: Math.min(8, cores), reason: cores > 1 ? null : 'this machine has one core', fma: relaxedSimdSupported() })
  assert.strictEqual(dflt.backend, 'wasm') // still the name
  dflt.dispose()
  const one = Model.fromBytesSync(bytes, { threads: 1 })
  assert.deepStrictEqual(one.backendInfo, { name: 'wasm', threads: 1, reason: 'threads: 1 was asked', fma: relaxedSimdSupported() })
  assert.strictEqual(one._x.pool, null)
  one.dispose()
  const js = Model.fromBytesSync(bytes, { backend: 'js', threads: 4 })
  assert.deepStrictEqual(js.backendInfo, { name: 'js', threads: 1, reason: "the 'js' backend runs on one thread", fma: false })
  js.dispose()
  assert.throws(() => js.backendInfo, ModelError)
})

test('the async twins give the results of the synchronous calls, on 1 and 2 threads', async () => {
  for (const threads of [1, 2]) {
    const sync = load('mlp_adam.pgb', threads)
    const m = await Model.fromBytes(fixture('mlp_adam.pgb'), { threads })
    m._x.minWork = 0
    sameBits((await m.forwardAsync({ x: ref.mlp.x })).logits, sync.forward({ x: ref.mlp.x }).logits, 'forwardAsync')
    sameBits((await m.callAsync('forward', { x: ref.mlp.x })).logits, sync.call('forward', { x: ref.mlp.x }).logits, 'callAsync')
    const data = { x: ref.mlp.x, y: ref.mlp.y }
    const opts = { epochs: 2, batchSize: 4, optimizer: 'adam', lr: 0.01 }
    const seen = []
    sameBits(Float32Array.from(await m.fitAsync(data, Object.assign({ onStep: (l) => seen.push(l) }, opts))), Float32Array.from(sync.fit(data, opts)), 'fitAsync')
    assert.strictEqual(seen.length, 2 * Math.ceil(ref.mlp.x.length / 4))
    const step = { x: ref.mlp.x.slice(0, 4), y: ref.mlp.y.slice(0, 4) }
    assert.ok(Object.is(await m.trainStepAsync(step, { lr: 0.02 }), sync.trainStep(step, { lr: 0.02 })), 'trainStepAsync')
    for (const [k, v] of Object.entries(params(sync))) sameBits(params(m)[k], v, k)
    if (threads > 1) assert.ok(m._x.pool.calls > 0, 'the workers ran slices')
    // one call at a time: a second call while one is awaited is a ModelError
    const first = m.forwardAsync({ x: ref.mlp.x })
    assert.throws(() => m.forward({ x: ref.mlp.x }), (e) => e instanceof ModelError && /still running/.test(e.message))
    await assert.rejects(m.forwardAsync({ x: ref.mlp.x }), /still running/)
    await first
    m.dispose()
    sync.dispose()
  }
})

/** Every call of `m`'s pool made to wait, in its first chunk on this thread, until a worker has run chunks of
 * it: the workers then run most of each call (up to 10 s for them to start, else an error). */
function workersFirst (m) {
  const pool = m._x.pool
  const call = pool.call.bind(pool)
  pool.call = (site, own, args) => {
    const before = pool.workerChunks()
    let first = true
    call(site, (...a) => {
      if (first) {
        first = false
        const deadline = Date.now() + 10000
        while (pool.workerChunks() === before) if (Date.now() > deadline) throw new Error('no worker took a chunk in 10 s')
      }
      own(...a)
    }, args)
  }
}

test('chunks the workers run give the bits of one thread (each call waits for a worker to take chunks)', () => {
  const name = 'decoder.pgb'
  const run = cases.find((c) => c[0] === name)[1]
  const one = load(name, 1)
  const want = run(one)
  one.dispose()
  for (const threads of [2, 3]) {
    const m = load(name, threads)
    workersFirst(m)
    sameBits(run(m), want, `${name} on ${threads} threads`)
    assert.ok(m._x.pool.workerChunks() >= m._x.pool.calls, 'a worker ran chunks of every call')
    m.dispose()
  }
})

/** CPU time (ms, every thread of this process) while this thread sleeps `ms` without ending its session. */
function cpuWhileAsleep (ms) {
  const c0 = process.cpuUsage()
  Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, ms)
  const c = process.cpuUsage(c0)
  return (c.user + c.system) / 1000
}

test('workers spin only a while: in a session whose caller stops sending calls they sleep', () => {
  const m = load('mlp_wide.pgb', 2)
  workersFirst(m) // the worker is in the session, and has just run chunks
  m.forward({ x: ref.wide.x })
  const pool = m._x.pool
  const step = m._x.entries.forward.find((st) => !st.copy && st.main.phases)
  const ph = step.main.phases[0]
  pool.call(ph.site, ph.fn, step.main.vars.map(() => ref.wide.x.length)) // its one Variable: the batch
  assert.ok(pool.session, 'the session is still open')
  const busy = cpuWhileAsleep(400)
  pool.end()
  assert.ok(busy < 80, `the process used ${busy.toFixed(1)} ms of CPU in 400 ms with the workers idle in a session`)
  assert.ok(cpuWhileAsleep(200) < 40, 'and between entrypoint calls')
  m.dispose()
})

test('a call whose workers never come is run by the calling thread alone (chunks are taken, not assigned)', () => {
  const out = exitsByItself(`
const api = require('.')
const { Model } = api
// the pool module of the API in use (the package's built bundle when it is fresh, else src/: not a second copy)
const pool = api._internals.threads
const node = require('./src/threads/node')
const x = require('./test/fixtures/reference.json').wide.x
const bytes = require('fs').readFileSync('test/fixtures/mlp_wide.pgb')
const one = Model.fromBytesSync(bytes, { threads: 1 }).forward({ x }).logits
// workers that never receive the message that starts a session
pool.setPlatform(Object.assign({}, node, { spawn () {
  const w = node.spawn()
  const post = w.post
  w.post = (msg) => { if (msg.type !== 'session') post(msg) }
  return w
} }))
const m = Model.fromBytesSync(bytes, { threads: 2 })
m._x.minWork = 0
const two = m.forward({ x }).logits
const same = Buffer.compare(Buffer.from(one.buffer), Buffer.from(two.buffer)) === 0
process.stdout.write([m._x.pool.calls > 0, m._x.pool.workerChunks(), same].join(' '))
m.dispose()`)
  assert.strictEqual(out, 'true 0 true')
})

test('calls below THREAD_MIN_WORK never start the workers, though they reach THREAD_HOT_WORK', () => {
  const m = load('mlp_wide.pgb', 2)
  m._x.minWork = Infinity
  m._x.minHotWork = 0
  m.forward({ x: ref.wide.x })
  m.forward({ x: ref.wide.x })
  assert.strictEqual(m._x.pool.calls, 0)
  assert.strictEqual(m._x.pool.workers, null, 'no worker started')
  m.dispose()
})

/** Run `code` in a fresh Node process; it must exit by itself (no worker left holding it) within 20 s. */
function exitsByItself (code) {
  const r = spawnSync(process.execPath, ['-e', code], { cwd: ROOT, timeout: 20000, encoding: 'utf8' })
  assert.strictEqual(r.error, undefined, `the process did not exit by itself: ${r.error && r.error.message}`)
  assert.strictEqual(r.status, 0, r.stderr)
  return r.stdout
}

const RUN = `
const { Model } = require('.')
const m = Model.load('test/fixtures/mlp_wide.pgb', { threads: 2 })
m._x.minWork = 0
const x = require('./test/fixtures/reference.json').wide.x
m.forward({ x })
`

test('a process that disposed its threaded model exits by itself, its workers ended', () => {
  const out = exitsByItself(RUN + `
const { threadId } = require('worker_threads')
const workers = m._x.pool.workers.length
m.dispose()
process.stdout.write(String(workers) + ' ' + String(m._disposed))`)
  assert.strictEqual(out, '1 true')
})

test('a process that forgot dispose() exits by itself too (idle workers are unref\'d)', async () => {
  exitsByItself(RUN)
  exitsByItself(RUN + 'm.forwardAsync({ x }).then((r) => { if (!r.logits) process.exit(3) })')
})
