"""Compile C source to a shared object with clang (gcc, then cc, as fallbacks).

Results are cached in memory and on disk under POLY_CACHE_DIR/cpu, keyed by source, compiler and
flags. The disk side is polygrad's shared entry format (`backend_api.write_entry`): the compiler
writes a temporary file carrying this process's pid, a length and checksum trailer is appended and the
file is renamed into place, so several processes can share the folder (the worst case is that two
of them compile the same kernel once each). An entry is loaded only after its trailer checks out: a
truncated, empty, garbage or foreign file is discarded with a warning and compiled again. The
compiler runs with a parent-death signal, so killing the Python process mid-compile kills it too;
the temporary file it leaves is removed by the next process that opens the folder.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import hashlib
import os
import shutil
import signal
import subprocess

from polygrad.backend_api import CompileError, cache_dir, temp_path, valid_entry, write_entry

FLAGS = ("-O3", "-march=native", "-shared", "-fPIC", "-fno-math-errno", "-ffp-contract=off", "-lm")
PR_SET_PDEATHSIG = 1
# in the key, so files of an older layout (no checksum trailer) are never looked up, rather than each
# one being discarded with a warning after an upgrade
ENTRY_FORMAT = "entry-v2"


def find_compiler() -> str | None:
    forced = os.environ.get("POLY_CC")
    if forced:
        return shutil.which(forced)
    for name in ("clang", "gcc", "cc"):
        path = shutil.which(name)
        if path:
            return path
    return None


def cache_root() -> str:
    """POLY_CACHE_DIR/cpu (or the temporary folder used instead when that cannot be written)."""
    return cache_dir("cpu")


_prctl: list = []  # [libc prctl or None], looked up once


def _die_with_parent():
    """A preexec_fn for the compiler child: SIGKILL it when the process that started it dies (Linux)."""
    if not _prctl:
        name = ctypes.util.find_library("c")
        try:
            _prctl.append(ctypes.CDLL(name, use_errno=True).prctl if name else None)
        except (OSError, AttributeError):
            _prctl.append(None)
    prctl = _prctl[0]
    if prctl is None:
        return None
    parent = os.getpid()

    def preexec() -> None:  # runs in the child between fork and exec: one foreign call, nothing else
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before the signal was armed
            os._exit(1)
    return preexec


class ClangCompiler:
    def __init__(self) -> None:
        self.cc = find_compiler()
        if self.cc is None:
            raise CompileError("no C compiler found: install clang (apt-get install clang), or run with "
                               "DEV=INTERP for interpreted execution")
        self.version = self._version()
        self.memory: dict[str, str] = {}

    def _version(self) -> str:
        try:
            out = subprocess.run([self.cc, "--version"], capture_output=True, text=True, timeout=30)
            return out.stdout.splitlines()[0] if out.stdout else "unknown"
        except (OSError, subprocess.SubprocessError):
            return "unknown"

    def key(self, src: str) -> str:
        h = hashlib.sha256()
        for part in (src, self.cc, self.version, " ".join(FLAGS), ENTRY_FORMAT):
            h.update(part.encode())
            h.update(b"\0")
        return h.hexdigest()[:40]

    def compile(self, src: str) -> str:
        """Return the path of a validated shared object built from `src` (cached)."""
        key = self.key(src)
        hit = self.memory.get(key)
        if hit is not None and valid_entry(hit):  # checked again: the file may have changed since
            return hit
        root = cache_root()
        path = os.path.join(root, f"{key}.so")
        if not valid_entry(path):  # missing, or corrupt and just discarded
            for attempt in range(2):
                try:
                    self._build(src, root, path)
                    break
                except FileNotFoundError:  # our temporary file was removed under us (a cleaner elsewhere)
                    if attempt:
                        raise
        self.memory[key] = path
        return path

    def _build(self, src: str, root: str, path: str) -> None:
        tmp = temp_path(root, os.path.basename(path), ".so")
        try:
            proc = subprocess.run([self.cc, *FLAGS[:-1], "-x", "c", "-", "-o", tmp, FLAGS[-1]], input=src,
                                  capture_output=True, text=True, timeout=300, preexec_fn=_die_with_parent())
            if proc.returncode != 0:
                raise CompileError(f"{os.path.basename(self.cc)} failed to compile a kernel:\n{proc.stderr}\n"
                                   f"--- source\n{src}")
            write_entry(path, tmp=tmp)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
