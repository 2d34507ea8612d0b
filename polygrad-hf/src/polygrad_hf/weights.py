"""The checkpoint data model: a model's config and its named weights, read on demand.

Stage: checkpoint reading (the type every reader returns). Input: what a reader found (checkpoint.py
for safetensors folders, gguf_file.py for GGUF). Output: a `Checkpoint` whose `take(name, shape)`
checks the tensor's presence and shape, names the file, and returns it as float32 (or `blocks(name)`:
a quantized tensor's blocks as stored). Readers import this module; it imports none of them.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from polygrad_hf.config import DecoderConfig
from polygrad_hf.errors import CheckpointError


@dataclass(frozen=True)
class Blocks:
    """A tensor a reader can hand over in a block format (GGUF Q8_0, Q4_0): `load()` gives its uint8
    blocks (rows, cols // 32, block bytes), in the row order the model expects (quant.py)."""

    format: str
    shape: tuple[int, int]  # (rows, cols) as stored: blocks run along cols
    load: Callable[[], np.ndarray]


@dataclass(frozen=True)
class Lazy:
    """A tensor read (converted, dequantized) on demand; its shape is known without reading it. `blocks`:
    the same tensor in its block format, for a reader whose file holds it quantized."""

    shape: tuple[int, ...]
    load: Callable[[], np.ndarray]
    blocks: Blocks | None = None


@dataclass
class Checkpoint:
    """A model's config and its named weights; `take(name, shape)` returns one as float32."""

    config: DecoderConfig
    source: str  # the folder or file, for messages
    arrays: dict[str, tuple[Any, str]]  # name -> (array or Lazy, file it lives in)
    extras: dict[str, np.ndarray] = field(default_factory=dict)  # e.g. GGUF rope_freqs
    tokenizer_file: str | None = None
    notes: list[str] = field(default_factory=list)  # what loading did (weights kept quantized, ...)

    def has(self, name: str) -> bool:
        return name in self.arrays

    def expect(self, name: str, shape: tuple[int, ...]) -> None:
        """CheckpointError naming the file unless tensor `name` is present with `shape` (nothing is read)."""
        if name not in self.arrays:
            files = sorted({f for _, f in self.arrays.values()}) or [self.source]
            where = files[0] if len(files) == 1 else f"{self.source} ({len(files)} files)"
            raise CheckpointError(f"{where}: tensor {name!r} is missing ({len(self.arrays)} tensors present); is this "
                                  f"a complete {self.config.family} checkpoint?")
        raw, file = self.arrays[name]
        if tuple(raw.shape) != tuple(shape):
            raise CheckpointError(f"{file}: tensor {name!r} has shape {list(raw.shape)}, the config implies "
                                  f"{list(shape)}")

    def blocks(self, name: str) -> Blocks | None:
        """Tensor `name` in its block format when the file holds it quantized, else None (check expect first)."""
        raw, _ = self.arrays[name]
        return raw.blocks if isinstance(raw, Lazy) else None

    def take(self, name: str, shape: tuple[int, ...]) -> np.ndarray:
        """The tensor `name` as a float32 array of `shape`; CheckpointError naming the file otherwise."""
        self.expect(name, shape)
        raw, file = self.arrays[name]
        arr = raw.load() if isinstance(raw, Lazy) else raw
        if tuple(arr.shape) != tuple(shape):  # a reader's Lazy promised another shape: a bug, named as one
            raise CheckpointError(f"{file}: tensor {name!r} was read with shape {list(arr.shape)}, not {list(shape)}")
        return arr
