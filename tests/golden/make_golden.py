"""Regenerate the golden kernel files in this folder: `python3 tests/golden/make_golden.py`.

Each golden file is one scheduled kernel, in the device-independent serialised form (the scheduler's
AST after `simplify_indices`, written by `polygrad.uop.serialize`), with the contents of its input
buffers and the expected contents of its output buffer. tests/test_golden.py runs every file on every
available backend through `programs.get_program` and compares.

Expected outputs come from references outside polygrad: NumPy, or PyTorch for the float ops whose
rounding matters (float16, transcendentals), computed in float64 where that is the better reference
and rounded once to the output dtype. Transcendental results are compared within a stored tolerance
(polygrad's EXP2/LOG2/SIN decompositions are within a few ulp, not correctly rounded); everything
exact (integers, float16 add/mul/sqrt, NaN-propagating max, where/gather selections) is compared
bit for bit, any NaN matching any NaN. The one exception is the RNG kernel: polygrad's own bits are
the specification (Threefry-2x32 with 20 rounds, key = (seed, call counter), counter = element index,
top 24 bits of the first word / 2**24). Its expected output is what polygrad produced when the file
was made, and this script checks it against a NumPy evaluation of the same algorithm before writing.

File format ("polygrad-golden", version 1):
  name, description           strings
  kernel                      the serialised kernel object ({"format": "polygrad-kernel", ...})
  buffers                     one per DEFINE_GLOBAL slot, in slot order: slot, dtype (serialised name),
                              shape, role ("input" or "output"), and for inputs data: base64 of the
                              little-endian element bytes (bfloat16 as its 16-bit words)
  expected                    per output slot: slot, dtype, shape, data (base64 as above), compare
                              ("exact" or "close"), rtol and atol (for "close"), reference (what made it)
"""
from __future__ import annotations

import base64
import json
import math
import os
import sys
from dataclasses import dataclass
from typing import Callable

import numpy as np

GOLDEN_FORMAT = "polygrad-golden"
GOLDEN_VERSION = 1
HERE = os.path.dirname(os.path.abspath(__file__))


def b64(a: np.ndarray) -> str:
    a = np.ascontiguousarray(a)
    return base64.b64encode(a.astype(a.dtype.newbyteorder("<"), copy=False).tobytes()).decode("ascii")


def unb64(text: str, np_dtype, shape) -> np.ndarray:
    return np.frombuffer(base64.b64decode(text), dtype=np.dtype(np_dtype).newbyteorder("<")).astype(
        np.dtype(np_dtype)).reshape(shape)


@dataclass
class Case:
    name: str
    description: str
    inputs: Callable[[], list[np.ndarray]]  # host arrays (float16 arrays become float16 tensors)
    build: Callable  # (*polygrad tensors) -> the tensor the kernel computes
    reference: Callable  # (*host arrays) -> expected output (NumPy array of the output's storage dtype)
    compare: str = "exact"
    rtol: float = 0.0
    atol: float = 0.0
    reference_name: str = "numpy"


def _special_f32() -> np.ndarray:
    base = [0.0, -0.0, 1e-30, -1e-30, 0.5, -0.5, 1.0, -1.0, 2.5, -2.5, 10.0, -10.0, 30.0, -30.0, 88.0, 89.0,
            -87.0, -104.0, 1e4, -1e4, 3.1415927, 1e-45, float("inf"), float("-inf"), float("nan")]
    rng = np.random.default_rng(1)
    return np.concatenate([np.array(base, np.float32), rng.uniform(-6, 6, 39).astype(np.float32)])


def _torch():
    import torch
    return torch


def _ref_transcendental(x: np.ndarray) -> np.ndarray:
    torch = _torch()
    t = torch.from_numpy(x.astype(np.float64))
    with np.errstate(all="ignore"):
        rows = [torch.exp(t), torch.log(t), torch.sin(t), torch.sigmoid(t), torch.nn.functional.gelu(t),
                torch.tanh(t), torch.sqrt(t)]
    return torch.stack(rows).numpy().astype(np.float32)


