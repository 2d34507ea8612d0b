#!/usr/bin/env node
'use strict'
/**
 * npm test: node --test test/, with the environment the webgpu tests need where there is no GPU: Dawn (the
 * optional `webgpu` package) on the CPU through Chromium's SwiftShader Vulkan driver, when Chromium ships
 * one ($CHROMIUM_LIB, default /usr/lib/chromium) and VK_ICD_FILENAMES is not set already (a real GPU's
 * driver is then left alone). The loader reads LD_LIBRARY_PATH at process start, so it is set here.
 *
 *   node tools/test.js [node --test arguments, default test/]
 */

const fs = require('fs')
const path = require('path')
const { spawnSync } = require('child_process')

const lib = process.env.CHROMIUM_LIB || '/usr/lib/chromium'
const icd = path.join(lib, 'vk_swiftshader_icd.json')
const env = Object.assign({}, process.env)
if (!env.VK_ICD_FILENAMES && fs.existsSync(icd)) {
  env.VK_ICD_FILENAMES = icd
  env.LD_LIBRARY_PATH = [lib, env.LD_LIBRARY_PATH].filter(Boolean).join(':')
}
const args = process.argv.slice(2)
const r = spawnSync(process.execPath, ['--test', ...(args.length ? args : ['test/'])], { env, stdio: 'inherit', cwd: path.join(__dirname, '..') })
process.exit(r.status === null ? 1 : r.status)
