"""Activation functions on Tensor (a mixin of Tensor), with torch's definitions and gradients.

Stage: graph construction. Input: tensors. Output: elementwise graphs built from `tensor_math`
functions. Kinks follow torch's subgradients (relu'(0) = 0, hardtanh is flat at its edges, clamp
passes the gradient at its bounds), and every overflowing branch gets a safe input.
"""
from __future__ import annotations

import math

from polygrad.errors import InvalidArgumentError
from polygrad.tensor_math import float_math

SELU_ALPHA = 1.6732632423543772848170429916717
SELU_SCALE = 1.0507009873554804934193349852946


class ActivationMixin:
    """relu, gelu, sigmoid, softplus, ... as Tensor methods."""

    __slots__ = ()

    def relu(self):
        return (self <= 0).where(0, self)

    def relu6(self):
        return self.hardtanh(0, 6)

    def hardtanh(self, min_val: float = -1.0, max_val: float = 1.0):
        """Clip to [min_val, max_val]; the gradient is zero at and beyond the edges, like torch."""
        return (self <= min_val).where(min_val, (self >= max_val).where(max_val, self))

    def leaky_relu(self, neg_slope: float = 0.01):
        return (self > 0).where(self, self * neg_slope)

    @float_math
    def elu(self, alpha: float = 1.0):
        neg = (self > 0).where(0, self)
        return (self > 0).where(self, alpha * neg.expm1())

    @float_math
    def celu(self, alpha: float = 1.0):
        neg = (self > 0).where(0, self)
        return (self > 0).where(self, alpha * (neg / alpha).expm1())

    @float_math
    def selu(self, alpha: float = SELU_ALPHA, gamma: float = SELU_SCALE):
        return gamma * self.elu(alpha)

    @float_math
    def gelu(self, approximate: str = "none"):
        """torch's gelu: exact (erf) by default, or the tanh approximation with approximate='tanh'."""
        if approximate == "tanh":
            inner = math.sqrt(2 / math.pi) * (self + 0.044715 * self * self * self)
            return 0.5 * self * (1 + inner.tanh())
        if approximate != "none":
            raise InvalidArgumentError(f"gelu approximate must be 'none' or 'tanh', got {approximate!r}")
        return 0.5 * self * (1 + (self * (1 / math.sqrt(2))).erf())

    @float_math
    def quick_gelu(self):
        return self * (self * 1.702).sigmoid()

    @float_math
    def sigmoid(self):
        """1 / (1 + exp(-x)) computed from exp(-|x|), so neither value nor gradient overflows."""
        pos = self >= 0
        e = pos.where(-self, self).exp()
        return pos.where(1, e) / (1 + e)

    @float_math
    def silu(self):
        return self * self.sigmoid()

    swish = silu

    @float_math
    def mish(self):
        return self * self.softplus().tanh()

    @float_math
    def softplus(self, beta: float = 1.0, threshold: float = 20.0):
        """log(1 + exp(beta x)) / beta, linear above threshold like torch."""
        linear = self * beta > threshold
        safe = linear.where(0, self)
        return linear.where(self, (safe * beta).exp().log1p() / beta)

    @float_math
    def softsign(self):
        return self / (1 + self.abs())

    @float_math
    def hardswish(self):
        return self * (self + 3).relu6() * (1 / 6)

    @float_math
    def hardsigmoid(self, alpha: float = 1 / 6, beta: float = 0.5):
        """clip(alpha * x + beta, 0, 1); the defaults are torch's (relu6(x + 3) / 6)."""
        if alpha == 1 / 6 and beta == 0.5:
            return (self + 3).relu6() * (1 / 6)
        return (self * alpha + beta).clamp(0, 1)

    @float_math
    def logsigmoid(self):
        """-log(1 + exp(-x)), each side from exp of a non-positive value (x = 0 takes the x >= 0 side)."""
        pos = self >= 0
        xp = pos.where(self, 0)
        xn = pos.where(0, self)
        return pos.where(-(-xp).exp().log1p(), xn - xn.exp().log1p())
