"""benchmarks/bench_sched.py keeps working: its quick workloads run once and print their table.

Speed is never asserted here (benchmarks measure it); only that the script runs and reports.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "benchmarks", "bench_sched.py")


def test_bench_sched_runs_its_quick_workloads(tmp_path):
    out = tmp_path / "out.jsonl"
    env = {**os.environ, "POLY_CACHE_DIR": str(tmp_path / "cache")}
    proc = subprocess.run([sys.executable, SCRIPT, "--rounds", "1", "--only", "tiny_op", "jit_replay", "--json",
                           str(out)], capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr
    assert "tiny_op" in proc.stdout and "jit_replay" in proc.stdout
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["workload"] for r in rows] == ["tiny_op", "jit_replay"]
    assert all(r["polygrad"] > 0 and r["torch"] > 0 for r in rows)
