"""src/generated/dtypes.js: the dtypes of polygrad/definitions/dtypes.py for dtypes.js.

Stage: build (generator). Input: polygrad.definitions.dtypes. Output: each dtype's serialised name, item
size, kind and, for integers and bool, its inclusive range as BigInts.
"""
from __future__ import annotations

from polygrad.definitions import dtypes as d

from gen._js import GENERATED, BigInt, module

OUT = GENERATED / "dtypes.js"


def _row(dt: d.DTypeDef) -> dict:
    bounds = d.int_range(dt)
    low, high = (None, None) if bounds is None else (BigInt(bounds[0]), BigInt(bounds[1]))
    return {"name": dt.name, "itemsize": dt.itemsize, "kind": dt.kind, "min": low, "max": high}


SOURCE = "polygrad-core/src/polygrad/definitions/dtypes.py"
ABOUT = "Every dtype in priority order: serialised name, bytes, kind, integer range (BigInt, null for floats)."


def exports() -> dict:
    """The table: the values module.exports holds."""
    return {"DTYPES": [_row(dt) for dt in d.DTYPES]}


def render() -> str:
    return module(__file__, SOURCE, ABOUT, exports())
