"""Structured linear algebra composed from tensor ops: solve, lstsq, cholesky, qr, inv, det, ...

Stage: graph construction (with eager factorisation). Input: float tensors of shape (..., m, n).
Output: tensors whose values come from a factorisation and whose gradients come from tensor ops.

No LAPACK and no NumPy at run time: every number is computed by polygrad kernels, so the functions
run on every backend. Each function works in two parts:

1. A detached factorisation, computed eagerly. solve/inv/det use blocked Gauss-Jordan with partial
   pivoting: a panel of nb columns is eliminated one pivot at a time (3 small kernels per column),
   then one pair of matrix products applies the panel to the rest. The eliminated columns become the
   inverse in place, so no identity is carried along. cholesky uses forward elimination without
   pivoting (1 kernel per column); qr and lstsq use shifted CholeskyQR3 in float64. Each step is scheduled
   once per shape and replayed with new buffers for k = 0..n-1 (k arrives in a one-element buffer,
   and the columns rotate so the step always works on column 0), so the graph is never rebuilt.
2. A differentiable wrapper. The result is refined once with the detached inverse Z, e.g.
   x = x0 + Z @ (b - A @ x0), which keeps the value (and improves it) while giving exactly the
   first-order gradients PyTorch gives (dx = -A^-1 dA x, db -> A^-T g).

Functions that need an invertible or positive definite matrix read the pivots back to the host and
raise LinAlgError; that is one small readback per call, only to decide the error.
"""
from __future__ import annotations

import threading
from typing import Any

from polygrad.dtype import DType, dtypes
from polygrad.engine.capture import capture
from polygrad.errors import LinAlgError
from polygrad.tensor import Tensor, _buffer_uop, broadcast_shape
from polygrad.uop.ops import Ops, UOp

# ---------------------------------------------------------------------------------------------------
# small tensor helpers (movement and masks only)


def _mT(x: Tensor) -> Tensor:  # noqa: N802
    return x.transpose(-1, -2)


def _index_grid(rows: int, cols: int, device: str) -> tuple[Tensor, Tensor]:
    r = Tensor.arange(rows, device=device, dtype=dtypes.int32).reshape(rows, 1)
    c = Tensor.arange(cols, device=device, dtype=dtypes.int32).reshape(1, cols)
    return r, c


def _eye(n: int, dtype: DType, device: str) -> Tensor:
    r, c = _index_grid(n, n, device)
    return r.eq(c).cast(dtype)


def _tril(x: Tensor, diagonal: int = 0) -> Tensor:
    r, c = _index_grid(x.shape[-2], x.shape[-1], x.device)
    return (c <= r + diagonal).where(x, 0.0)


def _triu(x: Tensor, diagonal: int = 0) -> Tensor:
    r, c = _index_grid(x.shape[-2], x.shape[-1], x.device)
    return (c >= r + diagonal).where(x, 0.0)


def _diagonal(x: Tensor) -> Tensor:
    """The main diagonal of (..., n, n) as (..., n), by movement only."""
    *batch, n, _ = x.shape
    flat = x.reshape(*batch, n * n).pad(tuple((0, 0) for _ in batch) + ((0, n),))
    return flat.reshape(*batch, n, n + 1)[..., 0]


def _pad_last(x: Tensor, before: int, after: int) -> Tensor:
    return x.pad(tuple((0, 0) for _ in x.shape[:-1]) + ((before, after),))


def _cat_last(*parts: Tensor) -> Tensor:
    total = sum(p.shape[-1] for p in parts)
    out, at = None, 0
    for p in parts:
        piece = _pad_last(p, at, total - at - p.shape[-1])
        out = piece if out is None else out + piece
        at += p.shape[-1]
    return out


# ---------------------------------------------------------------------------------------------------
# argument checks


def _as_tensor(x: Any, like: Tensor) -> Tensor:
    return x if isinstance(x, Tensor) else Tensor(x, device=like.device, _runtime=like._runtime)


def _work_dtype(*xs: Tensor) -> DType:
    dts = {x.dtype for x in xs}
    return dtypes.float64 if dtypes.float64 in dts else dtypes.float32


def _require_matrix(a: Tensor, name: str) -> None:
    if a.ndim < 2:
        raise LinAlgError(f"{name}: expected a matrix or a batch of matrices (..., m, n), got shape {a.shape}")


def _require_square(a: Tensor, name: str) -> None:
    _require_matrix(a, name)
    if a.shape[-1] != a.shape[-2]:
        raise LinAlgError(f"{name}: needs square matrices (..., n, n), got shape {a.shape}; for a "
                          "rectangular system use lstsq")


