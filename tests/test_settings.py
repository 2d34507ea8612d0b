"""Settings have one owner: typed, checked names and values, read by backends through backend_api, the
thread count a Context sets is the one kernels run on, and the documented tables list what exists."""
import itertools
import os
import re
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from polygrad import Context, Device, backend_api, config, errors

from conftest import run_python

ROOT = Path(__file__).resolve().parents[1]
SOURCES = [ROOT / "polygrad-core" / "src", *sorted(ROOT.glob("polygrad-backend-*/src")), ROOT / "polygrad-hf" / "src"]
HOST_DEVICES = [d for d in ("CPU", "X86") if Device.available(d)]


def _import_backends() -> None:
    """Backends declare their settings when imported: import every one installed here."""
    for name in ("polygrad_backend_cpu", "polygrad_backend_x86", "polygrad_backend_cuda", "polygrad_backend_interp"):
        try:
            __import__(name)
        except ImportError:
            pass


def test_unknown_names_raise_and_suggest_the_closest():
    for attempt in (lambda: config.get("DEBGU"), lambda: config.set_value("DEBGU", 1),
                    lambda: Context(DEBGU=1), lambda: config.process_value("DEBGU")):
        with pytest.raises(errors.UnknownSettingError, match=r"unknown setting 'DEBGU'; did you mean DEBUG\?") as info:
            attempt()
        assert isinstance(info.value, KeyError) and isinstance(info.value, errors.PolygradError)
        assert "POLY_THREADS" in str(info.value)  # the known names are listed
    assert config.get("DEBUG") == 0


@pytest.mark.parametrize("name,raw", [("POLY_THREADS", "abc"), ("POLY_THREADS", "0"), ("DEBUG", "1.5"),
                                      ("BEAM", "-2"), ("POLY_ALLOC_CACHE_MB", "lots")])
def test_a_bad_environment_value_fails_at_import_naming_the_variable(name, raw):
    p = run_python("import polygrad", env={name: raw})
    assert p.returncode != 0
    last = p.stderr.strip().splitlines()[-1]
    assert last.startswith("polygrad.errors.SettingError: ") and f"{name}={raw!r}" in last, p.stderr


def test_environment_values_are_parsed_to_their_type():
    p = run_python("from polygrad import config; print(repr(config.get('POLY_THREADS')), config.get('BEAM') + 1)",
                   env={"POLY_THREADS": " 3 ", "BEAM": "2"})
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["3", "3"]


def test_context_and_set_value_check_values():
    with pytest.raises(errors.SettingError, match=r"POLY_THREADS=0 \(Context\) is below 1"):
        Context(POLY_THREADS=0)
    with pytest.raises(errors.SettingError, match="BEAM='wide'"):
        Context(BEAM="wide")
    with pytest.raises(errors.SettingError, match="DEBUG=1.5"):
        config.set_value("DEBUG", 1.5)
    with Context(BEAM="2"):  # text is parsed as the environment's would be
        assert config.get("BEAM") == 2
    assert config.get("BEAM") == 0


def test_live_settings_follow_the_environment_unless_a_context_sets_them(monkeypatch, tmp_path):
    monkeypatch.setenv("POLY_CACHE_DIR", str(tmp_path / "a"))
    assert config.cache_dir() == str(tmp_path / "a")
    with Context(POLY_CACHE_DIR=str(tmp_path / "b")):
        assert config.cache_dir() == str(tmp_path / "b")
    monkeypatch.setenv("POLY_CACHE_DIR", str(tmp_path / "c"))
    assert config.cache_dir() == str(tmp_path / "c")


@pytest.mark.skipif(not Device.available("X86"), reason="X86 backend unavailable")
def test_a_backend_setting_is_typed_and_a_bad_value_names_it(monkeypatch):
    from polygrad_backend_x86.cpu import choose_isa
    monkeypatch.setenv("POLY_X86_ISA", "avx9000")
    with pytest.raises(errors.SettingError, match=r"POLY_X86_ISA='avx9000' \(from the environment\) is not one of "
                                           r"sse2, avx2, avx512"):
        choose_isa()
    monkeypatch.setenv("POLY_X86_ISA", " SSE2 ")
    assert choose_isa().tier == "sse2"


