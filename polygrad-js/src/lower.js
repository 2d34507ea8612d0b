'use strict'
/**
 * Device optimisation for the WebAssembly target: `chooseOpts(ast, width)` and `applyOpts(g, ast, opts)`.
 *
 * Stage: lowering, after index simplification, before linearizing. Input: a simplified kernel (global and
 * reduce ranges). Output: the same kernel with ranges split, as polygrad's codegen/lower.py does:
 *   UPCAST r by n        r -> ro*n + ri, ri an `upcast` range (register tiles; unrolled by the linearizer)
 *   VECTOR r by w        the same split, ri the block's vector range (w lanes of 128-bit SIMD)
 *   SPLIT_REDUCE r by w  REDUCE over r -> REDUCE(REDUCE(body, ro), ri): one partial accumulator per lane
 *   UNROLL r by n        a reduce range r -> ro*n + ri, ri an `upcast` range of the same REDUCE (its steps
 *                        unrolled into the same accumulators; after SPLIT_REDUCE it splits the outer part;
 *                        by r's whole size: r becomes ri, no loop left)
 *   a symbolic range (a Variable's size) is tiled with a clamp: r -> min(ro*n + ri, size-1), ro < ceil(size/n);
 *   the last tile recomputes the last row and stores the same values again (never used for a kernel that
 *   reads a buffer it writes); an UPCAST or VECTOR marked `clamp` tiles a constant size n it does not divide
 *   with its last tile moved back to start at n - amount (overlapping the one before: its points store again)
 *   SPLIT_ACC r by n     a reduce range r -> ro*n + ri: REDUCE(REDUCE(body, ro), ri), ri an `upcast` range, so
 *                        n partial accumulators, each over every n-th step, summed in order at the end (after
 *                        SPLIT_REDUCE it splits the outer part: n vector accumulators; changes the sum's order)
 *   OUTER r              r's loop becomes its block's outermost (a weight panel read once per call)
 *   PANELS r by n        a global range r -> ro*n + ri, ri a global loop innermost of its block's loops (after
 *                        OUTER r: for each group of n column panels, every row tile, then each panel of the
 *                        group: a row tile's operand stays in L1 while the group's panels come from L2)
 * Where this differs from Python's heuristics (which target C compilers): a matmul whose operands are both
 * contiguous along the reduction (x @ W.T, PyTorch's Linear layout) vectorises the reduction itself
 * (SPLIT_REDUCE into lanes, the lanes summed at the end) instead of gathering columns; the other matmul
 * layouts vectorise the output's contiguous axis; a kernel with neither (a convolution on a 7x7 image) vectorises
 * a range along which the reduction's operands are contiguous (its output channels); a small window (a
 * depthwise convolution, a pooling) is unrolled whole with its output row tiled (windowOpts). Tiles are sized
 * for 16 SIMD registers.
 */

const { DTYPES } = require('./dtypes')
const { toposort } = require('./ir')
const { rangeCoeff, simplifyIndices } = require('./simplify')
const { aluFn } = require('./scalar')

const constSize = (r) => (r.src[0].op === 'CONST' ? Number(r.src[0].arg) : null)

function rangesOf (ast) {
  return toposort(ast).filter((n) => n.op === 'RANGE').sort((a, b) => a.arg[0] - b.arg[0])
}

const TOP_REDUCES = new WeakMap()

/** REDUCE nodes reachable from u without passing through another REDUCE, sources first (cached). */
function topLevelReduces (u) {
  let hit = TOP_REDUCES.get(u)
  if (!hit) {
    hit = findTopLevelReduces(u)
    TOP_REDUCES.set(u, hit)
  }
  return hit
}

function findTopLevelReduces (u) {
  const out = new Set()
  const seen = new Set()
  const stack = [u]
  while (stack.length) {
    const x = stack.pop()
    if (seen.has(x)) continue
    seen.add(x)
    if (x.op === 'REDUCE') {
      out.add(x)
      continue
    }
    stack.push(...x.src)
  }
  const order = new Map(toposort(u).map((n, i) => [n, i]))
  return [...out].sort((a, b) => order.get(a) - order.get(b))
}

const VECTOR_DTYPES = new Set(['float32', 'int32', 'uint32'])
// loaded in lanes widened to 32 bits (linearize.js NARROW_LANE_DTYPES): a quantized weight's uint8 blocks,
// read by the kernels that dequantize them (polygrad.quantize), vectorise as float32 weights do
const NARROW_LOAD_DTYPES = new Set(['uint8', 'int8'])

/** Whether a kernel has an accumulating STORE (arg ADD/MUL/MAX): such a kernel gets no opts at all, so its
 * points run one at a time in loop order, as in Python's lowering. */
function hasAccumulatingStore (ast) {
  return toposort(ast).some((n) => n.op === 'STORE' && n.arg !== null)
}

/**
 * The optimisations for one kernel: a list of {kind, range, amount}. `width` is the SIMD lane count of
 * 32-bit values (4 for wasm SIMD; 1: no vector code, no tiles). `dotCols`: the columns of a tile whose block
 * sums are on 8-bit activations (dotGroupUnroll), 2 or 4, by engine (runtime.js: see DOT_COLS).
 */
function chooseOpts (ast, width, { dotCols = 2 } = {}) {
  if (width <= 1 || hasAccumulatingStore(ast)) return []
  return ast.src.flatMap((block) => (block.op === 'END' ? blockOpts(block, width, dotCols) : []))
}

