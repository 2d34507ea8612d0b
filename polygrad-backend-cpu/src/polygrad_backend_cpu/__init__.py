"""polygrad's CPU backend: C source from the shared C-family renderer, compiled by clang (gcc/cc fallback),
loaded through cffi, and launched once per THREAD index across cores."""
from __future__ import annotations

import os

from polygrad.backend_api import (BackendSpec, Capabilities, DeviceImpl, HostAllocator, ProbeResult, Setting, hookimpl,
                                  process_setting, register_setting)

__version__ = "0.1.0"
# declared when the package is imported, before any of its code reads it; read with backend_api.setting("POLY_CC")
register_setting(Setting("POLY_CC", str, "", "the C compiler to use instead of clang, gcc or cc (a name on PATH "
                         "or a path)", live=True, owner="polygrad-backend-cpu"))


def probe() -> ProbeResult:
    # imported when probed or opened, not when the entry point registers the backend (registration stays cheap)
    from polygrad_backend_cpu.compiler import find_compiler
    cc = find_compiler()
    if cc is None:
        return ProbeResult(False, "no C compiler found (clang, gcc or cc on PATH); install clang "
                                  "(apt-get install clang), or use DEV=INTERP for interpreted execution")
    return ProbeResult(True, f"compiler {cc}")


def open_cpu(ordinal: int) -> DeviceImpl:
    # imported when probed or opened, not when the entry point registers the backend (registration stays cheap)
    from polygrad_backend_cpu.compiler import ClangCompiler
    from polygrad_backend_cpu.renderer import CPURenderer
    from polygrad_backend_cpu.runtime import load_program
    compiler = ClangCompiler()
    renderer = CPURenderer(stream_bytes=last_level_cache_bytes())
    threads = process_setting("POLY_THREADS")  # kernels are split this many ways; a Context may use fewer
    lanes, registers, fma = vector_caps()
    return DeviceImpl(name="CPU", allocator=HostAllocator(), render=renderer.render, compile=compiler.compile,
                      load=load_program, compile_many=compiler.compile_many, render_cacheable=True,
                      capabilities=Capabilities(threads=threads, vector_width=lanes, registers=registers, fma=fma,
                                                stage_bytes=STAGE_BYTES,
                                                tile_vectors=tile_vectors(compiler.version, registers)))


STAGE_BYTES = 512 * 1024  # staged panels live on the launch's stack (8 MB for the main thread and the pool)


def tile_vectors(compiler_version: str, registers: int) -> int:
    """Vectors per register-tile row: 4 with clang and 32 vector registers (a 4 x 64 AVX-512 tile ran
    7-11% faster than 8 x 32 on matmuls 512-2048 and 1.2-1.8x on a transformer block's, measured on
    Zen 4), else 2: gcc 12 folds a 4-vector row's B loads into every multiply-add and loads A's scalars
    64 bytes wide, which made that tile 35% slower than 8 x 32 there."""
    return 4 if "clang" in compiler_version.lower() and registers >= 32 else 2


def last_level_cache_bytes(default: int = 16 << 20) -> int:
    """The largest CPU cache (Linux sysfs; `default` elsewhere): outputs at least this big are written with
    non-temporal stores (renderer.CPURenderer.stream_slots)."""
    root = "/sys/devices/system/cpu/cpu0/cache"
    best = 0
    try:
        for entry in os.listdir(root):
            try:
                with open(os.path.join(root, entry, "size")) as f:
                    text = f.read().strip().upper()
            except OSError:
                continue
            scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
            digits = text.rstrip("KMG")
            if digits.isdigit():
                best = max(best, int(digits) * scale)
    except OSError:
        pass
    return best or default


def vector_caps() -> tuple[int, int, bool]:
    """(float32 lanes, vector registers, fused multiply-add) of this CPU, as -march=native compiles for it."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line.split(":", 1)[1].split() for line in f if line.startswith(("flags", "Features"))), [])
    except OSError:
        flags = []
    fma = "fma" in flags or "asimd" in flags  # x86 FMA3; every ARMv8 NEON unit fuses (vfma)
    if "avx512f" in flags:
        return 16, 32, fma
    if "avx2" in flags or "avx" in flags:
        return 8, 16, fma
    return 4, 16, fma  # SSE2 (every x86-64) or NEON/ASIMD


@hookimpl
def polygrad_register_backends() -> list[BackendSpec]:
    return [BackendSpec(name="CPU", probe=probe, open=open_cpu, priority=100, aliases=("CLANG", "C"),
                        package="polygrad-backend-cpu", version=__version__, pip_name="polygrad-backend-cpu")]
