"""The polygrad IR package: UOp, Ops, KernelInfo and the rewrite engine.

Importing it imports the modules that give UOp's convenience methods their implementations
(`ops.provided`: shape.py, sint.py, movement.py), so they are present wherever a UOp exists.
"""
from polygrad.uop import movement, shape, sint  # noqa: F401  (fill ops.provided)
from polygrad.uop.ops import KernelInfo, Ops, UOp

__all__ = ["KernelInfo", "Ops", "UOp"]
