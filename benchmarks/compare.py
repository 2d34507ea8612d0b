"""polygrad beside NumPy and PyTorch (and, optionally, other interpreters), measured in one invocation.

Run:  python benchmarks/compare.py [--only matmul1024 ...] [--cc clang gcc] [--python /other/venv/bin/python]
                                   [--jsonl results.jsonl] [--reps 5] [--tiny] [--shared-process]

Every (library, workload) runs in a fresh subprocess of this file (`--worker`), so first-call timings
are honest and one library's thread pools never slow another. polygrad runs once per C compiler in
`--cc` (POLY_CC; default: every one of clang and gcc found on PATH), so each row has a column per
compiler. `--python PATH` adds a column per interpreter: it runs the polygrad workloads with that
interpreter, whatever `polygrad` (or, failing that, `tinygrad`) it imports, e.g. a separate venv with
the published polygrad. Nothing here is a dependency of the project. On x86-64 with clang or gcc, a
"ceiling" column runs hand-written C (benchmarks/ceiling.c) in the same invocation: the FMA peak of every
core on the matmul rows, a non-temporal stream of the same body on the elementwise row. It says how close
to the machine each library is on this run (`--no-ceiling` leaves it out).

The table prints one row per workload, the figure of each column and the ratios of the first polygrad
column to NumPy and to PyTorch, oriented so that > 1 means polygrad is better. Each figure is also
written as one JSON line ({"workload", "library", "value", "unit", "better", ...}) to `--jsonl`.
OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE are removed from the workers' environment (they slow a current
NumPy); the BLAS NumPy ran with is reported when threadpoolctl is installed.

`--shared-process` adds a column "LIB shared" per library column (polygrad, NumPy, PyTorch; not the
ceiling): the library is timed in a process where the other libraries of the row run their own version
of the workload too, once (untimed) before its warm-up and before every timed round, as in a user's
script that mixes them. Their thread pools then wait in their own ways (NumPy's OpenBLAS and PyTorch's
OpenMP threads spin for a while after each call) on the cores the timed library wants: the columns show
what a library loses beside the others, and polygrad's idle workers must cost NumPy and PyTorch nothing.
The ratios of the shared polygrad column against the shared NumPy and PyTorch columns are printed too.

The polygrad packages' bytecode is written first (benchmarks/prepare_bytecode.py), as pip install leaves
it. Before its timed workers, each polygrad column runs one untimed process in its cache folder, so one-time
set-up that lands there (the CPU backend builds its C thread pool in the background on a first run)
is not timed; the first-call rows use folders of their own, cold or warmed as they say.

`--tiny` runs every workload at toy sizes with one repetition: CI uses it to keep this script working
(tests/test_compare_bench.py); its figures mean nothing. The machine is usually shared: figures are the
best of `--reps` runs after 0.25 s of untimed calls (WARMUP_S; a first call: the best of `--reps` fresh
processes), and still noisy under load.

Adding a workload: write `w_<name>(lib, tiny, reps)` below returning the figure (the worker imports
`np`, and `pg`/`torch` as the library needs), and add a row to WORKLOADS.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable

HERE = os.path.abspath(__file__)
ROOT = os.path.dirname(os.path.dirname(HERE))


# ---- worker side: one workload for one library ------------------------------------------------------
# Untimed calls before the rounds, for at least this long: a fresh worker is not yet steady (NumPy's
# OpenBLAS threads spin for tens of ms after the import, on the core the other thread of a 2-core machine
# needs; measured: a tiny op read 13 us instead of 9 in a third of fresh processes). Every column gets it.
WARMUP_S = 0.25
# Calls made (untimed) before the warm-up and before every timed round of `best`: --shared-process puts
# the other libraries' version of the workload here
BETWEEN_ROUNDS: list[Callable[[], Any]] = []


def _between_rounds() -> None:
    for call in BETWEEN_ROUNDS:
        call()


def best(fn: Callable[[], Any], reps: int, inner: int = 1) -> float:
    """Best seconds per call of fn over `reps` rounds of `inner` calls, after warm-up calls (at least one,
    and for at least WARMUP_S); BETWEEN_ROUNDS runs before the warm-up and before each round, untimed."""
    _between_rounds()
    end = time.perf_counter() + WARMUP_S
    fn()
    while time.perf_counter() < end:
        fn()
    t = float("inf")
    for _ in range(max(1, reps)):
        _between_rounds()
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        t = min(t, (time.perf_counter() - t0) / inner)
    return t


def import_polygrad() -> Any:
    try:
        import polygrad as pg
    except ImportError:
        import tinygrad as pg  # another library with the same front end (optional, --python)
    return pg


def _rand(*shape: int) -> Any:
    import numpy as np
    return np.random.default_rng(0).random(shape, dtype=np.float32)


def _ceiling_lib() -> Any:
    """benchmarks/ceiling.c compiled with POLY_CC (else clang or gcc) for this CPU, loaded with ctypes."""
    import ctypes
    cc = os.environ.get("POLY_CC") or next((c for c in ("clang", "gcc") if shutil.which(c)), None)
    if cc is None:
        raise RuntimeError("the ceiling column needs a C compiler (clang or gcc) on PATH")
    so = os.path.join(tempfile.mkdtemp(prefix="pgceiling-"), "ceiling.so")
    subprocess.run([cc, "-O3", "-march=native", "-shared", "-fPIC", "-pthread", "-o", so,
                    os.path.join(os.path.dirname(HERE), "ceiling.c")], check=True)
    lib = ctypes.CDLL(so)
    lib.pg_stream.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    lib.pg_fma_peak.argtypes, lib.pg_fma_peak.restype = [ctypes.c_long, ctypes.c_int], ctypes.c_double
    return lib


def _threads() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def _fma_peak(tiny: bool, reps: int) -> float:
    """GFLOP/s of independent FMA chains on every core: the most any matmul here can reach."""
    lib, iters = _ceiling_lib(), 1000 if tiny else 1_000_000
    flops: list[float] = []
    # a few ms a round: more rounds than the libraries get, so one round with both cores free is likely
    t = best(lambda: flops.append(lib.pg_fma_peak(iters, _threads())), max(reps, 20))
    return flops[-1] / t / 1e9


def _matmul(lib: str, tiny: bool, reps: int, n: int, kind: str) -> float:
    if lib == "ceiling":
        return _fma_peak(tiny, reps)
    n = 64 if tiny else n
    a, b = _rand(n, n), _rand(n, n)
    if lib == "numpy":
        fa, fb = {"nn": (lambda: a, lambda: b), "tn": (lambda: a.T, lambda: b), "nt": (lambda: a, lambda: b.T)}[kind]
        t = best(lambda: fa() @ fb(), reps)
    elif lib == "torch":
        import torch
        ta, tb = torch.from_numpy(a), torch.from_numpy(b)
        fn = {"nn": lambda: ta @ tb, "tn": lambda: ta.T @ tb, "nt": lambda: ta @ tb.T}[kind]
        t = best(fn, reps)
    else:
        pg = import_polygrad()
        ta, tb = pg.Tensor(a).realize(), pg.Tensor(b).realize()
        fn = {"nn": lambda: (ta @ tb).realize(), "tn": lambda: (ta.T @ tb).realize(),
              "nt": lambda: (ta @ tb.T).realize()}[kind]
        t = best(fn, reps)
    return 2 * n ** 3 / t / 1e9


def w_matmul1024(lib: str, tiny: bool, reps: int) -> float:
    return _matmul(lib, tiny, reps, 1024, "nn")


def w_matmul2048(lib: str, tiny: bool, reps: int) -> float:
    return _matmul(lib, tiny, reps, 2048, "nn")


def w_matmul1024_tn(lib: str, tiny: bool, reps: int) -> float:
    return _matmul(lib, tiny, reps, 1024, "tn")


def w_matmul1024_nt(lib: str, tiny: bool, reps: int) -> float:
    return _matmul(lib, tiny, reps, 1024, "nt")


def w_matmul1024_beam(lib: str, tiny: bool, reps: int) -> float:
    if lib in ("numpy", "torch", "ceiling"):
        return _matmul(lib, tiny, reps, 1024, "nn")
    pg = import_polygrad()
    with pg.Context(BEAM=2):
        return _matmul(lib, tiny, reps, 1024, "nn")


def w_mlp_adam(lib: str, tiny: bool, reps: int) -> float:
    """Steps per second of a jitted Adam step of a 784-512-512-10 MLP on a batch of 128."""
    import numpy as np
    dims, batch = ((32, 16, 16, 4), 8) if tiny else ((784, 512, 512, 10), 128)
    rng = np.random.default_rng(0)
    x_np = rng.random((batch, dims[0]), dtype=np.float32)
    y_np = rng.integers(0, dims[-1], batch).astype(np.int32)
    if lib == "torch":
        import torch
        layers = [torch.nn.Linear(i, o) for i, o in zip(dims[:-1], dims[1:])]
        opt = torch.optim.Adam([p for ly in layers for p in ly.parameters()], lr=1e-3)
        x, y = torch.from_numpy(x_np), torch.from_numpy(y_np).long()

        def step() -> None:
            opt.zero_grad()
            h = x
            for i, ly in enumerate(layers):
                h = ly(h) if i == len(layers) - 1 else ly(h).relu()
            torch.nn.functional.cross_entropy(h, y).backward()
            opt.step()
        return 1 / best(step, reps, 1 if tiny else 10)
    pg = import_polygrad()
    layers = [pg.nn.Linear(i, o) for i, o in zip(dims[:-1], dims[1:])]
    params = [p for ly in layers for p in (ly.weight, ly.bias)]
    opt = pg.nn.optim.Adam(params, lr=1e-3)
    x, y = pg.Tensor(x_np).realize(), pg.Tensor(y_np).realize()

    @pg.TinyJit
    def step(x: Any, y: Any) -> Any:
        opt.zero_grad()
        h = x
        for i, ly in enumerate(layers):
            h = ly(h) if i == len(layers) - 1 else ly(h).relu()
        loss = h.cross_entropy(y)
        loss.backward()
        opt.step()
        return loss.realize()

    def run() -> Any:
        with pg.Context(TRAINING=1):
            return step(x, y)
    for _ in range(3):
        run()
    return 1 / best(run, reps, 1 if tiny else 10)


def w_transformer_block(lib: str, tiny: bool, reps: int) -> float:
    """Milliseconds for one jitted forward of a pre-norm transformer block (d768, 12 heads, seq 128)."""
    import numpy as np
    d, heads, seq = (32, 2, 8) if tiny else (768, 12, 128)
    rng = np.random.default_rng(0)
    w = {k: (rng.standard_normal(s).astype(np.float32) * 0.02) for k, s in
         {"qkv": (d, 3 * d), "o": (d, d), "up": (d, 4 * d), "down": (4 * d, d)}.items()}
    x_np = rng.standard_normal((1, seq, d)).astype(np.float32)
    hd = d // heads
    if lib == "torch":
        import torch
        tw = {k: torch.from_numpy(v) for k, v in w.items()}
        x = torch.from_numpy(x_np)
        f = torch.nn.functional

        def fwd() -> Any:
            with torch.no_grad():
                h = f.layer_norm(x, (d,))
                q, k, v = (h @ tw["qkv"]).split(d, dim=-1)
                q, k, v = (t.reshape(1, seq, heads, hd).transpose(1, 2) for t in (q, k, v))
                att = ((q @ k.transpose(-1, -2)) / hd ** 0.5).softmax(-1) @ v
                h = x + att.transpose(1, 2).reshape(1, seq, d) @ tw["o"]
                return h + f.gelu(f.layer_norm(h, (d,)) @ tw["up"], approximate="tanh") @ tw["down"]
        return 1e3 * best(fwd, reps)
    pg = import_polygrad()
    tw = {k: pg.Tensor(v).realize() for k, v in w.items()}
    x = pg.Tensor(x_np).realize()

    @pg.TinyJit
    def fwd(x: Any) -> Any:
        h = x.layernorm()
        qkv = h @ tw["qkv"]
        q, k, v = (qkv[:, :, i * d:(i + 1) * d].reshape(1, seq, heads, hd).transpose(1, 2) for i in range(3))
        att = ((q @ k.transpose(-1, -2)) / hd ** 0.5).softmax(-1) @ v
        h = x + att.transpose(1, 2).reshape(1, seq, d) @ tw["o"]
        return (h + (h.layernorm() @ tw["up"]).gelu() @ tw["down"]).realize()
    for _ in range(3):
        fwd(x)
    return 1e3 * best(lambda: fwd(x), reps)


def _conv(lib: str, tiny: bool, reps: int, backward: bool) -> float:
    import numpy as np
    bs, c, hw = (1, 4, 8) if tiny else (8, 64, 56)
    rng = np.random.default_rng(0)
    x_np = rng.standard_normal((bs, c, hw, hw)).astype(np.float32)
    w_np = (rng.standard_normal((c, c, 3, 3)) * 0.1).astype(np.float32)
    g_np = rng.standard_normal((bs, c, hw, hw)).astype(np.float32)  # the upstream gradient
    if lib == "torch":
        import torch
        x = torch.from_numpy(x_np).requires_grad_(backward)
        wt = torch.from_numpy(w_np).requires_grad_(backward)
        g = torch.from_numpy(g_np)

        def run() -> None:
            out = torch.nn.functional.conv2d(x, wt, padding=1)
            if backward:
                x.grad = wt.grad = None
                out.backward(g)
        return 1e3 * best(run, reps)
    pg = import_polygrad()
    x = pg.Tensor(x_np, requires_grad=backward).realize()
    wt = pg.Tensor(w_np, requires_grad=backward).realize()
    g_pg = pg.Tensor(g_np).realize()

    def run_pg() -> None:
        out = x.conv2d(wt, padding=1)
        if backward:  # forward output, input and weight gradients, as torch computes them
            x.grad = wt.grad = None
            (out * g_pg).sum().backward()
            out.realize(x.grad, wt.grad)
        else:
            out.realize()
    return 1e3 * best(run_pg, reps)


def w_conv2d_fwd(lib: str, tiny: bool, reps: int) -> float:
    return _conv(lib, tiny, reps, False)


def w_conv2d_bwd(lib: str, tiny: bool, reps: int) -> float:
    return _conv(lib, tiny, reps, True)


def w_elementwise(lib: str, tiny: bool, reps: int) -> float:
    """GB/s of input read by a fused elementwise chain ((x*2+1).relu()*x) over 16M float32."""
    import numpy as np
    n = 4096 if tiny else 1 << 24
    x_np = _rand(n)
    if lib == "ceiling":  # the same body in hand-written C: aligned loads, non-temporal stores, every core
        c, threads = _ceiling_lib(), _threads()
        n -= n % (16 * threads)
        x_al, y_al = (np.empty(n + 16, np.float32) for _ in range(2))
        x, y = (a[(-a.ctypes.data % 64) // 4:][:n] for a in (x_al, y_al))
        x[:] = x_np[:n]
        t = best(lambda: c.pg_stream(x.ctypes.data, y.ctypes.data, n, threads), reps)
        if not np.array_equal(y, np.maximum(x * 2 + 1, 0) * x):  # the C body must compute what the libraries do
            raise RuntimeError("benchmarks/ceiling.c's stream gave a wrong result")
    elif lib == "numpy":
        t = best(lambda: np.maximum(x_np * 2 + 1, 0) * x_np, reps)
    elif lib == "torch":
        import torch
        x = torch.from_numpy(x_np)
        t = best(lambda: (x * 2 + 1).relu() * x, reps)
    else:
        pg = import_polygrad()
        x = pg.Tensor(x_np).realize()
        t = best(lambda: ((x * 2 + 1).relu() * x).realize(), reps)
    return n * 4 / t / 1e9


def _tiny(lib: str, reps: int, jit: bool) -> float:
    import numpy as np
    a_np, b_np = np.array([1.0, 2.0, 3.0, 4.0], np.float32), np.array([4.0, 3.0, 2.0, 1.0], np.float32)
    if lib == "numpy":
        return 1e6 * best(lambda: a_np + b_np, reps, 2000)
    if lib == "torch":
        import torch
        a, b = torch.from_numpy(a_np), torch.from_numpy(b_np)
        return 1e6 * best(lambda: a + b, reps, 2000)
    pg = import_polygrad()
    a, b = pg.Tensor(a_np).realize(), pg.Tensor(b_np).realize()
    if not jit:
        return 1e6 * best(lambda: (a + b).realize(), reps, 200)
    add = pg.TinyJit(lambda a, b: (a + b).realize())
    for _ in range(3):
        add(a, b)
    pg.GlobalCounters.reset()
    add(a, b)
    kernels = max(1, pg.GlobalCounters.kernel_count)  # issue 17 sets the target per kernel a replay launches
    return 1e6 * best(lambda: add(a, b), reps, 500) / kernels


def w_tiny_op(lib: str, tiny: bool, reps: int) -> float:
    """Microseconds per call of a 4-element add, realized each call (no jit)."""
    return _tiny(lib, reps, False)


def w_tiny_op_jit(lib: str, tiny: bool, reps: int) -> float:
    """Microseconds per kernel of a jitted replay of a 4-element add (the replay's time over the kernels it
    launches, counted by GlobalCounters: one here)."""
    return _tiny(lib, reps, True)


def w_first_call(lib: str, tiny: bool, reps: int) -> float:
    """Milliseconds for the first realize of (a @ b).relu().sum() on 256x256 in this fresh process
    (the driver keeps the best of --reps processes, each with an empty POLY_CACHE_DIR for the cold
    figure, or with one that an earlier process filled for the warm one)."""
    import numpy as np
    n = 32 if tiny else 256
    a_np, b_np = _rand(n, n), _rand(n, n) + 1
    t0 = time.perf_counter()
    if lib == "numpy":
        float(np.maximum(a_np @ b_np, 0).sum())
    elif lib == "torch":
        import torch
        t0 = time.perf_counter()  # the import is not the compute path (as for polygrad)
        float((torch.from_numpy(a_np) @ torch.from_numpy(b_np)).relu().sum())
    else:
        pg = import_polygrad()
        a, b = pg.Tensor(a_np), pg.Tensor(b_np)
        t0 = time.perf_counter()  # the import is not the compile path
        float((a @ b).relu().sum().item())
    return 1e3 * (time.perf_counter() - t0)


# name: (unit, "higher"/"lower" is better, worker, libraries that have it)
ALL = ("polygrad", "numpy", "torch")
# "ceiling": hand-written C (benchmarks/ceiling.c) for what the machine allows: the FMA peak for the
# matmul rows, a non-temporal stream for the elementwise row
MM = ALL + ("ceiling",)
WORKLOADS: dict[str, tuple[str, str, Callable[[str, bool, int], float], tuple[str, ...]]] = {
    "matmul1024": ("GFLOP/s", "higher", w_matmul1024, MM),
    "matmul2048": ("GFLOP/s", "higher", w_matmul2048, MM),
    "matmul1024_tn": ("GFLOP/s", "higher", w_matmul1024_tn, MM),
    "matmul1024_nt": ("GFLOP/s", "higher", w_matmul1024_nt, MM),
    "matmul1024_beam2": ("GFLOP/s", "higher", w_matmul1024_beam, MM),
    "mlp_adam": ("steps/s", "higher", w_mlp_adam, ("polygrad", "torch")),
    "transformer_block": ("ms", "lower", w_transformer_block, ("polygrad", "torch")),
    "conv2d_fwd": ("ms", "lower", w_conv2d_fwd, ("polygrad", "torch")),
    "conv2d_fwd_bwd": ("ms", "lower", w_conv2d_bwd, ("polygrad", "torch")),
    "elementwise_16M": ("GB/s", "higher", w_elementwise, MM),
    "tiny_op": ("us", "lower", w_tiny_op, ALL),
    "tiny_op_jit": ("us/kernel", "lower", w_tiny_op_jit, ("polygrad",)),
    "first_call_cold": ("ms", "lower", w_first_call, ALL),
    "first_call_warm": ("ms", "lower", w_first_call, ("polygrad",)),
}
DEFAULT_SKIP = ("matmul1024_beam2",)  # minutes of search on a cold cache: ask for it with --only


SHARED = "-shared"  # a worker library "LIB-shared": LIB timed beside the row's other libraries


def peer_call(name: str, lib: str, tiny: bool) -> Callable[[], Any]:
    """The call that workload `name` times for `lib`, set up as it is for timing (its inputs, its jit
    warmed), without timing it: the workload runs with a `best` that keeps the call and returns 1."""
    global best
    kept: list[Callable[[], Any]] = []
    timed = best

    def keep(fn: Callable[[], Any], reps: int, inner: int = 1) -> float:
        fn()
        kept.append(fn)
        return 1.0
    best = keep
    try:
        WORKLOADS[name][2](lib, tiny, 1)
    finally:
        best = timed
    return kept[-1]


def run_workload(name: str, lib: str, tiny: bool, reps: int) -> float:
    """The figure of workload `name` for `lib`; for "LIB-shared", LIB's figure with the row's other
    libraries' calls in BETWEEN_ROUNDS (each set up once in this process)."""
    if not lib.endswith(SHARED):
        return WORKLOADS[name][2](lib, tiny, reps)
    lib = lib[:-len(SHARED)]
    peers = [peer_call(name, other, tiny) for other in ALL if other != lib and other in WORKLOADS[name][3]]
    BETWEEN_ROUNDS[:] = peers
    try:
        return WORKLOADS[name][2](lib, tiny, reps)
    finally:
        BETWEEN_ROUNDS.clear()


