"""Files written whole or not at all, for `Model.save(path)`.

Stage: export. Input: a path and the file's bytes. Output: the file at that path, replaced in one
step: the bytes go to `<path>.tmp<pid>` next to it, are flushed to disk (fsync), and the temporary
file is renamed over the target (`os.replace`), after which the folder is flushed too so the rename
survives a crash. A reader sees the old file or the new one, never a part.

A writer killed before the rename leaves its `<path>.tmp<pid>`. The next save to the same path
removes such files of processes that no longer run (and only those: a concurrent writer's temporary
file is kept, as is any name that does not match the pattern exactly).

>>> import os, tempfile
>>> folder = tempfile.mkdtemp()
>>> write_file(os.path.join(folder, "a.bin"), b"new")
>>> os.listdir(folder)
['a.bin']
"""
from __future__ import annotations

import os
import re
from typing import Any, BinaryIO, Callable

from polygrad.diskcache import pid_alive

__all__ = ["remove_stale_temporaries", "temporary_path", "write_file"]


def temporary_path(path: str | os.PathLike) -> str:
    """Where this process writes `path`'s bytes before the rename."""
    return f"{os.fspath(path)}.tmp{os.getpid()}"


def remove_stale_temporaries(path: str | os.PathLike) -> list[str]:
    """Remove `<path>.tmp<pid>` files whose writer no longer runs; returns the removed paths."""
    folder, name = os.path.split(os.fspath(path))
    pattern = re.compile(re.escape(name) + r"\.tmp([0-9]{1,10})")
    removed = []
    try:
        entries = list(os.scandir(folder or "."))
    except OSError:
        return removed  # the save itself will report a missing or unreadable folder
    for entry in entries:
        m = pattern.fullmatch(entry.name)
        if m is None or pid_alive(int(m.group(1))):
            continue
        try:
            if entry.is_file(follow_symlinks=False):
                os.unlink(entry.path)
                removed.append(entry.path)
        except OSError:
            continue  # removed by another process meanwhile, or not ours to remove
    return removed


def write_file(path: str | os.PathLike, data: bytes | Callable[[BinaryIO], Any]) -> None:
    """Replace the file at `path` with `data` atomically and durably (see the module docstring); `data` may
    be a function that writes the bytes into the file object it is given (a file too big to hold whole)."""
    remove_stale_temporaries(path)
    tmp = temporary_path(path)
    try:
        with open(tmp, "wb") as f:
            if callable(data):
                data(f)
            else:
                f.write(data)
            f.flush()
            os.fsync(f.fileno())  # the bytes are on disk before a name points at them
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass  # never created (a missing folder), or already gone
        raise
    _sync_folder(os.path.dirname(os.fspath(path)) or ".")


def _sync_folder(folder: str) -> None:
    """Flush the folder's entries (the rename) to disk where the platform allows opening a folder."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return  # Windows cannot open a folder; the rename is as durable as the OS makes it
    try:
        os.fsync(fd)
    except OSError:
        pass  # some file systems refuse fsync on a folder
    finally:
        os.close(fd)
