"""Singular value decomposition (torch.linalg.svd), composed from tensor ops like polygrad.linalg.

Stage: graph construction (with eager factorisation). Input: a float tensor (..., m, n). Output: U, S, Vh
tensors whose values come from a detached factorisation and whose gradients come from tensor ops.

1. The factorisation is one-sided Jacobi (Hestenes) in float64 on the tall orientation of A (a wide A is
   factored through A^T): columns are rotated in pairs until they are mutually orthogonal; their norms
   are the singular values and the accumulated rotations are V, with the relative accuracy Jacobi is
   known for. Each round rotates n/2 disjoint pairs at once and then moves the columns one seat along a
   round-robin tournament, so n - 1 rounds (a sweep) meet every pair and every round is the same
   program: it is scheduled once per shape and replayed with new buffers (linalg._Replay). After each
   sweep one readback decides whether the columns are orthogonal to working precision.
2. Columns of U for zero singular values, and the extra columns of full_matrices=True, complete U to an
   orthonormal basis: the same Jacobi factors the projector I - U_r U_r^T, whose unit-norm columns span
   the complement.
3. A differentiable wrapper adds first-order terms in dA = A - A.detach() (exactly zero in value) that give
   the gradients of Townsend's "Differentiating the singular value decomposition" (2016), as torch's:
   dS = diag(U^T dA V), dU = U (F o (G S + S G^T)) + (I - U U^T) dA V S^-1, dV = V (F o (S G + G^T S)),
   with G = U^T dA V and F_ij = 1 / (s_j^2 - s_i^2). Where that is infinite (repeated or zero singular
   values) the term is left out, so values stay finite; torch's gradients are inf or NaN there. As in
   torch, the extra columns of full_matrices=True (an arbitrary basis of the complement) get no gradient.
"""
from __future__ import annotations

from polygrad.dtype import dtypes
from polygrad.errors import LinAlgError
from polygrad.linalg import (_as_tensor_of, _buffer_of, _diagonal, _eye, _host_any, _mT, _replay, _require_matrix,
                             _work_dtype)
from polygrad.tensor import Tensor

EPS64 = 2.0 ** -52
MAX_SWEEPS = 60  # Jacobi converges quadratically: float64 needs about 6-12 sweeps


