"""The CPU backend compiles a batch of new kernels in few compiler runs (issue 30, the cold first token).

`ClangCompiler.compile_many` puts a schedule's new kernels in one translation unit per compile job
(POLY_COMPILE_JOBS), the units compiled side by side. Every rendered kernel carries its own copies of
the renderer's static helpers (`pg_fma_f32x16`, the half conversions), so a unit renames them per
kernel: before, two kernels that shared a helper made the unit fail with "redefinition", and every
kernel was then compiled alone, one compiler run each (52 runs for a GPT-2 load instead of 3 batches).
"""
from __future__ import annotations

import ctypes
import json
import os
import shutil
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.skipif(shutil.which("clang") is None and shutil.which("gcc") is None
                                and shutil.which("cc") is None, reason="needs a C compiler")

# New kernels (a constant unique to the run) that each use the vector FMA helper and the half
# conversions; one realize_all is one schedule, so one compile_many; the compiler runs are counted.
WORKER = """
import json, subprocess, sys
import numpy as np
runs = []
real = subprocess.run
def counted(cmd, *a, **kw):
    if "-c" in cmd and "pg_kernel" in (kw.get("input") or ""):  # not the thread pool's library
        runs.append(1)
    return real(cmd, *a, **kw)
subprocess.run = counted
import polygrad_backend_cpu.compiler as cc_mod
from polygrad import Tensor, dtypes
from polygrad.engine import programs
scale = float(sys.argv[1])
cc_mod.UNIT_MIN_CHARS = 0  # split however small the kernels are
a = np.linspace(-1, 1, 64 * 64, dtype=np.float32).reshape(64, 64)
x = Tensor(a, device="CPU")
h = Tensor(a.astype(np.float16), device="CPU")
outs = [(x @ x.T) * scale, ((x * scale) @ x).exp(), (h.float() @ x + scale).half(), (x.T @ (x - scale))]
Tensor.realize_all(*outs)
refs = [(a @ a.T) * np.float32(scale), np.exp((a * np.float32(scale)) @ a),
        (a.astype(np.float16).astype(np.float32) @ a + np.float32(scale)).astype(np.float16),
        a.T @ (a - np.float32(scale))]
errors = [float(np.abs(o.numpy().astype(np.float32) - r.astype(np.float32)).max() / np.abs(r).astype(np.float32).max())
          for o, r in zip(outs, refs)]
print(json.dumps({"runs": len(runs), "compiled": programs.runtime_stats["programs_compiled"], "errors": errors}))
"""


def _scale() -> str:
    return repr(1.0 + (time.time_ns() % 1_000_003) / 1e7)  # a constant no earlier run compiled


def _start(cache, jobs: int, scale: str) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k != "POLY_DEV"}
    env.update(POLY_CACHE_DIR=str(cache), DEV="CPU", POLY_COMPILE_JOBS=str(jobs))
    return subprocess.Popen([sys.executable, "-c", WORKER, scale], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _result(proc: subprocess.Popen) -> dict:
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-3000:]
    return json.loads(out.strip().splitlines()[-1])


def test_kernels_sharing_helpers_compile_in_one_run_per_job(tmp_path):
    scale = _scale()
    # one job in its own folder; two processes of two jobs each filling one folder at the same time
    procs = [_start(tmp_path / "one", 1, scale), _start(tmp_path / "two", 2, scale), _start(tmp_path / "two", 2, scale)]
    one, *two = [_result(p) for p in procs]
    assert one["compiled"] >= 4  # the four products (and whatever else the schedule needs)
    assert one["runs"] == 1 and [t["runs"] for t in two] == [2, 2], (one, two)
    assert max(max(r["errors"]) for r in (one, *two)) < 2e-3, (one, two)
    # side by side, the same cache entries as one unit, whole, and no temporary file left
    names = [sorted(p.name for p in (tmp_path / d / "cpu").iterdir()) for d in ("one", "two")]
    assert names[0] == names[1] and len(names[0]) >= 4 and all(n.endswith(".so") for n in names[0]), names


