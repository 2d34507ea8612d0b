"""benchmarks/bench_cuda.py (issue 35's GPU speed table) runs here on the host device at its --tiny sizes.

Speed is never asserted (the table is for a GPU); only that every row runs, is checked against its
reference (NumPy, and torch where installed) and passes, and that a wrong kernel fails its row.
"""
from __future__ import annotations

import importlib.util
import os
import shutil
import sys

import pytest

from polygrad import Tensor

HOST = "CPU" if shutil.which("clang") or shutil.which("gcc") or shutil.which("cc") else "INTERP"
SCRIPT = os.path.join(os.path.dirname(__file__), "..", "benchmarks", "bench_cuda.py")


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_cuda", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop(spec.name, None)


def test_every_row_runs_and_passes_its_check_at_tiny_sizes(bench, capsys):
    assert bench.main(["--device", HOST, "--tiny", "--repeats", "1"]) == 0
    out = capsys.readouterr().out
    for name in ("matmul 64 fp32", "matmul 64 fp32 with TF32 opted in (POLY_ALLOW_TF32=1)", "matmul 64 fp16",
                 "matmul 64 bf16", "conv2d 3x3 16->16 batch 2 8x8", "MLP 784-512-512-10 Adam step",
                 "GPT-2 training step (2x64, batch 2 x 16)", "GPT-2 decode (2x64, prompt 4, 4 new tokens)",
                 "launch: 40-kernel JIT replay, CUDA graphs", "launch: 40-kernel JIT replay, one launch each"):
        line = next(row for row in out.splitlines() if row.startswith(name))
        assert line.endswith(": ok"), line
    assert "RESULT: all 10 rows checked" in out
    assert f"matmul on wgmma: not run, device {HOST}" in out


def test_the_wgmma_rows_come_from_a_child_and_fail_without_wgmma(bench, capsys):
    """The wgmma rows' plumbing on the host device: a child process (POLY_CUDA_WGMMA=1) measures fp16 and bf16,
    its rows come back through JSON, named for wgmma, and fail their check since no kernel was lowered for
    wgmma here (TC:64): a GPU run cannot report mma.sync figures as wgmma ones."""
    rows = bench.wgmma_rows(64, HOST, 1, require_wgmma=False)
    assert [r.name.split(" (opts")[0] for r in rows] == ["matmul 64 on wgmma (POLY_CUDA_WGMMA=1) fp16",
                                                          "matmul 64 on wgmma (POLY_CUDA_WGMMA=1) bf16"]
    assert all(not r.ok and "not lowered for wgmma (TC:64)" in r.check and "rel err" in r.check for r in rows)


def test_a_wrong_matmul_fails_its_row(bench, capsys, monkeypatch):
    right = Tensor.__matmul__
    monkeypatch.setattr(Tensor, "__matmul__", lambda a, b: right(a, b) * 1.001)
    assert bench.main(["--device", HOST, "--tiny", "--repeats", "1", "--rows", "matmul"]) == 1
    out = capsys.readouterr().out
    assert "matmul 64 fp32" in out and "CHECK FAILED" in out


def test_a_wrong_convolution_fails_its_row(bench, capsys, monkeypatch):
    right = Tensor.conv2d
    monkeypatch.setattr(Tensor, "conv2d", lambda x, w, *a, **k: right(x, w, *a, **k) * 1.001)
    assert bench.main(["--device", HOST, "--tiny", "--repeats", "1", "--rows", "conv"]) == 1
    out = capsys.readouterr().out
    assert "conv2d 3x3" in out and "CHECK FAILED" in out
