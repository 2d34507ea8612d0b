"""Write test/fixtures/int8_dot.pgb and int8_dot.json: one-row Q8_0 and Q4_0 matvecs captured on Python polygrad's
int8 route (POLY_INT8_DOT=1, nn/quant.py _int8_matmul_t: the activation rounded to 8 bits per 32-value block, each
block's products summed exactly in int32), with a NumPy reference for them (float64 over exact int64 block sums).

polygrad-js sums Q4_0's blocks with relaxed SIMD's int8 dot product where the engine has it (linearize.js
dotReduce) and with 32-bit lanes elsewhere (Q8_0's everywhere); test/int8dot.test.js checks both against the
reference and against each other. The weights are raw random blocks (every int8 value, -128 included, and every
nibble), the scales float16 of both signs; 96 columns (3 blocks); Q4_0 16 rows (register tiles of 4 rows), Q8_0 13
(no tile).

Run from the repository root on a CPU with int8 dot products (VNNI; the route is taken only there):
`python polygrad-js/tools/make_int8_fixture.py [--out DIR]` (default polygrad-js/test/fixtures); `--rows` writes
int8_rows.pgb and int8_rows.json instead (main_rows: the prompt's multi-row route, test/int8rows.test.js); `--head`
int8_head.pgb and int8_head.json (the same matvecs over more rows: Q4_0 19, a decode head's odd count, which
polygrad-js tiles with a last tile moved back; Q8_0 18, which it reads one row at a time, lower.js streamsBlocks).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from polygrad import Context, Model, Tensor
from polygrad.nn.quant import QuantWeight, int8_dot_enabled

OUT = Path(__file__).resolve().parent.parent / "test" / "fixtures"
COLS = 96
ROWS = {"Q8_0": 13, "Q4_0": 16}
HEAD_ROWS = {"Q8_0": 18, "Q4_0": 19}
PROMPT_W, PROMPT_ROWS = 24, 5  # main_rows: weight rows (3 panels of 8), rows of x


def random_blocks(rng: np.random.Generator, rows: int, nbytes: int) -> np.ndarray:
    """(rows, COLS // 32, nbytes) uint8 blocks: a float16 scale of either sign, then random quant bytes."""
    blocks = rng.integers(0, 256, (rows, COLS // 32, nbytes), dtype=np.uint8)
    scales = (rng.uniform(0.002, 0.02, (rows, COLS // 32)) * rng.choice([-1, 1], (rows, COLS // 32))).astype(np.float16)
    blocks[..., :2] = scales.view(np.uint8).reshape(rows, COLS // 32, 2)
    return blocks


def quantize_activations(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """NumPy's own rounding of x (COLS,) per 32-value block, as quantize_activations documents it: d = max|x| / 127,
    q = round(x * (1 / d)) half to even (q = 0 in a block of zeros), in float32."""
    blocks = x.astype(np.float32).reshape(-1, 32)
    d = np.abs(blocks).max(-1) / np.float32(127)
    inverse = np.where(d != 0, np.float32(1) / np.where(d != 0, d, 1), 0).astype(np.float32)
    return np.rint(blocks * inverse[:, None]).astype(np.int8), d.astype(np.float32)


def weight_values(blocks: np.ndarray, fmt: str) -> np.ndarray:
    """The integer quants (rows, nb, 32) of Q8_0 or Q4_0 blocks (llama.cpp's layouts)."""
    if fmt == "Q8_0":
        return blocks[..., 2:].view(np.int8).astype(np.int64)
    qs = blocks[..., 2:18].astype(np.int64)
    return np.concatenate([(qs & 15) - 8, (qs >> 4) - 8], axis=-1)


def reference(blocks: np.ndarray, fmt: str, x: np.ndarray) -> tuple[list, list]:
    """float64 x @ W.T on the int8 route and the bound |block sum| * |d_w d_x| summed (float32 rounding's scale)."""
    xq, dx = quantize_activations(x)
    sums = (weight_values(blocks, fmt) * xq.astype(np.int64)[None]).sum(-1)  # (rows, nb), exact
    dw = blocks[..., :2].copy().view(np.float16)[..., 0].astype(np.float64)
    scale = dw * dx.astype(np.float64)[None]
    return (sums * scale).sum(-1).tolist(), (np.abs(sums) * np.abs(scale)).sum(-1).tolist()


class Matvecs:
    def __init__(self, w8: QuantWeight, w4: QuantWeight):
        self.w8, self.w4 = w8, w4

    def __call__(self, x):
        return {"y8": self.w8.matmul_t(x), "y4": self.w4.matmul_t(x)}


def main(out: Path = OUT, rows: dict = ROWS, stem: str = "int8_dot") -> None:
    rng = np.random.default_rng(8)
    b8, b4 = random_blocks(rng, rows["Q8_0"], 34), random_blocks(rng, rows["Q4_0"], 18)
    xs = rng.standard_normal((3, 1, COLS)).astype(np.float32)
    xs[1, 0, 32:64] = 0  # a block of zeros: its scale is 0
    with Context(POLY_INT8_DOT=1):
        if not int8_dot_enabled("CPU"):
            raise SystemExit("this CPU has no int8 dot product (VNNI): the matvecs would not take the int8 route")
        w8 = QuantWeight(Tensor(b8, dtype="uint8").realize(), "Q8_0", (rows["Q8_0"], COLS))
        w4 = QuantWeight(Tensor(b4, dtype="uint8").realize(), "Q4_0", (rows["Q4_0"], COLS))
        model = Model(Matvecs(w8, w4), inputs={"x": Tensor.empty(1, COLS)}, params={"w8": w8.blocks, "w4": w4.blocks})
        (out / f"{stem}.pgb").write_bytes(model.save())
        python = [model.forward(x=x) for x in xs]
    ref = {"rows": {"y8": rows["Q8_0"], "y4": rows["Q4_0"]}, "cols": COLS, "x": xs[:, 0].tolist(), "cases": []}
    for x, got in zip(xs, python):
        case = {}
        for name, blocks, fmt in (("y8", b8, "Q8_0"), ("y4", b4, "Q4_0")):
            want, bound = reference(blocks, fmt, x[0])
            # the capture took the route (float activations would be about 1e-2 off, not float32 rounding)
            err = np.abs(got[name].numpy().reshape(-1) - np.array(want)) / np.maximum(np.array(bound), 1e-30)
            if err.max() > 1e-5:
                raise SystemExit(f"{name}: Python polygrad is {err.max():.2e} (of the bound) from NumPy's int8 route")
            case[name] = {"want": want, "bound": bound}
        ref["cases"].append(case)
    model.dispose()
    (out / f"{stem}.json").write_text(json.dumps(ref))
    print(f"wrote {out / (stem + '.pgb')} and {out / (stem + '.json')}")


def main_rows(out: Path = OUT) -> None:
    """int8_rows.pgb and int8_rows.json: a prompt's x @ W.T on the multi-row int8 route (nn/quant.py
    _int8_matmul_rows: 8-row weight panels, unsigned weight bytes, block sums less offset x activation sums), Q8_0
    and Q4_0 weights of PROMPT_W rows (3 panels) x 96 columns, x of PROMPT_ROWS rows (odd: no whole tile)."""
    rng = np.random.default_rng(9)
    b8, b4 = random_blocks(rng, PROMPT_W, 34), random_blocks(rng, PROMPT_W, 18)
    xs = rng.standard_normal((2, PROMPT_ROWS, COLS)).astype(np.float32)
    xs[1, 2, 32:64] = 0  # a block of zeros: its scale is 0
    with Context(POLY_INT8_DOT=1, POLY_INT8_PROMPTS=1):
        if not int8_dot_enabled("CPU"):
            raise SystemExit("this CPU has no int8 dot product (VNNI): the matmuls would not take the int8 route")
        w8 = QuantWeight(Tensor(b8, dtype="uint8").realize(), "Q8_0", (PROMPT_W, COLS))
        w4 = QuantWeight(Tensor(b4, dtype="uint8").realize(), "Q4_0", (PROMPT_W, COLS))
        assert w8.int8_prompts() and w4.int8_prompts()
        params = {"w8": w8.blocks, "w4": w4.blocks, "s8": w8.keep_lane_scales(), "s4": w4.keep_lane_scales()}
        model = Model(Matvecs(w8, w4), inputs={"x": Tensor.empty(PROMPT_ROWS, COLS)}, params=params)
        (out / "int8_rows.pgb").write_bytes(model.save())
        python = [model.forward(x=x) for x in xs]
    ref = {"rows": {"y8": PROMPT_W, "y4": PROMPT_W}, "xrows": PROMPT_ROWS, "cols": COLS, "x": xs.tolist(),
           "cases": []}
    for x, got in zip(xs, python):
        case = {}
        for name, blocks, fmt in (("y8", b8, "Q8_0"), ("y4", b4, "Q4_0")):
            want, bound = zip(*(reference(blocks, fmt, row) for row in x))
            want, bound = np.array(want), np.array(bound)  # (PROMPT_ROWS, PROMPT_W)
            err = np.abs(got[name].numpy().reshape(want.shape) - want) / np.maximum(bound, 1e-30)
            if err.max() > 1e-5:
                raise SystemExit(f"{name}: Python polygrad is {err.max():.2e} (of the bound) from NumPy's int8 route")
            case[name] = {"want": want.reshape(-1).tolist(), "bound": bound.reshape(-1).tolist()}
        ref["cases"].append(case)
    model.dispose()
    (out / "int8_rows.json").write_text(json.dumps(ref))
    print(f"wrote {out / 'int8_rows.pgb'} and {out / 'int8_rows.json'}")


if __name__ == "__main__":
    dest = Path(sys.argv[sys.argv.index("--out") + 1]) if "--out" in sys.argv else OUT
    if "--rows" in sys.argv:
        main_rows(dest)
    elif "--head" in sys.argv:
        main(dest, HEAD_ROWS, "int8_head")
    else:
        main(dest)