def _rotate_pairs(x: Tensor, c: Tensor, s: Tensor) -> tuple[Tensor, Tensor]:
    """Rotate the column pairs (2i, 2i+1) of (B, r, n) by (c, s) of shape (B, n/2): (first, second) columns."""
    b, r, n = x.shape
    pairs = x.reshape(b, r, n // 2, 2)
    p, q = pairs[..., 0], pairs[..., 1]
    c, s = c.reshape(b, 1, n // 2), s.reshape(b, 1, n // 2)
    return c * p - s * q, s * p + c * q


def _next_seats(p: Tensor, q: Tensor) -> Tensor:
    """Interleave the rotated pairs back to (B, r, n), every column but the first moved one seat around the
    round-robin circle: the new pairs are (t0, b0), (b0', t1)... of the circle method."""
    h = p.shape[-1]
    if h > 1:
        top = [p[..., :1], q[..., :1]] + ([p[..., 1:h - 1]] if h > 2 else [])
        p, q = top[0].cat(*top[1:], dim=-1), q[..., 1:].cat(p[..., h - 1:], dim=-1)
    return p.unsqueeze(-1).cat(q.unsqueeze(-1), dim=-1).reshape(*p.shape[:-1], 2 * h)


def _jacobi_round(x: Tensor, v: Tensor) -> list[Tensor]:
    """One round: orthogonalise the n/2 column pairs of X (B, m, n) and of V (B, n, n) alike, then reseat."""
    b, _, n = x.shape
    pairs = x.reshape(b, -1, n // 2, 2)
    p, q = pairs[..., 0], pairs[..., 1]
    alpha, beta, gamma = p.square().sum(1), q.square().sum(1), (p * q).sum(1)
    # a pair already orthogonal to working precision (or holding a zero column) is left alone
    rotate = gamma.abs() > EPS64 * (alpha * beta).sqrt()
    zeta = (beta - alpha) / (2.0 * rotate.where(gamma, 1.0))
    t = (zeta >= 0).where(1.0, -1.0) / (zeta.abs() + (1.0 + zeta.square()).sqrt())
    c = (1.0 + t.square()).rsqrt()
    c, s = rotate.where(c, 1.0), rotate.where(c * t, 0.0)
    return [_next_seats(*_rotate_pairs(x, c, s)).contiguous(), _next_seats(*_rotate_pairs(v, c, s)).contiguous()]


def _off_diagonal(x: Tensor) -> Tensor:
    """max over i != j of |x_i . x_j| / (|x_i| |x_j|) per matrix (0 for zero columns)."""
    gram = _mT(x) @ x
    d = _diagonal(gram)
    scale = (d.unsqueeze(-1) * d.unsqueeze(-2)).sqrt()
    n = x.shape[-1]
    off = (_eye(n, dtypes.bool, x.device) | scale.eq(0)).where(0.0, gram.abs() / scale.maximum(1e-300))
    return off.max((-2, -1))


def _jacobi(a: Tensor) -> tuple[Tensor, Tensor]:
    """One-sided Jacobi on a detached float64 (B, m, n): (X, V) with X = A V of orthogonal columns."""
    b, m, n = a.shape
    even = n + (n & 1)  # an odd n gets a zero column, which no rotation touches, dropped at the end
    x = a.pad(((0, 0), (0, 0), (0, even - n))).contiguous().realize()
    v = _eye(even, dtypes.float64, a.device).reshape(1, even, even).expand(b, even, even).contiguous().realize()
    step = _replay(("svd_jacobi", b, m, even, a.device), _jacobi_round,
                   [((b, m, even), dtypes.float64), ((b, even, even), dtypes.float64)], a.device)
    xb, vb = _buffer_of(x.uop), _buffer_of(v.uop)
    seats = list(range(even))  # which column of A each seat holds (host copy of the reseating)
    for _ in range(MAX_SWEEPS):
        for r in range(max(even - 1, 1)):
            xb, vb = step.run(xb, vb, fresh=r == max(even - 1, 1) - 1)  # the sweep's last result outlives it
            seats = _reseated(seats)
        x, v = _as_tensor_of(xb, a, (b, m, even)), _as_tensor_of(vb, a, (b, even, even))
        if not _host_any(_off_diagonal(x) > 4 * m * EPS64):
            break
    else:
        raise LinAlgError(f"svd: Jacobi did not converge in {MAX_SWEEPS} sweeps; the input may be badly scaled")
    keep = [seat for seat, col in enumerate(seats) if col < n]  # the seats of A's columns, in seat order
    x, v = x[..., keep], v[..., keep]
    return x, v[..., :n, :] if even != n else v


def _reseated(seats: list[int]) -> list[int]:
    """The host copy of _next_seats on a list of column labels."""
    h = len(seats) // 2
    top, bottom = seats[0::2], seats[1::2]
    if h > 1:
        top, bottom = [top[0], bottom[0]] + top[1:h - 1], bottom[1:] + [top[h - 1]]
    return [c for pair in zip(top, bottom) for c in pair]


def _sorted_factors(a: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """(X, s, V) of a detached float64 (B, m, n), m >= n, with the singular values s descending."""
    x, v = _jacobi(a)
    s = x.square().sum(-2).sqrt()
    s, order = s.sort(-1, descending=True)
    return x.take_along_axis(order.unsqueeze(-2).expand(x.shape), -1), s, \
        v.take_along_axis(order.unsqueeze(-2).expand(v.shape), -1)


def _complete(u: Tensor, rank: Tensor, width: int) -> Tensor:
    """(B, m, width) orthonormal columns: u's first `rank` (per matrix) columns, then a basis of the rest
    of the space (the unit-norm columns of the projector I - U_r U_r^T, factored by Jacobi)."""
    b, m, k = u.shape
    proj = _eye(m, dtypes.float64, u.device) - u @ _mT(u)
    px, ps, _ = _sorted_factors(proj.contiguous().realize())
    basis = px / ps.maximum(1e-300).unsqueeze(-2)
    cols = Tensor.arange(width, device=u.device, dtype=dtypes.int32).reshape(1, 1, width)
    rank = rank.reshape(b, 1, 1)
    extra = basis.take_along_axis((cols - rank).maximum(0).minimum(m - 1).expand(b, m, width), -1)
    mine = u.pad(((0, 0), (0, 0), (0, max(width - k, 0))))[..., :width]
    return (cols < rank).where(mine, extra)


def _factor(a: Tensor, full_matrices: bool) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
    """Detached float64 factors of tall (B, m, n): U (B, m, n), s (B, n), V (B, n, n), and U's extra
    columns (B, m, m - n) when full_matrices (else None)."""
    b, m, n = a.shape
    a64 = a.detach().cast(dtypes.float64).contiguous().realize()
    if _host_any(a64.isfinite().logical_not()):
        raise LinAlgError("svd: the input holds inf or NaN; the decomposition needs finite values")
    x, s, v = _sorted_factors(a64)
    good = s > s[..., :1] * (max(m, n) * EPS64)
    u = good.unsqueeze(-2).where(x / s.maximum(1e-300).unsqueeze(-2), 0.0)
    width = m if full_matrices else n
    if width > n or _host_any(good.logical_not()):
        u = _complete(u, good.cast(dtypes.int32).sum(-1), width)
    return u[..., :n], s, v, (u[..., n:] if width > n else None)


def _differentiable(a: Tensor, u0: Tensor, s0: Tensor, v0: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """U, S, V with the values of the detached factors and Townsend's gradients."""
    m, n = a.shape[-2], a.shape[-1]
    da = a - a.detach()
    g = _mT(u0) @ da @ v0
    s = s0 + _diagonal(g)
    sq = s0.square()
    f = _reciprocal_or_zero(sq.unsqueeze(-2) - sq.unsqueeze(-1))  # [i, j] = 1 / (s_j^2 - s_i^2)
    row, col = s0.unsqueeze(-2), s0.unsqueeze(-1)  # G S scales columns, S G scales rows
    u = u0 + u0 @ (f * (g * row + col * _mT(g)))
    if m > n:
        u = u + (da @ v0 - u0 @ g) * _reciprocal_or_zero(s0).unsqueeze(-2)
    v = v0 + v0 @ (f * (col * g + _mT(g) * row))
    return u, s, v


def _reciprocal_or_zero(x: Tensor) -> Tensor:
    """1 / x, and 0 where that would not be finite (its term is then left out of the gradient)."""
    usable = x.abs() > (1e-300 if x.dtype is dtypes.float64 else 1e-30)
    return usable.where(1.0 / usable.where(x, 1.0), 0.0)


def svd(a: Tensor, full_matrices: bool = True) -> tuple[Tensor, Tensor, Tensor]:
    """U, S, Vh with A = U diag(S) Vh, as torch.linalg.svd (and tinygrad's Tensor.svd): S descending, U
    (..., m, m) and Vh (..., n, n) with full_matrices=True, (..., m, k) and (..., k, n) otherwise (k = min(m,
    n)). Singular vectors are unique up to sign (and to rotations within repeated singular values), so
    they may differ from LAPACK's by those; U diag(S) Vh reconstructs A. Differentiable (see the module
    docstring). Computed in float64; float32 input gives float32 results.

    >>> u, s, vh = Tensor([[3.0, 0.0], [0.0, -2.0]]).svd()
    >>> s.tolist()
    [3.0, 2.0]
    """
    _require_matrix(a, "svd")
    if not a.dtype.is_float:
        a = a.float()
    if a.shape[-2] < a.shape[-1]:  # A = (A^T)^T: U and V swap
        u, s, vh = svd(_mT(a), full_matrices)
        return _mT(vh), s, _mT(u)
    dt = _work_dtype(a)
    *batch, m, n = a.shape
    if m == 0 or n == 0:
        raise LinAlgError(f"svd: needs a non-empty matrix, got shape {a.shape}")
    a3 = a.cast(dt).reshape(-1, m, n)
    u0, s0, v0, rest0 = (None if t is None else t.cast(dt) for t in _factor(a3, full_matrices))
    u, s, v = _differentiable(a3, u0, s0, v0)
    if rest0 is not None:  # any basis of the complement will do: no gradient flows into it (torch's rule)
        u = u.cat(rest0, dim=-1)
    return u.reshape(*batch, m, u.shape[-1]), s.reshape(*batch, n), _mT(v).reshape(*batch, n, n)


Tensor.svd = svd  # type: ignore[attr-defined]  # a Tensor method, added here as linalg.py adds its own