function blockOpts (end, width, dotCols = 2) {
  const store = end.src[0]
  if (store.op !== 'STORE') return []
  const nodes = toposort(store)
  const loads = nodes.filter((n) => n.op === 'LOAD').map((n) => n.src[0])
  const storeIndex = store.src[0]
  // a bool buffer may be read (a mask: the linearizer loads it in lanes where it is contiguous), not written;
  // so may 8-bit integers (a quantized weight's blocks, widened in lanes)
  if (!VECTOR_DTYPES.has(storeIndex.dtype.name)) return []
  if (loads.some((ix) => !VECTOR_DTYPES.has(ix.dtype.name) && !NARROW_LOAD_DTYPES.has(ix.dtype.name) && !ix.dtype.isBool)) return []
  const glob = end.src.slice(1).filter((r) => r.arg[1] === 'global')
  const written = new Set([storeIndex.src[0].arg[0]])
  const inPlace = loads.some((ix) => written.has(ix.src[0].arg[0]))
  const reduces = nodes.filter((n) => n.op === 'REDUCE')
  const coeff = (ix, r) => rangeCoeff(ix.src[1], r)
  const opts = []

  // rows: a second global range tiled by `rows` (a clamp where symbolic), the innermost across which some load
  // is reused (a 1x1 convolution's pixel rows reuse no vector of its image, its output channels do: MobileNetV2's
  // expansions at 28 and 56 pixels had one accumulator a tile)
  const rowTile = (exclude, rows, reusedBy) => {
    const r = glob.filter((x) => x !== exclude).reverse().find((x) => loads.some((ix) => coeff(ix, x) === 0 && reusedBy(ix)))
    if (!r) return
    const n = constSize(r)
    if (n === null) {
      if (!inPlace) opts.push({ kind: 'UPCAST', range: r, amount: rows })
      return
    }
    const amt = [rows, 4, 2].find((a) => a <= rows && n % a === 0 && n >= a)
    if (amt && amt > 1) opts.push({ kind: 'UPCAST', range: r, amount: amt })
    // no divisor (ResNet's 7-pixel rows): the tile anyway, its last one moved back to overlap (applyOpts);
    // one pixel a tile keeps 2 accumulators, too few to hide an add's latency (ResNet-18 b1 took 1.4x the time)
    else if (!amt && n > rows && !inPlace) opts.push({ kind: 'UPCAST', range: r, amount: rows, clamp: true })
  }

  if (!reduces.length) {
    const last = glob[glob.length - 1]
    const n = last ? constSize(last) : null
    // over a prompt's tokens (attention's softmax over its keys): lanes along the Variable's range
    if (last && n === null) return symbolicLanes(last, { loads, storeIndex, inPlace, width, gathers: false })
    if (n === null || n % width !== 0 || coeff(storeIndex, last) !== 1) return []
    opts.push({ kind: 'VECTOR', range: last, amount: width })
    if ((n / width) % 2 === 0) opts.push({ kind: 'UPCAST', range: last, amount: 2 })
    return opts
  }
  const tops = topLevelReduces(store)
  // C: vectorise a global range along which the reduction's operands are contiguous (and not gated) or constant: a
  // convolution's output channels (its weight stored (*kernel, in, out), as polygrad.onnx keeps it), where the
  // image row is too narrow for A (7 or 14 pixels), or A's vector operand is read through a padding gate
  // (lane by lane), and the channels are strided for B. The store (once per output) and an epilogue's loads
  // (a bias, a residual) go lane by lane. Also for two reductions in one kernel (a block's convolution and
  // its 1x1 shortcut), which A and B do not take.
  const channelVector = () => {
    const operands = new Set(tops.flatMap((red) => toposort(red)).filter((n) => n.op === 'LOAD').map((n) => n.src[0]))
    const inner = loads.filter((ix) => operands.has(ix))
    for (const r of [...glob].reverse()) {
      const n = constSize(r)
      if (n === null || n % width !== 0 || !inner.some((ix) => coeff(ix, r) === 1)) continue
      if (!inner.every((ix) => { const c = coeff(ix, r); return c === 0 || c === 1 }) || gatedAlong(r)) continue
      const cols = [2, 1].find((c) => (n / width) % c === 0)
      const tile = [{ kind: 'VECTOR', range: r, amount: width }]
      if (cols > 1) tile.push({ kind: 'UPCAST', range: r, amount: cols })
      return { range: r, opts: tile }
    }
    return null
  }
  const gatedAlong = (r) => loads.some((ix) => ix.src.length > 2 && coeff(ix, r) === 1)
  const channels = channelVector()
  // C's tile: 8 channels (2 vectors) x 4 pixels of a row, or 16 x 2 where the row takes 2 (ResNet's 14-pixel
  // rows): 8 accumulators either way, 6 loads per step (16 x 2: ResNet-18's 14x14 layers about 0.8x the time)
  const channelTile = () => {
    opts.push(...channels.opts)
    rowTile(channels.range, 4, (ix) => coeff(ix, channels.range) !== 0)
    const rows = opts.find((o) => o.kind === 'UPCAST' && o.range !== channels.range)
    const cols = opts.find((o) => o.kind === 'UPCAST' && o.range === channels.range)
    if (rows && rows.amount === 2 && cols && (constSize(channels.range) / width) % 4 === 0) cols.amount = 4
    return opts
  }
  if (tops.length !== 1) return channels === null ? [] : channelTile()
  const red = reduces.find((r) => tops[0] === r)
  const k = red.src[red.src.length - 1]
  // A: vectorise the output's contiguous axis (every load that moves along it moves contiguously)
  const last = glob[glob.length - 1]
  const nLast = last ? constSize(last) : null
  if (rowDotShape(red, last, nLast, { loads, storeIndex, width })) {
    // a prompt's x @ W.T on the multi-row int8 route (nn/quant.py _int8_matmul_rows): lanes along the weight
    // rows of a panel, whose bytes are not contiguous across the lanes (linearize.js rowDotReduce reads each
    // lane's 4 bytes of a turn at once), 2 vectors x 4 rows a tile
    opts.push({ kind: 'VECTOR', range: last, amount: width })
    if ((nLast / width) % 2 === 0) opts.push({ kind: 'UPCAST', range: last, amount: 2 })
    rowTile(last, 4, (ix) => coeff(ix, last) !== 0)
    return opts
  }
  const preferChannels = channels !== null && channels.range !== last && gatedAlong(last)
  if (last && nLast !== null && nLast % width === 0 && coeff(storeIndex, last) === 1 && !preferChannels &&
      loads.every((ix) => { const c = coeff(ix, last); return c === 0 || c === 1 })) {
    opts.push({ kind: 'VECTOR', range: last, amount: width })
    // one row (a decode step's x @ W: no row range to tile) takes 4 column vectors, else 2: each accumulator is
    // one chain of adds (multiply-adds with fma), one link per step, so 2 chains left the step waiting on the
    // add's latency (GPT-2 small's decode matvecs about 1.7x the time, cache-resident; fma's longer latency
    // made it worse, 1.2x again, in Chromium). The columns' sums are the same either way.
    const wideCols = glob.length === 1 && red.src.length === 2 ? [ONE_ROW_COLS] : []
    // many rows (a prompt's x @ W, a 1x1 convolution's pixels): 2 rows x 4 column vectors, not 4 x 2 (manyRowCols)
    const cols = [...wideCols, ...manyRowCols(glob, red), 2, 1].find((c) => (nLast / width) % c === 0)
    if (cols > 1) opts.push({ kind: 'UPCAST', range: last, amount: cols })
    rowTile(last, cols === MANY_ROW_COLS ? 2 : 4, (ix) => coeff(ix, last) !== 0)
    if (glob.length === 2) opts.push(...panelGroups(opts, last, nLast / (width * Math.max(cols, 1)), width * Math.max(cols, 1) * reduceSize(red)))
    if (glob.length === 2) opts.push({ kind: 'OUTER', range: last, amount: 1 })
    // a 2-D window (a depthwise convolution on a row the lanes divide): unrolled whole, as D does
    if (red.src.length > 2) opts.push(...unrollWindow(red))
    return opts
  }
  // B: vectorise the reduction (partial sums per lane) when its loads are contiguous along it
  const nk = constSize(k)
  if (k.arg[1] === 'reduce' && nk !== null && nk % width === 0 && nk >= 2 * width &&
      loads.every((ix) => { const c = coeff(ix, k); return c === 0 || c === 1 }) &&
      loads.some((ix) => coeff(ix, k) === 1)) {
    opts.push({ kind: 'SPLIT_REDUCE', range: k, amount: width })
    const blocks = loads.some((ix) => NARROW_LOAD_DTYPES.has(ix.dtype.name))
    if (blocks) opts.push(...blockUnroll(red, k, loads))
    const groups = blocks ? dotGroupUnroll(red, k, nk / width) : []
    opts.push(...groups)
    // over several rows a quantized weight's tile is 4 rows x 2 columns, not 2 x 4: each dequantized vector
    // (5 to 9 ops from its bytes) serves 4 rows (GPT-2 small's 32-token prompt: about 0.88x the time at Q8_0,
    // 0.72x at Q4_0). A block sum on 8-bit activations (dotGroupUnroll) takes 2 columns too: with 4, V8 spilled
    // 55 values a block step of the Q8_0 decode matvec (224 instructions for 4 columns, 99 for 2 with 1 spill;
    // GPT-2 small's 3072-column matvec about 0.85x the time at Q8_0, 0.9x at Q4_0, Node 20, load average 4.5);
    // Chromium's V8 holds 4 (dotCols: its matvecs about 0.83x the time of 2 columns, cache-resident). One row of
    // 8-bit weight blocks takes one column: read whole, the weight streams fastest one row at a time (streamsBlocks)
    const wide = blocks && glob.length > 1 ? 2 : blocks && groups.length ? (streamsBlocks(red, last, loads) ? 1 : dotCols) : 4
    if (last) {
      // 2 rows x 4 columns (8 accumulators, 6 loads per step: 15 of the 16 SIMD registers with the product);
      // 4 x 2 where the columns do not divide by 4. Of the two shapes with the same load count, 2 x 4 streams
      // two rows of the swept operand instead of four (about 4% faster on the benchmark's MLP).
      let cols = 1
      if (nLast !== null && loads.some((ix) => coeff(ix, last) === 0)) {
        cols = [4, 2, 1].filter((c) => c <= wide).find((c) => nLast % c === 0)
        if (cols > 1) opts.push({ kind: 'UPCAST', range: last, amount: cols })
        else if (nLast >= 16 && !inPlace && wide > 1 && (glob.length > 1 || groups.length)) {
          // an odd column count (GPT-2's 50257-token head) over several rows: 4 columns a tile anyway, the last
          // tile moved back to end at the last column (applyOpts); 1 column a tile ran at about half the rate.
          // Not for one row of float weights (a decode step's head): there one column streams the weight fastest
          // (fewRowsOpts). One row of block sums on 8-bit activations (dotGroupUnroll) computes more than it
          // streams: its dotCols columns share the activations' widened bytes and each column's lane sums fold
          // once a tile (GPT-2 small's Q4_0 head in Chromium 156, a cache-resident 1/64: 53 us against 72)
          cols = wide
          opts.push({ kind: 'UPCAST', range: last, amount: cols, clamp: true })
        }
      }
      // one row and one column a tile (a decode step's head, 50257 columns): the column's 4 lanes were one chain
      // of adds over the reduction, the step waiting on each; SPLIT_ACC keeps 4 (or 2) vector partial sums of
      // alternate steps instead, read as one stream still (column tiles read 4 weight rows at once: cache-
      // resident as fast, but about 2x the time on the whole 154 MB head). Its sum's order changes.
      if (cols === 1 && glob.length === 1 && nLast !== null && loads.some((ix) => coeff(ix, last) === 0) && !blocks) {
        const steps = nk / width
        const accs = [ONE_ROW_ACCS, 2].find((a) => steps % a === 0 && steps >= 2 * a)
        if (accs) opts.push({ kind: 'SPLIT_ACC', range: k, amount: accs })
      }
      rowTile(last, cols === 4 ? 2 : 4, (ix) => coeff(ix, last) !== 0)
      // the column tiles' loop outermost: each block of weight rows is read once, the rows it meets stay cached
      if (glob.length === 2) opts.push({ kind: 'OUTER', range: last, amount: 1 })
    }
    return opts
  }
  if (channels !== null) return channelTile()
  // a reduction over a prompt's tokens per row of them (attention's softmax max and sum over its keys): lanes
  // along the rows, each lane its own row's sum in the same order (bits unchanged); the loads that move along
  // the rows by more than one element (the scores, the mask) are gathered
  if (last && nLast === null && red.src.slice(1).some((r) => constSize(r) === null)) {
    return symbolicLanes(last, { loads, storeIndex, inPlace, width, gathers: true })
  }
  return windowOpts(red, last, { loads, storeIndex, inPlace, width })
}

