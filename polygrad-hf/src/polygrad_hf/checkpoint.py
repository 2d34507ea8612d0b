"""Find and read a checkpoint folder: config.json plus safetensors weights (single or sharded), or GGUF.

Stage: checkpoint reading. Input: a local folder or file path. Output: a `Checkpoint`: the
`DecoderConfig` and the weights by their Hugging Face names as host arrays (memory-mapped views
until converted), where every look-up checks the tensor's presence and shape and names the file.

F32, F16 and BF16 safetensors are read; a sharded checkpoint is found through
`model.safetensors.index.json` (its weight_map names each tensor's shard). GGUF files go through
gguf_file.py, which returns the same names and layouts (both return weights.Checkpoint).
"""
from __future__ import annotations

import json
import os
from typing import Any

import numpy as np

from polygrad.dtype import DType, dtypes
from polygrad.errors import SafetensorsError
from polygrad.filemap import drop_pages
from polygrad.nn.safetensors import safe_load_numpy

from polygrad_hf.config import from_hf_config
from polygrad_hf.errors import CheckpointError, UnsupportedModelError
from polygrad_hf.gguf_file import open_gguf
from polygrad_hf.weights import Checkpoint, Lazy

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
FLOAT_TYPES = (dtypes.float32, dtypes.float16, dtypes.bfloat16)


def to_float32(arr: np.ndarray, dt: DType, file: str, name: str) -> np.ndarray:
    """A safetensors array (its storage view) as float32."""
    if dt is dtypes.float32:
        return arr
    if dt is dtypes.float16:
        out = arr.astype(np.float32)
    elif dt is dtypes.bfloat16:
        out = (arr.astype(np.uint32) << 16).view(np.float32)
    else:
        raise UnsupportedModelError(f"{file}: tensor {name!r} is {dt.name}; weights must be F32, F16 or BF16")
    drop_pages(arr)  # the file's 16-bit pages: read once, into the float32 array
    return out


def _lazy(arr: np.ndarray, dt: DType, file: str, name: str) -> Lazy:
    return Lazy(tuple(arr.shape), lambda: to_float32(arr, dt, file, name))


def _read_safetensors(path: str, names: set[str] | None = None) -> dict[str, tuple[Any, str]]:
    try:
        raw = safe_load_numpy(path)
    except (SafetensorsError, OSError) as e:
        raise CheckpointError(f"{path}: cannot read safetensors: {e}") from None
    out = {}
    for name, (arr, dt) in raw.items():
        if names is not None and name not in names:
            continue
        out[name] = (_lazy(arr, dt, path, name), path)
    return out


def _read_json(path: str) -> Any:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except OSError as e:
        raise CheckpointError(f"{path}: cannot read: {e.strerror}") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{path}: not valid JSON ({e})") from None


def _sharded(folder: str) -> dict[str, tuple[Any, str]]:
    index_path = os.path.join(folder, INDEX)
    index = _read_json(index_path)
    wmap = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(wmap, dict) or not all(isinstance(v, str) for v in wmap.values()):
        raise CheckpointError(f"{index_path}: expected {{'weight_map': {{tensor name: shard file}}}}")
    by_file: dict[str, set[str]] = {}
    for name, file in wmap.items():
        if os.path.basename(file) != file:
            raise CheckpointError(f"{index_path}: shard {file!r} for {name!r} must be a file name in the folder")
        by_file.setdefault(file, set()).add(name)
    out: dict[str, tuple[Any, str]] = {}
    for file, names in by_file.items():
        path = os.path.join(folder, file)
        if not os.path.exists(path):
            raise CheckpointError(f"{index_path}: shard {file!r} (holding e.g. {sorted(names)[0]!r}) is missing")
        got = _read_safetensors(path, names)
        lost = sorted(names - set(got))
        if lost:
            raise CheckpointError(f"{path}: tensor {lost[0]!r} is listed in {INDEX} but not in this shard")
        out.update(got)
    return out


def open_checkpoint(path: str | os.PathLike) -> Checkpoint:
    """The Checkpoint of a Hugging Face folder (config.json + safetensors) or of a .gguf file (or a folder
    holding exactly one .gguf and no safetensors)."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise CheckpointError(f"{path}: no such file or folder; download it first with download_hf(repo_id)")
    if os.path.isfile(path):
        if path.endswith(".gguf"):
            return open_gguf(path)
        raise CheckpointError(f"{path}: load_hf takes a model folder (config.json + *.safetensors) or a .gguf file")
    files = os.listdir(path)
    tokenizer = os.path.join(path, "tokenizer.json") if "tokenizer.json" in files else None
    if INDEX not in files and SINGLE not in files:
        ggufs = sorted(f for f in files if f.endswith(".gguf"))
        if len(ggufs) == 1:
            ck = open_gguf(os.path.join(path, ggufs[0]))
            ck.tokenizer_file = ck.tokenizer_file or tokenizer
            return ck
        what = "several .gguf files: pass the one to load" if ggufs else \
            f"no {SINGLE}, {INDEX} or .gguf file (pytorch_model.bin is not read: convert it to safetensors)"
        raise CheckpointError(f"{path}: {what}")
    cfg_path = os.path.join(path, "config.json")
    if "config.json" not in files:
        raise CheckpointError(f"{path}: config.json is missing next to the weights")
    config = from_hf_config(_read_json(cfg_path), cfg_path)
    arrays = _sharded(path) if INDEX in files else _read_safetensors(os.path.join(path, SINGLE))
    return Checkpoint(config, path, arrays, tokenizer_file=tokenizer)
