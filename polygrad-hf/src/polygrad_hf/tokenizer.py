"""Tokenizer: encode/decode text with a model folder's tokenizer.json, through the `tokenizers` package.

Stage: user API, optional (generate accepts strings through it). Input: a tokenizer.json path, a model
folder, or a Model that load_hf built from a folder holding one. Output: a `Tokenizer` with
`encode(text) -> list[int]` and `decode(ids) -> str`.
"""
from __future__ import annotations

import os
from typing import Any, Sequence

from polygrad_hf.errors import CheckpointError, HFError, need_package


class Tokenizer:
    """A thin wrapper over tokenizers.Tokenizer (no special tokens added, none skipped on decode)."""

    def __init__(self, path: str | os.PathLike):
        lib = need_package("tokenizers", "tokenizers", "the polygrad-hf tokenizer helper")
        self.path = os.fspath(path)
        try:
            self._tok = lib.Tokenizer.from_file(self.path)  # type: ignore[attr-defined]
        except Exception as e:  # noqa: BLE001 (tokenizers raises its own exception type)
            raise CheckpointError(f"{self.path}: cannot read the tokenizer: {e}") from None

    def encode(self, text: str) -> list[int]:
        if not isinstance(text, str):
            raise TypeError(f"encode takes a str, got {type(text).__name__}")
        return list(self._tok.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: Sequence[int]) -> str:
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=False)

    @property
    def vocab_size(self) -> int:
        return int(self._tok.get_vocab_size())

    def __repr__(self) -> str:
        return f"<Tokenizer {self.path} ({self.vocab_size} tokens)>"


def load_tokenizer(source: Any) -> Tokenizer:
    """The Tokenizer of a tokenizer.json file, of a folder holding one, or of a Model load_hf built from one."""
    path = getattr(source, "tokenizer_file", source)
    if path is None:
        raise HFError("this model was not loaded from a folder with a tokenizer.json; pass tokenizer= or token ids")
    path = os.fspath(path)
    if os.path.isdir(path):
        path = os.path.join(path, "tokenizer.json")
    if not os.path.isfile(path):
        raise CheckpointError(f"{path}: no tokenizer.json here")
    return Tokenizer(path)