/**
 * Lanes along `last`, a global range over a Variable (a prompt's tokens), for a kernel that the rules over
 * constant sizes leave scalar: where the Variable's maximum is a multiple of the lanes (symbolicTiles: the
 * last tile reads past the size inside the buffers and its stores are gated lane by lane), the store moves
 * along it contiguously and no load is of the buffer it writes; its loads move along it by 0 or 1 elements,
 * or (`gathers`) any float32 load in any way (a row's stride is the Variable itself). GPT-2's 32-token prompt: attention's softmax kernels ran
 * as scalar code, about 6% of the prompt on one thread.
 */
function symbolicLanes (last, { loads, storeIndex, inPlace, width, gathers }) {
  if (inPlace || !symbolicTiles(last.src[0], width) || rangeCoeff(storeIndex.src[1], last) !== 1) return []
  const fits = (ix) => {
    const c = rangeCoeff(ix.src[1], last)
    return c === 0 || c === 1 || (gathers && ix.dtype.name === 'float32')
  }
  return loads.every(fits) ? [{ kind: 'VECTOR', range: last, amount: width }] : []
}

/**
 * Whether red (a float sum over blocks) is a multi-row int8 matmul that linearize.js rowDotReduce takes with
 * lanes along `last`: 8-bit loads only inside int32 sums whose last range has 4 points along which they are
 * contiguous, at least one of them moving along `last` by a constant other than 0 or 1 (a gather in lanes
 * otherwise, which 8-bit loads do not have: the whole kernel ran as scalar code); every other load moves
 * along `last` by 0 or 1 and the store by 1.
 */
