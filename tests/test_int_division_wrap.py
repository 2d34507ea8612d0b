"""Signed integer division wraps like NumPy on every backend: INT_MIN // -1 and INT_MIN % -1 never trap.

x86's idiv raises SIGFPE for that one pair, which killed the process on CPU. The cases run in a child
interpreter so a regression fails this test instead of taking the test runner down with it.
"""
from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import DEVICES, run_python

CASES = {"int32": -2**31, "int64": -2**63}


@pytest.mark.parametrize("device", DEVICES)
def test_int_min_divided_by_minus_one_wraps(device: str) -> None:
    code = f"""
    import json
    import numpy as np
    from polygrad import Tensor
    out = {{}}
    for name, low in {CASES!r}.items():
        a = np.array([low, 7, -7, low, 5, low + 1, low, 9], dtype=name)
        b = np.array([-1, -1, 2, 1, 0, -1, -1, -3], dtype=name)
        for n in (1, 64):  # one element (scalar code), and vector lanes
            x, y = Tensor(np.resize(a, n), device="{device}"), Tensor(np.resize(b, n), device="{device}")
            out[f"{{name}} {{n}}"] = [(x // y).tolist(), (x % y).tolist(), x.div(y, rounding_mode="trunc").tolist(),
                                     (x // -1).tolist(), (x % -1).tolist(), x.fmod(y).tolist()]
    print(json.dumps(out))
    """
    proc = run_python(code)
    assert proc.returncode == 0, f"the child died (rc {proc.returncode}): {proc.stderr[-2000:]}"
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    for name, low in CASES.items():
        a = np.array([low, 7, -7, low, 5, low + 1, low, 9], dtype=name)
        b = np.array([-1, -1, 2, 1, 0, -1, -1, -3], dtype=name)
        for n in (1, 64):
            x, y = np.resize(a, n), np.resize(b, n)
            safe = np.where(y == 0, 1, y)  # the documented rule: division by zero divides by 1
            with np.errstate(all="ignore"):
                trunc = np.where((x % safe != 0) & ((x < 0) != (safe < 0)), x // safe + 1, x // safe)
                want = [x // safe, x % safe, trunc, x // -1, x % -1, np.fmod(x, safe)]
            for k, (g, w) in enumerate(zip(got[f"{name} {n}"], want)):
                assert g == w.tolist(), f"{device} {name} n={n} case {k}: {g} != {w.tolist()}"