def _ref_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    torch = _torch()
    return (torch.from_numpy(a.astype(np.float64)) @ torch.from_numpy(b.astype(np.float64))).numpy().astype(
        np.float32)


def _ref_f16(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    # torch's CPU half ops round each result to float16 (the polygrad rule: every op rounds)
    torch = _torch()
    ta, tb, tc = (torch.from_numpy(v) for v in (a, b, c))
    out = torch.sqrt((ta * tb + tc).abs()) - ta / tb
    return out.numpy()


def _ref_int(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    torch = _torch()
    ta, tb = torch.from_numpy(a), torch.from_numpy(b)
    return torch.stack([torch.div(ta, tb, rounding_mode="floor"), torch.remainder(ta, tb),
                        torch.div(ta, tb, rounding_mode="trunc"), torch.fmod(ta, tb)]).numpy()


def _ref_where_gather(x: np.ndarray, idx: np.ndarray) -> np.ndarray:
    g = np.take_along_axis(x, idx.astype(np.int64), 1)
    return np.where(g > 0.5, g, np.float32(-1.0)).astype(np.float32)


def _ref_max_nan(x: np.ndarray) -> np.ndarray:
    torch = _torch()
    return torch.amax(torch.from_numpy(x), dim=1).numpy()


def _threefry_unit(n: int, seed: int, counter: int) -> np.ndarray:
    from polygrad.tensor_random import threefry2x32
    c0 = np.arange(n, dtype=np.uint32)
    with np.errstate(over="ignore"):
        x0, _ = threefry2x32(c0, np.zeros(n, np.uint32), np.uint32(seed), np.uint32(counter))
    return ((x0 >> np.uint32(8)).astype(np.float32) * np.float32(1.0 / (1 << 24))).astype(np.float32)


def _cases() -> list[Case]:
    from polygrad import Tensor

    def int_inputs():
        rng = np.random.default_rng(5)
        a = np.concatenate([np.array([-7, 7, -7, 7, 0, -1, 1, 2**31 - 1, -2**31 + 1, -2**31], np.int32),
                            rng.integers(-1000, 1000, 22).astype(np.int32)])
        b = np.concatenate([np.array([2, 2, -2, -2, 5, 3, -3, 7, -7, 3], np.int32),
                            rng.choice(np.array([-9, -4, -1, 1, 3, 8, 13], np.int32), 22)])
        return [a, b]

    def f16_inputs():
        rng = np.random.default_rng(6)
        a = rng.uniform(-4, 4, 48).astype(np.float16)
        b = rng.uniform(0.25, 3, 48).astype(np.float16)
        c = rng.uniform(-8, 8, 48).astype(np.float16)
        a[:4] = [np.float16(65504), np.float16(-0.0), np.float16(6e-8), np.float16(1e-4)]
        return [a, b, c]

    def max_inputs():
        rng = np.random.default_rng(7)
        x = rng.standard_normal((6, 9)).astype(np.float32)
        x[1, 3] = np.nan
        x[2, :] = -np.inf
        x[3, 0] = np.nan
        x[3, 8] = np.inf
        x[4, :] = np.nan
        return [x]

    return [
        Case("elementwise_transcendental",
             "exp, log, sin, sigmoid, gelu (erf), tanh and sqrt of float32 inputs including 0, -0, subnormals, "
             "+-inf, NaN and overflowing/underflowing exps, stacked into one elementwise kernel",
             lambda: [_special_f32()],
             lambda x: Tensor.stack(x.exp(), x.log(), x.sin(), x.sigmoid(), x.gelu(), x.tanh(), x.sqrt()),
             _ref_transcendental, "close", 5e-6, 2e-6, "torch float64, rounded to float32"),
        Case("sum_reduction", "row sums of a 12x67 float32 matrix",
             lambda: [np.random.default_rng(2).standard_normal((12, 67)).astype(np.float32)],
             lambda x: x.sum(1), lambda x: x.astype(np.float64).sum(1).astype(np.float32), "close", 1e-5, 1e-5,
             "numpy float64 sum, rounded to float32"),
        Case("matmul", "(8, 32) @ (32, 16) float32 matmul",
             lambda: [np.random.default_rng(3).standard_normal((8, 32)).astype(np.float32),
                      np.random.default_rng(4).standard_normal((32, 16)).astype(np.float32)],
             lambda a, b: a @ b, _ref_matmul, "close", 1e-5, 1e-5, "torch float64 matmul, rounded to float32"),
        Case("max_nan", "max over rows of float32 with NaN (propagates, as torch.amax), -inf rows and +inf",
             max_inputs, lambda x: x.max(1), _ref_max_nan, "exact", reference_name="torch.amax"),
        Case("int32_div_mod",
             "int32 floor division, remainder (sign of divisor), truncating division and fmod with negative "
             "operands and values near INT_MIN/INT_MAX, stacked",
             int_inputs, lambda a, b: Tensor.stack(a // b, a % b, a.div(b, rounding_mode="trunc"), a.fmod(b)),
             _ref_int, "exact", reference_name="torch int32 div(rounding_mode=floor/trunc), remainder, fmod"),
        Case("float16_arith", "sqrt(|a*b + c|) - a/b in float16, every op rounded to float16",
             f16_inputs, lambda a, b, c: (a * b + c).abs().sqrt() - a / b, _ref_f16, "exact",
             reference_name="torch float16 (CPU) ops"),
        Case("where_gather", "x.gather(1, idx) then where(g > 0.5, g, -1) on float32",
             lambda: [np.random.default_rng(8).random((5, 7)).astype(np.float32),
                      np.random.default_rng(9).integers(0, 7, (5, 4)).astype(np.int32)],
             lambda x, idx: (x.gather(1, idx) > 0.5).where(x.gather(1, idx), -1.0), _ref_where_gather, "exact",
             reference_name="numpy take_along_axis / where"),
        Case("rng_rand", "the kernel behind Tensor.rand(6, 10) with key (seed 1234, counter 5); polygrad's own "
             "bits are the spec (Threefry-2x32-20, top 24 bits / 2**24), checked against NumPy Threefry",
             lambda: [], None, None, "exact", reference_name="polygrad (Threefry-2x32-20), cross-checked in numpy"),
    ]


def _schedule_one(out) -> tuple:
    from polygrad.schedule.template import schedule
    tpl, inputs = schedule([out.uop])
    steps = [s for s in tpl.steps if s.kind == "kernel"]
    if len(tpl.steps) != 1 or len(steps) != 1:
        raise SystemExit(f"expected one kernel step, got {[s.kind for s in tpl.steps]}")
    return steps[0], tpl, inputs


def make(case: Case) -> dict:
    from polygrad import Tensor, random
    from polygrad.codegen.passes import simplify_indices
    from polygrad.uop.ops import Ops
    from polygrad.uop.serialize import DTYPE_NAMES, encode, loads, dumps
    if case.name == "rng_rand":
        random.manual_seed(1234)
        random._state["counter"] = 5
        out = Tensor.rand(6, 10, device="INTERP")
        host = []
    else:
        host = case.inputs()
        out = case.build(*[Tensor(h, device="INTERP").realize() for h in host])
    step, tpl, inputs = _schedule_one(out)
    ast = simplify_indices(step.ast)
    assert loads(dumps(ast)) is ast
    globals_ = sorted((n for n in ast.toposort() if n.op is Ops.DEFINE_GLOBAL), key=lambda g: g.arg[0])
    written = {n.src[0].src[0].arg[0] for n in ast.toposort() if n.op is Ops.STORE}
    buffers, expected = [], []
    for g in globals_:
        slot, shape = g.arg[0], g.arg[1]
        entry = step.args[slot]
        item = {"slot": slot, "dtype": DTYPE_NAMES[g.dtype], "shape": list(shape),
                "role": "output" if slot in written else "input"}
        if slot not in written:
            item["data"] = b64(inputs[entry].numpy())
        buffers.append(item)
    assert written == {0}, written
    # the expected output
    if case.name == "rng_rand":
        ref = out.numpy().reshape(-1)
        key = inputs[step.args[1]].numpy()
        assert key.tolist() == [1234, 5], key
        np.testing.assert_array_equal(ref, _threefry_unit(60, 1234, 5))
    else:
        ref = np.asarray(case.reference(*host))
        assert ref.dtype == globals_[0].dtype.np, (ref.dtype, case.name)
        ref = ref.reshape(-1)
        # sanity: polygrad (INTERP) agrees with the reference as the test will check it
        mine = out.numpy().reshape(-1)
        if case.compare == "close":
            bad = ~np.isclose(mine, ref, case.rtol, case.atol, equal_nan=True)
            err = np.nanmax(np.abs(mine.astype(np.float64) - ref)[np.isfinite(ref)] /
                            (case.atol + case.rtol * np.abs(ref[np.isfinite(ref)])))
            print(f"  {case.name}: worst error {err:.3f} of the tolerance")
            assert not bad.any(), (case.name, mine[bad], ref[bad])
        else:
            same = (mine == ref) | (np.isnan(mine) & np.isnan(ref)) if mine.dtype.kind == "f" else mine == ref
            assert same.all(), (case.name, mine[~same], ref[~same])
    n_out = math.prod(globals_[0].arg[1])
    assert ref.size == n_out, (ref.size, n_out)
    exp = {"slot": 0, "dtype": DTYPE_NAMES[globals_[0].dtype], "shape": list(globals_[0].arg[1]),
           "data": b64(ref), "compare": case.compare, "reference": case.reference_name}
    if case.compare == "close":
        exp.update(rtol=case.rtol, atol=case.atol)
    expected.append(exp)
    return {"format": GOLDEN_FORMAT, "version": GOLDEN_VERSION, "name": case.name,
            "description": case.description, "generated_by": "tests/golden/make_golden.py",
            "kernel": encode(ast), "buffers": buffers, "expected": expected}


def write(obj: dict, path: str) -> None:
    """One field per line; the kernel's nodes one per line (diffable, not one huge line)."""
    kernel = obj["kernel"]
    head = {k: kernel[k] for k in ("format", "version", "roots")}
    dumps = lambda v: json.dumps(v, sort_keys=True, separators=(", ", ": "))  # noqa: E731
    knodes = ",\n    ".join(json.dumps(n, separators=(",", ":")) for n in kernel["nodes"])
    kernel_text = dumps(head)[:-1] + ',\n   "nodes": [\n    ' + knodes + "\n  ]}"
    lines = []
    for k in ("format", "version", "name", "description", "generated_by"):
        lines.append(f"  {json.dumps(k)}: {dumps(obj[k])}")
    lines.append('  "buffers": [\n    ' + ",\n    ".join(dumps(b) for b in obj["buffers"]) + "\n  ]")
    lines.append('  "expected": [\n    ' + ",\n    ".join(dumps(e) for e in obj["expected"]) + "\n  ]")
    lines.append(f'  "kernel": {kernel_text}')
    text = "{\n" + ",\n".join(lines) + "\n}\n"
    assert json.loads(text) == obj
    with open(path, "w") as f:
        f.write(text)


def main(argv: list[str]) -> None:
    only = set(argv)
    for case in _cases():
        if only and case.name not in only:
            continue
        obj = make(case)
        path = os.path.join(HERE, f"{case.name}.json")
        write(obj, path)
        print(f"wrote {os.path.relpath(path)} ({len(obj['kernel']['nodes'])} nodes)")


if __name__ == "__main__":
    main(sys.argv[1:])