def _host_any(flags: Tensor, *also: Tensor) -> bool:
    """Host readback of 'any flag set' (used only to decide whether to raise); realizes `also` with it."""
    found = flags.cast(dtypes.int32).max()
    Tensor.realize_all(found, *also)
    # read the buffer directly, past the capture guards: this only decides whether to raise, and a
    # TinyJit replay of the solve skips the check rather than refusing to capture it
    return bool(found._buffer().numpy()[0] > 0)


def _raise_if_singular(pivots: Tensor, name: str, *also: Tensor) -> None:
    if _host_any(pivots.eq(0.0), *also):
        raise LinAlgError(f"{name}: the matrix is singular (a pivot of the LU factorisation is exactly zero); "
                          "check the input, or use lstsq for a full-rank rectangular system")


# ---------------------------------------------------------------------------------------------------
# programs scheduled once and replayed with new buffers


def _buffer_of(u: UOp) -> Any:
    if u.op is Ops.RESHAPE:
        u = u.src[0]
    if u.op is not Ops.BUFFER:
        raise RuntimeError(f"linalg: expected a realized buffer, got {u.op}")
    return u.arg


class _Replay:
    """A tensor function of fixed-shape inputs, captured once; run() replays its kernels on new buffers.

    The loops below run the same step n times; building and scheduling its graph every time would
    cost far more than the kernels themselves. The first run realizes the step under
    `engine.capture.capture()`; later runs replay the CapturedGraph with the new feeds. Intermediate
    buffers alternate between two sets allocated once (run k + 1 never writes what run k returned);
    run(fresh=True) allocates new ones, for results that outlive the loop.
    """

    def __init__(self, build: Any, inputs: list[tuple[tuple[int, ...], DType]], device: str):
        self.build, self.shapes, self.device = build, [shape for shape, _ in inputs], device
        self.graph: Any = None  # engine.capture.CapturedGraph, after the first run
        self.scratch: list[Any] = [None, None]
        self.calls = 0

    def _capture(self, feeds: tuple) -> list[Any]:
        holders = [Tensor(_buffer_uop(b, shape)) for b, shape in zip(feeds, self.shapes)]
        with capture() as cap:
            outs = self.build(*holders)
            Tensor.realize_all(*outs)
        results = [_buffer_of(o.uop) for o in outs]
        graph = cap.graph(inputs=list(feeds), outputs=results)
        if "param" in graph.roles or graph.n_copies:
            raise RuntimeError("linalg: a replayed step reads an unexpected buffer or copies")
        self.graph = graph
        return results

    def run(self, *feeds: Any, fresh: bool = False) -> list[Any]:
        self.calls += 1
        if self.graph is None:
            return self._capture(feeds)  # the capture's own buffers are new: fresh by construction
        if fresh:
            scratch = self.graph.new_scratch()
        else:
            scratch = self.scratch[self.calls & 1]
            if scratch is None:
                scratch = self.scratch[self.calls & 1] = self.graph.new_scratch()
        return self.graph.launch(feeds, scratch=scratch)


# (thread id, step key) -> _Replay. A replay patches its graph's buffer table and writes its scratch
# buffers, so each thread replays its own (two threads sharing one would swap inputs and results).
_replays: dict[tuple, _Replay] = {}
_step_indices: dict[str, list[Any]] = {}
_index_lock = threading.Lock()


def clear_cache() -> None:
    """Drop the replayed linalg steps and their scratch buffers (polygrad.collect() calls this)."""
    _replays.clear()


def _replay(key: tuple, build: Any, inputs: list[tuple[tuple[int, ...], DType]], device: str) -> _Replay:
    key = (threading.get_ident(), *key)
    r = _replays.get(key)
    if r is None:
        alive = {t.ident for t in threading.enumerate()}
        for old in [k for k in list(_replays) if k[0] not in alive]:  # the steps of threads that ended
            _replays.pop(old, None)
        r = _replays[key] = _Replay(build, inputs, device)
    return r


def _index_buffer(k: int, device: str) -> Any:
    """A cached one-element int32 buffer holding k (the only thing that changes between steps)."""
    held = _step_indices.setdefault(device, [])
    if len(held) <= k:
        with _index_lock:  # one thread appends at a time, or two could append the same index
            while len(held) <= k:
                t = Tensor([len(held)], dtype=dtypes.int32, device=device).realize()
                held.append(_buffer_of(t.uop))
    return held[k]


