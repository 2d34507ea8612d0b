"""Shared checker for the movement/indexing/nn op tests: forward and backward against PyTorch CPU."""
from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np
import torch

from polygrad import Tensor


def rand(*shape: int, seed: int = 0, dtype: Any = np.float32) -> np.ndarray:
    """Deterministic normal data of a given shape."""
    return np.random.default_rng(seed + sum(shape)).standard_normal(shape).astype(dtype)


def compare(pg_fn: Callable[..., Tensor], torch_fn: Callable[..., torch.Tensor], arrays: Sequence[np.ndarray],
            device: str, grad: bool = True, atol: float = 1e-5, rtol: float = 1e-4,
            grad_atol: float | None = None) -> None:
    """Run pg_fn on polygrad tensors and torch_fn on torch tensors; compare values and input gradients.

    Gradients use a random upstream gradient so every output element's contribution is checked.
    """
    floats = [a.dtype.kind == "f" for a in arrays]
    pts = [Tensor(a, device=device, requires_grad=f and grad) for a, f in zip(arrays, floats)]
    tts = [torch.tensor(a, requires_grad=f and grad) for a, f in zip(arrays, floats)]
    out = pg_fn(*pts)
    ref = torch_fn(*tts)
    do_grad = grad and ref.requires_grad and ref.numel() > 0
    if do_grad:
        upstream = np.random.default_rng(7).standard_normal(tuple(ref.shape)).astype(np.float32)
        (out * Tensor(upstream, device=device)).sum().backward()
        (ref * torch.tensor(upstream)).sum().backward()
    assert out.shape == tuple(ref.shape), f"shape {out.shape} != torch {tuple(ref.shape)}"
    # one realize for the output and every gradient, so shared subgraphs compile and run once
    Tensor.realize_all(out, *[p.grad for p in pts if p.grad is not None])
    got = out.numpy()
    want = ref.detach().numpy()
    if want.dtype == np.bool_ or want.dtype.kind in "iu":
        np.testing.assert_array_equal(got, want)
    else:
        np.testing.assert_allclose(got, want, atol=atol, rtol=rtol)
    if not do_grad:
        return
    for i, (p, t) in enumerate(zip(pts, tts)):
        if not t.requires_grad:
            continue
        want_g = t.grad.numpy() if t.grad is not None else np.zeros(t.shape, np.float32)
        got_g = p.grad.numpy() if p.grad is not None else np.zeros(p.shape, np.float32)
        np.testing.assert_allclose(got_g, want_g, atol=grad_atol or atol * 10, rtol=rtol * 10,
                                   err_msg=f"gradient of input {i}")
