// Type declarations for the polygrad npm package (CommonJS, ES module and browser builds).

export type DType = 'bool' | 'int8' | 'uint8' | 'int16' | 'uint16' | 'int32' | 'uint32' | 'int64' | 'uint64' |
  'float16' | 'bfloat16' | 'float32' | 'float64'

/** A dimension: a size, or the name of a bounded Variable such as 'batch' (format 1: leading dimension only). */
export type Dim = number | string

export interface TensorSpec { name: string; dtype: DType; shape: Dim[] }

export interface Signature { inputs: TensorSpec[]; targets: TensorSpec[]; outputs: TensorSpec[] }

export type TypedArray = Float32Array | Float64Array | Int8Array | Uint8Array | Uint8ClampedArray | Int16Array |
  Uint16Array | Int32Array | Uint32Array | BigInt64Array | BigUint64Array

/** An input: a typed array or plain array read with the signature's shape, a nested array of that shape, or
 * {data, shape}. A Variable dimension takes any size within its bounds (flat data: one Variable dimension at
 * most). */
export type Input = TypedArray | number[] | boolean[] | bigint[] | unknown[][] | { data: TypedArray | number[]; shape: number[] }

/** A result: a copy of the output buffer (float16/bfloat16 widened to Float32Array) with its shape. */
export type Output = TypedArray & { readonly shape: number[] }

export interface LoadOptions {
  /** Default: 'wasm' where WebAssembly SIMD exists, else 'js'. 'auto': the same, but an asynchronous load takes
   * 'webgpu' first on a hardware adapter (synchronous loads never do). 'webgpu' (asynchronous loads only; a
   * fallback adapter too), 'wasm' or 'js'. Any other name, or an option not listed here, is a ModelError. */
  backend?: 'auto' | 'webgpu' | 'wasm' | 'js'
  /** Refuse bundles whose buffers need more bytes than this (default: max(256 MiB, 16 x the file's size)). */
  maxBytes?: number
  /** Refuse bundles one of whose entrypoints evaluates more kernel nodes per call than this (default: max(2**36,
   * 2**16 x the file's size)). Both defaults are Python's (docs/bundle-format.md, "Trust model"). */
  maxWork?: number
  /** Check every kernel's indices at load ('all'), or forward's at load and the others' when first compiled (default). */
  validate?: 'forward' | 'all'
  /** Prove the lowered kernels' indices again; accesses it cannot prove get run-time checks (default false). */
  verify?: boolean
  /** Threads the kernels run on, an integer 1..16 (else a ModelError). Default: the cores, at most 8, where
   * SharedArrayBuffer is usable (Node; a cross-origin isolated page), else 1; the 'js' backend always runs on 1.
   * Results are bit for bit those of one thread. See Model.backendInfo. */
  threads?: number
  /** wasm: a float32 reduction step (matmul, convolution) acc + a * b as one relaxed-SIMD multiply-add where the
   * engine has it (Chrome 114+, Node 22+): faster, rounded once or twice as the hardware does it. false keeps the
   * separate multiply and add everywhere (default true; see BackendInfo.fma). */
  fma?: boolean
  /** wasm: a quantized bundle's int8 block sums (captured on Python polygrad's int8 route) with relaxed SIMD's int8
   * dot product where the engine computes it (Chrome 114+): exact, results equal to the plain path's. false keeps
   * 32-bit lanes (default true). */
  int8Dot?: boolean
}

/** The backend a model runs on: its name, its threads, and why (or null) an async 'auto' load did not take
 * webgpu and why threads are 1. */
export interface BackendInfo {
  name: 'webgpu' | 'wasm' | 'js'
  threads: number
  reason: string | null
  /** Whether the wasm kernels' reduction steps use relaxed SIMD's multiply-add (the fma load option). */
  fma: boolean
}

export interface OptimizerOptions {
  /** 'sgd', 'adam' or 'adamw' (built in JavaScript when the bundle holds another one). Default: the bundle's, else 'sgd'. */
  optimizer?: 'sgd' | 'adam' | 'adamw' | 'lamb'
  lr?: number
  momentum?: number
  weight_decay?: number
  weightDecay?: number
  nesterov?: boolean
  betas?: [number, number]
  eps?: number
}

