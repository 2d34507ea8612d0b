"""The CPU dialect of the C-family renderer (plain C99 with GNU statement expressions)."""
from __future__ import annotations

from polygrad.backend_api import CStyleRenderer
from polygrad.dtype import DType, dtypes
from polygrad.uop.ops import Ops

# outputs of at least this many bytes get non-temporal stores when the cache size is unknown
DEFAULT_STREAM_BYTES = 16 << 20


# x86 builtins that gcc and clang both name (the intrinsics headers' own), by (element type, lanes):
# a lane-wise fused multiply-add, and a load of the lanes whose mask's sign bit is set (the others read
# nothing and give 0, so a padded row's edge cannot fault). The portable per-lane loops these replace
# are correct everywhere, but gcc keeps their lanes in general registers and spills the accumulators
# of a register tile around them (conv2d's weight gradient: 3x slower than with these).
X86_FMA = {(dtypes.float32, 4): ("__FMA__", "__builtin_ia32_vfmaddps(a, b, c)"),
           (dtypes.float32, 8): ("__FMA__", "__builtin_ia32_vfmaddps256(a, b, c)"),
           (dtypes.float64, 2): ("__FMA__", "__builtin_ia32_vfmaddpd(a, b, c)"),
           (dtypes.float64, 4): ("__FMA__", "__builtin_ia32_vfmaddpd256(a, b, c)"),
           (dtypes.float32, 16): ("__AVX512F__", "__builtin_ia32_vfmaddps512_mask(a, b, c, (unsigned short)-1, 4)"),
           (dtypes.float64, 8): ("__AVX512F__", "__builtin_ia32_vfmaddpd512_mask(a, b, c, (unsigned char)-1, 4)")}
X86_MASKLOAD = {(dtypes.float32, 4): ("__AVX__", "__builtin_ia32_maskloadps"),
                (dtypes.float32, 8): ("__AVX__", "__builtin_ia32_maskloadps256")}


def x86_or(macro: str, fast: str, portable: str) -> str:
    """A helper body: `fast` where the compiler targets the x86 feature `macro`, else `portable`."""
    return f"\n#if defined({macro})\n  {fast}\n#else\n{portable}\n#endif\n"


class CPURenderer(CStyleRenderer):
    prelude = "#include <math.h>\n#include <stdint.h>\n"

    def __init__(self, stream_bytes: int = DEFAULT_STREAM_BYTES):
        self.stream_bytes = stream_bytes  # 0: never stream

    def stream_slots(self, spec) -> frozenset[int]:  # type: ignore[no-untyped-def]
        """Outputs larger than the last-level cache that the kernel does not read: their contiguous vector
        stores go straight to memory (no read-for-ownership of each line, the cache left to the inputs)."""
        if not self.stream_bytes:
            return frozenset()
        big = {g.slot for g in spec.globals if g.written and isinstance(g.size, int)
               and g.size * g.dtype.itemsize >= self.stream_bytes}
        if not big:
            return frozenset()
        read = {n.src[0].src[0].arg[0] for n in spec.ast.toposort() if n.op is Ops.LOAD}
        return frozenset(big - read)

    def vfma_body(self, dt: DType, n: int) -> str:
        portable = super().vfma_body(dt, n)
        if (dt, n) not in X86_FMA:
            return portable
        macro, call = X86_FMA[dt, n]
        return x86_or(macro, f"return {call};", f"  {portable}")

    def gated_vload_body(self, dt: DType, lanes: int) -> str:
        portable = super().gated_vload_body(dt, lanes)
        if (dt, lanes) not in X86_MASKLOAD:
            return portable
        macro, builtin = X86_MASKLOAD[dt, lanes]
        return x86_or(macro, f"return {builtin}((const {self.vtype(dt, lanes)}*)p, m);", portable).strip("\n")

    def render_program(self, prog, stream: frozenset[int] = frozenset()) -> str:  # type: ignore[no-untyped-def]
        """The kernel, and for a THREAD kernel its pool trampoline `<name>_task(void** args, int tid)`
        (args: the buffer pointers, then pointers to the variables' values; see runtime.py)."""
        src = super().render_program(prog, stream)
        if prog.threads <= 1:
            return src
        args = [f"({'' if p.arg[1] else 'const '}{self.storage_ctype(p.dtype)}*)a[{i}]"
                for i, p in enumerate(prog.params)]
        args += [f"*(const {self.ctype(v.dtype)}*)a[{len(prog.params) + i}]" for i, v in enumerate(prog.vars)]
        return src + f"void {prog.name}_task(void** a, int tid) {{ {prog.name}({', '.join(args + ['tid'])}); }}\n"
