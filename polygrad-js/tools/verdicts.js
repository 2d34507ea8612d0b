'use strict'
/**
 * The loader's verdict on every bundle of a folder: `node tools/verdicts.js DIR OUT.json [OPTIONS_JSON] [path|bytes]`.
 *
 * Stage: tests (the differential corpus of tests/test_bundle_differential.py). Input: DIR/*.pgb and the
 * Model.load options (JSON: maxBytes, maxWork, ...; the defaults otherwise, which validate every kernel at
 * load, as Python does), and how each file is given: its path (Model.load, the default: read a piece at a time)
 * or its bytes (Model.fromBytesSync of the whole file, as a browser loads). Output: OUT.json, {file name: {verdict, error, message}} with verdict 'accept' (loaded
 * and compiled), 'reject' (a BundleError from a check) or 'crash' (any other exception, or an engine error
 * the last line of defence wrapped: a bug, since every file the checks pass must load).
 */

const fs = require('fs')
const path = require('path')
const { Model, BundleError } = require('..')

function main () {
  const [dir, out, options, how = 'path'] = process.argv.slice(2)
  const opts = options ? JSON.parse(options) : {}
  if (how !== 'path' && how !== 'bytes') throw new Error(`how a file is given is 'path' or 'bytes', not ${JSON.stringify(how)}`)
  const result = {}
  for (const file of fs.readdirSync(dir).filter((f) => f.endsWith('.pgb')).sort()) {
    let row
    try {
      const where = path.join(dir, file)
      const model = how === 'path' ? Model.load(where, opts) : Model.fromBytesSync(fs.readFileSync(where), opts)
      model.dispose()
      row = { verdict: 'accept' }
    } catch (e) {
      const name = e && e.constructor ? e.constructor.name : typeof e
      // the last line of defence (model.js asLoadError) turns an engine error into a BundleError: still a bug
      const typed = e instanceof BundleError && !/^this bundle cannot be loaded here/.test(e.message)
      row = { verdict: typed ? 'reject' : 'crash', error: name, message: String(e && e.message).slice(0, 400) }
    }
    result[file] = row
  }
  fs.writeFileSync(out, JSON.stringify(result, null, 1))
}

main()
