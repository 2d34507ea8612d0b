"""The CPU dialect of the C-family renderer (plain C99 with GNU statement expressions)."""
from __future__ import annotations

from polygrad.backend_api import CStyleRenderer


class CPURenderer(CStyleRenderer):
    prelude = "#include <math.h>\n#include <stdint.h>\n"
