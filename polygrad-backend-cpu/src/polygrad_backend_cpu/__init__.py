"""polygrad's CPU backend: C source from the shared C-family renderer, compiled by clang (gcc/cc fallback),
loaded through cffi, and launched once per THREAD index across cores."""
from __future__ import annotations

from polygrad.backend_api import (BackendSpec, Capabilities, DeviceImpl, HostAllocator, ProbeResult, Setting,
                                  describe_cpu, hookimpl, host_fields, process_setting, register_setting)

__version__ = "0.1.0"
# declared when the package is imported, before any of its code reads it; read with backend_api.setting("POLY_CC")
register_setting(Setting("POLY_CC", str, "", "the C compiler to use instead of clang, gcc or cc (a name on PATH "
                         "or a path)", live=True, owner="polygrad-backend-cpu"))
register_setting(Setting("POLY_COMPILE_JOBS", int, 0, "compiler processes run side by side for a batch of new "
                         "kernels (0: one per usable core)", minimum=0, live=True, owner="polygrad-backend-cpu"))


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
    cpu = describe_cpu()
    # outputs at least as big as the largest cache are written with non-temporal stores
    int8_dot = has_int8_dot(cpu, compiler.version)
    renderer = CPURenderer(stream_bytes=cpu.l3_bytes, int8_dot=int8_dot)
    threads = process_setting("POLY_THREADS")  # kernels are split this many ways; a Context may use fewer
    registers = cpu.vector_registers
    fma = "fma" in cpu.flags or "asimd" in cpu.flags  # x86 FMA3; every ARMv8 NEON unit fuses (vfma)
    tuned = host_fields(cpu, "CPU", compiler.version, cpu.vector_bits, tile_vectors(compiler.version, registers),
                        stage=True)
    return DeviceImpl(name="CPU", allocator=HostAllocator(), render=renderer.render, compile=compiler.compile,
                      load=load_program, compile_many=compiler.compile_many, render_cacheable=True,
                      capabilities=Capabilities(threads=threads, vector_width=cpu.lanes, registers=registers, fma=fma,
                                                strided_lanes=strided_lanes(cpu), masked_vectors=strided_lanes(cpu),
                                                int8_dot=int8_dot, **tuned))


def has_int8_dot(cpu, compiler_version: str) -> bool:  # type: ignore[no-untyped-def]
    """Whether byte dot products are single instructions here: x86 VNNI on 256-bit vectors (AVX-512 VNNI
    with VL, or AVX-VNNI), through clang's builtin (renderer.dot4_body). POLY_INT8_DOT=0 turns the use off
    (nn/quant.py); the capability itself stays what the CPU has."""
    flags = cpu.flags
    vnni = ("avx512_vnni" in flags and "avx512vl" in flags) or "avx_vnni" in flags
    return vnni and "clang" in compiler_version.lower()


def strided_lanes(cpu) -> bool:  # type: ignore[no-untyped-def]
    """Whether a stride-2 window gets vector lanes: where the renderer reads 16 float32 lanes 2 apart with
    AVX-512's masked loads and a shuffle (renderer.strided_vload_body); elsewhere its lanes would be loaded
    one at a time, slower than the window's plain loop. The same test gives `masked_vectors`: the renderer's
    16-lane masked loads and stores (AVX512_MASKLOAD, X86_MASKSTORE); its 8-lane AVX ones exist too, but the
    padded tiles that rely on them (host_opts.padded_columns) were measured with AVX-512 only."""
    return cpu.lanes == 16 and "avx512f" in cpu.flags


def tile_vectors(compiler_version: str, registers: int) -> int:
    """Vectors per register-tile row: 4 with clang and 32 vector registers (a 4 x 64 AVX-512 tile ran
    7-11% faster than 8 x 32 on matmuls 512-2048 and 1.2-1.8x on a transformer block's, measured on
    Zen 4), else 2: gcc 12 folds a 4-vector row's B loads into every multiply-add and loads A's scalars
    64 bytes wide, which made that tile 35% slower than 8 x 32 there."""
    return 4 if "clang" in compiler_version.lower() and registers >= 32 else 2


@hookimpl
def polygrad_register_backends() -> list[BackendSpec]:
    return [BackendSpec(name="CPU", probe=probe, open=open_cpu, priority=100, aliases=("CLANG", "C"),
                        package="polygrad-backend-cpu", version=__version__, pip_name="polygrad-backend-cpu")]
