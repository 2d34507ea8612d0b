"""Random tensor programs mirrored in NumPy: the generator behind the long randomized tests.

`run_program(seed, n_ops, device)` keeps a pool of live values (a polygrad Tensor and the NumPy array it
must equal), applies `n_ops` random operations (creation, elementwise math, broadcasting, reductions,
movement, indexing, gather, matmul, concatenation, casts, in-place assigns, gradients), realizes and
compares at random points, and lets old values die (so buffers are freed and reused while others are
still lazy). Any mismatch raises AssertionError naming the seed, the step and the expression.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from polygrad import Context, Tensor, dtypes

SHAPES = [(3, 4, 5), (4, 5), (5,), (2, 3, 4, 5), (1, 5), (60,), (3, 1, 5)]
FLOAT_TOL = dict(rtol=2e-4, atol=2e-5)  # plus an absolute part scaled by the array's magnitude (cumsums)


@dataclass
class Value:
    t: Tensor
    ref: np.ndarray
    expr: str
    viewed: bool = False  # some pool value is a view of this one's buffer: no assigns into it


def _atol(want: np.ndarray) -> float:
    finite = np.abs(want[np.isfinite(want)]) if want.dtype.kind == "f" else np.abs(want)
    return FLOAT_TOL["atol"] * (1 + (float(finite.max()) if finite.size else 0.0))


def _close(got: np.ndarray, want: np.ndarray) -> bool:
    if got.shape != want.shape:
        return False
    if want.dtype.kind == "f":
        return bool(np.allclose(got, want, equal_nan=True, rtol=FLOAT_TOL["rtol"], atol=_atol(want)))
    return bool(np.array_equal(got, want))


class Program:
    def __init__(self, seed: int, device: str):
        self.rng = np.random.default_rng(seed)
        self.seed, self.device = seed, device
        self.pool: list[Value] = []
        self.step = 0
        self.checked = 0

    # ---- helpers
    def pick(self, pred: Callable[[Value], bool] = lambda v: True) -> Value | None:
        cands = [v for v in self.pool if pred(v)]
        return cands[self.rng.integers(len(cands))] if cands else None

    def new(self, t: Tensor, ref: np.ndarray, expr: str) -> Value:
        v = Value(t, np.asarray(ref), expr)
        base = _view_base(t)
        for other in self.pool:  # aliases (a view, a no-op cast: the same graph) are never assigned into
            if other.t.uop is t.uop or (base is not None and _view_base(other.t) is base):
                other.viewed = v.viewed = True
        self.pool.append(v)
        if len(self.pool) > 12:  # old values die: their buffers go back to the allocator
            self.check(self.pool.pop(int(self.rng.integers(0, 6))))
        if self.rng.random() < 0.35:
            self.check(v)
        return v

    def check(self, v: Value) -> None:
        got = v.t.numpy()
        self.checked += 1
        if not _close(got, v.ref):
            same = got.shape == v.ref.shape
            bad = np.argwhere(~np.isclose(got.astype(np.float64), v.ref.astype(np.float64), equal_nan=True,
                                          rtol=FLOAT_TOL["rtol"], atol=_atol(v.ref))) if same else []
            where = f" first bad at {tuple(bad[0])}: {got[tuple(bad[0])]!r} != {v.ref[tuple(bad[0])]!r}" \
                if len(bad) else f" shapes {got.shape} vs {v.ref.shape}"
            raise AssertionError(f"seed {self.seed} step {self.step} on {self.device}: {v.expr}{where} "
                                 f"({len(bad)} elements differ)")

    def data(self, shape: tuple[int, ...], kind: str) -> np.ndarray:
        if kind == "f":
            return self.rng.standard_normal(shape).astype(np.float32)
        if kind == "i":
            return self.rng.integers(-20, 20, shape).astype(np.int32)
        return self.rng.random(shape) < 0.5

    # ---- operations: each returns False when it does not apply to the pool's values
    def op_create(self) -> bool:
        shape = SHAPES[self.rng.integers(len(SHAPES))]
        kind = "ffib"[self.rng.integers(4)]
        how = self.rng.integers(4)
        if how == 0 or kind == "b":
            a = self.data(shape, kind)
            self.new(Tensor(a, device=self.device), a, f"Tensor({a.dtype}{shape})")
        elif how == 1:
            c = float(self.rng.integers(-3, 4)) if kind == "f" else int(self.rng.integers(-3, 4))
            dt = dtypes.float32 if kind == "f" else dtypes.int32
            ref = np.full(shape, c, np.float32 if kind == "f" else np.int32)
            self.new(Tensor.full(shape, c, dtype=dt, device=self.device), ref, f"full({shape}, {c})")
        elif how == 2:
            n = int(np.prod(shape))
            ref = np.arange(n, dtype=np.int32 if kind == "i" else np.float32).reshape(shape)
            dt = dtypes.int32 if kind == "i" else dtypes.float32
            self.new(Tensor.arange(n, dtype=dt, device=self.device).reshape(shape), ref, f"arange({n})")
        else:
            ref = np.eye(shape[-1], dtype=np.float32)
            self.new(Tensor.eye(shape[-1], device=self.device), ref, f"eye({shape[-1]})")
        return True

    def op_unary(self) -> bool:
        v = self.pick(lambda v: v.ref.dtype.kind == "f")
        if v is None:
            return False
        name, f, g = [("neg", lambda t: -t, lambda a: -a),
                      ("relu", lambda t: t.relu(), lambda a: np.maximum(a, 0)),
                      ("exp", lambda t: (t * 0.5).exp(), lambda a: np.exp(a * np.float32(0.5))),
                      ("tanh", lambda t: t.tanh(), np.tanh),
                      ("sigmoid", lambda t: t.sigmoid(), lambda a: 1 / (1 + np.exp(-a))),
                      ("abs", lambda t: t.abs(), np.abs),
                      ("sqrt_abs", lambda t: t.abs().sqrt(), lambda a: np.sqrt(np.abs(a))),
                      ("log1p_abs", lambda t: (t.abs() + 1).log(), lambda a: np.log(np.abs(a) + 1)),
                      ("sin", lambda t: t.sin(), np.sin),
                      ("square", lambda t: t.square(), np.square)][self.rng.integers(10)]
        with np.errstate(all="ignore"):
            self.new(f(v.t), g(v.ref).astype(v.ref.dtype), f"{name}({v.expr})")
        return True

    def op_binary(self) -> bool:
        a = self.pick(lambda v: v.ref.dtype.kind in "fi")
        if a is None:
            return False
        b = self.pick(lambda v: v.ref.dtype == a.ref.dtype and _broadcastable(v.ref.shape, a.ref.shape))
        if b is None:
            return False
        ops = [("+", lambda x, y: x + y, np.add), ("*", lambda x, y: x * y, np.multiply),
               ("-", lambda x, y: x - y, np.subtract), ("max", lambda x, y: x.maximum(y), np.maximum)]
        if a.ref.dtype.kind == "i":  # comparisons of floats computed two ways would flip at near-ties
            ops += [("<", lambda x, y: x < y, np.less), ("==", lambda x, y: x == y, np.equal)]
            ops.append(("//", lambda x, y: x // y, lambda p, q: p // np.where(q == 0, 1, q)))
            ops.append(("%", lambda x, y: x % y, lambda p, q: p % np.where(q == 0, 1, q)))
        else:
            ops.append(("/", lambda x, y: x / (y.abs() + 1), lambda p, q: p / (np.abs(q) + 1)))
        name, f, g = ops[self.rng.integers(len(ops))]
        with np.errstate(all="ignore"):
            self.new(f(a.t, b.t), g(a.ref, b.ref), f"({a.expr} {name} {b.expr})")
        return True

    def op_where(self) -> bool:
        c = self.pick(lambda v: v.ref.dtype == np.bool_)
        x = self.pick(lambda v: v.ref.dtype.kind == "f" and c is not None and _broadcastable(v.ref.shape, c.ref.shape))
        if c is None or x is None:
            return False
        self.new(c.t.where(x.t, 0.5), np.where(c.ref, x.ref, np.float32(0.5)), f"where({c.expr}, {x.expr}, 0.5)")
        return True

    def op_reduce(self) -> bool:
        v = self.pick(lambda v: v.ref.dtype.kind in "fi" and v.ref.ndim >= 1)
        if v is None:
            return False
        axis = int(self.rng.integers(v.ref.ndim))
        keep = bool(self.rng.integers(2))
        name = ["sum", "max", "min", "mean"][self.rng.integers(4)]
        if name == "mean" and v.ref.dtype.kind != "f":
            name = "sum"
        t = getattr(v.t, name)(axis, keepdim=keep)
        ref = getattr(np, name)(v.ref, axis=axis, keepdims=keep)
        self.new(t, ref.astype(ref.dtype if v.ref.dtype.kind == "f" else v.ref.dtype), f"{name}({v.expr}, {axis})")
        return True

    def op_movement(self) -> bool:
        v = self.pick(lambda v: v.ref.ndim >= 1)
        if v is None:
            return False
        a, kind = v.ref, self.rng.integers(6)
        if kind == 0:
            t, r, e = v.t.reshape(-1), a.reshape(-1), "flat"
        elif kind == 1:
            order = tuple(int(i) for i in self.rng.permutation(a.ndim))
            t, r, e = v.t.permute(order), a.transpose(order), f"permute{order}"
        elif kind == 2:
            ax = int(self.rng.integers(a.ndim))
            t, r, e = v.t.flip(ax), np.flip(a, ax), f"flip{ax}"
        elif kind == 3:
            ax = int(self.rng.integers(a.ndim))
            pads = tuple((1, 2) if i == ax else (0, 0) for i in range(a.ndim))
            t, r, e = v.t.pad(pads), np.pad(a, pads), f"pad{ax}"
        elif kind == 4:
            sl = tuple(slice(1, None, 2) if s > 2 else slice(None) for s in a.shape)
            t, r, e = v.t[sl], a[sl], "stride2"
        else:
            t, r, e = v.t.unsqueeze(0).expand(2, *a.shape), np.broadcast_to(a, (2, *a.shape)), "expand"
        v.viewed = True
        self.new(t, np.ascontiguousarray(r), f"{e}({v.expr})").viewed = True  # a view aliases v's memory
        return True

    def op_gather(self) -> bool:
        v = self.pick(lambda v: v.ref.ndim >= 2 and v.ref.dtype.kind in "fi")
        if v is None:
            return False
        dim = int(self.rng.integers(v.ref.ndim))
        idx = self.rng.integers(0, v.ref.shape[dim], v.ref.shape).astype(np.int32)
        self.new(v.t.gather(dim, Tensor(idx, device=self.device)), np.take_along_axis(v.ref, idx, dim),
                 f"gather({v.expr}, {dim})")
        return True

    def op_index(self) -> bool:
        v = self.pick(lambda v: v.ref.ndim >= 1 and v.ref.shape[0] > 1)
        if v is None:
            return False
        rows = [int(i) for i in self.rng.integers(0, v.ref.shape[0], 3)]
        self.new(v.t[rows], v.ref[rows], f"{v.expr}[{rows}]")
        return True

    def op_matmul(self) -> bool:
        a = self.pick(lambda v: v.ref.ndim == 2 and v.ref.dtype.kind == "f")
        if a is None:
            return False
        b = self.data((a.ref.shape[1], int(self.rng.integers(1, 7))), "f")
        bt = Tensor(b, device=self.device)
        self.new(a.t @ bt, (a.ref.astype(np.float64) @ b).astype(np.float32), f"({a.expr} @ w)")
        return True

    def op_cat(self) -> bool:
        a = self.pick(lambda v: v.ref.ndim >= 1)
        if a is None:
            return False
        b = self.pick(lambda v: v.ref.ndim >= 1 and v.ref.shape[1:] == a.ref.shape[1:] and v.ref.dtype == a.ref.dtype)
        self.new(a.t.cat(b.t, dim=0), np.concatenate([a.ref, b.ref], 0), f"cat({a.expr}, {b.expr})")
        return True

    def op_cast(self) -> bool:
        v = self.pick()
        # float to int/bool truncates: a value computed two ways may sit on either side of the cut
        targets = ["float32"] if v.ref.dtype.kind == "f" else ["float32", "int32", "bool"]
        target = targets[self.rng.integers(len(targets))]
        self.new(v.t.cast(target), v.ref.astype(target), f"{v.expr}.cast({target})")
        return True

    def op_softmax(self) -> bool:
        v = self.pick(lambda v: v.ref.dtype.kind == "f" and v.ref.ndim >= 1)
        if v is None:
            return False
        e = np.exp(v.ref - v.ref.max(-1, keepdims=True))
        self.new(v.t.softmax(-1), e / e.sum(-1, keepdims=True), f"softmax({v.expr})")
        return True

    def op_cumsum(self) -> bool:
        v = self.pick(lambda v: v.ref.dtype.kind == "f" and v.ref.ndim >= 1)
        if v is None:
            return False
        self.new(v.t.cumsum(-1), np.cumsum(v.ref, -1, dtype=np.float32), f"cumsum({v.expr})")
        return True

    def op_assign(self) -> bool:
        v = self.pick(lambda v: not v.viewed and v.ref.dtype.kind == "f")
        if v is None:
            return False
        v.t.realize()
        new = self.data(v.ref.shape, "f")
        v.t.assign(Tensor(new, device=self.device) + v.t)  # reads the old value
        v.ref = new + v.ref
        if self.rng.random() < 0.5:
            v.t.realize()
        return True

    def op_grad(self) -> bool:
        v = self.pick(lambda v: v.ref.dtype.kind == "f" and v.ref.size <= 200)
        if v is None:
            return False
        x = Tensor(v.ref, device=self.device, requires_grad=True)
        kind = self.rng.integers(3)
        if kind == 0:
            (x * x).sum().backward()
            want = 2 * v.ref
        elif kind == 1:
            x.relu().mean().backward()
            want = (v.ref > 0).astype(np.float32) / v.ref.size
        else:
            x.tanh().sum().backward()
            # in float64: in float32 tanh(10) rounds to 1 and the reference's cancellation gives 0, where
            # the true value (8.2e-9, which polygrad computes) survives a later sqrt as 9e-5
            want = 1 - np.tanh(v.ref.astype(np.float64)) ** 2
        self.new(x.grad, want.astype(np.float32), f"grad{kind}({v.expr})")
        return True

    OPS = ["op_create", "op_unary", "op_binary", "op_binary", "op_where", "op_reduce", "op_movement",
           "op_gather", "op_index", "op_matmul", "op_cat", "op_cast", "op_softmax", "op_cumsum", "op_assign",
           "op_grad"]

    def run(self, n_ops: int, names: list[str] | None = None) -> int:
        """Apply n_ops random operations (or the given op names in order; one that does not apply to
        the pool is skipped), then compare every value still alive."""
        with Context(TRAINING=0):
            for _ in range(3):
                self.op_create()
            if names is not None:
                for name in names:
                    self.step += bool(getattr(self, name)())
            while names is None and self.step < n_ops:
                name = self.OPS[self.rng.integers(len(self.OPS))]
                if getattr(self, name)():
                    self.step += 1
            for v in self.pool:
                self.check(v)
        return self.checked


def _view_base(t: Tensor):
    """The Buffer a tensor is a pure view of (movement ops down to it), else None."""
    from polygrad.uop.ops import MOVEMENT, Ops
    u = t.uop
    while u.op in MOVEMENT:
        u = u.src[0]
    return u.arg if u.op is Ops.BUFFER else None


def _broadcastable(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    try:
        np.broadcast_shapes(a, b)
    except ValueError:
        return False
    return True


def run_program(seed: int, n_ops: int, device: str, names: list[str] | None = None) -> int:
    """Run one random program (or the op names given, in order); returns how many values were compared."""
    return Program(seed, device).run(n_ops, names)


