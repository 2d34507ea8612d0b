"""Tensor features beyond the foundation (advanced indexing, pad modes); filled in by the API work."""
from __future__ import annotations

from typing import Any


def advanced_getitem(x: Any, items: list) -> Any:
    raise NotImplementedError("integer-tensor indexing is not implemented yet")


def pad_mode(x: Any, pairs: list, mode: str) -> Any:
    raise NotImplementedError(f"pad mode {mode!r} is not implemented yet")
