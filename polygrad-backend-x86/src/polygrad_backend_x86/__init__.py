"""polygrad's X86 backend: kernels emitted as x86-64 machine code (encoded by iced-x86) from the linearized
program, mapped W^X and called through cffi. No C compiler is needed on the machine.

Pipeline: `render` (compiler.X86Source: linearize with the ISA's vector lanes) -> `compile` (expand.py,
regalloc.py, emit.py/vector.py, cached on disk) -> `load` (runtime.X86Program, one call per THREAD index).
"""
from __future__ import annotations

from polygrad.backend_api import (BackendSpec, Capabilities, DeviceImpl, HostAllocator, ProbeResult, Setting,
                                  describe_cpu, hookimpl, host_fields, process_setting, register_setting)

from polygrad_backend_x86.cpu import TIERS, choose_isa, features, host_is_x86_64

__version__ = "0.1.0"
# declared when the package is imported, before any of its code reads it; read with backend_api.setting("POLY_X86_ISA")
register_setting(Setting("POLY_X86_ISA", str, "", "the highest instruction set the X86 backend uses", choices=TIERS,
                         live=True, owner="polygrad-backend-x86"))


def probe() -> ProbeResult:
    why = host_is_x86_64()
    if why is not None:
        return ProbeResult(False, f"{why}; use DEV=CPU (with a C compiler) or DEV=INTERP")
    try:  # optional until probed: a missing one is reported, not raised at registration
        import cffi  # noqa: F401
        import iced_x86  # noqa: F401
    except ImportError as e:
        return ProbeResult(False, f"missing dependency ({e}); pip install polygrad-backend-x86")
    try:
        feats = features()
        isa = choose_isa()
    except (OSError, ValueError) as e:
        return ProbeResult(False, f"cannot run generated code here ({e}); use DEV=CPU or DEV=INTERP")
    if "sse2" not in feats:
        return ProbeResult(False, "this processor lacks SSE2, the X86 backend's minimum; use DEV=INTERP")
    return ProbeResult(True, f"x86-64 {isa.tier}{' +fma' if isa.fma else ''}")


def open_x86(ordinal: int) -> DeviceImpl:
    # imported when opened, not when the entry point registers the backend (registration stays cheap)
    from polygrad_backend_x86.compiler import X86Source, compile_source
    from polygrad_backend_x86.runtime import X86Program
    isa = choose_isa()
    # caches, FMA units and a stored calibration from the shared description; the vector tier from cpuid
    # (choose_isa: what this process may run, capped by POLY_X86_ISA). No staging: LOCAL is not emitted
    cpu = describe_cpu()
    tuned = host_fields(cpu, "X86", f"polygrad-backend-x86 {__version__} {isa.tier}", isa.vec_bits,
                        tile_vectors=2, stage=False)
    threads = process_setting("POLY_THREADS")  # kernels are split this many ways; a Context may use fewer

    def render(spec):
        return X86Source(spec, isa)

    def load(spec, kernel):
        return X86Program(spec, kernel.code, kernel.externs)

    return DeviceImpl(name="X86", allocator=HostAllocator(), render=render, compile=compile_source, load=load,
                      capabilities=Capabilities(threads=threads, vector_width=isa.lanes,
                                                registers=min(16 + isa.high_vec_regs, cpu.vector_registers),
                                                fma=isa.fma,
                                                masked_lanes=isa.vex, masked_vectors=isa.vex, **tuned))


@hookimpl
def polygrad_register_backends() -> list[BackendSpec]:
    return [BackendSpec(name="X86", probe=probe, open=open_x86, priority=50, aliases=("X64", "X86_64"),
                        package="polygrad-backend-x86", version=__version__, pip_name="polygrad-backend-x86")]
