"""benchmarks/compare.py keeps working: every workload runs at toy sizes for polygrad, NumPy and PyTorch
and is written as JSON lines. Never a timing assertion (the figures of --tiny mean nothing)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "benchmarks", "compare.py")
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
from compare import WORKLOADS  # noqa: E402


def test_compare_runs_every_workload_at_tiny_sizes(tmp_path):
    cc = next((c for c in ("clang", "gcc") if shutil.which(c)), None)
    if cc is None:
        pytest.skip("no C compiler")
    out = tmp_path / "out.jsonl"
    names = list(WORKLOADS)  # the BEAM row too: at tiny size its search takes seconds
    proc = subprocess.run([sys.executable, SCRIPT, "--tiny", "--cc", cc, "--jsonl", str(out), "--only", *names],
                          capture_output=True, text=True, timeout=600, cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    got = {(x["workload"], x["library"]) for x in lines}
    for name, (unit, better, _, libs) in WORKLOADS.items():
        for lib in libs:
            assert (name, lib) in got, f"{name} did not run for {lib}:\n{proc.stderr}"
    for x in lines:
        assert x["tiny"] is True and x["value"] > 0 and x["unit"] == WORKLOADS[x["workload"]][0]
    table = proc.stdout.splitlines()
    assert table[0].split()[:2] == ["workload", "unit"] and len(table) == len(names) + 2


def test_compare_shared_process_columns(tmp_path):
    """--shared-process times each library beside the others' calls in one process: a "LIB shared"
    column per library that has the workload, none for a first call (one per process)."""
    cc = next((c for c in ("clang", "gcc") if shutil.which(c)), None)
    if cc is None:
        pytest.skip("no C compiler")
    out = tmp_path / "out.jsonl"
    names = ["matmul1024", "first_call_cold"]  # (an MLP step's shared columns: about 30 s more on 2 cores)
    proc = subprocess.run([sys.executable, SCRIPT, "--tiny", "--shared-process", "--no-ceiling", "--cc", cc,
                           "--jsonl", str(out), "--only", *names],
                          capture_output=True, text=True, timeout=600, cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    got = {(x["workload"], x["library"]) for x in map(json.loads, out.read_text().splitlines())}
    shared = {(w, lib) for w, lib in got if lib.endswith("-shared")}
    assert shared == {("matmul1024", "polygrad-shared"), ("matmul1024", "numpy-shared"),
                      ("matmul1024", "torch-shared")}, proc.stderr
    head = proc.stdout.splitlines()[0]
    assert f"polygrad[{cc}] shared" in head and "sh. vs torch" in head
