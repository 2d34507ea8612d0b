"""The dtypes: every scalar type a tensor or a kernel holds, by its serialised name.

Stage: shared (definition). Input: nothing. Output: `DTYPES` (one `DTypeDef` per dtype, in promotion
priority order) and the integer ranges derived from it. polygrad/dtype.py builds its `dtypes` namespace
from these rows, uop/serialize.py names dtypes by `name`, and polygrad-js's src/dtypes.js builds its
table from src/generated/dtypes.js.
"""
from __future__ import annotations

from typing import NamedTuple, Optional, Tuple

BOOL, INT, UINT, FLOAT = "bool", "int", "uint", "float"  # kinds


class DTypeDef(NamedTuple):
    name: str      # the language-neutral, width-explicit name files use ("float32")
    itemsize: int  # bytes
    kind: str      # bool, int, uint or float
    c_name: str    # DType.name: the C spelling renderers use ("float", "char", "bfloat16")
    numpy: str     # the NumPy dtype that holds it on the host (bfloat16 is held as its uint16 bits)


# in priority order: promotion picks the lowest type every operand promotes to (polygrad/dtype.py)
DTYPES: Tuple[DTypeDef, ...] = (
    DTypeDef("bool", 1, BOOL, "bool", "?"),
    DTypeDef("int8", 1, INT, "char", "i1"),
    DTypeDef("uint8", 1, UINT, "uchar", "u1"),
    DTypeDef("int16", 2, INT, "short", "i2"),
    DTypeDef("uint16", 2, UINT, "ushort", "u2"),
    DTypeDef("int32", 4, INT, "int", "i4"),
    DTypeDef("uint32", 4, UINT, "uint", "u4"),
    DTypeDef("int64", 8, INT, "long", "i8"),
    DTypeDef("uint64", 8, UINT, "ulong", "u8"),
    DTypeDef("float16", 2, FLOAT, "half", "f2"),
    DTypeDef("bfloat16", 2, FLOAT, "bfloat16", "u2"),
    DTypeDef("float32", 4, FLOAT, "float", "f4"),
    DTypeDef("float64", 8, FLOAT, "double", "f8"),
)
BY_NAME = {d.name: d for d in DTYPES}
NAMES: Tuple[str, ...] = tuple(BY_NAME)


def int_range(d: DTypeDef) -> Optional[Tuple[int, int]]:
    """The inclusive range of an integer or bool dtype (two's complement), None for a float.

    >>> int_range(BY_NAME["int8"]), int_range(BY_NAME["bool"]), int_range(BY_NAME["float32"])
    ((-128, 127), (0, 1), None)
    """
    bits = 8 * d.itemsize
    if d.kind == BOOL:
        return (0, 1)
    if d.kind == UINT:
        return (0, (1 << bits) - 1)
    if d.kind == INT:
        return (-(1 << (bits - 1)), (1 << (bits - 1)) - 1)
    return None


INT_RANGES = {d.name: int_range(d) for d in DTYPES if int_range(d) is not None}
