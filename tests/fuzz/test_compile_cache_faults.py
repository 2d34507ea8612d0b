"""Fault injection for the CPU backend's on-disk compile cache (polygrad.diskcache + the CPU compiler).

Each fault ran into a crash or a raw exception before: a truncated .so made dlopen die with SIGBUS;
empty, garbage and foreign files raised OSError/AttributeError; a POLY_CACHE_DIR that is a file raised.
Now every entry is validated (length + sha256 trailer) before it is loaded, a bad one is discarded
with a CacheWarning and compiled again, an unusable folder falls back to a temporary one, the compiler
dies with its parent, and temporary files of dead writers are removed. Every case runs in a child
interpreter, so a crash fails the test instead of killing the runner.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import run_python

pytestmark = pytest.mark.skipif(shutil.which("clang") is None and shutil.which("gcc") is None
                                and shutil.which("cc") is None, reason="needs a C compiler")

# one kernel, checked against its known value
PROGRAM = """
import json, warnings
warnings.simplefilter("always")
from polygrad import Tensor
print(json.dumps((Tensor([1.0, 2.0, 3.0], device="CPU") * 3 + {c}).tolist()))
"""
C = 0.25  # a constant this file alone uses, so its kernel is compiled fresh in each cache folder


def _run(cache: Path | str, code: str = PROGRAM.format(c=C), **env: str | None):
    return run_python(code, {"POLY_CACHE_DIR": str(cache), "DEV": "CPU", "POLY_DEV": None, **env})


def _value(proc) -> list:
    assert proc.returncode == 0, f"rc {proc.returncode}: {proc.stderr[-2000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


WANT = [3.0 + C, 6.0 + C, 9.0 + C]


def _entries(cache: Path) -> list[Path]:
    return sorted((cache / "cpu").glob("*.so"))


@pytest.fixture(scope="module")
def warm_cache(tmp_path_factory) -> Path:
    cache = tmp_path_factory.mktemp("warm")
    assert _value(_run(cache)) == WANT
    assert len(_entries(cache)) == 1
    return cache


def _foreign_so(folder: Path) -> bytes:
    """A real shared object without the kernel's symbol (and without polygrad's trailer), at folder/foreign.so."""
    src, out = folder / "foreign.c", folder / "foreign.so"
    src.write_text("int not_a_kernel(void) { return 7; }\n")
    cc = shutil.which("clang") or shutil.which("gcc") or shutil.which("cc")
    subprocess.run([cc, "-shared", "-fPIC", str(src), "-o", str(out)], check=True)
    return out.read_bytes()


FAULTS = ["truncate10", "truncate40", "truncate75", "empty", "garbage", "foreign", "trailer_only", "flipped_byte",
          "directory"]
# One child runs every fault in turn: it corrupts its own cache entry, drops its programs (collect()
# closes the shared object), and computes again, which must validate, discard and rebuild the entry.
FAULT_RUNNER = """
import json, os, sys, warnings
from pathlib import Path
import polygrad
from polygrad import Tensor
foreign = Path(sys.argv[1]).read_bytes()
def value():
    return (Tensor([1.0, 2.0, 3.0], device="CPU") * 3 + {c}).tolist()
