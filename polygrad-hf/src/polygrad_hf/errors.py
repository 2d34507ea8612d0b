"""The errors polygrad-hf raises; every message names the file (and tensor) and says what to do.

Stage: shared by every module of the package. Input: none. Output: exception types.
"""
from __future__ import annotations

import importlib

from polygrad.errors import PolygradError


class HFError(PolygradError, ValueError):
    """A checkpoint or model folder polygrad-hf cannot use."""


class UnsupportedModelError(HFError):
    """An architecture, rope scaling, activation or tensor type that polygrad-hf does not implement."""


class CheckpointError(HFError):
    """A missing, corrupt or inconsistent file or tensor (missing tensor, wrong shape, truncated file)."""


class MissingDependencyError(PolygradError, ImportError):
    """An optional package (huggingface_hub, gguf, tokenizers) is needed and not installed."""


def need_package(module: str, pip_name: str, what: str) -> object:
    """import `module`, or raise MissingDependencyError naming the pip line."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise MissingDependencyError(f"{what} needs the {pip_name!r} package: pip install {pip_name}") from None
