"""Quantized matmuls over many rows (a prompt's tokens, issue 30): each weight panel is dequantized once.

- The float path throughout (POLY_INT8_DOT=0; Q8_0 and Q4_0 prompts on a CPU with VNNI otherwise take the
  8-bit route, tests/test_int8_gemm.py).
- Numbers: QuantWeight.matmul_t over Q8_0, Q4_0 and Q4_K blocks equals NumPy's x @ W.T on the gguf
  package's dequantized values (float64, within the float32 summation bound) on every backend, at row
  counts 1, 3, 17 and 69, fixed or a bound Variable (the prompt's case: padded row tiles); every block
  format at a Variable row count.
- Structure: on the CPU backend the prompt kernel stages its dequantized weight (host_opts'
  decompress_stage_opts: OUTER + STAGE on the column panel) and its row loop reads no byte of the blocks,
  so the dequantization is not repeated per row tile; the tile is an outer product (columns as vector
  lanes, no split reduction) with or without a costly epilogue (exp); a float32 matmul of the same shape
  is unchanged. The staged copy runs in vectors along each block's bytes and transposes them in
  registers (L.TRANSPOSE) into the panel's column layout; the transpose's shuffle rounds
  (cstyle.transpose_rounds) are checked against NumPy.
"""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("gguf")

import hf_checkpoints as hc  # noqa: E402

from polygrad import Context, Tensor, Variable  # noqa: E402
from polygrad.codegen.lower import lower  # noqa: E402
from polygrad.codegen.opts import OptKind  # noqa: E402
from polygrad.device import open_device  # noqa: E402
from polygrad.nn.quant import QuantWeight, quantize_rows  # noqa: E402
from polygrad.renderer.cstyle import transpose_rounds  # noqa: E402
from polygrad.renderer.linearize import L, linearize  # noqa: E402
from polygrad.uop.ops import Ops  # noqa: E402

@pytest.fixture(autouse=True)
def _float_path():
    """This file checks the float path (every format's, and the fallback of Q8_0 and Q4_0); their 8-bit
    route on a CPU with VNNI is tests/test_int8_gemm.py's."""
    with Context(POLY_INT8_DOT=0):
        yield


FORMATS = ("Q8_0", "Q4_0", "Q4_K")
ALL_FORMATS = ("Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K", "Q8_K")
# formats whose blocks hold their quants in runs of 16 bytes or more: the staged copy transposes in
# registers (Q5_0 and Q5_1 keep 8-byte runs: their copy stores each vector of 8 as a scatter)
TRANSPOSED_FORMATS = ("Q8_0", "Q4_0", "Q4_1", "Q4_K", "Q5_K", "Q6_K", "Q8_K")
N, K = 128, 256  # two 64-column panels; one Q4_K super-block or eight 32-weight blocks per row


def _weight(fmt: str) -> tuple[np.ndarray, np.ndarray]:
    """(blocks, their float32 values by the gguf package) of a random (N, K) weight."""
    w = np.random.default_rng(1).standard_normal((N, K)).astype(np.float32)
    blocks = quantize_rows(w, fmt)
    return blocks, hc.reference_dequantize(blocks.reshape(N, -1), fmt).reshape(N, K)


def _rows(x: Tensor, rows: int, symbolic: bool) -> Tensor:
    return x.reshape(Variable("tokens", 1, 128).bind(rows), K) if symbolic else x


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("rows", [1, 3, 17, 69])
@pytest.mark.parametrize("symbolic", [False, True], ids=["fixed", "variable"])
def test_prompt_matmul_matches_numpy(device, fmt, rows, symbolic):
    blocks, w = _weight(fmt)
    x = np.random.default_rng(rows).standard_normal((rows, K)).astype(np.float32)
    qw = QuantWeight(Tensor(blocks, device=device), fmt, (N, K))
    got = qw.matmul_t(_rows(Tensor(x, device=device), rows, symbolic)).numpy().reshape(rows, N)
    want = x.astype(np.float64) @ w.T.astype(np.float64)
    bound = K * 2.0 ** -24 * (np.abs(x) @ np.abs(w).T)
    assert np.all(np.abs(got - want) <= bound), float(np.max(np.abs(got - want) - bound))


@pytest.mark.parametrize("fmt", ALL_FORMATS)
def test_every_format_prompt_matmul_matches_numpy(device, fmt):
    """Every block format over a Variable row count (21 of at most 128): each staged-copy plan (transposed,
    scattered) against the gguf package's values."""
    blocks, w = _weight(fmt)
    x = np.random.default_rng(7).standard_normal((21, K)).astype(np.float32)
    qw = QuantWeight(Tensor(blocks, device=device), fmt, (N, K))
    got = qw.matmul_t(_rows(Tensor(x, device=device), 21, True)).numpy().reshape(21, N)
    want = x.astype(np.float64) @ w.T.astype(np.float64)
    bound = K * 2.0 ** -24 * (np.abs(x) @ np.abs(w).T)
    assert np.all(np.abs(got - want) <= bound), float(np.max(np.abs(got - want) - bound))