function rowDotShape (red, last, nLast, { loads, storeIndex, width }) {
  if (width !== 4 || !last || nLast === null || nLast % width !== 0 || rangeCoeff(storeIndex.src[1], last) !== 1) return false
  const inner = toposort(red.src[0]).filter((n) => n.op === 'REDUCE' && n.dtype.name === 'int32' && n.arg === 'ADD')
  const narrowIn = new Map()
  for (const r of inner) {
    const k = r.src[r.src.length - 1]
    if (constSize(k) !== 4) continue
    for (const n of toposort(r.src[0])) if (n.op === 'LOAD' && NARROW_LOAD_DTYPES.has(n.dtype.name)) narrowIn.set(n.src[0], k)
  }
  let strided = false
  for (const ix of loads) {
    const c = rangeCoeff(ix.src[1], last)
    if (!NARROW_LOAD_DTYPES.has(ix.dtype.name)) {
      if (c !== 0 && c !== 1) return false
      continue
    }
    const k = narrowIn.get(ix)
    if (!k || rangeCoeff(ix.src[1], k) !== 1 || c === null || c < 0) return false
    if (c !== 0 && c !== 1) strided = true
  }
  return strided
}

// one row's register tile: x @ W's column vectors (blockOpts A), x @ W.T's partial sums of one column (B)
const ONE_ROW_COLS = 4
const ONE_ROW_ACCS = 4

