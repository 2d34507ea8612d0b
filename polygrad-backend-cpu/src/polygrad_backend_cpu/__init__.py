"""polygrad's CPU backend: C source from the shared C-family renderer, compiled by clang (gcc/cc fallback),
loaded through cffi, and launched once per THREAD index across cores."""
from __future__ import annotations

import os

from polygrad.backend_api import BackendSpec, Capabilities, DeviceImpl, HostAllocator, ProbeResult, hookimpl

__version__ = "0.1.0"


def probe() -> ProbeResult:
    from polygrad_backend_cpu.compiler import find_compiler
    cc = find_compiler()
    if cc is None:
        return ProbeResult(False, "no C compiler found (clang, gcc or cc on PATH); install clang "
                                  "(apt-get install clang), or use DEV=INTERP for interpreted execution")
    return ProbeResult(True, f"compiler {cc}")


def open_cpu(ordinal: int) -> DeviceImpl:
    from polygrad_backend_cpu.compiler import ClangCompiler
    from polygrad_backend_cpu.renderer import CPURenderer
    from polygrad_backend_cpu.runtime import load_program
    compiler = ClangCompiler()
    renderer = CPURenderer()
    threads = int(os.environ.get("POLY_THREADS") or os.cpu_count() or 1)
    lanes, registers, fma = vector_caps()
    return DeviceImpl(name="CPU", allocator=HostAllocator(), render=renderer.render, compile=compiler.compile,
                      load=load_program, compile_many=compiler.compile_many, render_cacheable=True,
                      capabilities=Capabilities(threads=threads, vector_width=lanes, registers=registers, fma=fma,
                                                stage_bytes=STAGE_BYTES))


STAGE_BYTES = 512 * 1024  # staged panels live on the launch's stack (8 MB for the main thread and the pool)


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
