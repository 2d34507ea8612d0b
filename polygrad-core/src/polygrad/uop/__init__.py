"""The polygrad IR package: UOp, Ops, KernelInfo and the rewrite engine."""
from polygrad.uop.ops import KernelInfo, Ops, UOp

__all__ = ["KernelInfo", "Ops", "UOp"]
