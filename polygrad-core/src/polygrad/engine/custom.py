"""Custom kernels: user-written kernel IR that runs through the normal scheduler and caches.

Stage: graph construction (above Tensor: it adds `Tensor.custom_kernel`). Input: tensors and
`fxn(*placeholders) -> SINK` written with the public kernel-IR builders (`UOp.range`, indexing,
`store`, `end`, `sink`, `KernelInfo`). Output: one AFTER tensor per input, ordered after a CUSTOM
tensor-graph node whose arg is the returned SINK.

The scheduler turns the CUSTOM node into a kernel step over the inputs' buffers (slot i is the i-th
tensor, the one `custom_kernel` is called on first). A SINK without `KernelInfo` is not a kernel
boundary and does not run, as in tinygrad: the output keeps whatever it held.

>>> from polygrad import Tensor
>>> from polygrad.uop.ops import KernelInfo, UOp
>>> def double(out, a):
...     i = UOp.range(out.ctx, out.numel(), 0)
...     return out[i].store(a[i] * 2).end(i).sink(arg=KernelInfo(name="double"))
>>> Tensor.empty(3).custom_kernel(Tensor([1.0, 2.0, 3.0]), fxn=double)[0].numpy().tolist()
[2.0, 4.0, 6.0]
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

from polygrad.errors import DeviceError
from polygrad.tensor import Tensor, _check_runtimes, _effect_ids
from polygrad.tensor_common import check_writable
from polygrad.uop.names import plain_name
from polygrad.uop.ops import ELEMENTWISE, AxisKind, KernelInfo, Ops, UOp, vector_width


def custom_kernel(self: Any, *srcs: Any, fxn: Callable[..., UOp]) -> list[Any]:
    """Run `fxn`'s kernel over `self` and `srcs`; returns [self', *srcs'] ordered after the kernel.

    `fxn` receives one placeholder per tensor (shape and dtype of that tensor) and returns a SINK.
    """
    if fxn is None or not callable(fxn):
        raise TypeError("custom_kernel needs fxn=, a function taking placeholders and returning a SINK")
    tensors = [self, *srcs]
    for t in tensors:
        if not isinstance(t, Tensor):
            raise TypeError(f"custom_kernel inputs must be Tensors, got {type(t).__name__}")
    _check_runtimes(tensors)
    devices = {t.device for t in tensors}
    if len(devices) > 1:
        raise DeviceError(f"custom_kernel inputs are on different devices {sorted(devices)}; move them with .to()")
    for t in tensors:  # the kernel may store into any of its buffers
        check_writable(t.uop, "a custom kernel")
    placeholders = [UOp.placeholder(t.shape, t.dtype, slot) for slot, t in enumerate(tensors)]
    body = fxn(*placeholders)
    if not isinstance(body, UOp) or body.op is not Ops.SINK:
        raise TypeError(f"custom kernel function must return a SINK UOp (....end(i).sink(arg=KernelInfo(...))), "
                        f"got {body!r:.80}")
    body = devectorize(_safe_name(body))
    kernel = UOp(Ops.CUSTOM, None, tuple(t.uop for t in tensors), body)
    # each call's AFTERs are distinct UOps (a unique arg), so an identical second call runs again
    call_id = next(_effect_ids)
    return [Tensor(UOp(Ops.AFTER, t.dtype, (t.uop, kernel), call_id), _runtime=self._runtime) for t in tensors]


def _safe_name(sink: UOp) -> UOp:
    """Any KernelInfo name made a plain name (uop/names.py), so a model holding this kernel saves a bundle
    that loads (the name is metadata: renderers never put it in source)."""
    info = sink.arg
    if not isinstance(info, KernelInfo):
        return sink
    name = plain_name(str(info.name))
    return sink if name == info.name else sink.replace(arg=dataclasses.replace(info, name=name))


# ---------------------------------------------------------------------------------------------------
# vector stores -> an upcast range of scalar stores (every renderer already handles those)


def devectorize(sink: UOp) -> UOp:
    """Rewrite each store of a vector value into a loop over its lanes."""
    new_src = tuple(_devectorize_block(block, sink) for block in sink.src)
    return sink if new_src == sink.src else sink.replace(src=new_src)


def _devectorize_block(block: UOp, sink: UOp) -> UOp:
    store = block.src[0] if block.op is Ops.END else block
    if store.op is not Ops.STORE or vector_width(store.src[1]) == 1:
        return block
    index, value = store.src
    width = vector_width(value)
    axis = 1 + max((n.arg[0] for n in sink.toposort() if n.op is Ops.RANGE), default=-1)
    lane = UOp.range(None, width, axis, AxisKind.UPCAST)
    pick = _lane(value, width - 1, {})
    for k in reversed(range(width - 1)):
        pick = UOp(Ops.WHERE, pick.dtype, (lane.eq(k), _lane(value, k, {}), pick))
    shifted = UOp(Ops.INDEX, index.dtype, (index.src[0], index.src[1] + lane, *index.src[2:]))
    new_store = UOp(Ops.STORE, None, (shifted, pick))
    ranges = block.src[1:] if block.op is Ops.END else ()
    return UOp(Ops.END, None, (new_store, *ranges, lane))


def _lane(u: UOp, k: int, memo: dict[UOp, UOp]) -> UOp:
    """The k-th scalar lane of a vector expression (scalars broadcast to every lane)."""
    hit = memo.get(u)
    if hit is not None:
        return hit
    if u.op is Ops.VECTORIZE:
        out = u.src[k]
    elif u.op in ELEMENTWISE and vector_width(u) > 1:
        out = u.replace(src=tuple(_lane(s, k, memo) for s in u.src))
    else:
        out = u
    memo[u] = out
    return out


# x.custom_kernel(*srcs, fxn=...): this module builds on Tensor, so it adds the method to the class when
# imported (polygrad/__init__.py imports it), and tensor.py never reaches up to it
Tensor.custom_kernel = custom_kernel  # type: ignore[attr-defined]
