"""polygrad's INTERP backend: kernels evaluated with NumPy, vectorised over their loop ranges.

Needs no compiler. It is the reference semantics every other backend is checked against.
"""
from __future__ import annotations

from polygrad.backend_api import BackendSpec, Capabilities, DeviceImpl, HostAllocator, ProbeResult, hookimpl

__version__ = "0.1.0"


def open_interp(ordinal: int) -> DeviceImpl:
    # imported when opened, not when the entry point registers the backend (registration stays cheap)
    from polygrad_backend_interp.evaluator import InterpProgram, describe
    return DeviceImpl(name="INTERP", allocator=HostAllocator(), render=describe, compile=lambda src: src,
                      load=lambda spec, binary: InterpProgram(spec), capabilities=Capabilities(threads=1))


@hookimpl
def polygrad_register_backends() -> list[BackendSpec]:
    return [BackendSpec(name="INTERP", probe=lambda: ProbeResult(True, "numpy"), open=open_interp, priority=10,
                        aliases=("NUMPY", "PYTHON"), package="polygrad-backend-interp", version=__version__,
                        pip_name="polygrad-backend-interp")]
