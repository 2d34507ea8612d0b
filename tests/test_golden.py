"""Golden kernels (tests/golden/*.json): stored scheduled kernels with inputs and reference outputs.

Each file holds one kernel in the serialised device-independent form (polygrad.uop.serialize), the
contents of its input buffers and the expected output from NumPy/PyTorch (polygrad's own bits only for
the RNG kernel, whose algorithm is the spec). Every file runs on every usable backend through the
normal path, `programs.get_program(ast, device)` (lowering with the device's options, rendering,
compiling) and a launch over Buffers, and must match: exactly for "exact" files (any NaN matching any
NaN), within the stored rtol/atol for "close" ones. Kernels without a reduction must also give the very
same bits on CPU and INTERP. Regenerate the files with `python3 tests/golden/make_golden.py`.
"""
from __future__ import annotations

import base64
import json
import math
from pathlib import Path

import numpy as np
import pytest

from conftest import DEVICES
from polygrad.device import Buffer
from polygrad.dtype import dtypes
from polygrad.engine import programs
from polygrad.uop.ops import Ops, UOp
from polygrad.uop.serialize import DTYPES_BY_NAME, decode, encode

GOLDEN_DIR = Path(__file__).parent / "golden"
FILES = sorted(GOLDEN_DIR.glob("*.json"))
IDS = [p.stem for p in FILES]


def _load(path: Path) -> dict:
    obj = json.loads(path.read_text())
    assert obj["format"] == "polygrad-golden" and obj["version"] == 1, path
    (ast,) = decode(obj["kernel"])
    obj["ast"] = ast
    return obj


def _array(item: dict) -> np.ndarray:
    dt = DTYPES_BY_NAME[item["dtype"]]
    raw = base64.b64decode(item["data"])
    arr = np.frombuffer(raw, dtype=dt.np.newbyteorder("<")).astype(dt.np)
    assert arr.size == math.prod(item["shape"]), item
    return arr


def _globals(ast: UOp) -> dict[int, UOp]:
    return {n.arg[0]: n for n in ast.toposort() if n.op is Ops.DEFINE_GLOBAL}


def run_golden(obj: dict, device: str) -> dict[int, np.ndarray]:
    """Run the file's kernel on `device`; returns the output buffers' contents (storage dtype) by slot."""
    ast = obj["ast"]
    gl = _globals(ast)
    bufs = []
    for item in obj["buffers"]:
        g = gl[item["slot"]]
        buf = Buffer(device, math.prod(g.arg[1]), g.dtype)
        if item["role"] == "input":
            buf.copyin(_array(item))
        else:  # garbage first: the kernel must write every element
            buf.copyin(np.full(buf.nbytes, 0xA5, np.uint8).view(g.dtype.np))
        bufs.append(buf)
    prog = programs.get_program(ast, device)
    prog(bufs)
    return {item["slot"]: bufs[item["slot"]].numpy() for item in obj["buffers"] if item["role"] == "output"}


def _as_float(a: np.ndarray, dtype_name: str) -> np.ndarray:
    if dtype_name == "bfloat16":  # stored as the upper 16 bits of a float32
        return (a.astype(np.uint32) << 16).view(np.float32)
    return a


def _check(got: np.ndarray, exp: dict, where: str) -> None:
    ref = _array(exp)
    assert got.shape == ref.shape, where
    dt = DTYPES_BY_NAME[exp["dtype"]]
    if exp["compare"] == "exact":
        if dt.is_float:
            g, r = _as_float(got, exp["dtype"]), _as_float(ref, exp["dtype"])
            same = (g.view(np.dtype(f"u{g.itemsize}")) == r.view(np.dtype(f"u{r.itemsize}"))) | \
                (np.isnan(g) & np.isnan(r))
        else:
            same = got == ref
        bad = np.flatnonzero(~same)
        assert bad.size == 0, f"{where}: {bad.size} differ, first at {bad[:5]}: {got[bad[:5]]} vs {ref[bad[:5]]}"
        return
    assert exp["compare"] == "close", exp["compare"]
    g = _as_float(got, exp["dtype"]).astype(np.float64)
    r = _as_float(ref, exp["dtype"]).astype(np.float64)
    ok = np.isclose(g, r, rtol=exp["rtol"], atol=exp["atol"], equal_nan=True)
    ok &= np.isnan(g) == np.isnan(r)
    ok &= np.where(np.isinf(r), g == r, True)  # infinities exactly, with their sign
    bad = np.flatnonzero(~ok)
    assert bad.size == 0, (f"{where}: {bad.size} elements outside rtol={exp['rtol']} atol={exp['atol']}, first at "
                           f"{bad[:5]}: {g[bad[:5]]} vs {r[bad[:5]]}")


