"""Deterministic guards for fixed costs (issue 17 item 5): a warm first call and the dispatch of a cached
computation, measured by what they do (files read, graphs walked, compilers run), never by a clock.

- A process whose programs are on disk neither lowers nor renders nor runs a compiler (its lowered
  specs and sources come from the render cache, engine/rendercache.py), and reads each cache file at
  most once: a file that passed the checksum is trusted again at the cost of a stat until it changes.
- A render-cache entry gives back the very spec `lower` made; a corrupt one is discarded with a
  CacheWarning and the kernel lowered again; its key follows the capabilities, opts and code.
- The C pool library a cold process starts compiling is finished before it exits, so the next process
  finds it cached.
- A realize whose schedule is cached orders the graph once (UOp.toposort on the target only).
"""
from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

import numpy as np
import pytest

from conftest import run_python
from polygrad import Context, Tensor, Variable
from polygrad.codegen.lower import lower
from polygrad.codegen.opts import Opt, OptKind
from polygrad.device import open_device
from polygrad.diskcache import CacheWarning
from polygrad.engine import programs, rendercache
from polygrad.schedule.template import schedule

needs_cc = pytest.mark.skipif("CPU" not in __import__("conftest").DEVICES, reason="needs the CPU backend")

FIRST_CALL = """
import json, os
import numpy as np
from polygrad import Tensor
rng = np.random.default_rng(0)
a, b = rng.random((96, 64), dtype=np.float32), rng.random((64, 80), dtype=np.float32) + 1
got = float((Tensor(a, device="CPU") @ Tensor(b, device="CPU")).relu().sum().item())
print(json.dumps({"got": got, "want": float(np.maximum(a @ b, 0).sum())}))
"""

# installed before polygrad is imported: counts every file the process opens under POLY_CACHE_DIR, and
# fails on any lowering, rendering or compiler run
GUARD = """
import builtins, collections, os, subprocess
opened = collections.Counter()
_open = builtins.open
def _counting_open(file, *a, **k):
    p = os.fspath(file) if isinstance(file, (str, os.PathLike)) else None
    if p and p.startswith(os.environ["POLY_CACHE_DIR"]):
        opened[os.path.relpath(p, os.environ["POLY_CACHE_DIR"])] += 1
    return _open(file, *a, **k)
builtins.open = _counting_open
_run = subprocess.run
def _no_compiler(cmd, *a, **k):
    raise AssertionError(f"ran {cmd}")
subprocess.run = _no_compiler
import polygrad.engine.programs as _programs
def _no_lower(*a, **k):
    raise AssertionError("lowered a kernel")
_programs.lower = _no_lower
from polygrad_backend_cpu.renderer import CPURenderer
def _no_render(*a, **k):
    raise AssertionError("rendered a kernel")
CPURenderer.render = _no_render
"""


def _result(proc) -> dict:
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@needs_cc
def test_warm_process_neither_lowers_renders_nor_compiles(tmp_path: Path) -> None:
    env = {"POLY_CACHE_DIR": str(tmp_path), "DEV": "CPU", "POLY_DEV": None}
    cold = _result(run_python(FIRST_CALL, env))
    assert cold["got"] == pytest.approx(cold["want"], rel=1e-5)
    assert list((tmp_path / "rendered" / "CPU").glob("*.json"))
    warm_code = GUARD + FIRST_CALL.replace("print(json.dumps({", "print(json.dumps({'opened': dict(opened), ")
    warm = _result(run_python(warm_code, env))
    assert warm["got"] == pytest.approx(warm["want"], rel=1e-5)
    assert warm["opened"], "the warm process should read its programs from the cache"
    assert max(warm["opened"].values()) == 1, warm["opened"]  # each cache file read once


def test_checked_entry_is_read_once_until_it_changes(tmp_path: Path) -> None:
    from polygrad import diskcache
    path = str(tmp_path / "entry")
    diskcache.write_entry(path, b"payload")
    reads = []
    real = diskcache.read_entry
    try:
        diskcache.read_entry = lambda p: reads.append(p) or real(p)  # type: ignore[assignment]
        assert diskcache.valid_entry(path) and diskcache.valid_entry(path)
        assert reads == []  # written by this process: trusted while its identity holds
        blob = Path(path).read_bytes()
        os.unlink(path)  # a replacement (new inode), corrupted
        Path(path).write_bytes(blob[:-1] + bytes([blob[-1] ^ 1]))
        with pytest.warns(CacheWarning, match="checksum"):
            assert not diskcache.valid_entry(path)
        assert reads == [path] and not os.path.exists(path)
        diskcache.write_entry(path, b"payload")
        diskcache.forget_checks()  # polygrad.collect(): the next use checks in full
        assert diskcache.valid_entry(path) and diskcache.valid_entry(path)
        assert reads == [path, path]
    finally:
        diskcache.read_entry = real  # type: ignore[assignment]


def _specs(device: str = "CPU") -> list:
    impl = open_device(device)
    x = Tensor(np.ones((64, 48), np.float32), device=device)
    w = Tensor(np.ones((48, 32), np.float32), device=device)
    v = Variable("n", 1, 64).bind(5)
    exprs = [(x @ w).relu(), (x * 2 + 1).exp2(), x.sum(1), x.shrink(((0, v), None)).sum(0)]
    asts = []
    for t in exprs:
        tpl, _ = schedule([t.uop], [], {})
        asts += [s.ast for s in tpl.steps if s.kind == "kernel"]
    specs = [lower(ast, impl.capabilities) for ast in asts]
    specs.append(lower(asts[1], impl.capabilities, [Opt(OptKind.UPCAST, 0, 2)]))
    return specs


