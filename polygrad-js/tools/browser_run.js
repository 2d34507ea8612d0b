#!/usr/bin/env node
'use strict'
/**
 * Drive headless Chromium (Debian's `chromium`, through playwright-core) for the browser tests:
 *   node tools/browser_run.js URL RESULT_JSON [SCREENSHOT_PNG] [--wait EXPR] [--timeout MS]
 * Opens URL with a fresh profile, waits until EXPR (default `window.__result`) is set, writes its value
 * (plus the console log and, for the demo, the count of plotted pixels) to RESULT_JSON, and screenshots.
 */

const fs = require('fs')
const os = require('os')
const path = require('path')
const { chromium } = require('playwright-core')

const FLAGS = ['--no-sandbox', '--disable-gpu', '--no-first-run', '--disable-background-networking',
  '--disable-component-update', '--disable-sync']

async function main () {
  const [url, out, shot] = process.argv.slice(2).filter((a, i, all) => !a.startsWith('--') && !(all[i - 1] || '').startsWith('--'))
  const opt = (name, dflt) => {
    const i = process.argv.indexOf(name)
    return i > 0 ? process.argv[i + 1] : dflt
  }
  const expr = opt('--wait', 'window.__result')
  const timeout = Number(opt('--timeout', 60000))
  const profile = fs.mkdtempSync(path.join(os.tmpdir(), 'polygrad-chromium-'))
  const context = await chromium.launchPersistentContext(profile, {
    executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
    headless: true,
    args: ['--headless', ...FLAGS],
    viewport: { width: 720, height: 480 }
  })
  const logs = []
  try {
    const page = context.pages()[0] || await context.newPage()
    page.on('console', (m) => logs.push(`${m.type()}: ${m.text()}`))
    page.on('pageerror', (e) => logs.push(`pageerror: ${e.message}`))
    await page.goto(url)
    await page.waitForFunction(`(${expr}) !== undefined || window.demoError !== undefined`, null, { timeout })
    const value = await page.evaluate(`(${expr})`)
    const result = { value, logs, demoError: await page.evaluate('window.demoError') }
    result.plotted = await page.evaluate(() => {
      const c = document.querySelector('canvas')
      if (!c) return null
      const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data
      let blue = 0
      for (let i = 0; i < d.length; i += 4) if (d[i + 2] > 180 && d[i] < 120 && d[i + 3] > 0) blue++
      return blue
    })
    result.status = await page.evaluate(() => (document.getElementById('status') || {}).textContent || null)
    if (shot) await page.screenshot({ path: shot })
    fs.writeFileSync(out, JSON.stringify(result))
  } finally {
    await context.close()
    fs.rmSync(profile, { recursive: true, force: true })
  }
}

main().catch((e) => {
  console.error(e)
  process.exit(1)
})