def worker(lib: str, names: str, tiny: bool, reps: int) -> None:
    """Run workloads (comma-separated) for one library; print one JSON line each."""
    for name in names.split(","):
        value = run_workload(name, lib, tiny, reps)
        extra: dict[str, Any] = {}
        if lib.startswith("numpy"):
            try:
                from threadpoolctl import threadpool_info
                extra["blas"] = [f"{i.get('internal_api')}:{i.get('architecture')}:{i.get('num_threads')}"
                                 for i in threadpool_info()]
            except ImportError:
                pass
        print(json.dumps({"workload": name, "value": value, **extra}), flush=True)


# ---- driver side ---------------------------------------------------------------------------------------
def column_runs(args: argparse.Namespace) -> list[tuple[str, str, str, dict[str, str]]]:
    """(column label, library, interpreter, extra environment) for every column of the table."""
    cols = []
    for cc in args.cc:
        if shutil.which(cc):
            cols.append((f"polygrad[{cc}]", "polygrad", sys.executable, {"POLY_CC": cc}))
    cols.append(("numpy", "numpy", sys.executable, {}))
    cols.append(("torch", "torch", sys.executable, {}))
    if args.ceiling and platform.machine() in ("x86_64", "AMD64") and (shutil.which("clang") or shutil.which("gcc")):
        cols.append(("ceiling", "ceiling", sys.executable, {}))
    for py in args.python:
        cols.append((f"py:{py}", "polygrad", py, {}))
    if args.shared_process:
        cols += [(f"{label} shared", lib + SHARED, py, env) for label, lib, py, env in list(cols)
                 if lib in ALL and py == sys.executable]
    return cols


