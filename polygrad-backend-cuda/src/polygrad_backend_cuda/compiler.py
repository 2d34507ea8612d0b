"""Compile CUDA C to a cubin with NVRTC (or nvcc, for the compile-only check), cached on disk.

Stage: compiling. Input: CUDA C source from the renderer and a target architecture ("sm_90").
Output: cubin bytes for cuModuleLoadData. A cubin for the exact architecture, not PTX: the driver
then never JIT-compiles, so an NVRTC newer than the driver's PTX support still loads.
Results are cached in memory and under POLY_CACHE_DIR/cuda/<key>.cubin, keyed by source, NVRTC
version, architecture and options, as checked entries of polygrad.diskcache (written to a temporary
name and renamed into place; a damaged file is discarded and compiled again).
"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile

from polygrad.backend_api import CompileError, cache_dir, read_entry, write_entry

from polygrad_backend_cuda import libs

OPTIONS = ("--std=c++17", "-default-device", "--fmad=false", "-diag-suppress=177,550")


# in the key, so cubins of the older layout (no checksum trailer) are never looked up, rather than each
# one being discarded with a warning after an upgrade
ENTRY_FORMAT = "entry-v2"


def cache_root() -> str:
    """POLY_CACHE_DIR/cuda (or the temporary folder used instead when that cannot be written)."""
    return cache_dir("cuda")


def nvrtc_version() -> tuple[int, int]:
    lib = libs.nvrtc()
    major, minor = libs.ffi.new("int *"), libs.ffi.new("int *")
    lib.nvrtcVersion(major, minor)
    return int(major[0]), int(minor[0])


def compile_arch(src: str, arch: str) -> str:
    """The target a source compiles for: sm_90a (Hopper's architecture-specific features) for a kernel
    holding wgmma instructions on sm_90, else `arch` (a sm_90a cubin loads only on compute capability 9.0)."""
    return arch + "a" if arch == "sm_90" and "wgmma." in src else arch


def nvrtc_compile(src: str, arch: str, name: str = "kernel.cu", ptx: bool = False) -> bytes:
    """Compile with NVRTC for `arch` ("sm_90"); cubin bytes (PTX text with ptx=True). CompileError on failure."""
    lib, ffi = libs.nvrtc(), libs.ffi
    arch = compile_arch(src, arch)
    prog = ffi.new("nvrtcProgram *")
    status = lib.nvrtcCreateProgram(prog, src.encode(), name.encode(), 0, ffi.NULL, ffi.NULL)
    if status != 0:
        raise CompileError(f"nvrtcCreateProgram failed: {ffi.string(lib.nvrtcGetErrorString(status)).decode()}")
    try:
        target = arch.replace("sm_", "compute_") if ptx else arch
        opts = [ffi.new("char[]", o.encode()) for o in (f"--gpu-architecture={target}", *OPTIONS)]
        status = lib.nvrtcCompileProgram(prog[0], len(opts), ffi.new("char *[]", opts))
        size = ffi.new("size_t *")
        lib.nvrtcGetProgramLogSize(prog[0], size)
        log = ffi.new("char[]", max(size[0], 1))
        lib.nvrtcGetProgramLog(prog[0], log)
        if status != 0:
            text = ffi.string(log).decode(errors="replace")
            raise CompileError(f"NVRTC failed to compile a kernel for {arch}:\n{text}\n--- source\n{src}")
        get_size, get = (lib.nvrtcGetPTXSize, lib.nvrtcGetPTX) if ptx else (lib.nvrtcGetCUBINSize, lib.nvrtcGetCUBIN)
        get_size(prog[0], size)
        out = ffi.new("char[]", size[0])
        get(prog[0], out)
        return bytes(ffi.buffer(out, size[0]))
    finally:
        lib.nvrtcDestroyProgram(prog)


def nvcc_compile(src: str, arch: str) -> bytes:
    """Compile with nvcc (when NVRTC is missing but a toolkit is installed): cubin bytes."""
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        raise CompileError("neither libnvrtc nor nvcc found: pip install nvidia-cuda-nvrtc-cu12")
    arch = compile_arch(src, arch)
    with tempfile.TemporaryDirectory() as tmp:
        path, out = os.path.join(tmp, "kernel.cu"), os.path.join(tmp, "kernel.cubin")
        with open(path, "w") as f:
            f.write(src)
        flags = ["-cubin", f"-arch={arch}", "-std=c++17", "--fmad=false", "-diag-suppress=177,550", "-o", out, path]
        proc = subprocess.run([nvcc, *flags], capture_output=True, text=True, timeout=300)
        if proc.returncode != 0:
            raise CompileError(f"nvcc failed to compile a kernel for {arch}:\n{proc.stderr}\n--- source\n{src}")
        with open(out, "rb") as f:
            return f.read()


class NVRTCCompiler:
    """compile(source) -> cubin bytes for one architecture, cached in memory and on disk."""

    def __init__(self, arch: str):
        self.arch = arch
        self.version = ".".join(map(str, nvrtc_version()))
        self.memory: dict[str, bytes] = {}

    def key(self, src: str) -> str:
        h = hashlib.sha256()
        for part in (src, "nvrtc", self.version, self.arch, " ".join(OPTIONS), ENTRY_FORMAT):
            h.update(part.encode())
            h.update(b"\0")
        return h.hexdigest()[:40]

    def compile(self, src: str) -> bytes:
        key = self.key(src)
        hit = self.memory.get(key)
        if hit is not None:
            return hit
        path = os.path.join(cache_root(), f"{key}.cubin")
        binary = read_entry(path)  # a checked entry: a damaged file is discarded with a warning
        if binary is None:
            binary = nvrtc_compile(src, self.arch)
            try:
                write_entry(path, binary)
            except OSError:
                pass  # a read-only cache only costs a compile next time
        self.memory[key] = binary
        return binary
