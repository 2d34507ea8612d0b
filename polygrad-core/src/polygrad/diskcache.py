"""The on-disk cache's folders and entries, shared by backends (compiled programs) and BEAM (choices).

Stage: runtime support. Input: a cache subfolder name and entry bytes. Output: validated files under
POLY_CACHE_DIR that several processes may share.

- `cache_dir(*parts)`: POLY_CACHE_DIR/parts, created. A POLY_CACHE_DIR that cannot be used (a file, a
  read-only folder, a path that cannot be created) falls back to one temporary folder per process,
  with a warning, so a bad setting costs recompiles but never an error. A folder is probed (created,
  a file written and removed) once per process; later calls only check that it is still a writable
  folder (two system calls), since every cache lookup asks for its folder.
- `write_entry(path, data)`: the bytes followed by a trailer (magic, length, sha256), written to a
  temporary file in the same folder and renamed into place (`os.replace`): readers never see a
  partial entry, and two writers of one entry both succeed. The trailer leaves the payload usable as
  it is (a shared object loads with trailing bytes after its sections).
- `read_entry(path)` / `valid_entry(path)`: an entry is used only if its length and checksum match
  the trailer. A truncated, empty, garbage or foreign file is removed with a warning and reported as
  missing, so the caller rebuilds it. (A shared object truncated by a crash made dlopen die with
  SIGBUS; loading only validated entries rules that out.) The full check reads and hashes the whole
  file, so it runs once per process per file version: a file that passed it (or that this process
  wrote) is remembered with its identity (inode, size, modification and change times, nanoseconds),
  and `valid_entry` of the same file again costs one `stat`. Any rewrite, truncation or replacement
  changes that identity and brings the full check back.
- Temporary files carry their writer's pid (`<name>.<pid>.<random>.tmp<suffix>`); `clean_stale`
  removes those whose writer is gone (a process killed mid-compile), once per folder per process,
  when the process first writes there (`temp_path`): a process that only reads a warm cache never
  lists the folder.
"""
from __future__ import annotations

import atexit
import hashlib
import os
import re
import shutil
import struct
import tempfile
import time
import warnings
from typing import Callable

from polygrad import config

TRAILER = struct.Struct("<8sQ32s")  # magic, payload length, sha256 of the payload
MAGIC = b"pgcache1"
STALE_AGE_S = 24 * 3600  # a temporary file this old is removed whoever wrote it (pids get reused)


class CacheWarning(UserWarning):
    """The on-disk cache could not be used as configured; polygrad carried on without it."""


_fallback: dict[str, str] = {}  # configured root -> the temporary folder used instead
_cleaned: set[str] = set()
_probed: set[str] = set()  # folders found usable by the full probe in this process
# path -> identity (os.stat fields) of the file version that passed the full check in this process
_verified: dict[str, tuple[int, int, int, int]] = {}
_TMP_NAME = re.compile(r"\.(\d+)\.[^.]*\.tmp")


def cache_dir(*parts: str) -> str:
    """POLY_CACHE_DIR/parts..., created and writable; a temporary folder (with a warning) when not."""
    root = config.cache_dir()
    path = os.path.join(_fallback.get(root, root), *parts)
    if path in _probed and os.path.isdir(path) and os.access(path, os.W_OK | os.X_OK):
        return path  # probed before; still a writable folder
    if _usable(path):
        _probed.add(path)
        return path
    if root not in _fallback:
        _fallback[root] = tempfile.mkdtemp(prefix="polygrad-cache-")
        atexit.register(shutil.rmtree, _fallback[root], True)
        warnings.warn(f"POLY_CACHE_DIR {root!r} cannot be used (not a writable folder); compiled kernels are "
                      f"cached in {_fallback[root]} for this process only. Point POLY_CACHE_DIR at a writable "
                      "folder to keep them.", CacheWarning, stacklevel=3)
    path = os.path.join(_fallback[root], *parts)
    os.makedirs(path, exist_ok=True)
    return path


def _usable(path: str) -> bool:
    try:
        os.makedirs(path, exist_ok=True)
    except OSError:
        return False
    if not os.path.isdir(path) or not os.access(path, os.W_OK | os.X_OK):
        return False
    try:  # os.access trusts mode bits; an immutable or read-only-mounted folder still refuses
        fd, probe = tempfile.mkstemp(dir=path, prefix=f".probe.{os.getpid()}.", suffix=".tmp")
        os.close(fd)
        os.unlink(probe)
    except OSError:
        return False
    return True


