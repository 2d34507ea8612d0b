"""The CPU backend's on-disk program cache (issue 2, item 6) and the no-compiler error.

Programs are cached under POLY_CACHE_DIR/cpu as <key>.so, the key hashing source, compiler and flags;
files are written under a temporary name and renamed into place, so processes can share the folder.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import run_python

pytestmark = pytest.mark.skipif(not any(os.access(os.path.join(p, c), os.X_OK)
                                        for p in os.environ.get("PATH", "").split(os.pathsep)
                                        for c in ("clang", "gcc", "cc")), reason="needs a C compiler")

# Compiles N_KERNELS kernels whose source is new (a constant unique to the test run), checks values.
WORKER = """
import json, os, sys, time
import numpy as np
go, scale = sys.argv[1], float(sys.argv[2])
while go != "-" and not os.path.exists(go):
    time.sleep(0.005)
from polygrad import Tensor
a = np.arange(1, 13, dtype=np.float32).reshape(3, 4)
x = Tensor(a, device="CPU")
exprs = [(lambda t: t * scale + 1, lambda v: v * np.float32(scale) + 1),
         (lambda t: (t * scale).exp().sum(1), lambda v: np.exp(v * np.float32(scale)).sum(1)),
         (lambda t: (t - scale).relu().max(0), lambda v: np.maximum(v - np.float32(scale), 0).max(0)),
         (lambda t: (t @ t.T) * scale, lambda v: (v @ v.T) * np.float32(scale))]
errors = [float(np.abs(f(x).numpy() - ref(a)).max() / max(1.0, np.abs(ref(a)).max())) for f, ref in exprs]
print(json.dumps({"errors": errors}))
"""
N_KERNELS = 4


def _so_files(cache: Path) -> list[Path]:
    return sorted((cache / "cpu").glob("*.so")) if (cache / "cpu").exists() else []


def _leftovers(cache: Path) -> list[Path]:
    return [p for p in (cache / "cpu").iterdir() if ".tmp" in p.name or not p.name.endswith(".so")]


def _scale() -> str:
    return repr(1.0 + (time.time_ns() % 1_000_003) / 1e7)  # a constant no earlier run compiled


def test_two_processes_share_a_fresh_cache(tmp_path):
    cache = tmp_path / "cache"
    go = tmp_path / "go"
    scale = _scale()
    env = {**os.environ, "POLY_CACHE_DIR": str(cache), "DEV": "CPU"}
    env.pop("POLY_DEV", None)
    procs = [subprocess.Popen([sys.executable, "-c", WORKER, str(go), scale], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    time.sleep(0.3)
    go.write_text("go")  # both start compiling the same kernels at about the same moment
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        errors = json.loads(out.strip().splitlines()[-1])["errors"]
        assert max(errors) < 1e-5, errors
    files = _so_files(cache)
    assert len(files) == N_KERNELS, [f.name for f in files]
    assert _leftovers(cache) == []
    assert all(f.stat().st_size > 0 for f in files)


def test_second_process_reuses_the_cache(tmp_path):
    cache = tmp_path / "cache"
    scale = _scale()
    env = {"POLY_CACHE_DIR": str(cache), "DEV": "CPU", "POLY_DEV": None}
    first = run_python(WORKER.replace("sys.argv[1], float(sys.argv[2])", f"'-', {scale}"), env)
    assert first.returncode == 0, first.stderr
    before = {f.name: f.stat().st_mtime_ns for f in _so_files(cache)}
    assert len(before) == N_KERNELS
    # the second process may not run the compiler at all (only `cc --version` for the key)
    guard = """
import subprocess
_real_run = subprocess.run
def _no_compile(cmd, *a, **kw):
    if "--version" not in cmd:
        raise RuntimeError(f"compiler invoked: {cmd}")
    return _real_run(cmd, *a, **kw)
subprocess.run = _no_compile
"""
    second = run_python(guard + WORKER.replace("sys.argv[1], float(sys.argv[2])", f"'-', {scale}"), env)
    assert second.returncode == 0, second.stderr
    assert max(json.loads(second.stdout.strip().splitlines()[-1])["errors"]) < 1e-5
    after = {f.name: f.stat().st_mtime_ns for f in _so_files(cache)}
    assert after == before


def test_cache_key_covers_source_compiler_and_flags(monkeypatch, tmp_path):
    from polygrad_backend_cpu import compiler as cc_mod
    monkeypatch.setenv("POLY_CACHE_DIR", str(tmp_path))
    comp = cc_mod.ClangCompiler()
    src = "void k(float* a, int s, int e) { for (int i = s; i < e; i++) a[i] += 1.0f; }\n"
    key = comp.key(src)
    assert comp.key(src) == key and len(key) >= 32
    assert comp.key(src + " ") != key
    monkeypatch.setattr(cc_mod, "FLAGS", ("-O1",) + cc_mod.FLAGS[1:])
    assert comp.key(src) != key
    monkeypatch.undo()
    monkeypatch.setenv("POLY_CACHE_DIR", str(tmp_path))
    other = cc_mod.ClangCompiler()
    other.cc = "/opt/another/cc"
    assert other.key(src) != key
    other.cc, other.version = comp.cc, "some other version"
    assert other.key(src) != key
    path = comp.compile(src)
    assert Path(path) == tmp_path / "cpu" / f"{key}.so" and Path(path).exists()
    assert comp.compile(src) == path
    assert _leftovers(tmp_path) == []


def test_compile_error_leaves_no_files(monkeypatch, tmp_path):
    from polygrad.errors import CompileError
    from polygrad_backend_cpu import compiler as cc_mod
    monkeypatch.setenv("POLY_CACHE_DIR", str(tmp_path))
    with pytest.raises(CompileError, match="failed to compile"):
        cc_mod.ClangCompiler().compile("this is not C;\n")
    assert list((tmp_path / "cpu").iterdir()) == []


NO_COMPILER_ENV = {"PATH": "/nonexistent", "POLY_CC": None, "POLY_DEV": None}


def test_no_compiler_error_names_dev_interp(tmp_path):
    proc = run_python("""
        from polygrad import Tensor
        from polygrad.errors import DeviceError
        try:
            (Tensor([1.0, 2.0]) * 2).numpy()
        except DeviceError as e:
            print("typed:", type(e).__name__, e)
    """, {**NO_COMPILER_ENV, "DEV": "CPU", "POLY_CACHE_DIR": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr
    assert "typed: DeviceUnavailableError" in proc.stdout, proc.stdout
    assert "DEV=INTERP" in proc.stdout and "compiler" in proc.stdout


def test_no_compiler_default_falls_back_to_the_next_backend(tmp_path):
    """Without a compiler the default is the next usable backend: X86 (machine code) where it is installed
    and usable, else INTERP."""
    from polygrad import Device
    expected = "X86" if "X86" in Device.installed() and Device.available("X86") else "INTERP"
    proc = run_python("""
        from polygrad import Device, Tensor
        print(Device.DEFAULT, (Tensor([1.0, 2.0]) * 2).tolist(), Device.available("CPU"))
    """, {**NO_COMPILER_ENV, "DEV": None, "POLY_CACHE_DIR": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == [expected, "[2.0,", "4.0]", "False"]