// the bytes of weight panels a PANELS opt keeps together (panelGroups): well inside a core's 1 MB L2, beside the rows
const PANELS_BYTES = 384 * 1024

/**
 * Whether one row of block sums (a decode step's matvec on 8-bit activations) reads at least a byte of weight a
 * value (Q8_0's 34-byte blocks of 32; Q4_0's 18 are 4.5 bits): such a weight streams fastest as one row at a
 * time. With dotCols columns a tile GPT-2 small's Q8_0 decode kernels ran faster cache-resident but took 1.66x
 * the time of one column on the whole model (Chromium 156, one thread: 24.4 ms a step against 14.7; Node 20 at 2
 * columns 29.1 against 14.9; bench/gpt2_kernels_browser.js --profile decode), where Q4_0's, computing more a byte,
 * took 0.86x (14.2 against 16.5).
 */
function streamsBlocks (red, last, loads) {
  if (!last) return false
  let values = 1
  for (const n of toposort(red)) {
    if (n.op === 'REDUCE') for (const r of n.src.slice(1)) values *= constSize(r) || 0
  }
  const rowBytes = loads.filter((ix) => NARROW_LOAD_DTYPES.has(ix.dtype.name)).map((ix) => rangeCoeff(ix.src[1], last) || 0)
  return values > 0 && Math.max(0, ...rowBytes) >= values
}

/** The points of a reduction (its ranges' sizes multiplied; a Variable's range counts as null). */
function reduceSize (red) {
  return red.src.slice(1).reduce((a, r) => (a === null || constSize(r) === null ? null : a * constSize(r)), 1)
}

/**
 * A PANELS opt for a matrix product's column tiles (blockOpts A, before OUTER), given `tiles` column tiles of
 * `panelElems` weight elements each (float32): where a row tile (an UPCAST of the other global range) exists,
 * the largest group of panels that divides the tiles, fits PANELS_BYTES and leaves at least 2 groups (threads
 * split the groups). The loop order becomes group, row tile, panel of the group, reduction: before, every
 * row tile swept a whole panel and its rows, more than L1 holds (GPT-2's prompt x @ W: a 24 KB panel and 12 KB
 * of rows), so each step's loads missed L1; now the row tile stays in L1 across a group's panels. Each output
 * is the same sum in the same order: bits unchanged.
 */
function panelGroups (opts, last, tiles, panelElems) {
  const rows = opts.some((o) => o.kind === 'UPCAST' && o.range !== last)
  if (!rows || !Number.isInteger(tiles) || !panelElems) return []
  let best = 1
  for (let d = 2; d <= tiles / 2; d++) {
    if (tiles % d === 0 && d * panelElems * 4 <= PANELS_BYTES) best = d
  }
  return best > 1 ? [{ kind: 'PANELS', range: last, amount: best }] : []
}

// x @ W over many rows (blockOpts A): column vectors per tile, with 2 rows
const MANY_ROW_COLS = 4

/**
 * The column vectors that blockOpts A tries first for a matrix product over rows (two global ranges, one
 * reduce range): MANY_ROW_COLS, with 2 rows. Both 2 x 4 and 4 x 2 keep 8 accumulators and 6 loads a step
 * (V8 loads a step's operands at its top, so 8 accumulators and 6 operands are what 15 SIMD registers hold;
 * 3 x 3 spilled an accumulator and ran at about half the rate), but 2 x 4 broadcasts 2 row values a step
 * instead of 4 and reads 4 weight vectors, one 64-byte line of the packed copy (pack.js).
 */
function manyRowCols (glob, red) {
  return glob.length === 2 && red.src.length === 2 ? [MANY_ROW_COLS] : []
}

// A window reduction (a depthwise convolution, a pooling) of at most this many points is unrolled whole
const WINDOW_MAX = 32

/**
 * D: a small window (a depthwise 3x3 convolution, a pooling) on a row that the lanes do not divide or read at a
 * stride (MobileNetV2's 14- and 7-pixel rows, its stride-2 layers, ResNet's max pool), which A and B do not take
 * and which ran as a scalar loop of 3 steps per output point (about 0.3 G points/s). The window is unrolled
 * whole into straight code, and the row is tiled: in 4 lanes where its loads run along it contiguously (the
 * last tile moved back to end at the row's end, as a clamped UPCAST; a padded window's interior loads whole
 * vectors, wasm/emit.js), else 4 pixels of scalar code.
 */
function windowOpts (red, last, { loads, storeIndex, inPlace, width }) {
  const unroll = unrollWindow(red)
  const n = last ? constSize(last) : null
  if (!unroll.length || n === null || inPlace || rangeCoeff(storeIndex.src[1], last) !== 1) return []
  const opts = []
  // lanes where every load moves along the row by 0, 1 or 2 elements (stride 2: two vector loads and a shuffle)
  const contiguous = loads.every((ix) => { const c = rangeCoeff(ix.src[1], last); return c === 0 || c === 1 || (c === 2 && ix.dtype.size === 4) })
  if (contiguous && n >= width) opts.push({ kind: 'VECTOR', range: last, amount: width, clamp: n % width !== 0 })
  else if (n >= 4) opts.push({ kind: 'UPCAST', range: last, amount: 4, clamp: n % 4 !== 0 })
  return [...opts, ...unroll]
}

