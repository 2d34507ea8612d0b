"""Bytecode for the polygrad packages, written once before a benchmark times first calls.

A package installed by pip has its modules' bytecode (pip compiles it at install). An editable
checkout run with PYTHONDONTWRITEBYTECODE=1 (this machine sets it) has none, so every fresh process
compiles the source of each module it imports, and a lazily imported one (the X86 emitter, the C
renderer) is compiled inside the timed first call: milliseconds that no installed user pays.
`compileall` writes the bytecode whatever PYTHONDONTWRITEBYTECODE says.
"""
from __future__ import annotations

import compileall
import importlib.util

PACKAGES = ("polygrad", "polygrad_backend_cpu", "polygrad_backend_interp", "polygrad_backend_x86",
            "polygrad_backend_cuda", "polygrad_hf")


def prepare_bytecode() -> None:
    """Compile every installed polygrad package's modules to bytecode (no-op where it is current)."""
    for name in PACKAGES:
        spec = importlib.util.find_spec(name)
        for folder in (spec.submodule_search_locations or []) if spec is not None else []:
            compileall.compile_dir(folder, quiet=1)
