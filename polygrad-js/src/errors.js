'use strict'
/**
 * Typed errors. Every failure the package reports is one of these, and every message says what to do.
 *
 *   PolygradError        base class
 *   BundleError          a .pgb file that cannot be read: truncated, corrupted, another version, inconsistent
 *   KernelError          a kernel the package cannot run safely (malformed IR, an access outside its buffers)
 *   ModelError           a Model used in a way it cannot serve (disposed, no training entrypoint, bad options)
 *   ModelInputError      an input or target with a wrong name, shape or dtype
 *   EntrypointError      an entrypoint the bundle does not have
 */

class PolygradError extends Error {
  constructor (message) {
    super(message)
    this.name = this.constructor.name
  }
}

class BundleError extends PolygradError {}
class KernelError extends PolygradError {}
class ModelError extends PolygradError {}
class ModelInputError extends ModelError {}
class EntrypointError extends ModelError {}

module.exports = { PolygradError, BundleError, KernelError, ModelError, ModelInputError, EntrypointError }