def test_backends_declare_their_settings_through_the_plugin_api():
    _import_backends()
    owners = {s.name: s.owner for s in config.settings()}
    assert owners["POLY_THREADS"] == "polygrad-core"
    for name, owner in (("POLY_CC", "polygrad-backend-cpu"), ("POLY_X86_ISA", "polygrad-backend-x86"),
                        ("POLY_CUDA_LIB", "polygrad-backend-cuda"), ("POLY_NVRTC_LIB", "polygrad-backend-cuda")):
        if owner.replace("-", "_") in sys.modules:
            assert owners[name] == owner
    declared = next(s for s in config.settings() if s.name == "POLY_THREADS")
    config.register(declared)  # the same declaration again is a no-op
    with pytest.raises(errors.PluginError, match="declared by polygrad-core and again, differently, by toy"):
        config.register(config.Setting("POLY_THREADS", str, "", "toy's threads", owner="toy"))


# os.environ may be read for what is not polygrad's own setting: config.py is the one place for those
ALLOWED_ENV_READS = {
    ("polygrad/config.py", 'raw = os.environ.get(self.name)'),
    ("polygrad/config.py", 'os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "polygrad")'),
    ("polygrad_backend_cuda/libs.py", "home = os.environ.get(env)"),  # CUDA_HOME, CUDA_PATH: the toolkit's
    ("polygrad/distributed/comm.py", 'value = os.environ.get(name, "")'),  # PMI_SIZE...: the MPI launcher's
}


def _python_files():
    for src in SOURCES:
        for path in sorted(src.rglob("*.py")):
            yield path, path.relative_to(src).as_posix(), path.read_text()


def test_no_environment_reads_outside_config():
    """Backends, hf and core read polygrad's settings through config (backends: backend_api.setting)."""
    found = set()
    for _, rel, text in _python_files():
        for line in text.splitlines():
            if re.search(r"\b(environ|getenv|putenv)\b", line) and not line.lstrip().startswith("#"):
                found.add((rel, line.strip()))
    found = {(rel, line) for rel, line in found if "`os.environ`" not in line}  # docs that say not to
    assert found == ALLOWED_ENV_READS


def test_every_setting_read_in_the_sources_is_declared():
    _import_backends()
    known = {s.name for s in config.settings()}
    reads = re.compile(r"""(?:\bsetting|process_setting|config\.get|get_setting|process_value|values\.get|"""
                       r"""set_value)\(\s*["']([A-Z][A-Z0-9_]+)["']|\bContext\(([A-Z][A-Z0-9_]+)=""")
    seen = set()
    for _, rel, text in _python_files():
        for name in (a or b for a, b in reads.findall(text)):
            seen.add(name)
            assert name in known, f"{rel} reads undeclared setting {name}"
    assert {"POLY_THREADS", "DEBUG", "POLY_CC", "POLY_X86_ISA", "TRAINING"} <= seen


def _table_names(text: str, heading: str) -> set[str]:
    """The setting names in the first column of the first table after `heading`."""
    lines = text.split(heading, 1)[1].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    rows = [line for line in itertools.takewhile(lambda ln: ln.startswith("|"), lines[start + 2:])]
    return {n for row in rows for n in re.findall(r"[A-Z][A-Z0-9_]{2,}", row.split("|")[1])}


def test_the_documented_tables_list_the_declared_settings():
    _import_backends()
    declared = {s.name for s in config.settings()}
    core = {s.name for s in config.settings() if s.owner == "polygrad-core"}
    doc = (ROOT / "docs" / "architecture.md").read_text()
    assert _table_names(doc, "## Settings (") == declared
    assert _table_names(config.__doc__, "Output:") == core
    readme = (ROOT / "README.md").read_text()
    devices = _table_names(readme, "## Devices") - {"POLY_LONG_TESTS"}  # the test suite's own switch
    assert devices <= declared and devices


def test_run_split_runs_every_part_on_the_threads_the_context_allows():
    for want, split in ((1, 8), (2, 8), (3, 7), (8, 4)):
        parts, threads = [], set()

        def part(i):
            parts.append(i)
            threads.add(threading.get_ident())
        with Context(POLY_THREADS=want):
            used = backend_api.run_split(part, split)
        assert sorted(parts) == list(range(split))
        assert used == min(want, split) and len(threads) <= used
        if want == 1:
            assert threads == {threading.get_ident()}


