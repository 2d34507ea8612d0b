"""Quantized prompts on integer dot products (issue 30): a Q8_0 or Q4_0 matmul over many rows on 8-bit activations.

- Numbers: on a device declaring Capabilities.int8_dot (the CPU backend with VNNI), QuantWeight.matmul_t over
  1, 15, 17 and 33 rows of a Variable length (and a fixed 2 and 8) equals a NumPy model of its arithmetic
  (activations rounded per block as quantize_activations does, exact integer block sums, one float32 scale
  per block) within float32 summation, and the float path within the activations' rounding bound. Every
  int8 quant (-128 included) and every nibble is in the weights; the activations' blocks include a block of
  zeros and one whose largest magnitude is negative.
- Structure: the prompt kernel stages its weights per panel of 8 rows as bytes and contracts each turn to
  the CPU renderer's pg_dot4p helper (vpdpbusd in clang's assembly), 4 rows of x sharing one loop nest of
  block sums (one helper call per row, no 4-turn loop left); the float path is what POLY_INT8_DOT=0, INTERP
  and X86 get (one kernel, no 8-bit activations).
- A saved Model with the route runs in Node as in Python.
"""
from __future__ import annotations

import re
import shutil
import subprocess

import numpy as np
import pytest

from polygrad import Context, Tensor, Variable
from polygrad.codegen.opts import OptKind
from polygrad.device import open_device
from polygrad.errors import QuantizationError
from conftest import programs_of
from polygrad.nn.quant import QuantWeight, int8_dot_enabled

ROWS, COLS = 24, 96  # 3 blocks a row, 3 panels of 8 weight rows


