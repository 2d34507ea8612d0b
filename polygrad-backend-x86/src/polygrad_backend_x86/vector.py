"""Vector instructions (placeholder until the vector emitter lands)."""
from __future__ import annotations

from polygrad_backend_x86.emit import Emitter


class VectorEmitter(Emitter):
    pass
