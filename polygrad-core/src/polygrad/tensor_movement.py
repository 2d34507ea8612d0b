"""Movement of Tensor (a mixin): views (reshape, permute, expand, pad, shrink, flip and their derivatives), padding
modes, joining, splitting, repeating and windows.

Stage: graph construction. Input: Tensors. Output: Tensors whose graphs use only the primitive
movement ops (RESHAPE PERMUTE EXPAND PAD SHRINK FLIP) plus ADD/WHERE, so gradients come for free.
Indexing with tensors, `__setitem__` and scatter live in `tensor_indexing.py` (mixed in here).
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Sequence

from polygrad.dtype import dtypes, least_upper_dtype
from polygrad.errors import DimensionError, InvalidArgumentError
from polygrad.tensor_common import _prod, _resolve_axis, _shape_arg, is_tensor
from polygrad.tensor_indexing import IndexingMixin
from polygrad.uop import movement as mv
from polygrad.uop import sint
from polygrad.uop.shape import ShapeError
from polygrad.uop.ops import UOp

if TYPE_CHECKING:
    from polygrad.tensor import Tensor


def _axis(axis: int, ndim: int) -> int:
    """Normalise a possibly negative axis; a 0-d tensor accepts axes 0 and -1 like PyTorch."""
    n = max(ndim, 1)
    if not -n <= axis < n:
        raise DimensionError(f"dimension {axis} is out of range for a tensor with {ndim} dimensions "
                             f"(expected one in [{-n}, {n - 1}])")
    return axis % n


def _ints(args: Sequence[Any]) -> tuple[int, ...]:
    """Accept f(1, 2), f((1, 2)) and f([1, 2]) alike."""
    if len(args) == 1 and isinstance(args[0], (tuple, list)):
        args = tuple(args[0])
    return tuple(int(a) for a in args)


def _tensor_list(first: Any, rest: Sequence[Any]) -> list["Tensor"]:
    """Operands of cat/stack given as t.cat(a, b), Tensor.cat(a, b) or Tensor.cat([a, b])."""
    items = list(first) if isinstance(first, (list, tuple)) else [first]
    for r in rest:
        items.extend(r if isinstance(r, (list, tuple)) else [r])
    if not items:
        raise InvalidArgumentError("cat/stack need at least one tensor")
    for t in items:
        if not is_tensor(t):
            raise TypeError(f"expected Tensors to join, got {type(t).__name__}; wrap data in Tensor(...) first")
    return items


def _rearrange_side(side: str) -> list[list[str]]:
    """"b (h w) 1 ..." -> [["b"], ["h", "w"], [], ["..."]]: one list of names per axis."""
    groups: list[list[str]] = []
    current: list[str] | None = None
    for tok in side.replace("(", " ( ").replace(")", " ) ").split():
        if tok == "(":
            if current is not None:
                raise InvalidArgumentError(f"rearrange: nested parentheses in {side!r}")
            current = []
        elif tok == ")":
            if current is None:
                raise InvalidArgumentError(f"rearrange: unbalanced ')' in {side!r}")
            groups.append(current)
            current = None
        elif tok == "1":  # a size-1 axis (inside parentheses it changes nothing)
            if current is None:
                groups.append([])
        elif tok == "..." or tok.isidentifier():
            if current is not None:
                current.append(tok)
            else:
                groups.append([tok])
        else:
            raise InvalidArgumentError(f"rearrange: {tok!r} is not an axis name")
    if current is not None:
        raise InvalidArgumentError(f"rearrange: unbalanced '(' in {side!r}")
    return groups


def _expand_ellipsis(groups: list[list[str]], names: list[str]) -> list[list[str]]:
    out: list[list[str]] = []
    for g in groups:
        if g == ["..."]:
            out += [[n] for n in names]
        elif "..." in g:
            i = g.index("...")
            out.append(g[:i] + names + g[i + 1:])
        else:
            out.append(g)
    return out


def shrink_axis(x: "Tensor", axis: int, start: int, stop: int) -> "Tensor":
    """x restricted to [start, stop) along one axis."""
    return x.shrink(tuple((start, stop) if i == axis else None for i in range(x.ndim)))


def pad_axis(x: "Tensor", axis: int, before: int, after: int) -> "Tensor":
    """x padded with zeros along one axis."""
    return x.pad(tuple((before, after) if i == axis else (0, 0) for i in range(x.ndim)))


def move_axis(x: "Tensor", src: int, dst: int) -> "Tensor":
    """Move axis src to position dst, keeping the order of the others."""
    order = [i for i in range(x.ndim) if i != src]
    order.insert(dst, src)
    return x.permute(order)


class MovementMixin(IndexingMixin):
    __slots__ = ()

    # movement
    def reshape(self, *shape: Any) -> "Tensor":
        """New shape with the same elements; one entry may be -1 (inferred), None keeps that dimension."""
        shape = _shape_arg(_keep_none(shape, self.shape), allow_neg=True)
        if shape.count(-1) > 1:
            raise ShapeError(f"reshape {shape}: only one dimension can be -1")
        if any(not isinstance(s, UOp) and s < -1 for s in shape):
            raise ShapeError(f"reshape {shape}: sizes must be >= 0, or -1 for one size to infer")
        if -1 in shape:
            known = _prod(s for s in shape if s != -1)
            numel = self.numel()
            if sint.has_sym((known, numel)):
                rest = 1 if known is numel else sint.sdiv(numel, known)
                if not sint.sym_equal(sint.smul(rest, known), numel):
                    raise ShapeError(f"cannot infer -1 in reshape {shape} of {self.shape}: give every size")
            elif known == 0 or numel % known:
                raise ShapeError(f"cannot reshape {self.shape} to {shape}")
            else:
                rest = numel // known
            shape = tuple(rest if s == -1 else s for s in shape)
        if sint.has_sym(shape) and sint.resolve(_prod(shape)) is None:
            sint.value(_prod(shape))  # an unbound Variable: VariableError says to bind it
        if not sint.sym_equal(_prod(shape), self.numel()):
            raise ShapeError(f"cannot reshape {self.shape} ({self.numel()} elements) to {shape}")
        return self._new(mv.reshape(self.uop, shape))

    view = reshape

    def permute(self, *order: Any) -> "Tensor":
        order = tuple(_resolve_axis(o, self.ndim) for o in _shape_arg(order, allow_neg=True))
        return self._new(mv.permute(self.uop, order))

    def expand(self, *shape: Any) -> "Tensor":
        shape = _shape_arg(_keep_none(shape, (1,) * 0, fill=-1), allow_neg=True)
        if any(not isinstance(s, UOp) and s < -1 for s in shape):
            raise ShapeError(f"expand {shape}: sizes must be >= 0, or -1 to keep a size")
        pad = (1,) * (len(shape) - self.ndim) + self.shape
        shape = tuple(p if s == -1 else s for s, p in zip(shape, pad))
        base = self.reshape(pad) if pad != self.shape else self
        return self._new(mv.expand(base.uop, shape))

    def pad(self, padding: Sequence[Any], mode: str = "constant", value: float = 0.0) -> "Tensor":
        """padding: per-axis ((before, after), ...) or torch-style flat (last axis first); mode 'constant'
        (with value), 'reflect', 'replicate' or 'circular' (tinygrad's and torch's argument order)."""
        flat = list(padding)
        if flat and all(not isinstance(p, (tuple, list)) and p is not None for p in flat):
            if len(flat) % 2 or len(flat) > 2 * self.ndim:
                raise InvalidArgumentError(f"pad: flat padding {tuple(flat)} needs an even number of entries, at most "
                                           f"{2 * self.ndim} (two per dimension, last dimension first)")
            pairs = [(0, 0)] * self.ndim
            for i in range(len(flat) // 2):
                pairs[self.ndim - 1 - i] = (flat[2 * i], flat[2 * i + 1])
        else:
            pairs = [(0, 0) if p is None else tuple(p) for p in flat]
            if len(pairs) != self.ndim or any(len(p) != 2 for p in pairs):
                raise InvalidArgumentError(f"pad: grouped padding {tuple(padding)} needs one (before, after) pair or "
                                           f"None per dimension ({self.ndim})")
        if mode != "constant":
            return self._pad_mode(pairs, mode)
        grow = tuple((max(b, 0), max(a, 0)) for b, a in pairs)
        x = self
        if any(b < 0 or a < 0 for b, a in pairs):
            x = x.shrink(tuple((-min(b, 0), s + min(a, 0)) for (b, a), s in zip(pairs, self.shape)))
        out = x._new(mv.pad(x.uop, grow))
        if value != 0 and any(b or a for b, a in grow):
            mask = type(self).ones(*x.shape, dtype=dtypes.bool, device=x.device)._new(
                mv.pad(type(self).ones(*x.shape, dtype=dtypes.bool, device=x.device).uop, grow))
            out = mask.where(out, value)
        return out

    def shrink(self, bounds: Sequence[Any]) -> "Tensor":
        if len(bounds) != self.ndim:
            raise InvalidArgumentError(f"shrink: {len(bounds)} bounds for a tensor with {self.ndim} dimensions; give "
                                       "one (start, end) pair or None per dimension")
        full = tuple((0, s) if b is None else (b[0], b[1]) for b, s in zip(bounds, self.shape))
        return self._new(mv.shrink(self.uop, full))

    def flip(self, *axis: Any) -> "Tensor":
        named = [_resolve_axis(a, self.ndim) for a in _shape_arg(axis, allow_neg=True)]
        axes = set(named)
        if len(axes) != len(named):
            twice = next(a for a in named if named.count(a) > 1)
            raise DimensionError(f"flip: dims {tuple(axis)} name dimension {twice} more than once")
        return self._new(mv.flip(self.uop, tuple(i in axes for i in range(self.ndim))))

    def transpose(self, dim0: int = 1, dim1: int = 0) -> "Tensor":
        order = list(range(self.ndim))
        a, b = _resolve_axis(dim0, self.ndim), _resolve_axis(dim1, self.ndim)
        order[a], order[b] = order[b], order[a]
        return self.permute(order)

    def pad_to(self, *shape: Any) -> "Tensor":
        """Pad at the end of each dimension up to shape (None keeps a dimension)."""
        shape = _keep_none(shape, self.shape)
        if len(shape) != self.ndim:
            raise ShapeError(f"pad_to: {shape} does not name every dimension of {self.shape}")
        return self.pad(tuple((0, n - s) for s, n in zip(self.shape, shape)))

    def shrink_to(self, *shape: Any) -> "Tensor":
        """Keep the first shape[i] entries of each dimension (None keeps a dimension)."""
        shape = _keep_none(shape, self.shape)
        if len(shape) != self.ndim:
            raise ShapeError(f"shrink_to: {shape} does not name every dimension of {self.shape}")
        return self.shrink(tuple((0, n) for n in shape))

    @property
    def T(self) -> "Tensor":  # noqa: N802
        return self.permute(tuple(reversed(range(self.ndim))))

    def flatten(self, start_dim: int = 0, end_dim: int = -1) -> "Tensor":
        if self.ndim == 0:
            return self.reshape(1)
        s, e = _resolve_axis(start_dim, self.ndim), _resolve_axis(end_dim, self.ndim)
        return self.reshape(self.shape[:s] + (_prod(self.shape[s:e + 1]),) + self.shape[e + 1:])

    def squeeze(self, dim: int | None = None) -> "Tensor":
        if dim is None:
            return self.reshape(tuple(s for s in self.shape if s != 1))
        d = _resolve_axis(dim, self.ndim)  # a 0-d tensor takes dim 0 or -1, as torch
        if self.ndim == 0:
            return self
        return self if self.shape[d] != 1 else self.reshape(self.shape[:d] + self.shape[d + 1:])

    def unsqueeze(self, dim: int) -> "Tensor":
        d = _resolve_axis(dim, self.ndim + 1)
        return self.reshape(self.shape[:d] + (1,) + self.shape[d:])

    # ---------------------------------------------------------------------------------------------
    # shape changes
    def unflatten(self: "Tensor", dim: int, sizes: Sequence[int]) -> "Tensor":
        """Split axis `dim` into `sizes` (one entry may be -1).

        >>> type(self).ones(6).unflatten(0, (2, 3)).shape
        (2, 3)
        """
        d = _axis(dim, self.ndim)
        sizes = tuple(int(s) for s in sizes)
        if not sizes:
            raise ShapeError("unflatten: sizes must be non-empty")
        if sizes.count(-1) > 1:
            raise ShapeError(f"unflatten: only one size can be -1, got {sizes}")
        n = self.shape[d]
        if -1 in sizes:
            known = math.prod(s for s in sizes if s != -1)
            if known == 0 or n % known:
                raise ShapeError(f"unflatten: cannot split a dimension of size {n} into {sizes}")
            sizes = tuple(n // known if s == -1 else s for s in sizes)
        if math.prod(sizes) != n:
            raise ShapeError(f"unflatten: sizes {sizes} multiply to {math.prod(sizes)}, not {n}")
        return self.reshape(self.shape[:d] + sizes + self.shape[d + 1:])

    def _pad_mode(self: "Tensor", pairs: list, mode: str) -> "Tensor":
        """Pad with mode 'reflect', 'replicate' or 'circular' (per-axis (before, after) pairs)."""
        if mode not in ("reflect", "replicate", "circular"):
            raise InvalidArgumentError(f"pad mode must be 'constant', 'reflect', 'replicate' or 'circular', got "
                                       f"{mode!r}")
        pairs = list(pairs) + [(0, 0)] * (self.ndim - len(pairs))
        if len(pairs) > self.ndim:
            raise ShapeError(f"pad: {len(pairs)} axes of padding for a tensor with {self.ndim} dimensions")
        x = self
        for axis, (before, after) in enumerate(pairs):
            before, after = int(before), int(after)
            n = x.shape[axis]
            if n + before + after < (0 if mode == "circular" else 1):
                raise InvalidArgumentError(f"pad: padding {(before, after)} in mode {mode!r} leaves dimension {axis} "
                                           f"of size {n} with {n + before + after} elements; crop less")
            # a negative pad crops, as torch: circular wraps what is left after cropping, reflect and
            # replicate pad the whole dimension and crop after
            crop = (max(-before, 0), max(-after, 0))
            if mode == "circular":
                x = shrink_axis(x, axis, crop[0], n - crop[1])
            x = _pad_one_axis(x, axis, max(before, 0), max(after, 0), mode)
            if mode != "circular":
                x = shrink_axis(x, axis, crop[0], x.shape[axis] - crop[1])
        return x

    def rearrange(self: "Tensor", formula: str, **sizes: int) -> "Tensor":
        """einops-style axis rearrangement: "b c (h w) -> b h w c", "... d -> d ...". Names in parentheses are
        split (sizes given by keyword, one may be inferred) or merged; "()" or "1" is a size-1 axis."""
        if formula.count("->") != 1:
            raise InvalidArgumentError(f"rearrange: formula {formula!r} needs exactly one '->'")
        left, right = (_rearrange_side(side) for side in formula.split("->"))
        flat_l = [n for g in left for n in g]
        flat_r = [n for g in right for n in g]
        if sorted(flat_l) != sorted(flat_r) or len(set(flat_l)) != len(flat_l):
            raise InvalidArgumentError(f"rearrange: {formula!r} must name the same axes once on each side")
        if "..." in flat_l:
            n_ell = self.ndim - (len(left) - 1)
            if n_ell < 0:
                raise ShapeError(f"rearrange: {formula!r} names more axes than the tensor's {self.ndim}")
            ell = [f"...{i}" for i in range(n_ell)]
            left = _expand_ellipsis(left, ell)
            right = _expand_ellipsis(right, ell)
        if len(left) != self.ndim:
            raise ShapeError(f"rearrange: {formula!r} has {len(left)} input axes, the tensor {self.ndim}")
        known: dict[str, int] = {}
        elementary = []
        for group, size in zip(left, self.shape):
            given = [sizes.get(n) for n in group]
            if given.count(None) > 1 and len(group) > 1:
                raise InvalidArgumentError(f"rearrange: give the sizes of all but one of {group} (e.g. {group[0]}=2)")
            rest = math.prod(g for g in given if g is not None)
            for n, g in zip(group, given):
                known[n] = g if g is not None else (size // rest if rest else 0)
            if math.prod(known[n] for n in group) != size:
                raise ShapeError(f"rearrange: axes {group} of sizes {[known[n] for n in group]} do not make {size}")
            elementary += group
        x = self.reshape(tuple(known[n] for n in elementary))
        x = x.permute([elementary.index(n) for g in right for n in g])
        return x.reshape(tuple(math.prod(known[n] for n in g) for g in right))

    def roll(self: "Tensor", shifts: Any, dims: Any = None) -> "Tensor":
        """Shift elements along `dims`, wrapping around; with dims=None the flat tensor rolls."""
        if dims is None:
            return self.flatten().roll(shifts, 0).reshape(self.shape)
        shifts = (shifts,) if isinstance(shifts, int) else tuple(shifts)
        dims = (dims,) if isinstance(dims, int) else tuple(dims)
        if len(shifts) != len(dims):
            raise InvalidArgumentError(f"roll: shifts {shifts} and dims {dims} must have the same length")
        x = self
        for s, d in zip(shifts, dims):
            d = _axis(d, x.ndim)
            n = x.shape[d]
            if n == 0 or s % n == 0:
                continue
            s %= n
            x = MovementMixin.cat(shrink_axis(x, d, n - s, n), shrink_axis(x, d, 0, n - s), dim=d)
        return x

    def repeat(self: "Tensor", *repeats: Any) -> "Tensor":
        """Tile the tensor `repeats[i]` times along each axis (PyTorch type(self).repeat).

        >>> type(self)([1, 2]).repeat(2).tolist()
        [1, 2, 1, 2]
        """
        reps = _ints(repeats)
        if len(reps) < self.ndim:
            raise ShapeError(f"repeat: {len(reps)} repeat counts for a tensor with {self.ndim} dimensions; "
                             "give at least one per dimension")
        if any(r < 0 for r in reps):
            raise InvalidArgumentError(f"repeat counts must be non-negative, got {reps}")
        base = (1,) * (len(reps) - self.ndim) + self.shape
        x = self.reshape(base)
        x = x.reshape(tuple(v for s in base for v in (1, s)))
        x = x.expand(tuple(v for r, s in zip(reps, base) for v in (r, s)))
        return x.reshape(tuple(r * s for r, s in zip(reps, base)))

    def repeat_interleave(self: "Tensor", repeats: Any, dim: int | None = None) -> "Tensor":
        """Repeat each element `repeats` times along `dim` (flattened when dim is None).

        >>> type(self)([1, 2]).repeat_interleave(2).tolist()
        [1, 1, 2, 2]
        """
        x = self.flatten() if dim is None else self
        d = 0 if dim is None else _axis(dim, x.ndim)
        if x.ndim == 0:
            x = x.reshape(1)
        if isinstance(repeats, type(self)) and repeats.numel() == 1:
            repeats = int(repeats.item())
        if isinstance(repeats, int):
            if repeats < 0:
                raise InvalidArgumentError(f"repeat_interleave: repeats must be non-negative, got {repeats}")
            y = x.unsqueeze(d + 1)
            y = y.expand(y.shape[:d + 1] + (repeats,) + y.shape[d + 2:])
            return y.flatten(d, d + 1)
        counts = [int(r) for r in (repeats.tolist() if isinstance(repeats, type(self)) else repeats)]
        if len(counts) != x.shape[d] or any(c < 0 for c in counts):
            raise InvalidArgumentError(f"repeat_interleave: need {x.shape[d]} non-negative repeat counts along dim "
                                       f"{d}, got {counts}")
        # the output length depends on the counts, so they are read on the host (as in PyTorch)
        index = [i for i, c in enumerate(counts) for _ in range(c)]
        return x.index_select(d, type(self)(index, device=x.device, _runtime=x._runtime))

    # ---------------------------------------------------------------------------------------------
    # joining and splitting
    def cat(self: Any = (), *args: Any, dim: int = 0) -> "Tensor":
        """Concatenate along an existing axis: `a.cat(b, c, dim=1)`, `type(self).cat(a, b)` or `type(self).cat([a, b])`.

        >>> type(self).cat(type(self)([1]), type(self)([2, 3])).tolist()
        [1, 2, 3]
        """
        tensors = _tensor_list(self, args)
        if any(t.ndim == 0 for t in tensors):
            raise ShapeError("cat: zero-dimensional tensors cannot be concatenated; unsqueeze them or use stack")
        # PyTorch still skips legacy empty 1-d tensors when joining higher-dimensional ones
        if any(t.ndim > 1 for t in tensors):
            tensors = [t for t in tensors if not (t.ndim == 1 and t.shape[0] == 0)] or tensors[:1]
        first = tensors[0]
        d = _axis(dim, first.ndim)
        for t in tensors[1:]:
            if t.ndim != first.ndim or any(a != b for i, (a, b) in enumerate(zip(t.shape, first.shape)) if i != d):
                raise ShapeError(f"cat: shapes {first.shape} and {t.shape} differ outside dimension {d}")
        dt = least_upper_dtype(*[t.dtype for t in tensors])
        if len(tensors) == 1:
            return tensors[0].cast(dt)
        total = sum(t.shape[d] for t in tensors)
        out, offset = None, 0
        for t in tensors:
            piece = pad_axis(t.cast(dt), d, offset, total - offset - t.shape[d])
            offset += t.shape[d]
            out = piece if out is None else (out | piece if dt.name == "bool" else out + piece)
        return out

    def stack(self: Any = (), *args: Any, dim: int = 0) -> "Tensor":
        """Join tensors of one shape along a new axis: `a.stack(b, dim=0)` or `type(self).stack([a, b])`."""
        tensors = _tensor_list(self, args)
        shape = tensors[0].shape
        for t in tensors[1:]:
            if t.shape != shape:
                raise ShapeError(f"stack: every tensor needs the same shape, got {shape} and {t.shape}")
        d = _axis(dim, len(shape) + 1)
        return MovementMixin.cat([t.unsqueeze(d) for t in tensors], dim=d)

    def split(self: "Tensor", sizes: Any, dim: int = 0) -> tuple["Tensor", ...]:
        """Split into pieces of `sizes` (an int: equal pieces, the last may be smaller; a list: exact sizes)."""
        d = _axis(dim, self.ndim)
        n = self.shape[d] if self.ndim else 1
        if isinstance(sizes, int):
            if sizes <= 0 and not (sizes == 0 and n == 0):
                raise InvalidArgumentError(f"split: split size must be positive, got {sizes}")
            sizes = [min(sizes, n - i) for i in range(0, n, sizes)] if n else [0]
        sizes = [int(s) for s in sizes]
        if sum(sizes) != n or any(s < 0 for s in sizes):
            raise InvalidArgumentError(f"split: sizes {sizes} must be non-negative and sum to {n}, the size of dim {d}")
        out, start = [], 0
        for s in sizes:
            out.append(shrink_axis(self, d, start, start + s))
            start += s
        return tuple(out)

    def chunk(self: "Tensor", chunks: int, dim: int = 0) -> tuple["Tensor", ...]:
        """Split into at most `chunks` pieces of ceil(size / chunks) (like torch.chunk)."""
        if chunks <= 0:
            raise InvalidArgumentError(f"chunk: chunks must be positive, got {chunks}")
        d = _axis(dim, self.ndim)
        n = self.shape[d]
        if n == 0:
            return tuple(self for _ in range(chunks))
        return self.split(-(-n // chunks), dim=d)

    # ---------------------------------------------------------------------------------------------
    # windows
    def _pool(self: "Tensor", kernel: Sequence[int], stride: Any = 1, dilation: Any = 1) -> "Tensor":
        """Sliding windows over the last len(kernel) axes: (..., *spatial) -> (..., *out, *kernel).

        One view (repeat + shrink + reshape), so the consumer fuses it into a single kernel.
        """
        k_ = tuple(int(k) for k in kernel)
        nk = len(k_)
        s_ = _tuple(stride, nk, "stride")
        d_ = _tuple(dilation, nk, "dilation")
        if self.ndim < nk:
            raise ShapeError(f"cannot take {nk}-d windows of a tensor with shape {self.shape}")
        if any(k <= 0 for k in k_) or any(s <= 0 for s in s_) or any(d <= 0 for d in d_):
            raise InvalidArgumentError(f"kernel {k_}, stride {s_} and dilation {d_} must all be positive")
        batch, i_ = self.shape[:-nk], self.shape[-nk:]
        nb = len(batch)
        if any(d * (k - 1) + 1 > i for k, d, i in zip(k_, d_, i_)):
            raise ShapeError(f"kernel {k_} with dilation {d_} is larger than the input {i_} (after padding)")
        o_ = [-(-(i - d * (k - 1)) // s) for i, d, k, s in zip(i_, d_, k_, s_)]
        keep = [(0, b) for b in batch]
        if all(k <= s for k, s in zip(k_, s_)) and all(d == 1 for d in d_):
            x = self.pad(tuple([(0, 0)] * nb + [(0, max(0, o * s - i)) for i, o, s in zip(i_, o_, s_)]))
            x = x.shrink(tuple(keep + [(0, o * s) for o, s in zip(o_, s_)]))
            x = x.reshape(batch + tuple(v for o, s in zip(o_, s_) for v in (o, s)))
            x = x.shrink(tuple(keep + [b for o, k in zip(o_, k_) for b in ((0, o), (0, k))]))
            return x.permute(*range(nb), *[nb + 2 * i for i in range(nk)], *[nb + 2 * i + 1 for i in range(nk)])
        # repeat each axis so that window j starts at offset j*(i*f+d) -> reshape gives the dilation
        f_ = [1 + int(o * s > i - d * (k - 1)) for o, s, i, d, k in zip(o_, s_, i_, d_, k_)]
        x = self.repeat([1] * nb + [-(-k * (i * f + d) // i) for k, i, d, f in zip(k_, i_, d_, f_)])
        x = x.shrink(tuple(keep + [(0, k * (i * f + d)) for k, i, d, f in zip(k_, i_, d_, f_)]))
        x = x.reshape(batch + tuple(v for k, i, d, f in zip(k_, i_, d_, f_) for v in (k, i * f + d)))
        x = x.shrink(tuple(keep + [b for k, o, s in zip(k_, o_, s_) for b in ((0, k), (0, o * s))]))
        x = x.reshape(batch + tuple(v for k, o, s in zip(k_, o_, s_) for v in (k, o, s)))
        x = x.shrink(tuple(keep + [b for k, o in zip(k_, o_) for b in ((0, k), (0, o), (0, 1))]))
        x = x.reshape(batch + tuple(v for k, o in zip(k_, o_) for v in (k, o)))
        return x.permute(*range(nb), *[nb + 2 * i + 1 for i in range(nk)], *[nb + 2 * i for i in range(nk)])

    def unfold(self: "Tensor", dimension: int | None = None, size: int | None = None, step: int | None = None,
               dim: int | None = None) -> "Tensor":
        """All windows of `size` along `dimension`, `step` apart, as a new last axis (torch.Tensor.unfold).

        >>> type(self)([1, 2, 3, 4]).unfold(0, 2, 2).tolist()
        [[1, 2], [3, 4]]
        """
        dimension = dim if dimension is None else dimension  # tinygrad's keyword is dim
        if dimension is None or size is None or step is None:
            raise TypeError("unfold needs dimension (or dim), size and step")
        if step <= 0:
            raise InvalidArgumentError(f"unfold: step must be positive, got {step}")
        if self.ndim == 0:
            if size > 1:
                raise ShapeError(f"unfold: size {size} is larger than the 0-d tensor's 1 element")
            return self.reshape(1)
        d = _axis(dimension, self.ndim)
        n = self.shape[d]
        if size < 0 or size > n:
            raise ShapeError(f"unfold: size {size} must be in [0, {n}] (the size of dimension {d})")
        x = move_axis(self, d, self.ndim - 1)
        if size == 0:
            empty = shrink_axis(x, x.ndim - 1, 0, 0).reshape(x.shape[:-1] + (1, 0))
            w = empty.expand(x.shape[:-1] + (n // step + 1, 0))
        else:
            w = x._pool((size,), step)
        return move_axis(w, w.ndim - 2, d)

    def diagonal(self: "Tensor", offset: int = 0, dim1: int = 0, dim2: int = 1) -> "Tensor":
        """The diagonal of the (dim1, dim2) planes as a new last axis (torch.diagonal)."""
        if self.ndim < 2:
            raise ShapeError(f"diagonal needs at least 2 dimensions, got shape {self.shape}")
        a1, a2 = _axis(dim1, self.ndim), _axis(dim2, self.ndim)
        if a1 == a2:
            raise InvalidArgumentError(f"diagonal: dim1 and dim2 must differ, both are {a1}")
        rest = [i for i in range(self.ndim) if i not in (a1, a2)]
        x = self.permute(rest + [a1, a2])
        rows, cols = x.shape[-2], x.shape[-1]
        r0, c0 = (0, offset) if offset >= 0 else (-offset, 0)
        m = max(0, min(rows - r0, cols - c0))
        batch = x.shape[:-2]
        if m == 0:
            return x.shrink(tuple([None] * len(batch) + [(0, 0), (0, 0)])).reshape(batch + (0,))
        x = x.shrink(tuple([None] * len(batch) + [(r0, r0 + m), (c0, c0 + m)])).reshape(batch + (m * m,))
        x = pad_axis(x, len(batch), 0, m).reshape(batch + (m, m + 1))
        return shrink_axis(x, len(batch) + 1, 0, 1).reshape(batch + (m,))

    def diag(self: "Tensor", diagonal: int = 0) -> "Tensor":
        """1-d input: a square matrix with it on a diagonal; 2-d input: that diagonal (torch.diag)."""
        if self.ndim == 2:
            return self.diagonal(diagonal)
        if self.ndim != 1:
            raise ShapeError(f"diag needs a 1-d or 2-d tensor, got shape {self.shape}")
        n = self.shape[0]
        eye = _arange(n, self).unsqueeze(1).eq(_arange(n, self))
        m = eye.where(self.unsqueeze(1).expand(n, n), self.zeros_like().unsqueeze(1).expand(n, n))
        k = abs(diagonal)
        return m.pad(((0, k), (k, 0)) if diagonal >= 0 else ((k, 0), (0, k)))

    def tril(self: "Tensor", diagonal: int = 0) -> "Tensor":
        """Keep the lower triangle (row + diagonal >= col) of the last two axes, zero the rest."""
        return _triangle(self, diagonal, lower=True)

    def triu(self: "Tensor", diagonal: int = 0) -> "Tensor":
        """Keep the upper triangle (col >= row + diagonal) of the last two axes, zero the rest."""
        return _triangle(self, diagonal, lower=False)


# -------------------------------------------------------------------------------------------------
def _tuple(v: Any, n: int, what: str) -> tuple[int, ...]:
    if isinstance(v, int):
        return (v,) * n
    v = tuple(int(a) for a in v)
    if len(v) != n:
        raise InvalidArgumentError(f"{what} {v} needs {n} entries, one per spatial dimension")
    return v


def _arange(n: int, like: "Tensor") -> "Tensor":
    return type(like).arange(n, device=like.device, dtype=dtypes.int32)


def _triangle(x: "Tensor", diagonal: int, lower: bool) -> "Tensor":
    if x.ndim < 2:
        raise ShapeError(f"{'tril' if lower else 'triu'} needs at least 2 dimensions, got shape {x.shape}")
    rows, cols = x.shape[-2], x.shape[-1]
    if rows == 0 or cols == 0:
        return x
    r = _arange(rows, x).unsqueeze(1) + diagonal
    c = _arange(cols, x).unsqueeze(0)
    keep = (r >= c) if lower else (c >= r)
    return keep.where(x, x.zeros_like())


def _pad_one_axis(x: "Tensor", axis: int, before: int, after: int, mode: str) -> "Tensor":
    if not (before or after):
        return x
    n = x.shape[axis]
    if mode == "reflect":
        if before >= n or after >= n:
            raise InvalidArgumentError(f"reflect padding ({before}, {after}) must be smaller than the dimension size "
                                       f"{n}")
        left = shrink_axis(x, axis, 1, before + 1).flip(axis)
        right = shrink_axis(x, axis, n - 1 - after, n - 1).flip(axis)
    elif mode == "replicate":
        if n == 0:
            raise InvalidArgumentError("replicate padding needs a non-empty dimension")
        first, last = shrink_axis(x, axis, 0, 1), shrink_axis(x, axis, n - 1, n)
        left = first.expand(tuple(before if i == axis else s for i, s in enumerate(first.shape)))
        right = last.expand(tuple(after if i == axis else s for i, s in enumerate(last.shape)))
    else:
        if before > n or after > n:
            raise InvalidArgumentError(f"circular padding ({before}, {after}) can wrap at most once; the dimension "
                                       f"has {n}")
        left = shrink_axis(x, axis, n - before, n)
        right = shrink_axis(x, axis, 0, after)
    return MovementMixin.cat(left, x, right, dim=axis)


def _keep_none(shape: Any, current: tuple, fill: Any = None) -> tuple:
    """A shape argument whose None entries mean "keep this dimension" (tinygrad): None at position i becomes
    current[i], or `fill` when given (expand's -1, aligned from the right)."""
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        shape = tuple(shape[0])
    if not any(s is None for s in shape):
        return tuple(shape)
    if fill is not None:
        return tuple(fill if s is None else s for s in shape)
    if any(s is None for s in shape[len(current):]):
        raise ShapeError(f"reshape {tuple(shape)}: None keeps a dimension, but the tensor has only {len(current)}")
    return tuple(current[i] if s is None else s for i, s in enumerate(shape))