def _blocks(fmt: str, seed: int = 0, cols: int = COLS) -> np.ndarray:
    """Q8_0 or Q4_0 blocks (ROWS, cols // 32, bytes): random float16 scales, random bytes (every int8 quant
    and nibble), -128 and 127 in the first block."""
    rng = np.random.default_rng(seed)
    blocks = rng.integers(0, 256, (ROWS, cols // 32, 34 if fmt == "Q8_0" else 18), dtype=np.uint8)
    blocks[..., :2] = rng.uniform(1e-3, 1e-1, (ROWS, cols // 32)).astype(np.float16)[..., None].view(np.uint8)
    blocks[0, 0, 2:4] = [128, 127]
    return blocks


def _activations(rows: int, seed: int, cols: int = COLS) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal((rows, cols)).astype(np.float32) * 3
    x[0, -32:] = 0.0  # a block of zeros: d = 0 and q = 0
    x[-1, 0] = -np.abs(x[-1, 1:32]).max() * 2  # the block's largest magnitude negative: q = -127
    return x


def _model(blocks: np.ndarray, x: np.ndarray, fmt: str) -> tuple[np.ndarray, np.ndarray]:
    """(the NumPy model's float64 sums of the float32 block terms, their magnitudes' sums) per (row, weight row):
    x rounded per block (d = max|x| / 127, q = round half to even of x / d), int64 block sums, float32 terms."""
    n = x.shape[0]
    xb = x.reshape(n, -1, 32)
    d = np.abs(xb).max(-1) / np.float32(127)
    inverse = np.where(d != 0, np.float32(1) / np.where(d != 0, d, 1), np.float32(0)).astype(np.float32)
    xq = np.rint(xb * inverse[..., None]).astype(np.int64)
    if fmt == "Q8_0":
        wq = blocks[..., 2:].view(np.int8).astype(np.int64)
    else:
        q = blocks[..., 2:].astype(np.int64)
        wq = np.concatenate([q & 15, q >> 4], axis=-1) - 8
    dw = blocks[..., :2].copy().view(np.float16)[..., 0].astype(np.float32)
    sums = np.einsum("mbi,rbi->mrb", xq, wq)  # exact
    terms = sums.astype(np.float32) * (dw[None] * d[:, None, :])
    return terms.sum(-1, dtype=np.float64), np.abs(terms).sum(-1)


def _require_int8_dot():
    if not int8_dot_enabled("CPU"):
        pytest.skip("the CPU device does not declare int8_dot (no VNNI or no clang)")


def _prompt(rows: int, device: str = "CPU", symbolic: bool = True, seed: int = 1, cols: int = COLS):
    x = _activations(rows, seed, cols)
    t = Tensor(x, device=device)
    return x, (t.reshape(Variable("tokens", 1, 64).bind(rows), cols) if symbolic else t)


@pytest.mark.parametrize("fmt", ["Q8_0", "Q4_0"])
@pytest.mark.parametrize("rows,symbolic,cols", [(1, True, COLS), (15, True, COLS), (17, True, COLS), (33, True, COLS),
                                                (2, False, COLS), (8, False, COLS), (17, True, 32)])
def test_prompt_matmul_matches_numpy_model_and_the_float_path(fmt, rows, symbolic, cols):
    """(One block a row, 32 columns: no sum over blocks around the block sums.)"""
    _require_int8_dot()
    blocks = _blocks(fmt, cols=cols)
    qw = QuantWeight(Tensor(blocks), fmt, (ROWS, cols))
    x, xt = _prompt(rows, symbolic=symbolic, seed=rows, cols=cols)
    got = []
    new = programs_of(lambda: got.append(qw.matmul_t(xt).numpy().reshape(rows, ROWS)))
    assert any("pg_dot4p_" in p.source for p in new), [p.spec.name for p in new]
    want, size = _model(blocks, x, fmt)
    assert np.all(np.abs(got[0] - want) <= 1e-6 * size), float(np.max(np.abs(got[0] - want) / size))
    with Context(POLY_INT8_DOT=0):
        floats = qw.matmul_t(xt).numpy().reshape(rows, ROWS)
    # the rounding moves each activation by at most d_x / 2
    w = (_model_weights(blocks, fmt)).reshape(ROWS, -1, 32)
    d = np.abs(x.reshape(rows, -1, 32)).max(-1) / 127
    bound = np.einsum("rb,mb->mr", np.abs(w).sum(-1), d / 2) + 1e-5 * np.abs(floats).max()
    assert np.all(np.abs(got[0] - floats) <= bound)


def _model_weights(blocks: np.ndarray, fmt: str) -> np.ndarray:
    dw = blocks[..., :2].copy().view(np.float16)[..., 0].astype(np.float64)
    if fmt == "Q8_0":
        q = blocks[..., 2:].view(np.int8).astype(np.float64)
    else:
        b = blocks[..., 2:].astype(np.int64)
        q = (np.concatenate([b & 15, b >> 4], axis=-1) - 8).astype(np.float64)
    return q * dw[..., None]


def _gemm_program(fmt: str):
    qw = QuantWeight(Tensor(_blocks(fmt, 5)), fmt, (ROWS, COLS))
    _, xt = _prompt(21, seed=9)
    new = programs_of(lambda: qw.matmul_t(xt).realize())
    return next(p for p in new if "pg_dot4p_" in p.source)


@pytest.mark.parametrize("fmt", ["Q8_0", "Q4_0"])
def test_prompt_kernel_stages_bytes_and_runs_vpdpbusd(fmt):
    """One kernel computes the prompt's block sums: 8 weight rows as lanes, the weights staged as bytes per
    panel, 4 rows of x whose block sums share one loop nest (4 helper calls, each one vpdpbusd: the staged
    weights are unsigned, Q4_0's nibbles or Q8_0's weights + 128, so no sign correction), no 4-turn loop
    left."""
    _require_int8_dot()
    prog = _gemm_program(fmt)
    kinds = [o.kind for o in prog.spec.opts]
    assert OptKind.STAGE in kinds and OptKind.OUTER in kinds, prog.spec.opts
    body = prog.source[prog.source.index("void pg_kernel("):]
    assert re.search(r"(signed|unsigned) char local\d+\[", body), "the staged panel holds bytes"
    assert len(re.findall(r"pg_dot4p_\w+\(acc", body)) == 4, body
    assert "+ 4*pl]" not in body  # no staged weight read lane by lane ("quads" loads all contracted)
    helper = prog.source[prog.source.index("static inline pg_i32x8 pg_dot4p_"):]
    helper = helper[:helper.index("\n}")]
    assert helper.count("__builtin_ia32_vpdpbusd256") == 1, helper
    cc = shutil.which("clang")
    if cc is None:
        pytest.skip("no clang to read the assembly")
    flags = ["-O3", "-march=native", "-ffp-contract=off", "-S", "-x", "c", "-", "-o", "-"]
    asm = subprocess.run([cc, *flags], input=prog.source, capture_output=True, text=True, check=True).stdout
    assert "vpdpbusd" in asm


@pytest.mark.parametrize("fmt", ["Q8_0", "Q4_0"])
def test_kept_lane_scales_leave_a_prompt_one_kernel_fewer_with_the_same_bits(fmt):
    """QuantWeight.keep_lane_scales lays the float16 scales out once (float32 (rows / 8, nb, 8): panel p,
    block j, lane l holds row 8p + l's scale of block j, as the blocks' bytes say); a prompt matmul then runs
    four kernels (the activations' per-block max, their int8 values with 1 / d computed inline, their block
    sums, the int32 GEMM) and a copy out of its Variable rows, one fewer than without them (the layout), and
    gives the same bits. A weight off the route has none (a typed error)."""
    _require_int8_dot()
    blocks = _blocks(fmt, 4)
    _, xt = _prompt(13, seed=4)
    fresh = QuantWeight(Tensor(blocks), fmt, (ROWS, COLS))
    got = []
    per_call = programs_of(lambda: got.append(fresh.matmul_t(xt).numpy()))
    kept = QuantWeight(Tensor(blocks), fmt, (ROWS, COLS))
    scales = kept.keep_lane_scales().numpy()
    want = blocks[..., :2].copy().view(np.float16)[..., 0].astype(np.float32)  # (rows, nb)
    assert np.array_equal(scales, want.reshape(ROWS // 8, 8, -1).transpose(0, 2, 1))
    assert kept.keep_lane_scales() is kept.lane_scales  # made once
    once = programs_of(lambda: got.append(kept.matmul_t(xt).numpy()))
    before, after = [p.spec.name for p in per_call], [p.spec.name for p in once]
    assert len(after) == len(before) - 1 and [n for n in before if n not in after] == [f"E_{ROWS // 8}_3_8"], \
        (before, after)
    assert len(after) == 5, after  # the copy out of a Variable number of rows is the fifth
    assert np.array_equal(got[0], got[1])
    with pytest.raises(QuantizationError, match="whole 8-row panels"):
        QuantWeight(Tensor(_blocks(fmt)[:12]), fmt, (12, COLS)).keep_lane_scales()


@pytest.mark.parametrize("fmt", ["Q8_0", "Q4_0"])
def test_setting_keeps_the_float_path(fmt):
    """POLY_INT8_DOT=0: one kernel (the float path's staged tile), no 8-bit activations."""
    _require_int8_dot()
    qw = QuantWeight(Tensor(_blocks(fmt)), fmt, (ROWS, COLS))
    _, xt = _prompt(17)
    with Context(POLY_INT8_DOT=0):
        new = programs_of(lambda: qw.matmul_t(xt).realize())
    assert [p.spec.name for p in new] == [f"r_tokens_{ROWS}"]
    assert all("pg_dot4" not in p.source for p in new)


@pytest.mark.parametrize("fmt", ["Q8_0", "Q4_0"])
def test_prompts_setting_keeps_prompts_in_float_and_decode_on_8_bits(fmt):
    """POLY_INT8_PROMPTS=0 (a model saved for polygrad-js): a prompt takes the float path's one kernel, with
    POLY_INT8_DOT=0's bits; a one-row decode matvec still rounds its activation to 8 bits."""
    _require_int8_dot()
    qw = QuantWeight(Tensor(_blocks(fmt)), fmt, (ROWS, COLS))
    _, xt = _prompt(17)
    got = {}
    for name, ctx in (("float", {"POLY_INT8_DOT": 0}), ("prompts off", {"POLY_INT8_PROMPTS": 0})):
        with Context(**ctx):
            assert qw.int8_prompts() is False
            new = programs_of(lambda: got.__setitem__(name, qw.matmul_t(xt).numpy()))
        assert [p.spec.name for p in new] == [f"r_tokens_{ROWS}"] and all("pg_dot4" not in p.source for p in new)
    assert np.array_equal(got["float"], got["prompts off"])
    with Context(POLY_INT8_PROMPTS=0):
        decode = programs_of(lambda: qw.matmul_t(Tensor(_activations(1, 3))).realize())
    assert any("pg_dot4" in p.source for p in decode)
    assert qw.int8_prompts() is True


@pytest.mark.parametrize("fmt", ["Q8_0", "Q4_0"])
@pytest.mark.parametrize("device", ["INTERP", "X86"])
def test_other_backends_keep_the_float_path(device, fmt):
    try:
        caps = open_device(device).capabilities
    except Exception as e:  # noqa: BLE001 - a backend not installed here
        pytest.skip(f"{device}: {e}")
    assert not caps.int8_dot
    blocks = _blocks(fmt)
    qw = QuantWeight(Tensor(blocks, device=device), fmt, (ROWS, COLS))
    x, xt = _prompt(3, device=device)
    got = []
    new = programs_of(lambda: got.append(qw.matmul_t(xt).numpy().reshape(3, ROWS)))
    assert [p.spec.name for p in new] == [f"r_tokens_{ROWS}"]  # one kernel: no 8-bit activations
    want = x.astype(np.float64) @ _model_weights(blocks, fmt).reshape(ROWS, COLS).T
    assert np.abs(got[0] - want).max() <= 1e-5 * np.abs(want).max()


@pytest.mark.parametrize("fmt", ["Q8_0", "Q4_0"])
def test_a_saved_prompt_route_runs_in_node_as_in_python(tmp_path, fmt):
    """A Model over a Variable number of rows captured with the route saves its kernels (the rounding, the
    per-block scales, the int32 block sums) into the bundle; polygrad-js computes them as Python does."""
    _require_int8_dot()
    from test_js import forward_in_node

    from polygrad import Model
    qw = QuantWeight(Tensor(_blocks(fmt, 7)), fmt, (ROWS, COLS))

    class MatMul:
        def __init__(self) -> None:
            self.blocks = qw.blocks

        def __call__(self, x):
            return {"y": qw.matmul_t(x)}
    n = Variable("tokens", 1, 16)
    m = Model(MatMul(), inputs={"x": Tensor.empty(n, COLS)})
    x = _activations(5, 3)
    assert any("pg_dot4p_" in p.source for p in programs_of(lambda: m.forward(x=x)))
    want = m.forward(x=x)["y"].numpy()
    path = tmp_path / "matmul.pgb"
    m.save(str(path))
    for backend, out in forward_in_node(path.read_bytes(), {"x": x}, tmp_path).items():
        assert np.abs(out["y"] - want).max() <= 1e-5 * np.abs(want).max(), backend
