"""Neural-network functions on Tensor (convolution, pooling, attention, losses...), as a mixin.

Built only from the primitive ops in tensor.py, so gradients come for free.
"""
from __future__ import annotations


class NNMixin:
    __slots__ = ()
