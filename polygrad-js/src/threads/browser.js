'use strict'
/**
 * The browser thread platform (pool.setPlatform, installed by the browser build, tools/build.js): Web Workers
 * started from a Blob URL of the build's own module table (`source`: the text of the function that returns
 * its `load`), so the package ships no worker file and a page needs no extra URL. Threads need
 * SharedArrayBuffer, which a browser gives only to a cross-origin isolated page (served with
 * Cross-Origin-Opener-Policy: same-origin and Cross-Origin-Embedder-Policy: require-corp). A page's main
 * thread cannot block, so only the async calls (forwardAsync, ...) use the workers (canBlock: false).
 */

const NOT_ISOLATED = 'this page is not cross-origin isolated, so SharedArrayBuffer is unavailable; serve it with the headers Cross-Origin-Opener-Policy: same-origin and Cross-Origin-Embedder-Policy: require-corp'

function browserPlatform (source) {
  let url = null
  const spawn = () => {
    if (url === null) {
      const boot = `(${source})()('./threads/worker').start({ post: (m) => self.postMessage(m), onMessage: (fn) => self.addEventListener('message', (e) => fn(e.data)) })\n`
      url = URL.createObjectURL(new Blob([boot], { type: 'text/javascript' }))
    }
    const w = new Worker(url)
    return {
      post: (m) => w.postMessage(m),
      onMessage: (fn) => w.addEventListener('message', (e) => fn(e.data)),
      terminate: () => w.terminate()
    }
  }
  let sharedMemory = null
  if (typeof Worker !== 'function' || typeof Blob !== 'function') sharedMemory = 'this environment has no Web Workers'
  else if (typeof crossOriginIsolated !== 'undefined' && !crossOriginIsolated) sharedMemory = NOT_ISOLATED
  const cores = (typeof navigator !== 'undefined' && navigator.hardwareConcurrency) || 1
  return { name: 'browser', cores, sharedMemory, canBlock: false, spawn }
}

module.exports = { browserPlatform, NOT_ISOLATED }
