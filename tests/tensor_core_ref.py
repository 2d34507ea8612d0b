"""Helpers shared by the tests/test_tensor_core_*.py files: compare polygrad with torch CPU.

Many ops are evaluated in one kernel by stacking their outputs (pad + add), so a test pays the
C compiler once per shape instead of once per op and shape.
"""
from __future__ import annotations

import numpy as np
import torch

from polygrad import Tensor

from conftest import DEVICES  # noqa: E402,F401  (every usable backend: CPU, INTERP, X86, ...; re-exported)


def stack(ts: list[Tensor]) -> Tensor:
    """Stack same-shape tensors along a new leading axis using only pad and add."""
    n = len(ts)
    out = None
    for i, t in enumerate(ts):
        pads = ((i, n - 1 - i),) + ((0, 0),) * t.ndim
        part = t.reshape((1,) + t.shape).pad(pads)
        out = part if out is None else out + part
    return out


def concat_flat(ts: list[Tensor]) -> tuple[Tensor, list[tuple[int, int]]]:
    """Flatten tensors of any shapes into one vector (pad + add); returns it and each one's span."""
    sizes = [t.numel() for t in ts]
    total = sum(sizes)
    out, spans, at = None, [], 0
    for t, n in zip(ts, sizes):
        part = t.reshape(n).pad(((at, total - at - n),))
        out = part if out is None else out + part
        spans.append((at, at + n))
        at += n
    return out, spans


def to_np(t) -> np.ndarray:
    if isinstance(t, torch.Tensor):
        t = t.detach()
        if t.dtype in (torch.bfloat16, torch.float16):
            t = t.float()
        return t.numpy()
    return np.asarray(t.numpy())


def close(name: str, got, want, rtol: float, atol: float) -> str | None:
    """None when got matches want (NaNs in the same places), else a one-line report."""
    got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    if got.shape != want.shape:
        return f"{name}: shape {got.shape} != torch {want.shape}"
    if np.allclose(got, want, rtol=rtol, atol=atol, equal_nan=True):
        return None
    bad = ~np.isclose(got, want, rtol=rtol, atol=atol, equal_nan=True)
    i = np.argwhere(bad)[0]
    return f"{name}: at {tuple(i)} got {got[tuple(i)]!r}, torch {want[tuple(i)]!r} ({bad.sum()} bad)"


def check_all(problems: list) -> None:
    problems = [p for p in problems if p]
    assert not problems, "\n".join(problems)
