"""The CPU dialect of the C-family renderer (plain C99 with GNU statement expressions)."""
from __future__ import annotations

from polygrad.backend_api import CStyleRenderer
from polygrad.uop.ops import Ops

# outputs of at least this many bytes get non-temporal stores when the cache size is unknown
DEFAULT_STREAM_BYTES = 16 << 20


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
