"""What a second thread gives each threaded kernel of a decode step: time per launch at 1 and 2 threads.

Workload: a model load_hf opens (a GGUF file, e.g. one bench_gguf.write_qwen2_gguf wrote), a 32-token
prompt and a few decode steps, at POLY_THREADS=2. Then, per group of the decode step's threaded launches
(kernel name and opts, as profile_decode.py groups them), the group's launches run as one launch plan
(the pool library's pg_run_plan, no Python between them, as a step runs them) offered to 1 and to 2
threads in alternation, each after a 256 MB read so the weights come from memory as in a decode step.
Columns: launches, bytes a launch moves, the median and fastest time per launch at each thread count
over `--rounds`, and what a split cost beyond its halves (2-thread time less half the 1-thread time,
medians): the figure hostcpu's thread_handoff_ns stands for. A last line times the whole step's launch
plans the same way. profile_decode.py at --threads 2 runs each launch through Python instead (about 1-2 us
more a threaded launch), so its small kernels read slower than they are.

It reads the Model's executor (model/executor.py) and the CPU backend's LaunchPlan, internals that may
change. On a shared machine the 2-thread columns depend on whether the other core was free: run it quiet.

    python benchmarks/profile_threads.py FILE [--rounds 15] [--only NAME]
"""
from __future__ import annotations

import argparse
import collections
import os
import time

import numpy as np

from profile_decode import kernel_key


def decode_env(model, prompt: np.ndarray) -> dict:
    """The Variables' values of a decode step (captured from the executor's run)."""
    executor = type(model._x)
    run, seen = executor.run, {}

    def record(self, name, feeds, env):
        seen[name] = dict(env)
        return run(self, name, feeds, env)
    executor.run = record
    try:
        model.call("prefill", {"input_ids": prompt})
        for k in range(3):  # the first launches page in weights and start the thread pool
            model.call("decode", {"input_ids": prompt[:, :1], "pos": prompt.shape[1] + k})["logits"].numpy()
    finally:
        executor.run = run
    return seen["decode"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("file")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--only", default="", help="only groups whose name and opts contain this")
    args = ap.parse_args()
    os.environ["POLY_THREADS"] = "2"
    from polygrad.hf import load_hf
    from polygrad_backend_cpu.runtime import LaunchPlan
    model = load_hf(args.file, max_batch=1, max_seq_len=520)
    prompt = np.random.default_rng(0).integers(0, model.hf_config.vocab_size, (1, 32)).astype(np.int32)
    env = decode_env(model, prompt)
    plan = model._x.plan("decode")
    groups = collections.defaultdict(list)
    for i, (prog, _, _) in enumerate(plan):
        if prog is not None and prog.program.threads > 1:
            groups[kernel_key(i, prog, 0, 0)].append(i)
    flush = np.ones(64 << 20, np.float32)

    def timed(lp, want: int) -> float:
        flush.sum()
        t0 = time.perf_counter()
        lp.run(lp.n, lp.tasks, lp.args, lp.parts, want)
        return (time.perf_counter() - t0) / lp.n

    print(f"{'n':>4s} {'KB':>8s} {'1t med':>8s} {'2t med':>8s} {'1t min':>8s} {'2t min':>8s} {'split':>7s}  "
          "kernel (us a launch; split: 2-thread time less half the 1-thread one)")
    for key, launches in sorted(groups.items()):
        if args.only not in key:
            continue
        lp = LaunchPlan([(plan[i][0].program, plan[i][1], tuple(env[v] for v in plan[i][2])) for i in launches])
        t: dict[int, list[float]] = {1: [], 2: []}
        for r in range(args.rounds):
            for want in (1, 2) if r % 2 == 0 else (2, 1):
                t[want].append(timed(lp, want))
        one, two = np.median(t[1]) * 1e6, np.median(t[2]) * 1e6
        print(f"{len(launches):4d} {plan[launches[0]][0].spec.mem_bytes / 1024:8.1f} {one:8.2f} {two:8.2f} "
              f"{min(t[1]) * 1e6:8.2f} {min(t[2]) * 1e6:8.2f} {two - one / 2:7.2f}  {key}")
    segments = [s[0] for s in model._x.launch_plans("decode", env) if not isinstance(s, int)]
    step: dict[int, list[float]] = {1: [], 2: []}
    for r in range(args.rounds):
        for want in (1, 2) if r % 2 == 0 else (2, 1):
            t0 = time.perf_counter()
            for lp in segments:
                lp.run(lp.n, lp.tasks, lp.args, lp.parts, want)
            step[want].append(time.perf_counter() - t0)
    print(f"whole step's launch plans (weights warm as a step leaves them): 1 thread median "
          f"{np.median(step[1]) * 1e3:.2f} ms, 2 threads {np.median(step[2]) * 1e3:.2f} ms")


if __name__ == "__main__":
    main()