def _as_tensor_of(buf: Any, like: Tensor, shape: tuple[int, ...]) -> Tensor:
    return like._new(UOp(Ops.BUFFER, buf.dtype, (), buf)).reshape(shape)


# ---------------------------------------------------------------------------------------------------
# blocked Gauss-Jordan with partial pivoting (in place: the eliminated columns become the inverse)


def _panel_step(panel: Tensor, k: Tensor) -> list[Tensor]:
    """One pivot step on a panel (B, n, nb + 2) = [columns | pivot order | pivot value].

    Column 0 is eliminated from every row but the pivot row (the largest |value| among rows not yet
    used); it is replaced by E e_p, the elimination applied to the unit vector of the pivot row, and the
    panel columns rotate left. The order column records k + 1 and the value column the pivot.
    """
    _, n, width = panel.shape
    nb = width - 2
    rows = Tensor.arange(n, device=panel.device, dtype=dtypes.int32).reshape(1, n, 1)
    m, order, values = panel[:, :, :nb], panel[:, :, nb:nb + 1], panel[:, :, nb + 1:]
    col = m[:, :, 0:1]
    # largest |value| among unused rows, first index on near-ties: the low bits of the float's bit
    # pattern (monotone for non-negative floats) are replaced by the reversed row index
    low = (1 << max(n - 1, 0).bit_length()) - 1
    bits = col.abs().cast(dtypes.float32).bitcast(dtypes.int32)
    key = order.eq(0.0).where((bits & ~low) | (low - rows), -1)
    best = key.max(axis=1, keepdim=True)
    is_pivot = rows.eq(low - (best & low))
    pivot_row = is_pivot.where(m, 0.0).sum(axis=1, keepdim=True)
    piv = pivot_row[:, :, 0:1]
    scaled = pivot_row / piv
    body = is_pivot.where(scaled, m - col * scaled)
    unit_column = is_pivot.where(1.0 / piv, -col / piv)
    step = k.reshape(1, 1, 1).cast(panel.dtype) + 1.0
    return [_cat_last(body[:, :, 1:], unit_column, is_pivot.where(step, order), is_pivot.where(piv, values))
            .contiguous()]


def _block_update(state_t: Tensor, panel: Tensor, k: Tensor) -> list[Tensor]:
    """Apply a finished panel's elimination E to the rest of the state; rotate the panel's columns last.

    The state is stored transposed, (B, w, n), so both products below reduce over contiguous memory.
    With F = E Sel^T (the panel) and Sel the one-hot rows of the panel's pivots, E C = C + (F - Sel^T) Sel C.
    Also returns the next panel: the next nb columns with the pivot order and values carried over.
    """
    b, w, n = state_t.shape
    nb = panel.shape[-1] - 2
    f, order = panel[:, :, :nb], panel[:, :, nb:nb + 1]
    t = Tensor.arange(nb, device=panel.device, dtype=dtypes.int32).reshape(1, 1, nb)
    first = k.reshape(1, 1, 1).cast(panel.dtype) + 1.0
    sel_t = order.eq(first + t.cast(panel.dtype)).cast(panel.dtype).contiguous()  # (B, n, nb)
    rest_t = state_t[:, nb:, :]
    picked_t = (rest_t @ sel_t).contiguous()  # (Sel C)^T
    rest_t = (rest_t + picked_t @ _mT(f - sel_t)).contiguous()
    new_state_t = _mT(_cat_last(_mT(rest_t), f)).contiguous()
    next_panel = _cat_last(_mT(rest_t[:, :nb, :]), panel[:, :, nb:]).contiguous()
    return [new_state_t, next_panel]


def _block_size(n: int) -> int:
    return n if n <= 32 else 8


