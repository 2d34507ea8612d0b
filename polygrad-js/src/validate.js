'use strict'
/** Placeholder: no index proven yet (every access is checked at run time). */
function checkKernel (g, ast, where) {
  return new Set()
}
module.exports = { checkKernel }
