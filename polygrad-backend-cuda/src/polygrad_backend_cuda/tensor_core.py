"""Tensor-core matmul kernels (mma.sync) for kernels lowered with Opt(TC)."""
from __future__ import annotations

from typing import Any


def uses_tensor_cores(spec: Any) -> bool:
    return any(getattr(o, "kind", None) is not None and o.kind.value == "TC" for o in spec.opts)


def tensor_core_launch(spec: Any) -> Any:
    raise NotImplementedError


def render_tensor_core(spec: Any, renderer: Any) -> str:
    raise NotImplementedError