value()
(entry,) = sorted((Path(os.environ["POLY_CACHE_DIR"]) / "cpu").glob("*.so"))
good = entry.read_bytes()
for fault in {faults!r}:
    # drop (and dlclose) the program first: rewriting a loaded shared object in place would fault in
    # the loader of any process mapping it, which no cache can prevent; the next use loads from disk
    polygrad.runtime.collect()
    if fault.startswith("truncate"):
        entry.write_bytes(good[:len(good) * int(fault[8:]) // 100])
    elif fault == "empty":
        entry.write_bytes(b"")
    elif fault == "garbage":
        entry.write_bytes(os.urandom(len(good)))
    elif fault == "foreign":
        entry.write_bytes(foreign)
    elif fault == "trailer_only":  # a valid trailer on a truncated body: the length check catches it
        entry.write_bytes(good[:100] + good[-48:])
    elif fault == "flipped_byte":  # right length, wrong checksum
        entry.write_bytes(good[:200] + bytes([good[200] ^ 0xFF]) + good[201:])
    elif fault == "directory":
        entry.unlink()
        entry.mkdir()
    print(fault, flush=True)  # a crash in the next line names the fault that caused it
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        got = value()
    rebuilt = entry.is_file() and entry.read_bytes() == good  # compiles are deterministic
    print(json.dumps([fault, got, [str(w.message) for w in seen], rebuilt]), flush=True)
"""


def test_corrupt_entries_are_discarded_and_rebuilt(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    _foreign_so(tmp_path)
    code = FAULT_RUNNER.format(c=C, faults=FAULTS).replace("sys.argv[1]", repr(str(tmp_path / "foreign.so")))
    proc = run_python(code, {"POLY_CACHE_DIR": str(cache), "DEV": "CPU", "POLY_DEV": None})
    lines = proc.stdout.strip().splitlines()
    assert proc.returncode == 0, f"rc {proc.returncode} after {lines[-1:]}: {proc.stderr[-2000:]}"
    results = [json.loads(line) for line in lines if line.startswith("[")]
    assert [r[0] for r in results] == FAULTS
    for fault, got, warned, rebuilt in results:
        assert got == WANT, fault
        assert any("discarding cache entry" in w for w in warned), (fault, warned)
        assert rebuilt, fault
    again = _run(cache)
    assert _value(again) == WANT and "CacheWarning" not in again.stderr


def test_cache_dir_that_is_a_file_falls_back(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("x")
    proc = _run(blocker)
    assert _value(proc) == WANT
    assert "CacheWarning" in proc.stderr and "cannot be used" in proc.stderr
    assert blocker.read_text() == "x"


def _make_read_only(folder: Path) -> bool:
    """chmod a-w, and the immutable attribute where the mode bits do not bind (root); True if it took."""
    folder.chmod(stat.S_IRUSR | stat.S_IXUSR)
    if os.geteuid() == 0 and shutil.which("chattr"):
        subprocess.run(["chattr", "+i", str(folder)], capture_output=True)
    try:
        (folder / "probe").write_text("x")
    except OSError:
        return True
    (folder / "probe").unlink()
    return False


def _make_writable(folder: Path) -> None:
    if os.geteuid() == 0 and shutil.which("chattr"):
        subprocess.run(["chattr", "-i", str(folder)], capture_output=True)
    folder.chmod(stat.S_IRWXU)


def test_read_only_cache_folder(warm_cache: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    shutil.copytree(warm_cache, cache)
    folder = cache / "cpu"
    if not _make_read_only(folder):
        _make_writable(folder)
        pytest.skip("cannot make a folder read-only here")
    try:
        proc = _run(cache)
        assert _value(proc) == WANT  # a new kernel compiles into the temporary fallback
        assert "CacheWarning" in proc.stderr and "cannot be used" in proc.stderr
        other = _run(cache, PROGRAM.format(c=C + 1))
        assert _value(other) == [w + 1 for w in WANT]
    finally:
        _make_writable(folder)
    assert len(_entries(cache)) == 1


WRITER = """
import os, sys, time, json
go = sys.argv[1]
while not os.path.exists(go):
    time.sleep(0.002)
from polygrad import Tensor
x = Tensor([1.0, 2.0, 3.0, 4.0], device="CPU")
outs = [(x * 3 + 0.125).tolist(), (x - 0.125).exp().sum().item(), (x * x + 0.125).max().item()]
print(json.dumps(outs))
"""


def test_concurrent_writers_share_a_fresh_folder(tmp_path: Path) -> None:
    cache, go = tmp_path / "cache", tmp_path / "go"
    env = {**os.environ, "POLY_CACHE_DIR": str(cache), "DEV": "CPU"}
    env.pop("POLY_DEV", None)
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(go)], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(3)]
    time.sleep(0.5)
    go.write_text("go")
    results = []
    for p in procs:
        out, err = p.communicate(timeout=240)
        assert p.returncode == 0, err
        assert "CacheWarning" not in err, err  # no writer ever saw another's partial file
        results.append(json.loads(out.strip().splitlines()[-1]))
    assert all(r == results[0] for r in results)
    assert results[0][0] == [3.125, 6.125, 9.125, 12.125]
    names = [p.name for p in (cache / "cpu").iterdir()]
    assert names and all(n.endswith(".so") and ".tmp" not in n for n in names), names
    from polygrad.diskcache import valid_entry
    assert all(valid_entry(str(p)) for p in _entries(cache))


FAKE_CC = """#!/bin/sh
if [ "$1" = "--version" ]; then echo "fake cc 1.0"; exit 0; fi
echo $$ > "{pidfile}"
exec sleep 120
"""


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] in ("Z", "X")  # a zombie no one reaped yet is dead
    except FileNotFoundError:
        return True


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="parent-death signal is Linux only")
def test_compiler_dies_with_its_parent_and_its_temp_file_is_cleaned(tmp_path: Path) -> None:
    cache, pidfile, fake = tmp_path / "cache", tmp_path / "cc.pid", tmp_path / "fakecc"
    fake.write_text(FAKE_CC.format(pidfile=pidfile))
    fake.chmod(0o755)
    env = {**os.environ, "POLY_CACHE_DIR": str(cache), "DEV": "CPU", "POLY_CC": str(fake)}
    env.pop("POLY_DEV", None)
    parent = subprocess.Popen([sys.executable, "-c", PROGRAM.format(c=C)], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE)
    deadline = time.time() + 60
    while not (pidfile.exists() and pidfile.read_text().strip()) and time.time() < deadline:
        time.sleep(0.02)
    cc_pid = int(pidfile.read_text())
    assert not _gone(cc_pid)
    parent.send_signal(signal.SIGKILL)
    parent.communicate()
    deadline = time.time() + 10
    while not _gone(cc_pid) and time.time() < deadline:
        time.sleep(0.02)
    alive = not _gone(cc_pid)
    if alive:
        os.kill(cc_pid, signal.SIGKILL)
    assert not alive, "the compiler outlived the process that started it"
    stale = [p.name for p in (cache / "cpu").iterdir() if ".tmp" in p.name]
    assert stale, "the killed compile should have left its temporary file"
    assert _value(_run(cache)) == WANT  # the next process (real compiler) removes it
    assert [p.name for p in (cache / "cpu").iterdir() if ".tmp" in p.name] == []