def test_spec_round_trips_through_an_entry() -> None:
    specs = _specs("INTERP")
    assert any(s.vars for s in specs) and any(s.opts for s in specs)
    for spec in specs:
        assert rendercache._decode_spec(json.loads(json.dumps(rendercache._encode_spec(spec)))) == spec


@needs_cc
def test_entry_round_trip_and_corrupt_entry(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("POLY_CACHE_DIR", str(tmp_path))
    spec = _specs("CPU")[0]
    rendercache.store("CPU", "k" * 40, spec, "source text")
    assert rendercache.load("CPU", "k" * 40) == (spec, "source text")
    (path,) = (tmp_path / "rendered" / "CPU").glob("*.json")
    path.write_bytes(path.read_bytes()[:-5])
    with pytest.warns(CacheWarning, match="discarding"):
        assert rendercache.load("CPU", "k" * 40) is None
    assert not path.exists()


@needs_cc
def test_corrupt_entry_is_lowered_again(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("POLY_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(programs, "program_cache", {})
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    np.testing.assert_allclose((Tensor(a, device="CPU") * 3 + 0.375).numpy(), a * 3 + 0.375)
    for p in (tmp_path / "rendered" / "CPU").glob("*.json"):
        p.write_bytes(b"garbage")
    programs.program_cache.clear()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        np.testing.assert_allclose((Tensor(a, device="CPU") * 3 + 0.375).numpy(), a * 3 + 0.375)
    assert any("discarding cache entry" in str(w.message) for w in seen)
    assert all(p.read_bytes() != b"garbage" for p in (tmp_path / "rendered" / "CPU").glob("*.json"))


def test_key_follows_capabilities_opts_and_settings() -> None:
    impl = open_device("CPU") if "CPU" in __import__("conftest").DEVICES else open_device("INTERP")
    ast = _specs("INTERP")[1].ast
    (kernel_ast,) = [s.ast for s in schedule([(Tensor.ones(8, 8) @ Tensor.ones(8, 8)).uop], [], {})[0].steps]
    base = rendercache.key(kernel_ast, "CPU", impl, None)
    assert rendercache.key(kernel_ast, "CPU", impl, None) == base
    other_caps = type(impl)(**{**impl.__dict__, "capabilities": type(impl.capabilities)(vector_width=4)})
    keys = {base, rendercache.key(kernel_ast, "CPU", other_caps, None),
            rendercache.key(kernel_ast, "CPU", impl, []),
            rendercache.key(kernel_ast, "CPU", impl, [Opt(OptKind.UPCAST, 0, 2)]),
            rendercache.key(kernel_ast, "X86", impl, None),
            rendercache.key(ast, "CPU", impl, None)}
    with Context(NOOPT=1):
        keys.add(rendercache.key(kernel_ast, "CPU", impl, None))
    assert len(keys) == 7


def test_code_signature_follows_the_source_files(tmp_path: Path, monkeypatch) -> None:
    pkg = tmp_path / "fake_backend_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("X = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    __import__("fake_backend_pkg")
    try:
        first = rendercache.code_signature("fake_backend_pkg.render")
        assert rendercache.code_signature("fake_backend_pkg.render") == first
        (pkg / "__init__.py").write_text("X = 2\n")  # same size, new contents and modification time
        os.utime(pkg / "__init__.py", ns=(1, 1))
        rendercache._signatures.clear()
        assert rendercache.code_signature("fake_backend_pkg.render") != first
    finally:
        rendercache._signatures.clear()
        __import__("sys").modules.pop("fake_backend_pkg", None)


POOL_USER = """
import json
import numpy as np
from polygrad import Tensor
from polygrad.device import open_device
from polygrad_backend_cpu import runtime
x = Tensor(np.ones((256, 256), np.float32), device="CPU")
ready = runtime.c_pool() is not None  # cached already (no background build, no wait)?
out = (x @ x).numpy()
print(json.dumps({"ready": ready, "ok": bool((out == 256).all()),
                  "threads": open_device("CPU").capabilities.threads}))
"""


@needs_cc
def test_pool_library_is_finished_before_exit(tmp_path: Path) -> None:
    env = {"POLY_CACHE_DIR": str(tmp_path), "DEV": "CPU", "POLY_DEV": None}
    first = _result(run_python(POOL_USER, env))
    if first["threads"] < 2:
        pytest.skip("one core: no thread pool")
    assert first["ok"] and not first["ready"]
    second = _result(run_python(POOL_USER, env))
    assert second["ok"] and second["ready"]
    assert not [p.name for p in (tmp_path / "cpu").iterdir() if ".tmp" in p.name]


def test_cached_realize_walks_the_graph_once(monkeypatch) -> None:
    """Realizing a graph whose schedule is cached orders its nodes once: UOp.toposort runs only on the
    target, and every call after the first returns the order cached on it (no walk below it)."""
    from polygrad.uop.ops import UOp
    x = Tensor(np.arange(64, dtype=np.float32).reshape(8, 8)).realize()

    def f():
        return ((x * 2 + 1).relu() * x).sum(1)

    f().realize()
    y = f()
    calls: list[tuple[UOp, bool]] = []
    real = UOp.toposort
    monkeypatch.setattr(UOp, "toposort", lambda self: calls.append((self, self._toposort is not None)) or real(self))
    target = y.uop
    y.realize()
    assert calls and all(u is target for u, _ in calls)
    assert [cached for _, cached in calls[1:]] == [True] * (len(calls) - 1)
    a = np.arange(64, dtype=np.float32).reshape(8, 8)
    np.testing.assert_allclose(y.numpy(), (np.maximum(a * 2 + 1, 0) * a).sum(1))