def has_workload(lib: str, name: str) -> bool:
    """Whether workload `name` runs for column library `lib` (a shared one: when another library has it)."""
    libs = WORKLOADS[name][3]
    if lib.endswith(SHARED):  # a first call is one per process: the first library's alone
        own = lib[:-len(SHARED)]
        return own in libs and any(o in libs for o in ALL if o != own) and not name.startswith("first_call")
    return lib in libs


def run_one(py: str, lib: str, names: list[str], env_extra: dict[str, str], args: argparse.Namespace,
            cache: str) -> dict[str, dict[str, Any]]:
    """Run workloads in one fresh worker process; {workload: its JSON result} for those that ran."""
    env = {k: v for k, v in os.environ.items() if k not in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")}
    env.update(env_extra)
    env["POLY_CACHE_DIR"] = cache
    cmd = [py, HERE, "--worker", lib, ",".join(names), "--reps", str(args.reps)] + (["--tiny"] if args.tiny else [])
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
    results = {}
    for line in proc.stdout.splitlines():
        if line.startswith("{"):
            res = json.loads(line)
            results[res.pop("workload")] = res
    if proc.returncode != 0:
        print(f"  {names} [{lib} {py}] failed: {proc.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
    return results


def first_calls(py: str, lib: str, name: str, env: dict[str, str], args: argparse.Namespace) -> dict[str, Any]:
    """A first call is one sample per process: the best of --reps fresh processes, each cold one with an
    empty cache folder, the warm ones sharing a folder one process filled first."""
    best_res: dict[str, Any] = {}
    warm = tempfile.mkdtemp(prefix="pgcompare-first-")
    if name == "first_call_warm":
        run_one(py, lib, [name], env, args, warm)
    for _ in range(max(1, args.reps)):
        cache = warm if name == "first_call_warm" else tempfile.mkdtemp(prefix="pgcompare-first-")
        res = run_one(py, lib, [name], env, args, cache).get(name)
        if cache != warm:
            shutil.rmtree(cache, ignore_errors=True)
        if res is not None and (not best_res or res["value"] < best_res[name]["value"]):
            best_res = {name: res}
    shutil.rmtree(warm, ignore_errors=True)
    return best_res


def fmt(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v:.3g}" if abs(v) < 100 else f"{v:.0f}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--worker", nargs=2, metavar=("LIB", "WORKLOAD"), help=argparse.SUPPRESS)
    ap.add_argument("--only", nargs="*", default=None, help=f"workloads (default: all but {DEFAULT_SKIP})")
    ap.add_argument("--cc", nargs="*", default=["clang", "gcc"], help="C compilers for the polygrad columns")
    ap.add_argument("--python", action="append", default=[], help="another interpreter (a column of its own)")
    ap.add_argument("--jsonl", default="compare.jsonl", help="where to write one JSON line per figure")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--tiny", action="store_true", help="toy sizes, one repetition (keeps the script working)")
    ap.add_argument("--timeout", type=int, default=1800)
    ap.add_argument("--shared-process", action="store_true",
                    help="add a column per library timed beside the other libraries' calls in one process")
    ap.add_argument("--no-ceiling", dest="ceiling", action="store_false",
                    help="leave out the hand-written C ceiling column (shown on x86-64 with clang or gcc)")
    args = ap.parse_args(argv)
    if args.tiny:
        args.reps = 1
        global WARMUP_S
        WARMUP_S = 0.0  # one warm-up call: the figures of --tiny mean nothing anyway
    if args.worker:
        worker(args.worker[0], args.worker[1], args.tiny, args.reps)
        return 0
    names = args.only or [w for w in WORKLOADS if w not in DEFAULT_SKIP]
    unknown = [n for n in names if n not in WORKLOADS]
    if unknown:
        ap.error(f"unknown workloads {unknown}; known: {sorted(WORKLOADS)}")
    cols = column_runs(args)
    if any(lib == "polygrad" and py == sys.executable for _, lib, py, _ in cols):
        from prepare_bytecode import prepare_bytecode
        prepare_bytecode()  # as pip install leaves it: first calls do not compile module source
    caches = {label: tempfile.mkdtemp(prefix="pgcompare-") for label, *_ in cols}
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
    rows: dict[str, dict[str, float | None]] = {name: {} for name in names}
    with open(args.jsonl, "a") as out:
        for label, lib, py, env in cols:
            mine = [n for n in names if has_workload(lib, n)]
            # one process per workload (no shared thread pools or caches); --tiny batches the plain ones
            plain = [n for n in mine if not n.startswith("first_call")]
            batches = [plain] if args.tiny and plain else [[n] for n in plain]
            results: dict[str, dict[str, Any]] = {}
            if lib.startswith("polygrad") and plain and not args.tiny:
                # one untimed process first: a library's one-time set-up that lands in the cache folder (the
                # CPU backend compiles its C thread pool in the background, on a core a timed kernel wants)
                # is done before any timed worker runs, as on a user's machine after its first run
                run_one(py, lib, ["matmul1024"], env, argparse.Namespace(**{**vars(args), "reps": 1}), caches[label])
            for batch in batches:
                results.update(run_one(py, lib, batch, env, args, caches[label]))
            for name in (n for n in mine if n.startswith("first_call")):
                results.update(first_calls(py, lib, name, env, args))
            for name in names:
                res = results.get(name)
                rows[name][label] = None if res is None else res["value"]
                if res is not None:
                    unit, better = WORKLOADS[name][:2]
                    out.write(json.dumps({"time": stamp, "workload": name, "column": label, "library": lib,
                                          "python": py, "value": res["value"], "unit": unit, "better": better,
                                          "tiny": args.tiny, **{k: v for k, v in res.items() if k != "value"},
                                          **env}) + "\n")
    labels = [c[0] for c in cols]
    first = next((c for c in labels if c.startswith("polygrad")), None)
    pairs = [(first, "numpy", "vs numpy"), (first, "torch", "vs torch")]
    if args.shared_process:
        pairs += [(f"{first} shared", f"{ref} shared", f"sh. vs {ref}") for ref in ("numpy", "torch")]
    widths = [max(16, len(c)) for c in labels]
    head = f"{'workload':18s} {'unit':8s} " + " ".join(f"{c:>{w}s}" for c, w in zip(labels, widths))
    print(head + "  " + " ".join(f"{p[2]:>14s}" for p in pairs))
    for name in names:
        unit, better = WORKLOADS[name][:2]
        vals = rows[name]
        ratios = []
        for ours_col, ref_col, _ in pairs:
            ours, theirs = vals.get(ours_col), vals.get(ref_col)
            if ours and theirs:
                ratios.append(f"{(ours / theirs if better == 'higher' else theirs / ours):13.2f}x")
            else:
                ratios.append(f"{'-':>14s}")
        print(f"{name:18s} {unit:8s} " + " ".join(f"{fmt(vals.get(c)):>{w}s}" for c, w in zip(labels, widths)) +
              "  " + " ".join(ratios))
    print(f"(ratios: {first} against each, > 1 means polygrad is better; 'sh.': the shared-process columns; "
          f"JSON lines in {args.jsonl})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