def test_each_entry_exports_its_renamed_kernel(monkeypatch, tmp_path):
    from polygrad_backend_cpu import compiler as cc_mod
    monkeypatch.setenv("POLY_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("POLY_COMPILE_JOBS", "2")
    monkeypatch.setattr(cc_mod, "UNIT_MIN_CHARS", 0)  # tiny kernels, split all the same
    helper = "static inline float pg_twice(float v) { return v * 2.0f; }\n"
    srcs = [f"{helper}void pg_kernel(float* a) {{ a[0] = pg_twice(a[0]) + {k}.0f; }}\n" for k in range(5)]
    comp = cc_mod.ClangCompiler()
    runs = []
    real = subprocess.run
    monkeypatch.setattr(cc_mod.subprocess, "run", lambda cmd, *a, **kw: runs.append(cmd) or real(cmd, *a, **kw))
    paths = comp.compile_many(srcs)
    assert len(set(paths)) == 5
    assert len([cmd for cmd in runs if "-c" in cmd]) == 2  # two units side by side, though all share pg_twice
    for k, path in enumerate(paths):
        renamed, _ = cc_mod.symbol_names(path)
        fn = getattr(ctypes.CDLL(path), renamed)
        buf = (ctypes.c_float * 1)(1.5)
        fn(buf)
        assert buf[0] == 3.0 + k


def test_balanced_units_split_by_source_length(monkeypatch):
    from polygrad_backend_cpu import compiler as cc_mod
    from polygrad_backend_cpu.compiler import balanced_units
    srcs = {"a": "x" * 100, "b": "x" * 60, "c": "x" * 50, "d": "x" * 10}
    monkeypatch.setattr(cc_mod, "KERNEL_CHARS", 0)  # length alone
    monkeypatch.setattr(cc_mod, "UNIT_MIN_CHARS", 200)
    assert balanced_units(srcs, 2) == [srcs] == balanced_units(srcs, 1)  # 220 chars: not two units of 200
    monkeypatch.setattr(cc_mod, "UNIT_MIN_CHARS", 110)
    assert len(balanced_units(srcs, 2)) == 2 and len(balanced_units(srcs, 3)) == 2
    monkeypatch.setattr(cc_mod, "UNIT_MIN_CHARS", 0)
    units = balanced_units(srcs, 2)
    assert sorted(k for u in units for k in u) == ["a", "b", "c", "d"]
    assert [list(u) for u in units] == [["a", "d"], ["b", "c"]]  # 110 and 110; first order kept within
    assert balanced_units(srcs, 8) == [{"a": srcs["a"]}, {"b": srcs["b"]}, {"c": srcs["c"]}, {"d": srcs["d"]}]
    assert balanced_units(srcs, 1) == [srcs] and balanced_units({}, 2) == []


def test_balanced_units_count_a_cost_per_kernel(monkeypatch):
    """Many small kernels cost clang more than their length says (issue 30: GPT-2's prompt kernels compiled
    as one long matmul alone, 0.73 s, beside 26 small ones, 1.70 s): each kernel counts KERNEL_CHARS more,
    so the long one's unit takes some of the small ones."""
    from polygrad_backend_cpu import compiler as cc_mod
    from polygrad_backend_cpu.compiler import balanced_units
    monkeypatch.setattr(cc_mod, "UNIT_MIN_CHARS", 0)
    monkeypatch.setattr(cc_mod, "KERNEL_CHARS", 5_000)
    srcs = {"long": "x" * 30_000, **{f"s{i}": "x" * 1_000 for i in range(10)}}
    units = balanced_units(srcs, 2)
    assert sorted(k for u in units for k in u) == sorted(srcs)
    (with_long,) = [u for u in units if "long" in u]
    assert len(with_long) == 3  # 35,000 + 2 x 6,000 beside 8 x 6,000
    monkeypatch.setattr(cc_mod, "KERNEL_CHARS", 0)
    assert [len(u) for u in balanced_units(srcs, 2)] == [1, 10]  # by length alone: the long one alone


@pytest.mark.parametrize("jobs", [1, 2])
def test_a_bad_kernel_in_a_unit_is_named_alone(monkeypatch, tmp_path, jobs):
    """One unit: it fails, then each kernel is compiled alone; two units side by side: the error of the
    bad one's thread is raised here."""
    from polygrad.errors import CompileError
    from polygrad_backend_cpu import compiler as cc_mod
    monkeypatch.setenv("POLY_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("POLY_COMPILE_JOBS", str(jobs))
    monkeypatch.setattr(cc_mod, "UNIT_MIN_CHARS", 0)
    good = "void pg_kernel(float* a) { a[0] = 1.0f; }\n"
    bad = "void pg_kernel(float* a) { a[0] = undeclared_name; }\n"
    with pytest.raises(CompileError, match="undeclared_name") as err:
        cc_mod.ClangCompiler().compile_many([good, bad])
    assert "a[0] = 1.0f" not in str(err.value).split("--- source")[1]  # the source shown is the bad one's
    assert [p.suffix for p in (tmp_path / "cpu").iterdir()] == [".so"]  # the good one is kept, no leftovers