@pytest.mark.parametrize("device", HOST_DEVICES)
def test_context_threads_decide_the_threads_a_launch_uses(device):
    """A kernel split 4 ways (POLY_THREADS=4 when the device opened) runs on the calling thread alone
    inside Context(POLY_THREADS=1): no pool worker starts (no new OS thread appears), also
    when a JIT replays launchers bound inside that Context; outside it, 3 workers join."""
    p = run_python(f'''
        import os
        import numpy as np
        from polygrad import Context, Tensor, TinyJit
        from polygrad.engine import programs, realize
        DEV = "{device}"

        def threads():  # the ids of the process's OS threads
            return set(os.listdir("/proc/self/task"))

        step = TinyJit(lambda t: (t * 2 + 1).realize())
        x = Tensor(np.arange(1 << 20, dtype=np.float32), device=DEV).realize()
        want = np.arange(1 << 20, dtype=np.float32) * 2 + 1
        before = threads()
        with Context(POLY_THREADS=1):
            assert np.array_equal((x * 2 + 1).numpy(), want)  # compiles (and starts building CPU's pool)
            if DEV == "CPU":
                from polygrad_backend_cpu.runtime import c_pool
                assert c_pool(wait=True) is not None  # built or loaded (the builder thread has ended)
            assert np.array_equal((x * 2 + 1).numpy(), want)
            for _ in range(3):  # capture, then replays of launchers bound in this Context
                assert np.array_equal(step(x).numpy(), want)
            alone = len(threads() - before)
        assert np.array_equal(step(x).numpy(), want)  # the same bound launchers, outside the Context
        split = max(p.spec.threads for (ast, dev), p in programs.program_cache.items() if dev == DEV)
        print(split, alone, len(threads() - before))
    ''', env={"POLY_THREADS": "4", "DEV": device}, timeout=300)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["4", "0", "3"]


@pytest.mark.parametrize("device", HOST_DEVICES)
def test_a_bound_launcher_reads_the_thread_count_at_each_launch(device):
    """What a JIT replay keeps (`bind`) runs on the launch's POLY_THREADS, at most the kernel's split."""
    from polygrad.backend_api import Capabilities, HostMemory
    from polygrad.codegen.lower import lower
    from polygrad.device import open_device
    from test_padded_lanes import GUARD, SENTINEL, inputs, padded_kernel
    dev = open_device(device)
    n = 203530
    caps = dev.capabilities
    spec = lower(padded_kernel(n), Capabilities(threads=4, vector_width=caps.vector_width, registers=caps.registers))
    assert spec.threads == 4
    prog = dev.load(spec, dev.compile(dev.render(spec)))
    if device == "CPU":
        from polygrad_backend_cpu.runtime import c_pool
        assert c_pool(wait=True) is not None
    a, b, want = inputs(n)
    out = np.full(n + GUARD, SENTINEL, dtype=np.float32)
    launch = prog.bind([HostMemory(out), HostMemory(a), HostMemory(b)])
    for threads, used in ((1, 1), (2, 2), (3, 3), (16, 4)):
        out[:] = SENTINEL
        with Context(POLY_THREADS=threads):
            assert launch() == used
        np.testing.assert_array_equal(out[:n], want)
        assert (out[n:] == SENTINEL).all()


def test_all_settings_read_once_are_in_the_hot_path_table():
    """Hot paths read current.values directly: every setting read once is there from the start."""
    assert {s.name for s in config.settings() if not s.live} <= set(config.current.values)
    assert os.cpu_count() is None or config.lookup("POLY_THREADS").default == os.cpu_count()


def test_doctor_lists_the_settings_with_their_owners():
    p = run_python("import sys, runpy; sys.argv = ['polygrad', 'doctor']; runpy.run_module('polygrad', "
                   "run_name='__main__')", env={"POLY_THREADS": "3"})
    lines = p.stdout.splitlines()
    assert "  POLY_THREADS = 3, default %r, polygrad-core" % (os.cpu_count() or 1) in lines, p.stdout
    if Device.available("X86"):
        assert "  POLY_X86_ISA = '', default '', polygrad-backend-x86" in lines
