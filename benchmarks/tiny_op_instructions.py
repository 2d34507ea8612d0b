"""Instructions per cached tiny op (issue 32's "tiny op" dispatch), counted by valgrind's callgrind: a
measure that machine load does not move, for A/B comparisons of checkouts on a shared machine.

Run: python benchmarks/tiny_op_instructions.py [--tree /path/to/checkout ...] [--calls 2000]

Per tree, two processes run under callgrind: both realize a + b (4 float32 elements, the compare.py
tiny_op workload) 300 times to warm up, then one realizes it `--calls` more times; the difference of their
totals over `--calls` is one realize's instructions (the import and the warm-up cancel). Two things make
the count drift when left alone, and are pinned here: OpenBLAS's idle worker threads spin (callgrind counts
their loops; OPENBLAS_NUM_THREADS=1), and hash randomisation moves dict probes (PYTHONHASHSEED=0). The
workload holds no node of the graph between calls: a live a + b node would make every call a hash-cons hit
and keep the previous result alive one call longer, which is not what compare.py measures.
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile

PACKAGES = ("polygrad-core", "polygrad-backend-cpu", "polygrad-backend-interp", "polygrad-backend-x86",
            "polygrad-backend-cuda", "polygrad-hf", "polygrad-onnx")

WORKLOAD = r'''
import sys
import numpy as np
import polygrad as pg
a = pg.Tensor(np.array([1, 2, 3, 4], np.float32)).realize()
b = pg.Tensor(np.array([4, 3, 2, 1], np.float32)).realize()
for _ in range(300 + int(sys.argv[1])):
    (a + b).realize()
'''


def total_instructions(tree: str, calls: int, script: str) -> int:
    """callgrind's instruction total for the workload with `calls` realizes after the warm-up."""
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", PYTHONHASHSEED="0")
    env["PYTHONPATH"] = os.pathsep.join([os.path.join(tree, p, "src") for p in PACKAGES] + [tree])
    with tempfile.TemporaryDirectory() as tmp:
        out = subprocess.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={tmp}/cg.out",
                              os.path.realpath(sys.executable), script, str(calls)],
                             env=env, cwd=tree, capture_output=True, text=True)
    found = re.search(r"Collected : (\d+)", out.stderr)
    if out.returncode != 0 or found is None:
        raise RuntimeError(f"callgrind run in {tree} failed (is valgrind installed?):\n{out.stderr[-2000:]}")
    return int(found.group(1))


def per_call(tree: str, calls: int) -> float:
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(WORKLOAD)
    try:
        base = total_instructions(tree, 0, f.name)  # compiles the kernel into the tree's cache if needed
        base = total_instructions(tree, 0, f.name)
        return (total_instructions(tree, calls, f.name) - base) / calls
    finally:
        os.unlink(f.name)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tree", nargs="+", default=[os.path.dirname(os.path.dirname(os.path.abspath(__file__)))])
    parser.add_argument("--calls", type=int, default=2000)
    args = parser.parse_args()
    for tree in args.tree:
        print(f"{tree}: {per_call(tree, args.calls):,.0f} instructions per cached a + b realize")


if __name__ == "__main__":
    main()
