'use strict'
/**
 * Finding a WebGPU device: the platform's GPU object (a browser's navigator.gpu, or in Node the optional
 * `webgpu` package's, injected by index.js), its adapter and one device shared by every model.
 *
 * Stage: device setup for the webgpu backend (runtime.js). Input: nothing. Output: adapterInfo() ->
 * {adapter, fallback, reason} and device() -> a GPUDevice with the adapter's storage-buffer limits.
 */

const { ModelError } = require('../errors')

let provider = null // async () => a GPU object (navigator.gpu's interface) or null
let found = null // the promise of {adapter, fallback, reason}, once
let shared = null // the promise of the shared GPUDevice
let keep = null // the GPU object: Dawn's (Node) frees its adapters and devices when it is collected

/** Set where the GPU object comes from (index.js: the optional `webgpu` package in Node). */
function setProvider (fn) {
  provider = fn
  found = null
  shared = null
}

async function gpuObject () {
  if (provider) return provider()
  return (typeof navigator !== 'undefined' && navigator.gpu) || null
}

/** {adapter, fallback, reason}: the platform's adapter (null with the reason why), and whether it is a
 * fallback (software) adapter. Asked once per process. */
function adapterInfo () {
  if (!found) {
    found = (async () => {
      let gpu
      try {
        gpu = await gpuObject()
      } catch (e) {
        return { adapter: null, fallback: false, reason: `no WebGPU in this runtime (${e.message})` }
      }
      keep = gpu
      if (!gpu) return { adapter: null, fallback: false, reason: 'no WebGPU in this runtime (in Node install the optional package webgpu; in a browser, one with WebGPU enabled)' }
      const adapter = await gpu.requestAdapter()
      if (!adapter) return { adapter: null, fallback: false, reason: 'no WebGPU adapter (no GPU, or its driver is not usable)' }
      const fallback = !!((adapter.info && adapter.info.isFallbackAdapter) || adapter.isFallbackAdapter)
      return { adapter, fallback, reason: null }
    })()
  }
  return found
}

/** The shared GPUDevice (ModelError when there is no adapter), with the adapter's largest storage buffers. */
function device () {
  if (!shared) {
    shared = (async () => {
      const { adapter, reason } = await adapterInfo()
      if (!adapter) throw new ModelError(`backend 'webgpu' needs a WebGPU adapter: ${reason}. Load with { backend: 'auto' } or { backend: 'wasm' }`)
      const L = adapter.limits
      const d = await adapter.requestDevice({
        requiredLimits: { maxStorageBufferBindingSize: L.maxStorageBufferBindingSize, maxBufferSize: L.maxBufferSize }
      })
      d.lost.then(() => { shared = null })
      return d
    })()
    shared.catch(() => { shared = null })
  }
  return shared
}

module.exports = { setProvider, adapterInfo, device }