/** UNROLLs of each of a reduction's ranges whole, when all are constant and span at most WINDOW_MAX points. */
function unrollWindow (red) {
  const window = red.src.slice(1)
  const points = window.reduce((a, r) => a * (constSize(r) || Infinity), 1)
  return points <= WINDOW_MAX ? window.map((r) => ({ kind: 'UNROLL', range: r, amount: constSize(r) })) : []
}

// the most points a quantized block's range is unrolled to (blockUnroll)
const BLOCK_UNROLL = 4

/**
 * UNROLL opts for a reduction over quantized blocks (its weights loaded as uint8, split into lanes along k):
 * each reduce range inside the block loop (quant_formats.py `groups`; not k) along which a block byte load
 * does not move is unrolled whole, so that load is made once for all its points: Q4_0's two nibbles of a
 * byte are two points of one range (GPT-2 small at Q4_0: prompt and decode about 1.1x in CPU time, on a
 * loaded machine). Nothing else is unrolled:
 * the block's scale is decoded once per block anyway (linearize.js places a value in the outermost loop
 * its operands allow), and on Q8_0, whose bytes move along every range, unrolling them measured slower
 * (longer live ranges of the shared x vectors in the register tile).
 */
function blockUnroll (red, k, loads) {
  const own = red.src.slice(1)
  if (own.length < 2 || own.some((r) => constSize(r) === null || r.arg[1] !== 'reduce')) return []
  const bytes = loads.filter((ix) => NARROW_LOAD_DTYPES.has(ix.dtype.name) && rangeCoeff(ix.src[1], k) === 1)
  return own.slice(1).filter((r) => r !== k && constSize(r) <= BLOCK_UNROLL &&
    bytes.some((ix) => rangeCoeff(ix.src[1], r) === 0)).map((r) => ({ kind: 'UNROLL', range: r, amount: constSize(r) }))
}

/**
 * An UNROLL of a split reduction's outer part (`groups` vectors of lanes) where each step is an int32 sum of
 * 4 byte products per lane (a decode matvec on 8-bit activations, nn/quant.py _int8_matmul_t: a block's 8
 * lanes are 2 vectors): the groups' dot products (linearize.js dotReduce) then share the block's addresses and
 * scale with no loop around 2 steps, and their bytes are read as whole 16-byte vectors (linearize.js pairHalves).
 * Each sum keeps its order.
 */
function dotGroupUnroll (red, k, groups) {
  if (!Number.isInteger(groups) || groups < 2 || groups > DOT_GROUPS) return []
  const inner = toposort(red.src[0]).filter((n) => n.op === 'REDUCE' && n.dtype.name === 'int32' && n.arg === 'ADD' &&
    n.src.slice(1).every((r) => constSize(r) !== null) && n.src.slice(1).reduce((a, r) => a * constSize(r), 1) === 4 &&
    toposort(n.src[0]).some((u) => u.op === 'LOAD' && NARROW_LOAD_DTYPES.has(u.dtype.name)))
  return inner.length ? [{ kind: 'UNROLL', range: k, amount: groups }] : []
}

// the most lane vectors of a block dotGroupUnroll unrolls (Q8_0's and Q4_0's 8 lanes: 2)
const DOT_GROUPS = 2

/**
 * The opts of a kernel's variant for fewer rows than its row tile `rowTile` (an UPCAST of a Variable-sized
 * range: batch 1 runs it): no row tile; and where the reduction is split into lanes (x @ W.T, one row streaming
 * the weights) 8 columns per tile instead of 2 and the reduction unrolled by 2, so that 16 weight loads are in
 * flight per iteration (on the benchmark's MLP at batch 1 this takes the kernels from about 19 to 33 GFLOP/s);
 * where the output's columns are the lanes (x @ W), 4 column vectors as for one row.
 */
function fewRowsOpts (opts, rowTile) {
  const split = opts.find((o) => o.kind === 'SPLIT_REDUCE')
  const vector = opts.find((o) => o.kind === 'VECTOR')
  const out = []
  for (const o of opts) {
    if (o === rowTile) continue
    // no row tile: nothing stays in L1 across a group of panels (and the tile's columns change below)
    if (o.kind === 'PANELS') continue
    // x @ W without its row tile: as many column vectors as one row's (blockOpts A, ONE_ROW_COLS)
    if (!split && vector && o.kind === 'UPCAST' && o.range === vector.range && o.range.src[0].op === 'CONST' &&
        (Number(o.range.src[0].arg) / vector.amount) % ONE_ROW_COLS === 0) {
      out.push(Object.assign({}, o, { amount: ONE_ROW_COLS }))
      continue
    }
    // a clamped column tile (an odd column count) is left out: one column sweeps x @ W.T's weight as one
    // contiguous stream, where 8 clamped columns (not packable: the clamp is no affine index) read 8 streams
    // (GPT-2's head at batch 1: 8 clamped columns took about 1.6x the time of one)
    if (o.clamp) continue
    if (split && o.kind === 'UPCAST' && o.range.src[0].op === 'CONST') {
      const n = Number(o.range.src[0].arg)
      out.push(Object.assign({}, o, { amount: [8, 4, 2].find((a) => n % a === 0) || o.amount }))
      continue
    }
    out.push(o)
    if (o === split && (constSize(o.range) / o.amount) % 2 === 0) out.push({ kind: 'UNROLL', range: o.range, amount: 2 })
  }
  return out
}

/**
 * Apply opts in order (each splits its range; new ranges get fresh axis ids; an opt naming a range an
 * earlier opt split applies to its outer part). Returns {ast (simplified), vector: Set of vector ranges}.
 */
