"""src/generated/ops.js: the op table of polygrad/definitions/ops.py for ir.js and validate.js.

Stage: build (generator). Input: polygrad.definitions.ops. Output: every op's row (name, src count,
levels, group, dtype class, relation, commutative) and the op sets and RANGE kinds both languages use.
"""
from __future__ import annotations

from polygrad.definitions import ops as d

from gen._js import GENERATED, module

OUT = GENERATED / "ops.js"


def _row(op: d.Op) -> dict:
    src = op.src if isinstance(op.src, int) else list(op.src)  # [min, max], max null: any number
    return {"name": op.name, "src": src, "levels": list(op.levels), "group": op.group, "dtypes": op.dtypes,
            "relation": op.relation, "commutative": op.commutative}


SOURCE = "polygrad-core/src/polygrad/definitions/ops.py"
ABOUT = "Every op of the IR (src count or [min, max], levels, dtype class), the op sets and RANGE kinds."


def exports() -> dict:
    """The table: the values module.exports holds."""
    return {
        "OPS": [_row(op) for op in d.OPS],
        "NAMES": d.NAMES,
        "UNARY": d.UNARY,
        "BINARY": d.BINARY,
        "ALU": d.ALU,
        "COMPARISONS": d.COMPARISONS,
        "FLOAT_ONLY": d.FLOAT_ONLY,
        "INT_ONLY": d.INT_ONLY,
        "INT_OR_BOOL_ONLY": d.INT_OR_BOOL_ONLY,
        "KERNEL_OPS": d.KERNEL_OPS,
        "KERNEL_ELEMENTWISE": d.KERNEL_ELEMENTWISE,
        "SIZE_OPS": d.SIZE_OPS,
        "REDUCE_OPS": d.REDUCE_OPS,
        "AXIS_KINDS": [value for _, value in d.AXIS_KINDS],
        "STORED_AXIS_KINDS": d.STORED_AXIS_KINDS,
    }


def render() -> str:
    return module(__file__, SOURCE, ABOUT, exports())
