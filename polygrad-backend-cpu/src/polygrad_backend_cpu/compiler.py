"""Compile C source to a shared object with clang (gcc, then cc, as fallbacks).

Results are cached in memory and on disk under POLY_CACHE_DIR/cpu, keyed by source, compiler and
flags. Files are written to a temporary name and renamed into place, so several processes can share
the cache: the worst case is that two of them compile the same kernel once each.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile

from polygrad.backend_api import CompileError

FLAGS = ("-O3", "-march=native", "-shared", "-fPIC", "-fno-math-errno", "-ffp-contract=off", "-lm")


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
    base = os.environ.get("POLY_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "polygrad")
    return os.path.join(base, "cpu")


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

    def key(self, src: str, extra: tuple[str, ...] = ()) -> str:
        h = hashlib.sha256()
        for part in (src, self.cc, self.version, " ".join(FLAGS + extra)):
            h.update(part.encode())
            h.update(b"\0")
        return h.hexdigest()[:40]

    def compile(self, src: str, extra: tuple[str, ...] = ()) -> str:
        """Return the path of a shared object built from `src` (cached); `extra` adds compiler flags."""
        key = self.key(src, extra)
        hit = self.memory.get(key)
        if hit is not None and os.path.exists(hit):
            return hit
        root = cache_root()
        path = os.path.join(root, f"{key}.so")
        if not os.path.exists(path):
            os.makedirs(root, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=f"{key}.", suffix=".tmp.so", dir=root)
            os.close(fd)
            try:
                proc = subprocess.run([self.cc, *FLAGS[:-1], *extra, "-x", "c", "-", "-o", tmp, FLAGS[-1]], input=src,
                                      capture_output=True, text=True, timeout=300)
                if proc.returncode != 0:
                    raise CompileError(f"{os.path.basename(self.cc)} failed to compile a kernel:\n{proc.stderr}\n"
                                       f"--- source\n{src}")
                os.replace(tmp, path)
            finally:
                if os.path.exists(tmp):
                    os.unlink(tmp)
        self.memory[key] = path
        return path
