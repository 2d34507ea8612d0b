"""Runtime inspection: `stats()` counters and the advisory `can_run()` capability probe."""
from __future__ import annotations

import math
from typing import Any, Sequence

from polygrad.device import GlobalCounters, alloc_cache_bytes, buffers_live, open_device, registry
from polygrad.dtype import to_dtype
from polygrad.engine.programs import program_cache, runtime_stats
from polygrad.errors import CapabilityError, DeviceError
from polygrad.schedule.template import schedule_cache

ELEMENTWISE_OPS = {
    "add", "sub", "mul", "div", "neg", "exp", "exp2", "log", "log2", "sqrt", "rsqrt", "relu", "sigmoid", "tanh",
    "maximum", "minimum", "where", "cast", "abs", "sin", "cos", "pow", "square", "reciprocal", "cmplt", "cmpne",
    "eq", "ne", "lt", "gt", "le", "ge", "floor", "ceil", "trunc", "gelu", "silu", "softplus",
}
REDUCE_OPS = {"sum", "max", "min", "mean", "prod", "softmax", "log_softmax", "argmax", "argmin", "var", "std"}
MOVEMENT_OPS = {"reshape", "permute", "expand", "pad", "shrink", "flip", "transpose", "squeeze", "unsqueeze",
                "flatten", "contiguous", "copy"}
COMPOUND_OPS = {"matmul", "dot", "gather", "conv2d"}


def stats() -> dict[str, Any]:
    """Runtime counters: programs compiled, cache hits, kernels run, live buffers and bytes."""
    out = dict(runtime_stats)
    out.update({
        "programs_cached": len(program_cache), "schedules_cached": len(schedule_cache),
        "mem_used": GlobalCounters.mem_used, "mem_used_per_device": dict(GlobalCounters.mem_used_per_device),
        "kernel_count": GlobalCounters.kernel_count, "global_ops": GlobalCounters.global_ops,
        "buffers_live": sum(buffers_live.values()), "buffers_live_per_device": dict(buffers_live),
        "bytes_cached_for_reuse": alloc_cache_bytes["total"],
    })
    return out


def can_run(op: str, dtype: Any = "float32", shape: Sequence[int] | None = None,
            shapes: Sequence[Sequence[int]] | None = None, device: str = "auto") -> bool:
    """Whether `device` can run `op` on tensors of `dtype` and `shape` (advisory, conservative).

    >>> can_run("add", shape=[1024])
    True
    """
    dev = registry.default_name() if device in (None, "auto") else device
    try:
        impl = open_device(dev)
    except DeviceError:
        return False
    caps = impl.capabilities
    dt = to_dtype(dtype)
    if dt.name not in caps.dtypes:
        return False
    name = op.lower()
    if name in caps.unsupported_ops:
        return False
    all_shapes = [tuple(shape)] if shape is not None else []
    all_shapes += [tuple(s) for s in (shapes or [])]
    for s in all_shapes:
        if len(s) > caps.max_dims or math.prod(s) * dt.itemsize > caps.max_buffer_bytes:
            return False
    if name in ELEMENTWISE_OPS or name in REDUCE_OPS or name in MOVEMENT_OPS:
        return True
    if name in COMPOUND_OPS:
        if not shapes or len(shapes) < 2:
            raise CapabilityError(f"can_run({op!r}) needs shapes=[a_shape, b_shape] to decide statically")
        a, b = tuple(shapes[0]), tuple(shapes[1])
        if name in ("matmul", "dot") and (len(a) < 1 or len(b) < 1 or a[-1] != b[-2 if len(b) > 1 else 0]):
            return False
        return True
    raise CapabilityError(f"can_run cannot prove support for op {op!r}; known ops: "
                          f"{sorted(ELEMENTWISE_OPS | REDUCE_OPS | MOVEMENT_OPS | COMPOUND_OPS)}")