@pytest.mark.parametrize("fmt", ["Q4_0", "Q4_K"])
def test_prompt_matmul_with_an_exp_epilogue_matches_numpy(device, fmt):
    """A costly epilogue (a transcendental) takes the outer-product tile with the staged panel on the CPU."""
    blocks, w = _weight(fmt)
    x = np.random.default_rng(5).standard_normal((21, K)).astype(np.float32) * 0.05
    qw = QuantWeight(Tensor(blocks, device=device), fmt, (N, K))
    got = qw.matmul_t(_rows(Tensor(x, device=device), 21, True)).exp().numpy().reshape(21, N)
    y = x.astype(np.float64) @ w.T.astype(np.float64)
    # the matmul's summation bound carried through exp (d exp(y) = exp(y) dy), plus a few ulp of exp itself
    tol = np.exp(y) * (K * 2.0 ** -24 * (np.abs(x) @ np.abs(w).T) + 2e-6)
    assert np.all(np.abs(got - np.exp(y)) <= tol), float(np.max(np.abs(got - np.exp(y)) - tol))


def _prompt_kernel(fmt: str, epilogue: bool = False):
    """The CPU kernel of a prompt-shaped (Variable rows) quantized matmul (with an exp after it, or not) and a
    float32 one, lowered by the heuristics."""
    blocks, w = _weight(fmt)
    x = _rows(Tensor(np.ones((40, K), np.float32)).realize(), 40, True)
    qw = QuantWeight(Tensor(blocks).realize(), fmt, (N, K))
    wf = Tensor(w).realize()
    with hc.RecordedKernels() as k:
        (qw.matmul_t(x).exp() if epilogue else qw.matmul_t(x)).realize()
        (x @ wf.T).realize()
    caps = open_device("CPU").capabilities
    return [lower(ast, caps) for ast in k.asts], caps


def _row_loop_reads(spec, caps, slot: int) -> tuple[int, int]:
    """(loads of buffer `slot` inside the loop over the Variable rows, loads of it anywhere)."""
    rows = {r.arg for r in spec.ast.toposort() if r.op is Ops.RANGE and r.src[0].op is not Ops.CONST}
    prog = linearize(spec, vector_width=spec.vector_width)
    param = next(i for i in prog.params if i.arg[0] == slot)
    depth, inside, total = 0, 0, 0
    for inst in prog.insts:
        if inst.op is L.LOOP and (depth or inst.arg in rows):
            depth += 1
        elif inst.op is L.ENDLOOP and depth:
            depth -= 1
        elif inst.op is L.LOAD and inst.src[0] is param:
            total += 1
            inside += depth > 0
    return inside, total


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("epilogue", [False, True], ids=["plain", "exp"])
def test_prompt_kernel_dequantizes_outside_the_row_loop(fmt, epilogue):
    """The staged panel under an outer-product tile whose columns (vector lanes) are 64 weight rows, with or
    without a costly epilogue (the exp then runs in vectors); no tile of dot products (split reduction),
    which read each row tile's activations again per 4 weight rows."""
    (quant, floats), caps = _prompt_kernel(fmt, epilogue)
    if not caps.stage_bytes or caps.vector_width < 8:
        pytest.skip("the CPU backend here has no staging scratch or vector lanes")
    kinds = [o.kind for o in quant.opts]
    assert OptKind.STAGE in kinds and OptKind.OUTER in kinds, quant.opts
    blocks_slot = next(o.amount for o in quant.opts if o.kind is OptKind.STAGE)
    inside, total = _row_loop_reads(quant, caps, blocks_slot)
    assert total > 0 and inside == 0, (inside, total)
    assert OptKind.SPLIT_REDUCE not in kinds, quant.opts
    # the float matmul of the same shape reads its weight directly (no staging for a plain load)
    assert OptKind.STAGE not in [o.kind for o in floats.opts], floats.opts


@pytest.mark.parametrize("fmt", TRANSPOSED_FORMATS)
def test_prompt_kernel_transposes_its_panel_in_vectors(fmt):
    """The staged copy reads each block's bytes as vectors and stores the panel with contiguous vector
    stores, through one 16 x 16 transpose in registers per 16 weight rows x 16 weights (it ran as scalar
    loops, about 15 operations a weight, and for Q8_K gathered bytes lane by lane)."""
    (quant, _), caps = _prompt_kernel(fmt)
    if not caps.stage_bytes or caps.vector_width != 16:
        pytest.skip("the CPU backend here has no staging scratch or no 16-lane vectors")
    prog = linearize(quant, vector_width=quant.vector_width)
    transposes = [i for i in prog.insts if i.op is getattr(L, "TRANSPOSE", None)]
    local = next(i for i in prog.insts if i.op is L.LOCAL)
    stores = [i for i in prog.insts if i.op is L.STORE and i.src[0] is local]
    assert len(transposes) == 16 and all(t.lanes == 16 and len(t.src) == 16 for t in transposes), len(transposes)
    assert len(stores) == 16 and all(s.arg == "contiguous" and s.src[2] in transposes for s in stores), stores


@pytest.mark.parametrize("n", [4, 8, 16])
def test_transpose_rounds_transpose_a_square(n):
    """The C renderer's shuffle rounds, applied to an n x n array, give its transpose."""
    rows = np.arange(n * n).reshape(n, n)
    for shuffles in transpose_rounds(n):
        rows = np.stack([np.concatenate([rows[a], rows[b]])[[int(i) for i in lanes.split(",")]]
                         for a, b, lanes in shuffles])
    np.testing.assert_array_equal(rows, np.arange(n * n).reshape(n, n).T)
