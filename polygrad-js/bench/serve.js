'use strict'
// A local HTTP server for the Chromium benches' pages, cross-origin isolated (SharedArrayBuffer, so threads).
const http = require('http')

/**
 * Serve `files` (url path -> [content type, () => body]) on 127.0.0.1 at a free port; `fallback(url)` may
 * give an entry for other paths (undefined: 404). Resolves to the listening server.
 */
function serveIsolated (files, fallback = () => undefined) {
  const server = http.createServer((req, res) => {
    const url = req.url.split('?')[0]
    const entry = files[url] || fallback(url)
    if (!entry) {
      res.writeHead(404)
      return res.end()
    }
    res.writeHead(200, {
      'Content-Type': entry[0],
      'Cross-Origin-Opener-Policy': 'same-origin',
      'Cross-Origin-Embedder-Policy': 'require-corp',
      'Cross-Origin-Resource-Policy': 'same-origin'
    })
    res.end(entry[1]())
  })
  return new Promise((resolve) => server.listen(0, '127.0.0.1', () => resolve(server)))
}

module.exports = { serveIsolated }
