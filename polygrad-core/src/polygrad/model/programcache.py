"""Captured Programs kept on disk without their weights, so a later process skips the capture.

Stage: model support (between capture.py and a Model built with `Model._from_program`). Input: a key
text that names everything the capture depended on, and the captured Program with its initial data.
Output: the same Program read back in another process (or None: the caller captures again), and the
slot data for a Model, with the parameters and state taken from the caller's own Tensors by name.

An entry lives at POLY_CACHE_DIR/programs/<sha256 of the key>.pgp in the checked entry format of
`polygrad.diskcache` (length and sha256 trailer). Its payload is the key text (compared on reading,
so a hash collision or a renamed file is a miss) followed by bundle bytes (`polygrad.bundle`) whose
manifest stores no data for the parameter and state buffers (`format.to_manifest(external=...)`):
the entry holds the kernels (as captured, not in a bundle's stored form), slots, entrypoints and the
small constants the callable made, never the weights. Reading goes through `format.from_manifest`,
which checks everything as for an untrusted bundle; an entry that fails, or whose buffers do not
match the caller's weights, is removed with a warning and the caller captures again (and rewrites
it). `key` adds polygrad's version and `code_signature` to the caller's parts, so an edited polygrad
never reads an old entry.
"""
from __future__ import annotations

import hashlib
import os
import struct
import warnings
from typing import Any, Mapping

import numpy as np

from polygrad import bundle, limits
from polygrad.bundle import BundleError
from polygrad.device import Buffer
from polygrad.diskcache import CacheWarning, cache_dir, read_entry, write_entry
from polygrad.engine.rendercache import code_signature
from polygrad.model.format import from_manifest, to_manifest
from polygrad.model.program import Program
from polygrad.version import __version__

FORMAT = "polygrad-program-1"
FOLDER = "programs"  # under POLY_CACHE_DIR (tests point it elsewhere to start from an empty cache)
EXTERNAL = ("parameter", "state")  # roles whose contents the caller supplies (its weights)
_KEY_LEN = struct.Struct("<I")
stats = {"hits": 0, "misses": 0, "stored": 0}  # tests read them


def key(module: str, *parts: str) -> str:
    """The key text of an entry: `parts` (what the capture read), the format, polygrad's version and the
    code signature of polygrad core and of `module`'s package (the code that builds the graph)."""
    return "\n".join((FORMAT, __version__, code_signature(module), *parts))


def entry_path(key_text: str) -> str:
    """Where the entry of `key_text` lives (the folder is created)."""
    return os.path.join(cache_dir(FOLDER), hashlib.sha256(key_text.encode()).hexdigest()[:40] + ".pgp")


def store(key_text: str, prog: Program, data: Mapping[int, Any]) -> None:
    """Keep `prog` (a captured Program, and the constants of `data`) under `key_text`, its kernels as
    captured (a later process compiles, or finds compiled, the very kernels this one runs); a cache
    folder that cannot be written is skipped (the next process captures again)."""
    def stored(s: int) -> np.ndarray:
        value = data[s]
        return value.numpy() if isinstance(value, Buffer) else np.asarray(value)
    manifest, blobs = to_manifest(prog, stored, True, __version__, EXTERNAL, as_captured=True)
    head = key_text.encode()
    try:
        write_entry(entry_path(key_text), _KEY_LEN.pack(len(head)) + head + bundle.write(manifest, blobs))
    except OSError:
        return
    stats["stored"] += 1


def load(key_text: str, max_bytes: int, named: Mapping[str, Any],
         entrypoints: tuple[str, ...]) -> tuple[Program, dict[int, Any]] | None:
    """(Program, initial data for a Model) stored under `key_text`, or None when there is no valid entry.

    `max_bytes` caps the memory the entry's buffers may ask for (all of them, weights included). The
    data holds the stored constants and, for each parameter or state slot, the Buffer of the realized
    Tensor of its name in `named` (as `params=` named them at capture). An entry whose slots do not
    match `named` (name, dtype, shape) or whose entrypoints are not `entrypoints` is discarded."""
    path = entry_path(key_text)
    payload = read_entry(path)
    if payload is None:
        stats["misses"] += 1
        return None
    view = memoryview(payload)
    try:
        if len(view) < _KEY_LEN.size:
            raise BundleError("the entry is shorter than its key")
        (n,) = _KEY_LEN.unpack_from(view)
        if bytes(view[_KEY_LEN.size:_KEY_LEN.size + n]) != key_text.encode():
            raise BundleError("the entry was written for another key")
        manifest, body = bundle.read(view[_KEY_LEN.size + n:])
        prog, stored = from_manifest(manifest, body, max_bytes, limits.default_max_work(max_bytes), EXTERNAL)
        if set(prog.entries) != set(entrypoints):
            raise BundleError(f"its entrypoints are {sorted(prog.entries)}, not {sorted(entrypoints)}")
        data = _model_data(prog, stored, named)
    except BundleError as e:
        discard(path, str(e))
        stats["misses"] += 1
        return None
    stats["hits"] += 1
    return prog, data


def _model_data(prog: Program, stored: Mapping[int, Any], named: Mapping[str, Any]) -> dict[int, Any]:
    data: dict[int, Any] = dict(stored)
    for s, slot in enumerate(prog.slots):
        if slot.role not in EXTERNAL:
            continue
        t = named.get(slot.name)
        if t is None or t.dtype != slot.dtype or tuple(t.shape) != slot.shape:
            raise BundleError(f"its {slot.role} {slot.name!r} ({slot.dtype.name}{list(slot.shape)}) is not one of "
                              "the weights given")
        data[s] = t._buffer()
    return data


def discard(path: str, problem: str) -> None:
    """Remove a program entry that cannot be used, with a warning (it is captured and written again)."""
    warnings.warn(f"discarding cached program {path}: {problem}; the model is captured again",
                  CacheWarning, stacklevel=3)
    try:
        os.unlink(path)
    except OSError:
        pass
