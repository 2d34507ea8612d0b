"""Tensor methods for joining, splitting, windows and advanced indexing (a mixin of Tensor).

Built only from the primitive movement/ALU ops in tensor.py, so gradients come for free.
"""
from __future__ import annotations

from typing import Any


class MovementMixin:
    __slots__ = ()

    def _advanced_getitem(self, items: list) -> Any:
        raise NotImplementedError("integer-tensor indexing is not implemented yet")

    def _pad_mode(self, pairs: list, mode: str) -> Any:
        raise NotImplementedError(f"pad mode {mode!r} is not implemented yet")