@pytest.fixture(scope="module")
def goldens() -> dict[str, dict]:
    return {p.stem: _load(p) for p in FILES}


def test_golden_files_exist():
    assert len(FILES) >= 5, FILES
    for name in ("rng_rand", "max_nan", "int32_div_mod", "float16_arith", "matmul"):
        assert (GOLDEN_DIR / f"{name}.json").exists(), name


@pytest.mark.parametrize("name", IDS)
def test_golden_file_is_well_formed(goldens, name):
    obj = goldens[name]
    ast = obj["ast"]
    assert ast.op is Ops.SINK
    enc = encode(ast)
    if enc != obj["kernel"]:  # the stored form is the canonical encoding: name the first differing node
        pairs = list(zip(enc["nodes"], obj["kernel"]["nodes"]))
        i = next((k for k, (x, y) in enumerate(pairs) if x != y), len(pairs))
        raise AssertionError(f"node {i}: encoded {pairs[i] if i < len(pairs) else 'length'}")
    gl = _globals(ast)
    assert sorted(item["slot"] for item in obj["buffers"]) == sorted(gl) == list(range(len(gl)))
    written = {n.src[0].src[0].arg[0] for n in ast.toposort() if n.op is Ops.STORE}
    for item in obj["buffers"]:
        g = gl[item["slot"]]
        assert DTYPES_BY_NAME[item["dtype"]] is g.dtype and math.prod(item["shape"]) == math.prod(g.arg[1]), item
        assert (item["role"] == "output") == (item["slot"] in written), item
        if item["role"] == "input":
            _array(item)
    assert {e["slot"] for e in obj["expected"]} == written
    for e in obj["expected"]:
        assert e["compare"] in ("exact", "close") and e["reference"], e
        if e["compare"] == "close":
            assert 0 <= e["rtol"] < 1e-3 and 0 <= e["atol"] < 1e-3, e


@pytest.mark.parametrize("name", IDS)
@pytest.mark.parametrize("device", DEVICES)
def test_golden_kernel_matches_reference(goldens, name, device):
    obj = goldens[name]
    outs = run_golden(obj, device)
    for exp in obj["expected"]:
        _check(outs[exp["slot"]], exp, f"{name} on {device}, slot {exp['slot']}")


ELEMENTWISE = [p.stem for p in FILES if '"REDUCE"' not in p.read_text()]


@pytest.mark.parametrize("name", ELEMENTWISE)
def test_cpu_and_interp_agree_bit_exactly(goldens, name):
    if not {"CPU", "INTERP"} <= set(DEVICES):
        pytest.skip("needs both CPU and INTERP")
    cpu, interp = run_golden(goldens[name], "CPU"), run_golden(goldens[name], "INTERP")
    for slot in cpu:
        a, b = cpu[slot], interp[slot]
        assert a.tobytes() == b.tobytes(), f"{name} slot {slot}: CPU and INTERP differ at " \
            f"{np.flatnonzero(a.view(np.uint8) != b.view(np.uint8))[:8]} (byte offsets)"


def test_rng_golden_is_threefry():
    """The RNG file's expected bits are polygrad's Threefry-2x32-20 of its stored key."""
    from polygrad.tensor_random import threefry2x32
    obj = _load(GOLDEN_DIR / "rng_rand.json")
    (key_item,) = [b for b in obj["buffers"] if b["role"] == "input"]
    seed, counter = _array(key_item).tolist()
    n = math.prod(obj["expected"][0]["shape"])
    with np.errstate(over="ignore"):
        x0, _ = threefry2x32(np.arange(n, dtype=np.uint32), np.zeros(n, np.uint32), np.uint32(seed),
                             np.uint32(counter))
    unit = (x0 >> np.uint32(8)).astype(np.float32) * np.float32(1.0 / (1 << 24))
    assert unit.tobytes() == _array(obj["expected"][0]).tobytes()
    assert dtypes.float32 is DTYPES_BY_NAME[obj["expected"][0]["dtype"]]