function applyOpts (g, ast, opts) {
  const vector = new Set()
  const current = new Map() // a range as the opts name it -> the range that now stands for it
  for (const opt of opts) {
    const r = current.get(opt.range) || opt.range
    const ranges = rangesOf(ast)
    if (!ranges.includes(r)) continue
    if (opt.kind === 'OUTER') {
      // loop order: r becomes its END's outermost loop (the operand swept by the inner loops stays cached)
      ast = g.substitute(ast, new Map(toposort(ast).filter((n) => n.op === 'END' && n.src.includes(r)).map((e) =>
        [e, g.node('END', null, [e.src[0], r, ...e.src.slice(1).filter((x) => x !== r)])])))
      continue
    }
    const nextId = Math.max(...ranges.map((x) => x.arg[0])) + 1
    const n = constSize(r)
    const int = r.dtype
    let outer, expr
    // PANELS' inner part is a loop of r's kind (global), innermost of its block's loops; the others' is unrolled
    const inner = g.node('RANGE', int, [g.const(int, opt.amount)], [nextId + 1, opt.kind === 'PANELS' ? r.arg[1] : 'upcast'])
    if (opt.kind === 'PANELS' && (n === null || n % opt.amount !== 0 || r.arg[1] !== 'global')) continue
    if (n !== null && n % opt.amount !== 0) {
      if (!opt.clamp || !['UPCAST', 'VECTOR'].includes(opt.kind) || r.arg[1] !== 'global' || n < opt.amount) continue
      // a constant size the tile does not divide: the last tile starts at n - amount, overlapping the one
      // before (its points store their values again); a tile's points stay start + inner, one pointer apart
      outer = g.node('RANGE', int, [g.const(int, Math.ceil(n / opt.amount))], [nextId, r.arg[1]])
      const start = g.alu('MUL', outer, g.const(int, opt.amount))
      const last = g.const(int, n - opt.amount)
      expr = g.alu('ADD', g.node('WHERE', int, [g.alu('CMPLT', start, last), start, last]), inner)
    } else if (n !== null && n === opt.amount && opt.kind === 'UNROLL') {
      // unrolled whole: no outer loop of one step (a quantized block's ranges, blockUnroll; a window's points)
      ast = substituteRange(g, ast, r, null, inner, inner, opt.kind)
      current.set(opt.range, inner)
      continue
    } else if (n !== null) {
      outer = g.node('RANGE', int, [g.const(int, n / opt.amount)], [nextId, r.arg[1]])
      expr = g.alu('ADD', g.alu('MUL', outer, g.const(int, opt.amount)), inner)
    } else {
      if (!['UPCAST', 'VECTOR'].includes(opt.kind) || r.arg[1] !== 'global') continue
      const size = r.src[0]
      // lanes over a Variable's range only where its maximum is a multiple of them (the gated tile below):
      // a clamped last tile's lanes would not be contiguous
      if (opt.kind === 'VECTOR' && !symbolicTiles(size, opt.amount)) continue
      const tiles = g.alu('IDIV', g.alu('ADD', size, g.const(int, opt.amount - 1)), g.const(int, opt.amount))
      outer = g.node('RANGE', int, [tiles], [nextId, r.arg[1]])
      const raw = g.alu('ADD', g.alu('MUL', outer, g.const(int, opt.amount)), inner)
      if (symbolicTiles(size, opt.amount)) {
        // the buffers hold the Variable's maximum, a multiple of the tile: the last tile reads rows past the
        // size (inside the buffers, values unused) and its stores are gated; rows stay affine (one pointer).
        // As lanes (VECTOR), the gate is per lane: a tile wholly inside stores one vector (wasm/emit.js)
        ast = substituteRange(g, ast, r, outer, inner, raw, opt.kind)
        ast = gateStores(g, ast, inner, g.alu('CMPLT', raw, size))
        current.set(opt.range, outer)
        if (opt.kind === 'VECTOR') vector.add(inner)
        continue
      }
      const lastRow = g.alu('ADD', size, g.const(int, -1))
      expr = g.node('WHERE', int, [g.alu('CMPLT', raw, size), raw, lastRow])
    }
    ast = substituteRange(g, ast, r, outer, inner, expr, opt.kind)
    current.set(opt.range, outer || inner)
    if (opt.kind === 'VECTOR' || opt.kind === 'SPLIT_REDUCE') vector.add(inner)
  }
  return { ast: simplifyIndices(g, ast), vector }
}

/** Whether a range of `size` points may be tiled by `amount` with its last tile's stores gated (applyOpts):
 * a Variable whose maximum (what its buffers hold) is a multiple of amount. */
function symbolicTiles (size, amount) {
  const { bounds } = require('./simplify')
  return size.op === 'DEFINE_VAR' && bounds(size)[1] % amount === 0
}

/** Every STORE that depends on range r gets `cond` AND-ed into its INDEX's gate. */
function gateStores (g, ast, r, cond) {
  const map = new Map()
  for (const st of toposort(ast).filter((n) => n.op === 'STORE' && toposort(n).includes(r))) {
    const ix = st.src[0]
    const gate = ix.src.length > 2 ? g.alu('AND', ix.src[2], cond) : cond
    map.set(st, g.node('STORE', null, [g.node('INDEX', ix.dtype, [ix.src[0], ix.src[1], gate]), st.src[1]], st.arg))
  }
  return g.substitute(ast, map)
}

