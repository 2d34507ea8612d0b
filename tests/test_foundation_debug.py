"""Debug output (issue 2, item 9): POLY_DUMP_KERNELS=1 prints each kernel's source as it is compiled,
DEBUG=1..4 prints increasing detail. Settings are read at import, so each case is a fresh interpreter.
"""
from __future__ import annotations

import pytest

from conftest import run_python

SCRIPT = """
from polygrad import Tensor
x = Tensor([1.0, -2.0, 3.0], device="{device}")
print("value", ((x * 3 - 1).relu().sum()).numpy())
print("value", x.softmax(-1).numpy().round(4).tolist())
print("value", ((x * 3 - 1).relu().sum()).numpy())  # same kernel again: cached, not compiled
"""
BASE_ENV = {"DEV": None, "POLY_DEV": None, "DEBUG": None, "POLY_DUMP_KERNELS": None}


def _run(device: str, **env: str) -> str:
    proc = run_python(SCRIPT.format(device=device), {**BASE_ENV, **env})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("value") == 3
    return proc.stdout


def test_dump_kernels_prints_c_source_once_per_compiled_kernel():
    out = _run("CPU", POLY_DUMP_KERNELS="1")
    assert out.count("// ---- CPU kernel") == 4  # one fused chain + three for softmax; the rerun is cached
    assert out.count("void pg_kernel(") == 4 and "for (int" in out and "data0" in out  # (and its _task trampoline)


def test_dump_kernels_on_interp_shows_kernel_ir():
    out = _run("INTERP", POLY_DUMP_KERNELS="1")
    assert out.count("// ---- INTERP kernel") == 4
    assert "RANGE" in out and "STORE" in out


def test_no_output_by_default():
    out = _run("CPU")
    assert [ln for ln in out.splitlines() if not ln.startswith("value")] == []


@pytest.mark.parametrize("device", ["CPU"])
def test_debug_levels_add_detail(device):
    outputs = {level: _run(device, DEBUG=str(level)) for level in range(1, 5)}
    launches = [ln for ln in outputs[1].splitlines() if ln.startswith("***")]
    assert len(launches) == 5, outputs[1]  # every kernel run, the cached one included
    assert " us" not in outputs[1] and " us" in outputs[2]  # level 2 adds timings
    assert "DEFINE_GLOBAL" not in outputs[2] and "DEFINE_GLOBAL" in outputs[3]  # level 3: kernel IR
    assert "void " not in outputs[3] and "void " in outputs[4] and "DEFINE_GLOBAL" in outputs[4]  # 4: source
    sizes = [len(outputs[level]) for level in range(1, 5)]
    assert sizes == sorted(sizes) and len(set(sizes)) == 4
