"""The CPU dialect of the C-family renderer (plain C99 with GNU statement expressions)."""
from __future__ import annotations

from polygrad.backend_api import CStyleRenderer


class CPURenderer(CStyleRenderer):
    prelude = "#include <math.h>\n#include <stdint.h>\n"

    def render_program(self, prog) -> str:  # type: ignore[no-untyped-def]
        """The kernel, and for a THREAD kernel its pool trampoline `<name>_task(void** args, int tid)`
        (args: the buffer pointers, then pointers to the variables' values; see runtime.py)."""
        src = super().render_program(prog)
        if prog.threads <= 1:
            return src
        args = [f"({'' if p.arg[1] else 'const '}{self.storage_ctype(p.dtype)}*)a[{i}]"
                for i, p in enumerate(prog.params)]
        args += [f"*(const {self.ctype(v.dtype)}*)a[{len(prog.params) + i}]" for i, v in enumerate(prog.vars)]
        return src + f"void {prog.name}_task(void** a, int tid) {{ {prog.name}({', '.join(args + ['tid'])}); }}\n"