def temp_path(folder: str, name: str, suffix: str = "") -> str:
    """A new, empty temporary file in `folder` for entry `name`, marked with this process's pid (the
    first one in a folder removes what dead writers left there)."""
    clean_stale(folder)
    fd, tmp = tempfile.mkstemp(prefix=f"{name}.{os.getpid()}.", suffix=f".tmp{suffix}", dir=folder)
    os.close(fd)
    return tmp


def write_entry(path: str, data: bytes | None = None, tmp: str | None = None) -> None:
    """Store `data` (or the file `tmp` a tool wrote, which is consumed) at `path` with its trailer."""
    folder, name = os.path.split(path)
    if tmp is None:
        tmp = temp_path(folder, name)
        with open(tmp, "wb") as f:
            f.write(data or b"")
    try:
        with open(tmp, "rb+") as f:
            payload = f.read()
            f.seek(0, os.SEEK_END)
            f.write(TRAILER.pack(MAGIC, len(payload), hashlib.sha256(payload).digest()))
        os.replace(tmp, path)
        _remember(path)  # written whole by this process: no need to read it back
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def read_entry(path: str) -> bytes | None:
    """The payload of a valid entry; None when there is none (a corrupt one is removed, with a warning)."""
    try:
        with open(path, "rb") as f:
            blob = f.read()
            st = os.fstat(f.fileno())
    except FileNotFoundError:
        return None
    except OSError as e:  # a folder or an unreadable file in the entry's place
        _verified.pop(path, None)
        _discard(path, f"it cannot be read ({e.strerror})")
        return None
    problem = _check(blob)
    if problem:
        _verified.pop(path, None)
        _discard(path, problem)
        return None
    _verified[path] = _identity(st)
    return blob[:-TRAILER.size]


def valid_entry(path: str) -> bool:
    """Whether `path` holds a valid entry (its payload is then safe to hand to a loader). The full check
    runs once per process per file version; the same file again costs one stat."""
    known = _verified.get(path)
    if known is not None:
        try:
            if _identity(os.stat(path)) == known:
                return True
        except OSError:
            pass
        del _verified[path]
    return read_entry(path) is not None


def forget_checks() -> None:
    """Forget which files passed the full check (polygrad.collect()): each is read and hashed again at
    its next use."""
    _verified.clear()


def _identity(st: os.stat_result) -> tuple[int, int, int, int]:
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _remember(path: str) -> None:
    try:
        _verified[path] = _identity(os.stat(path))
    except OSError:
        _verified.pop(path, None)


def _check(blob: bytes) -> str | None:
    if len(blob) < TRAILER.size:
        return f"it is truncated ({len(blob)} bytes)"
    magic, length, digest = TRAILER.unpack(blob[-TRAILER.size:])
    if magic != MAGIC:
        return "it was not written by polygrad (no checksum trailer)"
    if length != len(blob) - TRAILER.size:
        return f"its length is {len(blob) - TRAILER.size} bytes, {length} were written"
    if hashlib.sha256(blob[:-TRAILER.size]).digest() != digest:
        return "its checksum does not match"
    return None


def _discard(path: str, problem: str) -> None:
    warnings.warn(f"discarding cache entry {path}: {problem}; it will be rebuilt", CacheWarning, stacklevel=4)
    try:
        if os.path.isdir(path) and not os.path.islink(path):
            os.rmdir(path)
        else:
            os.unlink(path)
    except OSError:
        pass  # another process replaced or removed it already, or the folder is read-only


def clean_stale(folder: str, alive: Callable[[int], bool] | None = None) -> list[str]:
    """Remove temporary files left by writers that died (once per folder per process); returns them."""
    if folder in _cleaned:
        return []
    _cleaned.add(folder)
    alive = alive or pid_alive
    removed = []
    try:
        names = os.listdir(folder)
    except OSError:
        return removed
    now = time.time()
    for name in names:
        if ".tmp" not in name:
            continue
        path = os.path.join(folder, name)
        m = _TMP_NAME.search(name)
        try:
            old = now - os.stat(path).st_mtime > STALE_AGE_S
            if old or (m is not None and not alive(int(m.group(1)))):
                os.unlink(path)
                removed.append(path)
        except OSError:
            continue  # removed by someone else meanwhile
    return removed


def pid_alive(pid: int) -> bool:
    """Whether process `pid` may still run (a temporary file it marked may be in use). Only a POSIX
    `kill(pid, 0)` can say no: elsewhere (Windows, where signal 0 is CTRL_C_EVENT) every pid counts as
    alive. A number no process can have is dead."""
    if not 0 < pid < 2**31:
        return False
    if pid == os.getpid() or os.name != "posix":
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # exists, owned by someone else
    return True
