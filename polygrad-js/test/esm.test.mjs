// The ES module entry (import { Model } from 'polygrad') and the browser build's module table.
import test from 'node:test'
import assert from 'node:assert'
import { readFileSync, existsSync } from 'node:fs'
import { fileURLToPath } from 'node:url'
import { Model, ModelError, BundleError } from '../index.mjs'

const fixture = (name) => readFileSync(fileURLToPath(new URL(`./fixtures/${name}`, import.meta.url)))

test('import { Model } from the package runs a bundle', async () => {
  const m = await Model.fromBytes(fixture('linear.pgb'))
  const { prediction } = m.forward({ x: [3, 4, 5, 6, 7] })
  assert.ok(Math.abs(prediction[0] - 11) < 0.2)
  m.dispose()
  assert.ok(new BundleError('x') instanceof Error)
  assert.strictEqual(typeof ModelError, 'function')
})

test('the browser build exports the same API and forbids Model.load', async () => {
  const dist = new URL('../dist/polygrad.browser.mjs', import.meta.url)
  if (!existsSync(fileURLToPath(dist))) return // built by `npm test` (tools/build.js)
  const api = await import(dist.href)
  assert.deepStrictEqual(Object.keys(api).sort(), ['BundleError', 'EntrypointError', 'KernelError', 'Model', 'ModelError', 'ModelInputError', 'PolygradError', 'VERSION', 'default', 'simdSupported'])
  const m = api.Model.fromBytesSync(fixture('linear.pgb'))
  assert.strictEqual(m.forward({ x: [1, 1, 1, 1, 1] }).prediction.length, 5)
  assert.throws(() => api.Model.load('x.pgb'), api.ModelError)
  assert.strictEqual(typeof api.Model.fetch, 'function')
})
