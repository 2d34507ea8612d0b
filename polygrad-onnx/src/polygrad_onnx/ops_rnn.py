"""Recurrent operators: RNN, GRU and LSTM, unrolled over the sequence.

Stage: operator implementations (graph.py runs them). Input: a Node and its input Tensors (X, W, R, and the
optional B, sequence_lens, initial_h, initial_c, P). Output: Y and the last states (Y_h, and Y_c for LSTM).
The input projection X W^T + Wb of every step is one matmul; each step then adds H R^T + Rb and applies the
gates, so a sequence of T steps becomes T small matmuls that the scheduler fuses with their gates. The
sequence length must be a fixed size (it is the number of unrolled steps, capped by MAX_STEPS); the batch
may be symbolic. Every attribute of the spec is implemented: direction (forward, reverse, bidirectional),
activations with activation_alpha/beta (consumed in order by the functions that take them), clip (bounds
the input of every gate activation; LSTM's cell state goes into h() unclipped, as in onnxruntime), layout,
hidden_size, GRU's linear_before_reset, LSTM's input_forget (forget gate = 1 - input gate) and peepholes.
sequence_lens may be data: steps at or past a sequence's length keep its state and give zeros in Y, for
either direction; a sequence of length 0 gives zero last states.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from polygrad import Tensor

from polygrad_onnx.node import Node, op

# steps one recurrent node may unroll (each is a few kernels): a longer sequence is refused, not compiled
MAX_STEPS = 4096

GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}
DEFAULT_ACTIVATIONS = {"RNN": ("Tanh",), "GRU": ("Sigmoid", "Tanh"), "LSTM": ("Sigmoid", "Tanh", "Tanh")}

# name (lower case, as onnxruntime matches them): (function of x, alpha, beta; alpha; beta), where alpha and beta
# are None for a function that takes no such value, REQUIRED where the spec gives no default (activation_alpha/
# beta must hold it), else the default (those of the standalone LeakyRelu, HardSigmoid and Elu operators)
REQUIRED = "required"
ACTIVATIONS: dict[str, tuple[Callable, Any, Any]] = {
    "relu": (lambda x, a, b: x.relu(), None, None),
    "tanh": (lambda x, a, b: x.tanh(), None, None),
    "sigmoid": (lambda x, a, b: x.sigmoid(), None, None),
    "affine": (lambda x, a, b: x * a + b, REQUIRED, REQUIRED),
    "leakyrelu": (lambda x, a, b: x.leaky_relu(a), 0.01, None),
    "thresholdedrelu": (lambda x, a, b: (x > a).where(x, 0.0), REQUIRED, None),
    "scaledtanh": (lambda x, a, b: (x * b).tanh() * a, REQUIRED, REQUIRED),
    "hardsigmoid": (lambda x, a, b: (x * a + b).clamp(0.0, 1.0), 0.2, 0.5),
    "elu": (lambda x, a, b: x.elu(a), 1.0, None),
    "softsign": (lambda x, a, b: x.softsign(), None, None),
    "softplus": (lambda x, a, b: x.maximum(0) + (-x.abs()).exp().log1p(), None, None),
}


def _activations(node: Node, kind: str, directions: int) -> list[list[Callable[[Tensor], Tensor]]]:
    """The activation functions of each direction, with their alpha and beta bound."""
    per = len(DEFAULT_ACTIVATIONS[kind])
    given = node.attr("activations")
    names = [n.decode() if isinstance(n, bytes) else n for n in given] if given is not None \
        else list(DEFAULT_ACTIVATIONS[kind]) * directions
    if len(names) == per and directions == 2:
        names = names * 2  # one list for both directions, as onnxruntime accepts
    if len(names) != per * directions:
        raise node.fail(f"activations={names} needs {per} function(s) per direction ({per * directions} in all)")
    alphas = list(node.attr("activation_alpha", []))
    betas = list(node.attr("activation_beta", []))
    funcs = []
    for name in names:
        if name.lower() not in ACTIVATIONS:
            raise node.unsupported("activations", name)
        fn, alpha, beta = ACTIVATIONS[name.lower()]
        if alpha is not None:
            alpha = alphas.pop(0) if alphas else alpha
        if beta is not None:
            beta = betas.pop(0) if betas else beta
        if REQUIRED in (alpha, beta):
            raise node.fail(f"activation {name} needs its alpha and beta (the spec gives no default): add them to "
                            "activation_alpha / activation_beta, in the order of the activations")
        funcs.append(lambda x, fn=fn, a=alpha, b=beta: fn(x, a, b))
    if alphas or betas:
        raise node.fail(f"activation_alpha/activation_beta hold {len(alphas)}/{len(betas)} value(s) that no "
                        f"function of {names} takes")
    return [funcs[d * per:(d + 1) * per] for d in range(directions)]


def _step_mask(lens: Any, steps: int) -> Callable[[int], Tensor | None]:
    """mask(t): (batch, 1) true where step t is inside the sequence, or None when every sequence is full."""
    if lens is None:
        return lambda t: None
    if isinstance(lens, np.ndarray) and bool((lens.reshape(-1) == steps).all()):
        return lambda t: None
    lens_t = (lens if isinstance(lens, Tensor) else Tensor(np.asarray(lens))).unsqueeze(1)
    return lambda t: lens_t > t


class Cell:
    """One direction of a recurrent node: its weights, gates and activation functions."""

    def __init__(self, kind: str, w: Tensor, r: Tensor, b: Tensor | None, p: Tensor | None, funcs: list,
                 clip: float | None, coupled: bool):
        self.kind, self.w, self.r, self.p, self.funcs, self.clip = kind, w, r, p, funcs, clip
        self.coupled = coupled  # GRU: linear_before_reset; LSTM: input_forget
        self.hidden = hidden = r.shape[-1]
        gh = GATES[kind] * hidden
        self.wb = None if b is None else b[:gh]
        self.rb = None if b is None else b[gh:]

    def act(self, k: int, x: Tensor, clip: bool = True) -> Tensor:
        return self.funcs[k](x if self.clip is None or not clip else x.clamp(-self.clip, self.clip))

    def project(self, x: Tensor) -> Tensor:
        """X W^T + Wb for every step at once: (T, batch, gates * hidden)."""
        xw = x @ self.w.transpose()
        return xw if self.wb is None else xw + self.wb

    def recur(self, h: Tensor, lo: int, hi: int) -> Tensor:
        """H R^T + Rb for gate rows [lo, hi)."""
        r = self.r[lo:hi]
        out = h @ r.transpose()
        return out if self.rb is None else out + self.rb[lo:hi]

    def step(self, xw: Tensor, h: Tensor, c: Tensor | None) -> tuple[Tensor, Tensor | None]:
        n = self.hidden
        if self.kind == "RNN":
            return self.act(0, xw + self.recur(h, 0, n)), None
        if self.kind == "GRU":
            z = self.act(0, xw[:, :n] + self.recur(h, 0, n))
            r = self.act(0, xw[:, n:2 * n] + self.recur(h, n, 2 * n))
            if self.coupled:
                cand = xw[:, 2 * n:] + r * self.recur(h, 2 * n, 3 * n)
            else:
                cand = xw[:, 2 * n:] + (r * h) @ self.r[2 * n:].transpose() + \
                    (0 if self.rb is None else self.rb[2 * n:])
            cand = self.act(1, cand)
            return (1 - z) * cand + z * h, None
        g = xw + self.recur(h, 0, 4 * n)  # LSTM gates in the order i, o, f, c
        i, o, f, cand = g[:, :n], g[:, n:2 * n], g[:, 2 * n:3 * n], g[:, 3 * n:]
        if self.p is not None:
            i, f = i + self.p[:n] * c, f + self.p[2 * n:] * c
        i = self.act(0, i)
        f = 1 - i if self.coupled else self.act(0, f)
        c_new = f * c + i * self.act(1, cand)
        if self.p is not None:
            o = o + self.p[n:2 * n] * c_new
        return self.act(0, o) * self.act(2, c_new, clip=False), c_new  # h(C) unclipped, as onnxruntime


def _direction(cell: Cell, xw: Tensor, h: Tensor, c: Tensor | None, reverse: bool,
               mask: Callable[[int], Tensor | None]) -> tuple[list[Tensor], Tensor, Tensor | None]:
    """Run one direction over the steps: (Y per step in time order, last H, last C)."""
    steps = xw.shape[0]
    ys: list[Tensor] = [None] * steps  # type: ignore[list-item]
    for t in (range(steps - 1, -1, -1) if reverse else range(steps)):
        h_new, c_new = cell.step(xw[t], h, c)
        m = mask(t)
        if m is None:
            h, c, ys[t] = h_new, c_new, h_new
        else:
            h, ys[t] = m.where(h_new, h), m.where(h_new, 0.0)
            c = None if c is None else m.where(c_new, c)
    started = mask(0)
    if started is not None:  # a sequence of length 0 ends in zero states (as onnxruntime), not the initial ones
        h, c = started.where(h, 0.0), None if c is None else started.where(c, 0.0)
    return ys, h, c


def _recurrent(kind: str, node: Node, x: Tensor, w: Tensor, r: Tensor, b: Tensor | None = None,
               lens: Any = None, h0: Tensor | None = None, c0: Tensor | None = None,
               p: Tensor | None = None) -> tuple:
    direction = node.only("direction", ("forward", "reverse", "bidirectional"), "forward")
    layout = node.only("layout", (0, 1), 0)
    clip = node.attr("clip")
    coupled = {"RNN": lambda: 0, "GRU": lambda: node.only("linear_before_reset", (0, 1), 0),
               "LSTM": lambda: node.only("input_forget", (0, 1), 0)}[kind]()
    dirs = 2 if direction == "bidirectional" else 1
    gates = GATES[kind]
    if w.ndim != 3 or r.ndim != 3 or w.shape[0] != dirs or r.shape[0] != dirs or w.shape[1] % gates:
        raise node.fail(f"W {tuple(w.shape)} and R {tuple(r.shape)} must be ({dirs}, {gates} * hidden_size, ...) "
                        f"for direction={direction!r}")
    hidden = w.shape[1] // gates
    declared = node.attr("hidden_size", hidden)
    if declared != hidden or tuple(r.shape[1:]) != (gates * hidden, hidden):
        raise node.fail(f"hidden_size={declared} does not match W {tuple(w.shape)} and R {tuple(r.shape)}")
    if clip is not None and not clip > 0:
        raise node.unsupported("clip", clip)
    if layout:  # batch first: (batch, T, ...) in and out
        x = x.transpose(0, 1)
        h0 = None if h0 is None else h0.transpose(0, 1)
        c0 = None if c0 is None else c0.transpose(0, 1)
    steps = x.shape[0]
    if not isinstance(steps, int):
        raise node.fail("the sequence length is symbolic; polygrad.onnx unrolls recurrent operators over the "
                        "steps, so give that dimension a fixed size")
    if steps > MAX_STEPS:
        raise node.fail(f"a sequence of {steps} steps is longer than the {MAX_STEPS} polygrad.onnx unrolls; "
                        "split the sequence into shorter chunks")
    funcs = _activations(node, kind, dirs)
    mask = _step_mask(lens, steps)
    ys, hs, cs = [], [], []
    for d in range(dirs):
        cell = Cell(kind, w[d], r[d], None if b is None else b[d], None if p is None else p[d], funcs[d], clip,
                    bool(coupled))
        xw = cell.project(x)
        zero = xw[0][:, :hidden].zeros_like()
        h = zero if h0 is None else h0[d]
        c = (zero if c0 is None else c0[d]) if kind == "LSTM" else None
        y, h, c = _direction(cell, xw, h, c, direction == "reverse" or d == 1, mask)
        ys.append(y)
        hs.append(h)
        cs.append(c)
    y = Tensor.stack([Tensor.stack([ys[d][t] for d in range(dirs)]) for t in range(steps)]) if steps else None
    y_h, y_c = Tensor.stack(hs), Tensor.stack(cs) if kind == "LSTM" else None
    if layout:
        y = None if y is None else y.permute(2, 0, 1, 3)
        y_h = y_h.transpose(0, 1)
        y_c = None if y_c is None else y_c.transpose(0, 1)
    return (y, y_h, y_c) if kind == "LSTM" else (y, y_h)


@op("RNN")
def rnn(node: Node, x: Tensor, w: Tensor, r: Tensor, b: Tensor | None = None, lens: Any = None,
        h0: Tensor | None = None):
    return _recurrent("RNN", node, x, w, r, b, lens, h0)


@op("GRU")
def gru(node: Node, x: Tensor, w: Tensor, r: Tensor, b: Tensor | None = None, lens: Any = None,
        h0: Tensor | None = None):
    return _recurrent("GRU", node, x, w, r, b, lens, h0)


@op("LSTM")
def lstm(node: Node, x: Tensor, w: Tensor, r: Tensor, b: Tensor | None = None, lens: Any = None,
         h0: Tensor | None = None, c0: Tensor | None = None, p: Tensor | None = None):
    return _recurrent("LSTM", node, x, w, r, b, lens, h0, c0, p)