def _gauss_jordan(a: Tensor, rhs: Tensor | None) -> tuple[Tensor | None, Tensor, Tensor, Tensor]:
    """Detached GJ on (B, n, n) and (B, n, m): E rhs, F, the pivot order (B, n) and pivot values (B, n).

    With Sel the one-hot (B, n, n) of the order (row k selects the k-th pivot row), the solution is
    Sel @ (E rhs) and the inverse is Sel @ F @ Sel. n is padded with an identity block to a whole
    number of panels, so every panel has the same shape.
    """
    b, n, _ = a.shape
    if rhs is None:
        rhs = Tensor.zeros(b, n, 1, dtype=a.dtype, device=a.device)
    m = rhs.shape[-1]
    nb = _block_size(n)
    padded = -(-n // nb) * nb
    a, rhs = a.detach(), rhs.detach()
    if padded != n:
        extra = padded - n
        eye = _eye(extra, a.dtype, a.device).reshape(1, extra, extra).expand(b, extra, extra)
        a = _cat_last(a, Tensor.zeros(b, n, extra, dtype=a.dtype, device=a.device))
        a = _mT(_cat_last(_mT(a), _mT(_cat_last(Tensor.zeros(b, extra, n, dtype=a.dtype, device=a.device), eye))))
        rhs = _mT(_cat_last(_mT(rhs), Tensor.zeros(b, m, extra, dtype=a.dtype, device=a.device)))
    w = padded + m
    state = _mT(_cat_last(a, rhs)).contiguous()
    zeros = Tensor.zeros(b, padded, 2, dtype=a.dtype, device=a.device)
    panel = _cat_last(a[:, :, :nb], zeros).contiguous()
    Tensor.realize_all(state, panel)
    dev, dt = a.device, a.dtype
    kshape = ((1,), dtypes.int32)
    step = _replay(("panel", b, padded, nb, dt, dev), _panel_step, [((b, padded, nb + 2), dt), kshape], dev)
    update = _replay(("update", b, padded, w, nb, dt, dev), _block_update,
                     [((b, w, padded), dt), ((b, padded, nb + 2), dt), kshape], dev)
    state_buf, panel_buf = _buffer_of(state.uop), _buffer_of(panel.uop)
    for first in range(0, padded, nb):
        last = first + nb == padded
        for k in range(first, first + nb):
            (panel_buf,) = step.run(panel_buf, _index_buffer(k, dev), fresh=last and k == padded - 1)
        last_panel = panel_buf
        state_buf, panel_buf = update.run(state_buf, panel_buf, _index_buffer(first, dev), fresh=last)
    final = _mT(_as_tensor_of(state_buf, state, (b, w, padded)))
    tail = _as_tensor_of(last_panel, state, (b, padded, nb + 2))
    order, values = tail[:, :, nb], tail[:, :, nb + 1]
    return final[:, :, :m], final[:, :, m:], order, values


def _selection(order: Tensor) -> Tensor:
    """(B, n) pivot order (1-based steps) -> one-hot (B, n, n) with row k selecting step k's pivot row."""
    n = order.shape[-1]
    steps = Tensor.arange(n, device=order.device, dtype=dtypes.int32).reshape(1, n, 1).cast(order.dtype) + 1.0
    return order.reshape(-1, 1, n).eq(steps).cast(order.dtype)


def _permutation_sign(order: Tensor) -> Tensor:
    """(-1)^(inversions) of the pivot order (B, n), as a float (B,)."""
    n = order.shape[-1]
    r, c = _index_grid(n, n, order.device)
    inversions = ((order.reshape(-1, n, 1) > order.reshape(-1, 1, n)) & (r < c)).cast(dtypes.int32).sum((-2, -1))
    return 1.0 - 2.0 * (inversions & 1).cast(order.dtype)


# ---------------------------------------------------------------------------------------------------
# forward elimination without pivoting (LU; used by cholesky)


def _forward_step(m: Tensor, k: Tensor) -> list[Tensor]:
    """Eliminate column 0 below row 0 of the active block, then rotate columns and move row 0 last.

    Rows [0, n-k) are active and columns [w-k, w) hold finished results. Column 0 is replaced by the
    L multipliers, the pivot and the U entries above it, so the finished columns form a compact LU.
    """
    _, n, w = m.shape
    rows = Tensor.arange(n, device=m.device, dtype=dtypes.int32).reshape(1, n, 1)
    cols = Tensor.arange(w, device=m.device, dtype=dtypes.int32).reshape(1, 1, w)
    kk = k.reshape(1, 1, 1)
    col = m[:, :, 0:1]
    pivot_row = m[:, 0:1, :]
    eliminate = (rows < (n - kk)) & (rows > 0)
    multiplier = col / pivot_row[:, :, 0:1]
    body = eliminate.where(m - multiplier * pivot_row, m)
    full = cols.eq(0).where(eliminate.where(multiplier, col), (cols >= (w - kk)).where(m, body))
    rotated = _cat_last(full[:, :, 1:], full[:, :, :1])
    return [_mT(_cat_last(_mT(rotated[:, 1:, :]), _mT(_cat_last(pivot_row[:, :, 1:], pivot_row[:, :, :1]))))
            .contiguous()]


def _forward_eliminate(aug: Tensor) -> Tensor:
    """n steps of forward elimination without pivoting on a detached (B, n, w) augmented matrix."""
    aug = aug.detach().contiguous().realize()
    b, n, w = aug.shape
    step = _replay(("forward", b, n, w, aug.dtype, aug.device), _forward_step,
                   [((b, n, w), aug.dtype), ((1,), dtypes.int32)], aug.device)
    buf = _buffer_of(aug.uop)
    for k in range(n):
        (buf,) = step.run(buf, _index_buffer(k, aug.device), fresh=k == n - 1)
    return _as_tensor_of(buf, aug, (b, n, w))


def _flatten_batch(x: Tensor, batch: tuple[int, ...]) -> Tensor:
    x = x.expand(*batch, *x.shape[-2:]) if x.shape[:-2] != batch else x
    return x.reshape(-1, *x.shape[-2:])


# ---------------------------------------------------------------------------------------------------
# solve, inv, det, slogdet


def _pad_rows(x: Tensor, rows: int) -> Tensor:
    return x if x.shape[-2] == rows else _mT(_pad_last(_mT(x), 0, rows - x.shape[-2]))


class _Factor:
    """A detached pivoted GJ factorisation of (B, n, n): applies A^-1, forms it, gives pivots and order."""

    def __init__(self, a3: Tensor, rhs: Tensor | None = None):
        self.n = a3.shape[-1]
        self.eb, self.f, self.order, self.pivots = _gauss_jordan(a3, rhs)
        self.padded = self.f.shape[-1]
        self.sel = _selection(self.order).contiguous()

    def solution(self) -> Tensor:
        return (self.sel @ self.eb)[:, :self.n, :].contiguous()

    def apply_inverse(self, r: Tensor) -> Tensor:
        """A^-1 r for (B, n, k) r, differentiable in r (three matrix products, no n^3 work)."""
        return (self.sel @ (self.f @ (self.sel @ _pad_rows(r, self.padded))))[:, :self.n, :]

    def inverse(self) -> Tensor:
        z = (self.sel @ self.f) @ self.sel
        return z[:, :self.n, :self.n].contiguous()

    def pivot_values(self) -> Tensor:
        return self.pivots[:, :self.n]


def _solve_matrix(a: Tensor, b: Tensor, name: str) -> Tensor:
    """A X = B for (..., n, n) and (..., n, k) with broadcast batch dims; differentiable in A and B."""
    batch = broadcast_shape(a.shape[:-2], b.shape[:-2])
    n, k = a.shape[-1], b.shape[-1]
    if n == 0 or k == 0:
        return b.expand(*batch, n, k).contiguous()
    a3, b3 = _flatten_batch(a, batch), _flatten_batch(b, batch)
    factor = _Factor(a3, b3)
    x0 = factor.solution()
    _raise_if_singular(factor.pivot_values(), name, x0)
    x = x0 + factor.apply_inverse(b3 - a3 @ x0)
    return x.reshape(*batch, n, k)


def solve(a: Tensor, b: Any) -> Tensor:
    """Solve A x = b for square A (..., n, n); b is (..., n) (vectors) or (..., n, k), as torch.linalg.solve.

    Blocked Gauss-Jordan elimination with partial pivoting, refined once. Gradients flow to A and b.
    Raises LinAlgError for non-square A or when a pivot is exactly zero (singular A); deciding that
    reads the n pivots back to the host.

    >>> from polygrad import Tensor
    >>> Tensor([[4.0, 2.0], [2.0, 5.0]]).solve(Tensor([1.0, 3.0])).numpy().round(4).tolist()
    [-0.0625, 0.625]
    """
    b = _as_tensor(b, a)
    _require_square(a, "solve")
    dt = _work_dtype(a, b)
    a, b = a.cast(dt), b.cast(dt)
    vector = b.ndim == 1 or (b.ndim == a.ndim - 1 and b.shape == a.shape[:-1])
    bm = b.unsqueeze(-1) if vector else b
    if bm.shape[-2] != a.shape[-1]:
        raise LinAlgError(f"solve: A is {a.shape} but b has {bm.shape[-2]} rows (shape {b.shape})")
    x = _solve_matrix(a, bm, "solve")
    return x.squeeze(-1) if vector else x


def inv(a: Tensor) -> Tensor:
    """The inverse of square matrices (..., n, n), as torch.linalg.inv; differentiable.

    Blocked Gauss-Jordan with partial pivoting, then one Newton refinement Z + Z (I - A Z).
    Raises LinAlgError for non-square or singular input (a zero pivot, read back to the host).
    """
    _require_square(a, "inv")
    a = a.cast(_work_dtype(a))
    n = a.shape[-1]
    if n == 0:
        return a.contiguous()
    factor = _Factor(a.reshape(-1, n, n))
    z = factor.inverse()
    _raise_if_singular(factor.pivot_values(), "inv", z)
    z = z.reshape(a.shape)
    return z + z @ (_eye(n, a.dtype, a.device) - a @ z)


def _det_parts(a: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Pivots, permutation sign, singular flags (all detached) and the first-order correction term."""
    n = a.shape[-1]
    batch = a.shape[:-2]
    factor = _Factor(a.reshape(-1, n, n))
    pivots = factor.pivot_values().reshape(*batch, n)
    sign = _permutation_sign(factor.order).reshape(batch)
    singular = pivots.eq(0.0).cast(dtypes.int32).max(-1).cast(dtypes.bool)
    z = singular.reshape(*batch, 1, 1).where(0.0, factor.inverse().reshape(a.shape))
    correction = (_mT(z) * (a - a.detach())).sum((-2, -1))
    return pivots, sign, singular, correction


def det(a: Tensor) -> Tensor:
    """Determinant of square matrices (..., n, n), as torch.linalg.det; differentiable.

    The product of the pivots with the permutation's sign. A singular matrix gives 0 (no error);
    its gradient is returned as zero there (PyTorch returns the adjugate).
    """
    _require_square(a, "det")
    a = a.cast(_work_dtype(a))
    if a.shape[-1] == 0:
        return Tensor.ones(*a.shape[:-2], dtype=a.dtype, device=a.device)
    pivots, sign, singular, correction = _det_parts(a)
    value = singular.where(0.0, pivots.prod(-1) * sign)
    return value * (1.0 + correction)


def slogdet(a: Tensor) -> tuple[Tensor, Tensor]:
    """(sign, log|det|) of square matrices, as torch.linalg.slogdet; log|det| is differentiable.

    A singular matrix gives sign 0 and log|det| = -inf (no error).
    """
    _require_square(a, "slogdet")
    a = a.cast(_work_dtype(a))
    if a.shape[-1] == 0:
        one = Tensor.ones(*a.shape[:-2], dtype=a.dtype, device=a.device)
        return one, one * 0.0
    pivots, sign, singular, correction = _det_parts(a)
    sign = singular.where(0.0, pivots.sign().prod(-1) * sign)
    logabs = singular.where(float("-inf"), pivots.abs().log().sum(-1))
    return sign, logabs + correction


# ---------------------------------------------------------------------------------------------------
# triangular systems


def _triangle(a: Tensor, upper: bool, unitriangular: bool) -> Tensor:
    t = _triu(a) if upper else _tril(a)
    if unitriangular:
        eye = _eye(a.shape[-1], a.dtype, a.device)
        t = t * (1.0 - eye) + eye
    return t


def solve_triangular(a: Tensor, b: Any, *, upper: bool, left: bool = True, unitriangular: bool = False) -> Tensor:
    """Solve A X = B (or X A = B with left=False) for triangular A, as torch.linalg.solve_triangular.

    Only the upper (upper=True) or lower triangle of A is read; unitriangular=True takes the diagonal
    as ones. B is (..., n, k). Uses the pivoted solver on the triangle, refined once; differentiable
    in A's triangle and in B. Raises LinAlgError for a zero on the diagonal.
    """
    b = _as_tensor(b, a)
    _require_square(a, "solve_triangular")
    _require_matrix(b, "solve_triangular")
    dt = _work_dtype(a, b)
    a, b = a.cast(dt), b.cast(dt)
    if not left:
        return _mT(solve_triangular(_mT(a), _mT(b), upper=not upper, unitriangular=unitriangular))
    if b.shape[-2] != a.shape[-1]:
        raise LinAlgError(f"solve_triangular: A is {a.shape} but B has {b.shape[-2]} rows (shape {b.shape})")
    return _solve_matrix(_triangle(a, upper, unitriangular), b, "solve_triangular")


def triangular_solve(b: Tensor, a: Any, upper: bool = True, transpose: bool = False,
                     unitriangular: bool = False) -> tuple[Tensor, Tensor]:
    """torch.triangular_solve: solve A X = b (A^T X = b with transpose=True); returns (X, A).

    Called as b.triangular_solve(A), like torch. upper defaults to True as in torch.
    """
    a = _as_tensor(a, b)
    _require_square(a, "triangular_solve")
    t = _triangle(a.cast(_work_dtype(a, b)), upper, unitriangular)
    if transpose:
        t, upper = _mT(t), not upper
    x = solve_triangular(t, b, upper=upper)
    return x, a.contiguous()


# ---------------------------------------------------------------------------------------------------
# cholesky, cholesky_solve, qr, lstsq


def _cholesky_parts(a: Tensor) -> tuple[Tensor, Tensor]:
    """Detached (L, L^-1) of symmetric (..., n, n) A (lower triangle read), via LU without pivoting."""
    *batch, n, _ = a.shape
    a3 = a.detach().reshape(-1, n, n)
    ident = _eye(n, a.dtype, a.device).reshape(1, n, n).expand(a3.shape[0], n, n)
    final = _forward_eliminate(_cat_last(a3, ident))
    lower_inverse_unit, lu = final[:, :, :n], final[:, :, n:]
    d = _diagonal(lu)
    if _host_any((d > 0.0).logical_not()):
        raise LinAlgError("cholesky: the matrix is not positive definite (a pivot is <= 0 or NaN); "
                          "check that it is symmetric positive definite")
    root = d.sqrt().reshape(-1, n, 1)
    lower = _mT(_triu(lu) / root)
    lower_inverse = lower_inverse_unit / root
    return lower.reshape(*batch, n, n), lower_inverse.reshape(*batch, n, n)


def _symmetric_from_lower(a: Tensor) -> Tensor:
    return _tril(a) + _mT(_tril(a, -1))


def cholesky(a: Tensor, upper: bool = False) -> Tensor:
    """Cholesky factor L (A = L L^T) of symmetric positive definite (..., n, n), as torch.linalg.cholesky.

    Only the lower triangle of A is read. upper=True returns U = L^T. Differentiable (the gradient
    matches torch's). Raises LinAlgError for non-square input and for a matrix that is not positive
    definite (a pivot <= 0 or NaN, read back to the host); it never returns NaN silently.
    """
    _require_square(a, "cholesky")
    a = a.cast(_work_dtype(a))
    n = a.shape[-1]
    if n == 0:
        return a.contiguous()
    lower0, lower_inv = _cholesky_parts(_symmetric_from_lower(a.detach()))
    # first-order term of the symmetric perturbation, so the gradient is symmetric like torch's
    delta = a - a.detach()
    s = lower_inv @ ((delta + _mT(delta)) * 0.5) @ _mT(lower_inv)
    phi = _tril(s) * (1.0 - 0.5 * _eye(n, a.dtype, a.device))
    lower = lower0 + lower0 @ phi
    return _mT(lower) if upper else lower


def cholesky_solve(b: Tensor, factor: Any, upper: bool = False) -> Tensor:
    """Solve A X = B given A's Cholesky factor, as torch.cholesky_solve(B, L, upper=False).

    Called as B.cholesky_solve(L). B is (..., n, k); A = L L^T (or U^T U with upper=True); only the
    factor's triangle is read for the value. Differentiable in B and in the factor; like torch, the
    factor's gradient is that of A = L L^T with L taken as a full matrix.
    """
    factor = _as_tensor(factor, b)
    _require_square(factor, "cholesky_solve")
    _require_matrix(b, "cholesky_solve")
    dt = _work_dtype(b, factor)
    b, factor = b.cast(dt), factor.cast(dt)
    lower = _mT(factor) if upper else factor
    n, k = lower.shape[-1], b.shape[-1]
    if b.shape[-2] != n:
        raise LinAlgError(f"cholesky_solve: the factor is {factor.shape} but B has {b.shape[-2]} rows")
    batch = broadcast_shape(lower.shape[:-2], b.shape[:-2])
    l3, b3 = _flatten_batch(lower, batch), _flatten_batch(b, batch)
    triangle = _tril(l3)
    inverse = _Factor(triangle.detach(), b3)
    z = inverse.inverse()
    x0 = (_mT(z) @ inverse.solution()).contiguous()
    _raise_if_singular(inverse.pivot_values(), "cholesky_solve", z, x0)
    # the value reads the triangle only; the gradient flows to the whole factor, as in torch
    l_full = l3 - (l3 - triangle).detach()
    x = x0 + _mT(z) @ (z @ (b3 - l_full @ (_mT(l_full) @ x0)))
    return x.reshape(*batch, n, k)


def _qr_detached(a: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Shifted CholeskyQR3 in float64 for full-column-rank tall (..., m, n): Q, R, R^-1 (detached).

    The first pass factors A^T A + s I with a small shift s (Fukaya et al. 2020), so the Gram matrix
    stays positive definite up to cond(A) ~ 1e15; two plain CholeskyQR passes then make Q orthogonal.
    """
    a64 = a.detach().cast(dtypes.float64)
    m, n = a64.shape[-2], a64.shape[-1]
    shift = 11.0 * (m * n + n * (n + 1)) * 2.0 ** -53 * a64.square().sum((-2, -1), keepdim=True)
    q, r_inv = a64, None
    for shifted in (True, False, False):
        gram = _mT(q) @ q
        if shifted:
            gram = gram + shift * _eye(n, dtypes.float64, a.device)
        _, l_inv = _cholesky_parts(gram)
        q = q @ _mT(l_inv)
        r_inv = _mT(l_inv) if r_inv is None else r_inv @ _mT(l_inv)
    r = _triu(_mT(q) @ a64)  # Q^T A reconstructs A to rounding; the product of the factors would not
    d = _diagonal(r).abs()
    if _host_any(d <= d.max(-1, keepdim=True) * (max(m, n) * 2.0 ** -52), q, r, r_inv):
        raise LinAlgError("the columns are linearly dependent to working precision")
    return q, r, r_inv


def qr(a: Tensor, mode: str = "reduced") -> tuple[Tensor, Tensor]:
    """Reduced QR of (..., m, n), as torch.linalg.qr(A, mode='reduced'); R has a positive diagonal.

    Shifted CholeskyQR3 computed in float64 (orthogonal Q for condition numbers up to about 1e15).
    Needs the leading min(m, n) columns to be linearly independent (LinAlgError otherwise). The outputs are
    detached: qr has no gradient.
    """
    if mode != "reduced":
        raise LinAlgError(f"qr: only mode='reduced' is implemented, got mode={mode!r}")
    _require_matrix(a, "qr")
    dt = _work_dtype(a)
    m, n = a.shape[-2], a.shape[-1]
    lead = a[..., :, :min(m, n)]
    try:
        q, r, _ = _qr_detached(lead)
    except LinAlgError as e:
        raise LinAlgError("qr: the leading columns of A are linearly dependent (rank-deficient input)") from e
    if n > m:
        r = _cat_last(r, _mT(q) @ a[..., :, m:].detach().cast(dtypes.float64))
    return q.cast(dt), r.cast(dt)


def lstsq(a: Tensor, b: Any) -> Tensor:
    """Least-squares solution of A x ~= b for FULL-RANK TALL OR SQUARE A (..., m, n), m >= n.

    Returns the solution only (not torch's residuals/rank/singular values). b is (..., m) or
    (..., m, k). Computed from a float64 CholeskyQR3 factorisation and refined once; differentiable
    in A and b. Raises LinAlgError for wide (m < n) or rank-deficient A (detected when a Cholesky pivot
    of the Gram matrix is not positive).
    """
    b = _as_tensor(b, a)
    _require_matrix(a, "lstsq")
    m, n = a.shape[-2], a.shape[-1]
    if m < n:
        raise LinAlgError(f"lstsq: only full-rank tall or square A is supported (m >= n), got shape {a.shape}")
    dt = _work_dtype(a, b)
    a, b = a.cast(dt), b.cast(dt)
    vector = b.ndim == 1 or (b.ndim == a.ndim - 1 and b.shape == a.shape[:-1])
    bm = b.unsqueeze(-1) if vector else b
    if bm.shape[-2] != m:
        raise LinAlgError(f"lstsq: A is {a.shape} but b has {bm.shape[-2]} rows (shape {b.shape})")
    batch = broadcast_shape(a.shape[:-2], bm.shape[:-2])
    a, bm = a.expand(*batch, m, n), bm.expand(*batch, m, bm.shape[-1])
    try:
        q, _, r_inv = _qr_detached(a)
    except LinAlgError as e:
        raise LinAlgError("lstsq: A is rank-deficient; only full-rank tall or square A is supported") from e
    pinv = (r_inv @ _mT(q)).cast(dt)
    gram_inv = (r_inv @ _mT(r_inv)).cast(dt)
    x0 = (pinv @ bm.detach()).contiguous().realize()
    residual0 = (bm - a @ x0).detach()
    x = x0 + pinv @ (bm - a @ x0) + gram_inv @ (_mT(a - a.detach()) @ residual0)
    return x.squeeze(-1) if vector else x


# Tensor methods (x.solve(b) is solve(x, b)): this module builds on Tensor, so it adds them to the class
# when imported (polygrad/__init__.py imports it), and tensor.py never reaches up to it
for _method in (solve, lstsq, cholesky, cholesky_solve, qr, solve_triangular, triangular_solve, inv, det, slogdet):
    setattr(Tensor, _method.__name__, _method)
