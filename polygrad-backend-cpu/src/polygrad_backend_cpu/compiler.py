"""Compile C source to a shared object with clang (gcc, then cc, as fallbacks).

Results are cached in memory and on disk under POLY_CACHE_DIR/cpu, keyed by source, compiler and
flags. The disk side is polygrad's shared entry format (`backend_api.write_entry`): the compiler
writes a temporary file carrying this process's pid, a length and checksum trailer is appended and the
file is renamed into place, so several processes can share the folder (the worst case is that two
of them compile the same kernel once each). An entry is loaded only after its trailer checks out: a
truncated, empty, garbage or foreign file is discarded with a warning and compiled again. The
compiler runs with a parent-death signal, so killing the Python process mid-compile kills it too;
the temporary file it leaves is removed by the next process that opens the folder.

The compiler process dominates a first call, so it runs as few times as possible: the driver only
compiles (`-c`; `ld -shared` links, without a second driver), and `compile_many` builds a schedule's new
kernels in a few translation units, one per compile job (POLY_COMPILE_JOBS, default the usable cores),
run side by side and balanced by compile cost (source length plus KERNEL_CHARS a kernel; a unit gets at
least UNIT_MIN_CHARS of it, so a small batch stays one process). Every rendered kernel defines the same function,
`pg_kernel` (the renderer's own name: no kernel or Variable name reaches the source), and its own copies
of the renderer's `static` helpers (`pg_fma_f32x16`, the half conversions...); in a unit each of these
names is renamed `<name>_<key16>` (`symbol_names` gives the kernel's names to look up), so the kernels'
definitions cannot clash, and the unit's shared object is linked under each kernel's key. Kernels whose
sources are equal share one entry, whatever their names.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import hashlib
import os
import re
import shutil
import signal
import subprocess
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

from polygrad.backend_api import (KERNEL_SYMBOL, CompileError, cache_dir, read_entry, setting, temp_path,
                                  valid_entry, write_entry)

FLAGS = ("-O3", "-march=native", "-shared", "-fPIC", "-fno-math-errno", "-ffp-contract=off", "-lm")
PR_SET_PDEATHSIG = 1
# in the key, so files of an older layout (no checksum trailer) are never looked up, rather than each
# one being discarded with a warning after an upgrade
ENTRY_FORMAT = "entry-v2"
# the least source a translation unit of a split batch gets: about 0.1 s of clang -O3 on a Zen 4 core,
# more than a compiler and linker process's start (~0.06 s of CPU), so small batches stay one unit
UNIT_MIN_CHARS = 16_000
# what a kernel costs clang beyond its source's length, in characters of source: about 0.04 s of clang -O3
# on a Zen 4 core (GPT-2's 27 prompt kernels: the 168,000-character matmul took 0.73 s alone, the other 26,
# 166,000 characters, 1.70 s), so a unit of many small kernels is not balanced against one long kernel by
# length alone (the two units were 0.73 and 1.70 s, where about 1.2 s each is possible)
KERNEL_CHARS = 9_000


def find_compiler() -> str | None:
    forced = setting("POLY_CC")
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


_versions: dict[tuple, str] = {}  # compiler identity -> its `--version` line, for this process


def compiler_version(cc: str) -> str:
    """The first line of `cc --version` (part of every program's key). Running the compiler costs tens
    of milliseconds, so the answer is kept per compiler file (its resolved path, inode, size and
    modification time), in memory and under POLY_CACHE_DIR/compilers: installing another compiler at
    that path changes the file and asks again."""
    try:
        real = os.path.realpath(cc)
        st = os.stat(real)
        ident: tuple = (real, st.st_ino, st.st_size, st.st_mtime_ns)
    except OSError:
        ident = (cc,)
    hit = _versions.get(ident)
    if hit is not None:
        return hit
    path = None
    if len(ident) > 1:
        name = hashlib.sha256(repr(ident).encode()).hexdigest()[:32]
        path = os.path.join(cache_dir("compilers"), name)
        stored = read_entry(path)
        if stored is not None:
            hit = _versions[ident] = stored.decode(errors="replace")
            return hit
    try:
        out = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30)
        version = out.stdout.splitlines()[0] if out.stdout else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"  # not remembered: a compiler that failed once is asked again
    _versions[ident] = version
    if path is not None:
        try:
            write_entry(path, version.encode())
        except OSError:
            pass  # a read-only cache only costs the question next time
    return version


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
        return compiler_version(self.cc)  # type: ignore[arg-type]

    def key(self, src: str, extra: tuple[str, ...] = ()) -> str:
        h = hashlib.sha256()
        for part in (src, self.cc, self.version, " ".join(FLAGS + extra), ENTRY_FORMAT):
            h.update(part.encode())
            h.update(b"\0")
        return h.hexdigest()[:40]

    def cached(self, key: str) -> str | None:
        """The shared object for a key, when memory or disk has it."""
        hit = self.memory.get(key)
        if hit is not None and valid_entry(hit):  # checked again: the file may have changed since
            return hit
        path = os.path.join(cache_root(), f"{key}.so")
        if valid_entry(path):  # missing, or corrupt and just discarded (with a warning)
            self.memory[key] = path
            return path
        return None

    def compile(self, src: str, extra: tuple[str, ...] = ()) -> str:
        """Return the path of a shared object built from `src` (cached); `extra` adds compiler flags."""
        return self.compile_many([src], extra)[0]

    def compile_many(self, srcs: list[str], extra: tuple[str, ...] = ()) -> list[str]:
        """Paths of shared objects built from `srcs` (cached); the new ones are compiled together, in one
        translation unit per compile job, the units side by side."""
        keys = [self.key(src, extra) for src in srcs]
        todo: dict[str, str] = {}
        for key, src in zip(keys, srcs):
            if self.cached(key) is None:
                todo.setdefault(key, src)
        if todo:
            names = {k: _local_names(src) for k, src in todo.items()}
            alone = [{k: src} for k, src in todo.items() if names[k] is None]  # the renaming cannot handle it
            together = {k: src for k, src in todo.items() if names[k] is not None}
            jobs = compile_jobs()
            units = alone + balanced_units(together, jobs)
            run_side_by_side([lambda unit=unit: self._build(unit, names, extra) for unit in units], jobs)
        for key, src in zip(keys, srcs):
            if key not in self.memory:  # our temporary file was removed under us (a cleaner elsewhere)
                self._build({key: src}, {}, extra)
        return [self.memory[key] for key in keys]

    def _build(self, srcs: dict[str, str], names: dict[str, tuple[str, ...] | None],
               extra: tuple[str, ...] = ()) -> None:
        """Compile srcs (key -> source) in one translation unit and link it under every key."""
        root = cache_root()
        unit = "".join(_renamed(src, key, names.get(key)) for key, src in srcs.items())
        first = next(iter(srcs))
        tmp = temp_path(root, f"{first}.so", ".so")
        obj = tmp[:-len(".so")] + ".o"
        try:
            flags = [f for f in FLAGS[:-1] if f != "-shared"]
            proc = subprocess.run([self.cc, *flags, *extra, "-c", "-x", "c", "-", "-o", obj], input=unit,
                                  capture_output=True, text=True, timeout=300, preexec_fn=_die_with_parent())
            if proc.returncode != 0:
                if len(srcs) > 1:  # find the kernel at fault: each on its own
                    for key, src in srcs.items():
                        self._build({key: src}, names, extra)
                    return
                raise CompileError(f"{os.path.basename(self.cc)} failed to compile a kernel:\n{proc.stderr}\n"
                                   f"--- source\n{unit}")
            self._link(obj, tmp)
            keys = list(srcs)
            path0 = os.path.join(root, f"{keys[0]}.so")
            write_entry(path0, tmp=tmp)  # the checksum trailer, then renamed into place
            self.memory[keys[0]] = path0
            for key in keys[1:]:
                path = os.path.join(root, f"{key}.so")
                _publish(path0, path)
                self.memory[key] = path
        except FileNotFoundError:
            return  # a cleaner elsewhere removed our temporary file: compile_many builds the rest alone
        finally:
            for leftover in (tmp, obj):
                if os.path.exists(leftover):
                    os.unlink(leftover)

    def _link(self, obj: str, out: str) -> None:
        """`ld -shared` (no second compiler driver); the driver links when ld is missing or fails."""
        ld = _linker()
        if ld is not None:
            proc = subprocess.run([ld, "-shared", "-o", out, obj, "-lm"], capture_output=True, text=True, timeout=300,
                                  preexec_fn=_die_with_parent())
            if proc.returncode == 0:
                return
        proc = subprocess.run([self.cc, "-shared", "-o", out, obj, FLAGS[-1]], capture_output=True, text=True,
                              timeout=300, preexec_fn=_die_with_parent())
        if proc.returncode != 0:
            raise CompileError(f"{os.path.basename(self.cc)} failed to link a kernel:\n{proc.stderr}")


_KERNEL_DEF = re.compile(r"^void ([A-Za-z_][A-Za-z0-9_]*)\(", re.M)
# a file-scope `static` function of the prelude (the renderer's helpers): its name is the first
# identifier followed by a parenthesis
_STATIC_DEF = re.compile(r"^static\s[^;{=(]*?\b([A-Za-z_][A-Za-z0-9_]*)\s*\(", re.M)


def _kernel_name(src: str) -> str | None:
    """The one kernel function a rendered source defines (besides its `<name>_task` trampoline), or
    None (then it is compiled unrenamed)."""
    found = _KERNEL_DEF.findall(src)
    if len(found) == 2 and found[1] == found[0] + "_task":
        return found[0]
    return found[0] if len(found) == 1 else None


def _local_names(src: str) -> tuple[str, ...] | None:
    """The names a rendered source defines at file scope: its kernel first, then its static helpers;
    None when it has no single kernel (then it is compiled alone, unrenamed)."""
    kernel = _kernel_name(src)
    if kernel is None:
        return None
    return (kernel, *dict.fromkeys(_STATIC_DEF.findall(src)))


def _renamed(src: str, key: str, names: tuple[str, ...] | None) -> str:
    """`src` for a translation unit shared with other kernels: each name it defines is renamed
    `<name>_<key16>` for its text (the trampoline `<kernel>_<key16>_task`), so two kernels' `pg_kernel`
    or their copies of one helper are different functions."""
    if not names:
        return src
    kernel, tag = names[0], key[:16]
    renames = {name: f"{name}_{tag}" for name in names}
    if f"void {kernel}_task(" in src:
        renames[f"{kernel}_task"] = f"{kernel}_{tag}_task"
    defines = "".join(f"#define {name} {new}\n" for name, new in renames.items())
    undefines = "".join(f"#undef {name}\n" for name in renames)
    return f"{defines}{src}\n{undefines}"


def compile_jobs() -> int:
    """How many translation units a batch of new kernels is split into (POLY_COMPILE_JOBS; 0: one per core
    this process may run on)."""
    jobs = setting("POLY_COMPILE_JOBS")
    if jobs > 0:
        return jobs
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


def balanced_units(srcs: dict[str, str], jobs: int) -> list[dict[str, str]]:
    """`srcs` (key -> source) in at most `jobs` groups of about equal compile cost (a kernel's source length
    plus KERNEL_CHARS), each of at least UNIT_MIN_CHARS of it where there is more than one (costliest first,
    each into the lightest group so far), in their first order within a group."""
    if not srcs:
        return []
    cost = {k: len(src) + KERNEL_CHARS for k, src in srcs.items()}
    total = sum(cost.values())
    count = max(1, min(jobs, len(srcs), total // UNIT_MIN_CHARS if UNIT_MIN_CHARS else len(srcs)))
    groups: list[list[str]] = [[] for _ in range(count)]
    sizes = [0] * len(groups)
    for key in sorted(srcs, key=lambda k: -cost[k]):
        lightest = sizes.index(min(sizes))
        groups[lightest].append(key)
        sizes[lightest] += cost[key]
    order = {k: i for i, k in enumerate(srcs)}
    return [{k: srcs[k] for k in sorted(group, key=order.__getitem__)} for group in groups]


def run_side_by_side(calls: list[Callable[[], None]], jobs: int) -> None:
    """Run the calls, at most `jobs` at a time on threads of their own (each waits on a compiler process;
    the thread pool library is built the same way); the first exception raised is raised again once all
    have ended."""
    if jobs <= 1 or len(calls) <= 1:
        for call in calls:
            call()
        return
    with ThreadPoolExecutor(max_workers=min(jobs, len(calls)), thread_name_prefix="polygrad-cc") as pool:
        futures = [pool.submit(call) for call in calls]
    errors = [f.exception() for f in futures if f.exception() is not None]
    if errors:
        raise errors[0]  # type: ignore[misc]


def symbol_names(path: str) -> tuple[str, str]:
    """The symbols to try for the kernel in the shared object at `path`: renamed (compiled with others
    by compile_many), then as rendered."""
    key = os.path.basename(path)[:-len(".so")]
    return f"{KERNEL_SYMBOL}_{key[:16]}", KERNEL_SYMBOL


_ld: list[str | None] = []


def _linker() -> str | None:
    if not _ld:
        _ld.append(shutil.which("ld"))
    return _ld[0]


def _publish(tmp: str, path: str) -> None:
    """Put the finished file `tmp` at `path` atomically (a hard link, or a copy renamed into place);
    a file another process already put there is as good."""
    if valid_entry(path):
        return
    try:
        os.link(tmp, path)
        return
    except FileExistsError:
        return
    except OSError:
        pass
    tmp2 = temp_path(os.path.dirname(path), os.path.basename(path), ".so")
    try:
        shutil.copyfile(tmp, tmp2)
        os.replace(tmp2, path)
    finally:
        if os.path.exists(tmp2):
            os.unlink(tmp2)