export interface FitOptions extends OptimizerOptions {
  epochs?: number
  /** Samples per step (default: all of them as one batch). */
  batchSize?: number
  /** What to do with an incomplete final batch: null (an error), 'drop' or 'keep'. */
  remainder?: null | 'drop' | 'keep'
  onStep?: (loss: number, step: number) => void
}

export interface ParameterInfo { name: string; dtype: DType; shape: Dim[]; count: number }

export interface Summary {
  inputs: TensorSpec[]
  targets: TensorSpec[]
  outputs: TensorSpec[]
  entrypoints: string[]
  parameters: ParameterInfo[]
  state: ParameterInfo[]
  parameterCount: number
  bytes: Record<string, number>
  memoryBytes: number
  backend: 'webgpu' | 'wasm' | 'js'
  optimizer: Record<string, unknown> | null
  toString(): string
}

export class Model {
  /** Node: read and compile a .pgb file synchronously. */
  static load (path: string, opts?: LoadOptions): Model
  /** Node: Model.load's asynchronous twin (every backend, webgpu included). */
  static loadAsync (path: string, opts?: LoadOptions): Promise<Model>
  /** Browser: fetch a bundle and compile it asynchronously. */
  static fetch (url: string, opts?: LoadOptions): Promise<Model>
  /** Everywhere: compile bundle bytes asynchronously (every entrypoint). */
  static fromBytes (bytes: Uint8Array | ArrayBuffer, opts?: LoadOptions): Promise<Model>
  /** Compile bundle bytes synchronously (Node; small bundles in browsers). */
  static fromBytesSync (bytes: Uint8Array | ArrayBuffer, opts?: LoadOptions): Model

  readonly signature: Signature
  readonly entrypoints: string[]
  readonly variables: Record<string, { min: number; max: number }>
  readonly backend: 'webgpu' | 'wasm' | 'js'
  /** The backend, its threads, and why they are 1: a page that is not cross-origin isolated, threads: 1, the js
   * backend. In a browser, synchronous calls run on one thread; the async twins use them all. */
  readonly backendInfo: BackendInfo

  forward (inputs: Record<string, Input>): Record<string, Output>
  /** Any entrypoint; an entrypoint's Variable arguments (a decode step's `pos`) are passed as integers by name. */
  call (entrypoint: string, inputs?: Record<string, Input | number>): Record<string, Output>
  /** One optimizer step on one batch (inputs and targets together); the loss before the update. */
  trainStep (data: Record<string, Input>, opts?: OptimizerOptions): number
  /** Python's Model.fit: samples in order, minibatches of batchSize; one loss per step. */
  fit (data: Record<string, Input>, opts?: FitOptions): number[]
  /** The async twins: the same results without blocking (kernels compiled asynchronously, worker threads awaited).
   * A browser's main thread uses threads only through these; one call at a time per model (a ModelError else).
   * A webgpu model takes only these (its synchronous calls, save and parameters are ModelErrors naming them). */
  forwardAsync (inputs: Record<string, Input>): Promise<Record<string, Output>>
  callAsync (entrypoint: string, inputs?: Record<string, Input | number>): Promise<Record<string, Output>>
  trainStepAsync (data: Record<string, Input>, opts?: OptimizerOptions): Promise<number>
  fitAsync (data: Record<string, Input>, opts?: FitOptions): Promise<number[]>
  summary (): Summary
  parameters (): Record<string, { data: Output; shape: Dim[]; dtype: DType }>
  parametersAsync (): Promise<Record<string, { data: Output; shape: Dim[]; dtype: DType }>>
  /** The bundle bytes of the model as it is now (Python's Model.load reads them). */
  save (): Uint8Array
  /** save() of any backend; on webgpu the weights are read back from the GPU first. */
  saveAsync (): Promise<Uint8Array>
  /** Frees the model and ends its worker threads; later calls throw ModelError. */
  dispose (): void
}

export const VERSION: string
export function simdSupported (): boolean

export class PolygradError extends Error {}
export class BundleError extends PolygradError {}
export class KernelError extends PolygradError {}
export class ModelError extends PolygradError {}
export class ModelInputError extends ModelError {}
export class EntrypointError extends ModelError {}
