"""polygrad: a lazy tensor library and JIT compiler with pluggable device backends.

>>> from polygrad import Tensor
>>> (Tensor([1.0, 2.0]) * 2).numpy().tolist()
[2.0, 4.0]
"""
from polygrad.config import Context
from polygrad.device import Device, GlobalCounters
from polygrad.dtype import dtypes
from polygrad.engine.jit import CompiledCallable, JitError, TinyJit, compile, jit
from polygrad.inspect import can_run, stats
from polygrad.runtime import Runtime, create
from polygrad.tensor import Tensor
from polygrad.uop.sint import Variable
from polygrad import nn  # noqa: E402  (after Tensor: nn builds on it)
# modules above Tensor that add methods to it (x.solve, x.svd, x.custom_kernel) when imported
from polygrad import linalg, linalg_svd  # noqa: E402,F401
from polygrad.engine import custom  # noqa: E402,F401
from polygrad.bundle import BundleError  # noqa: E402
from polygrad.model import Model, ModelError  # noqa: E402
from polygrad.quantization import quantize  # noqa: E402
from polygrad.version import __version__  # noqa: E402

__all__ = ["BundleError", "CompiledCallable", "Context", "Device", "GlobalCounters", "JitError", "Model", "ModelError",
           "Runtime", "Tensor", "TinyJit", "Variable", "can_run", "compile", "create", "dtypes", "jit", "nn",
           "quantize", "stats", "__version__"]