function substituteRange (g, ast, r, outer, inner, expr, kind) {
  const memo = new Map([[r, expr]])
  for (const node of toposort(ast)) {
    if (memo.has(node)) continue
    let out
    if (node.op === 'END') {
      const rs = node.src.slice(1).map((x) => (x === r ? outer : memo.get(x)))
      if (node.src.slice(1).includes(r)) rs.push(inner)
      out = g.node('END', null, [memo.get(node.src[0]), ...rs])
    } else if (node.op === 'REDUCE' && node.src.slice(1).includes(r)) {
      const body = memo.get(node.src[0])
      const others = node.src.slice(1).filter((x) => x !== r).map((x) => memo.get(x))
      if (kind === 'SPLIT_REDUCE' || kind === 'SPLIT_ACC') {
        const partial = g.node('REDUCE', node.dtype, [body, ...others, outer], node.arg)
        out = g.node('REDUCE', node.dtype, [partial, inner], node.arg)
      } else {
        out = g.node('REDUCE', node.dtype, [body, ...others, ...(outer ? [outer] : []), inner], node.arg)
      }
    } else {
      const src = node.src.map((s) => memo.get(s))
      out = src.every((s, i) => s === node.src[i]) ? node : g.node(node.op, node.dtype, src, node.arg)
    }
    memo.set(node, out)
  }
  return memo.get(ast)
}

// ---- threads
// Below this much work (points: see kernelWork) a kernel runs on the calling thread alone. A hand-off wakes
// the workers through a futex and waits for the last one: about 20-40 us in Node on a 2-core machine
// (measured on the benchmark MLP's last layer, 656k points: 46 us on one thread, 89 us on two). A point is
// at least one multiply-add, and x @ W.T runs about 14 G of them per second on one core in 4 lanes, so
// 2^20 points take about 70 us alone: from there, halving the work pays for the hand-off. (Python's CPU
// backend uses 2^17 operations, THREAD_MIN_WORK in codegen/host_opts.py: its workers wait spinning.)
const THREAD_MIN_WORK = 1 << 20
// While the workers are awake (spinning on the control block after the call before: threads/control.js
// waitWhile), a hand-off costs no futex wake (2-4 us a call measured, against 10-12 us with a wake), and
// calls from this much work (about 10 us alone) on are shared too: GPT-2 small's attention output matvec
// (590k points) in decode.
const THREAD_HOT_WORK = 1 << 17

/**
 * Whether a lowered kernel's blocks may each be split along their outermost loop across threads (linearize
 * with `split`): every block an END whose first loop is a global int32 range (global points are
 * independent: each writes its own elements from values no other point writes), and no accumulating STORE
 * (two points may add into one element). Blocks run one after another (a block may read what the one before
 * wrote), so each is a phase of its own with a join between phases.
 */
function threadable (ast) {
  if (hasAccumulatingStore(ast)) return false
  return ast.src.every((block) => {
    if (block.op !== 'END') return false
    const first = block.src.slice(1).find((r) => r.arg[1] !== 'upcast')
    return first !== undefined && first.arg[1] === 'global' && first.dtype.name === 'int32'
  })
}

/**
 * kernelWork(ast) -> (env) => work: the points a call runs with Variable values `env` (Map name -> int):
 * per block, the points of its ranges times (1 + the points of each reduce it evaluates per point, nested
 * reduces multiplied in). Every point costs at least one operation, so this is a lower bound on the
 * operations that is cheap to evaluate at every call (a few size expressions).
 */
function kernelWork (ast) {
  const terms = [] // [[size UOps multiplied], ...] summed
  const walk = (node, outer) => {
    for (const red of topLevelReduces(node)) {
      const sizes = [...outer, ...red.src.slice(1).map((r) => r.src[0])]
      terms.push(sizes)
      walk(red.src[0], sizes)
    }
  }
  for (const block of ast.src) {
    const store = block.op === 'END' ? block.src[0] : block
    const sizes = block.op === 'END' ? block.src.slice(1).map((r) => r.src[0]) : []
    terms.push(sizes)
    walk(store, sizes)
  }
  return (env) => {
    let total = 0
    for (const sizes of terms) {
      let n = 1
      for (const s of sizes) n *= sizeValue(s, env)
      total += n
    }
    return total
  }
}

/** The value of a range's size with Variables from env (their maximum when absent); an op this does not
 * evaluate counts as its upper bound. */
function sizeValue (u, env) {
  if (u.op === 'CONST') return Number(u.arg)
  if (u.op === 'DEFINE_VAR') return env.has(u.arg[0]) ? env.get(u.arg[0]) : Number(u.arg[2])
  const fn = u.dtype && u.dtype.isInt && u.src.length && ['ADD', 'MUL', 'IDIV', 'MOD', 'MAX'].includes(u.op) ? aluFn(u.op, u.dtype, u.src[0].dtype) : null
  if (fn) return Number(fn(...u.src.map((x) => (u.dtype.bits === 64 ? BigInt(sizeValue(x, env)) : sizeValue(x, env)))))
  const { bounds } = require('./simplify')
  return bounds(u)[1]
}

module.exports = { chooseOpts, fewRowsOpts, applyOpts, topLevelReduces, hasAccumulatingStore, rangesOf, constSize, VECTOR_DTYPES, DTYPES, threadable, kernelWork, sizeValue, THREAD_MIN_WORK, THREAD_HOT_WORK }
