"""polygrad: a lazy tensor library and JIT compiler with pluggable device backends.

>>> from polygrad import Tensor
>>> (Tensor([1.0, 2.0]) * 2).numpy().tolist()
[2.0, 4.0]
"""
from polygrad.config import Context
from polygrad.device import Device, GlobalCounters
from polygrad.dtype import dtypes
from polygrad.inspect import can_run, stats
from polygrad.tensor import Tensor

__version__ = "0.1.0"

__all__ = ["Context", "Device", "GlobalCounters", "Tensor", "can_run", "dtypes", "stats", "__version__"]
