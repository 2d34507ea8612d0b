"""Data-parallel Model.fit on MPI: 1 rank against 2 ranks, and gradient averaging against raw mpi4py.

MLP 784-512-512-10, cross-entropy, SGD, global batch 1024 (each rank 1024 / ranks samples), one thread
per rank (POLY_THREADS=1). Reports samples/s of each world size and the scaling efficiency
(samples/s of N ranks / (N x samples/s of 1 rank)); then, on 2 ranks, the bandwidth of averaging the
MLP's gradient buffers against raw mpi4py `Allreduce` on the same buffers (one call per buffer, and one
on a flat buffer of the same total), medians of alternated rounds. polygrad's rows: the Averager
(distributed/buckets.py: pack, one allreduce per bucket, unpack) leaving sums, as Model.fit uses it (its
update multiplies the gradients by a grad-scale slot holding 1/N); the same with the 1/N of the buffers
reduced in their own memory deferred to the optimizer's kernel, as DistributedOptimizer uses it; the same
writing means (a pass over the big buffers: fit's path when a train_step recorded the update first); and
dist.all_reduce of one flat Tensor (a new result buffer and the operand check each call). Bandwidth is
the algorithm bandwidth: bytes reduced per second.

    python benchmarks/bench_distributed.py [--steps 20]

It launches itself under mpiexec (found beside the Python interpreter or on PATH). Not a timed test.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import subprocess
import sys
import time

import numpy as np

SIZES, GLOBAL_BATCH = (784, 512, 512, 10), 1024


def worker(steps: int) -> None:
    import polygrad.distributed as dist
    from bench_model_fit import MLP  # the same 784-512-512-10 network (its SIZES are ours)
    from polygrad import Model, Tensor
    from polygrad.device import Buffer
    from polygrad.dtype import dtypes

    dist.init()
    n, r = dist.world_size(), dist.rank()
    local = GLOBAL_BATCH // n

    Tensor.manual_seed(0)
    model = Model(MLP(), inputs={"x": Tensor.empty(local, SIZES[0])}, targets={"y": Tensor.empty(local, dtype="int32")},
                  loss=lambda out, y: out["logits"].sparse_categorical_crossentropy(y))
    rng = np.random.default_rng(0)
    warm = 3
    X = rng.standard_normal(((warm + steps) * GLOBAL_BATCH, SIZES[0])).astype(np.float32)
    Y = rng.integers(0, 10, (warm + steps) * GLOBAL_BATCH).astype(np.int32)
    head = warm * GLOBAL_BATCH
    model.fit({"x": X[:head], "y": Y[:head]}, batch_size=GLOBAL_BATCH, optimizer="sgd", lr=0.01, verbose=False,
              distributed=True)
    dist.barrier()
    dist.reset_stats()
    t0 = time.perf_counter()
    model.fit({"x": X[head:], "y": Y[head:]}, batch_size=GLOBAL_BATCH, optimizer="sgd", lr=0.01, verbose=False,
              distributed=True)
    dist.barrier()
    took = time.perf_counter() - t0
    stats = dist.stats()
    out = {"ranks": n, "samples_per_s": steps * GLOBAL_BATCH / took, "step_ms": 1e3 * took / steps,
           "mpi_calls_per_step": stats["calls_per_step"], "mpi_seconds_per_step": stats["seconds"] / steps}
    if n > 1:  # gradient averaging against raw mpi4py on buffers of the MLP's gradient sizes
        from mpi4py import MPI
        from polygrad.distributed import Averager
        from polygrad.distributed.comm import world
        from polygrad.distributed.hostview import host_view
        sizes = [a * b for a, b in zip(SIZES, SIZES[1:])] + list(SIZES[1:])
        bufs = [Buffer("CPU", s, dtypes.float32).ensure_allocated() for s in sizes]
        views = [host_view(b) for b in bufs]
        flat = np.ones(sum(sizes), dtype=np.float32)
        nbytes = flat.nbytes
        averager = Averager(world())
        comm = MPI.COMM_WORLD

        rounds = 15
        out["bytes_reduced"] = nbytes

        def timed(fn, reps=20) -> float:
            fn()
            comm.Barrier()
            t = time.perf_counter()
            for _ in range(reps):
                fn()
            comm.Barrier()
            return nbytes * reps / (time.perf_counter() - t) / 1e9
        flat_t = Tensor(flat).realize()
        result = np.empty_like(flat)  # all_reduce leaves its operand as it is: compare it with this
        runs = {"polygrad_sums_GBps": lambda: averager.average(bufs, sums=True),
                "polygrad_deferred_GBps": lambda: averager.average(bufs, defer=True),
                "polygrad_average_GBps": lambda: averager.average(bufs),
                "polygrad_all_reduce_GBps": lambda: dist.all_reduce(flat_t),
                "mpi4py_per_buffer_GBps": lambda: [comm.Allreduce(MPI.IN_PLACE, v) for v in views],
                "mpi4py_flat_GBps": lambda: comm.Allreduce(MPI.IN_PLACE, flat),
                "mpi4py_flat_out_of_place_GBps": lambda: comm.Allreduce(flat, result)}
        samples: dict[str, list[float]] = {k: [] for k in runs}
        for _ in range(rounds):  # alternated, so a busy moment hits every variant alike
            for k, fn in runs.items():
                samples[k].append(timed(fn))
        out.update({k: float(np.median(v)) for k, v in samples.items()})
    if r == 0:
        print("RESULT " + json.dumps(out), flush=True)


def launch(ranks: int, steps: int) -> dict:
    mpiexec = pathlib.Path(sys.executable).parent / "mpiexec"
    exe = str(mpiexec) if mpiexec.exists() else shutil.which("mpiexec")
    if exe is None:
        sys.exit("needs mpiexec: pip install 'polygrad[distributed]'")
    env = {**os.environ, "POLY_THREADS": "1"}
    proc = subprocess.run([exe, "-n", str(ranks), sys.executable, __file__, "--worker", "--steps", str(steps)],
                          env=env, capture_output=True, text=True, check=True)
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--worker", action="store_true")
    args = ap.parse_args()
    if args.worker:
        worker(args.steps)
        return
    one, two = launch(1, args.steps), launch(2, args.steps)
    print(f"MLP {'-'.join(map(str, SIZES))}, global batch {GLOBAL_BATCH}, SGD, POLY_THREADS=1 per rank")
    for res in (one, two):
        print(f"  {res['ranks']} rank(s): {res['samples_per_s']:9.0f} samples/s, {res['step_ms']:7.1f} ms/step, "
              f"{res['mpi_calls_per_step']} MPI call(s)/step, {1e3 * res['mpi_seconds_per_step']:.2f} ms/step in MPI")
    print(f"  scaling efficiency on 2 ranks: {two['samples_per_s'] / (2 * one['samples_per_s']):.0%}")
    print(f"gradient averaging, {two['bytes_reduced'] / 2**20:.2f} MiB on 2 ranks (GB/s reduced):")
    raw = two["mpi4py_per_buffer_GBps"]
    rows = [("polygrad Averager, sums, 1/N in the update's grad-scale slot (Model.fit)", "polygrad_sums_GBps"),
            ("polygrad Averager, 1/N deferred to the step (DistributedOptimizer)", "polygrad_deferred_GBps"),
            ("polygrad Averager, means (fit after a train_step recorded the update)", "polygrad_average_GBps"),
            ("polygrad dist.all_reduce(sum) of one flat Tensor", "polygrad_all_reduce_GBps"),
            ("raw mpi4py Allreduce, one call per buffer", "mpi4py_per_buffer_GBps"),
            ("raw mpi4py Allreduce, one flat buffer", "mpi4py_flat_GBps"),
            ("raw mpi4py Allreduce, one flat buffer into another (as all_reduce)", "mpi4py_flat_out_of_place_GBps")]
    for label, key in rows:
        print(f"  {label}: {two[key]:.2f} ({raw / two[key] - 1:+.0%} time against raw per buffer)")


if __name__ == "__main__":
    main()
