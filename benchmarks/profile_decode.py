"""Per-kernel profile of a decoder's decode step (or prefill): where a token's time goes.

Workload: a model load_hf opens (a GGUF file, e.g. one bench_gguf.write_qwen2_gguf wrote, or a Hugging
Face folder), a 32-token prompt, then `--steps` decode steps (or `--prefill N`: prompts of N tokens), at
POLY_THREADS threads. Each kernel launch of the entrypoint's plan is timed on its own (the program's
launch, nothing else); a launch's figure is its fastest of the steps (the minimum filters out the
steps another process preempted). Launches are grouped by kernel name, opts and position within a
layer (`--per-layer`, the number of launches of one layer: by default the period the kernel names repeat
at, 26 for a Q4_0 Qwen2 (29 with POLY_JOIN_PROJ=0); 0 to group by name alone), so the table reads as
one layer's kernels times the layers, plus the head. Columns: the time summed over the group, its
share, launches, bytes the kernels read and write (ProgramSpec.mem_bytes) and the bandwidth that makes.
"outside kernels" is a step's wall time less its kernels' (the Python executor, argument packing, the
feeds' copies, reading the logits back).

It reads the Model's executor (model/executor.py), an internal that may change.

    python benchmarks/profile_decode.py FILE [--steps 10] [--threads 2] [--prefill N] [--per-layer N]
                                        [--cpu-time (with --threads 1)]
"""
from __future__ import annotations

import argparse
import collections
import os
import time

import numpy as np


class TimedProgram:
    """A plan entry's program whose launches record their time under `key`: wall time, or with `clock`
    time.thread_time, the calling thread's CPU time (one thread: the kernel runs in the caller, and the
    time another process held the core is not counted)."""

    def __init__(self, prog, key: str, times: dict, clock=time.perf_counter):
        self.prog, self.spec, self.key, self.times, self.clock = prog, prog.spec, key, times, clock

    def program(self, *args) -> None:
        t0 = self.clock()
        self.prog.program(*args)
        self.times[self.key].append(self.clock() - t0)


def kernel_key(index: int, prog, first: int, per_layer: int) -> str:
    """The group a launch belongs to: name, opts (kind initials and amounts) and place in a layer."""
    opts = ",".join(f"{o.kind.value[:2]}{o.amount}" for o in prog.spec.opts)
    place = f" #{(index - first) % per_layer}" if per_layer and index >= first else ""
    return f"{prog.spec.name} {opts}{place}"


def instrument(model, entry: str, per_layer: int, clock=time.perf_counter) -> tuple[dict, dict]:
    """Wrap every program of `entry`'s plan: ({launch index: times}, {launch index: (key, bytes)})."""
    # plans made afresh: bound launchers and launch plans already made call the unwrapped programs (the
    # wrapped ones have no launch plan, so the entrypoint then runs launch by launch)
    model._x.replan()
    plan = model._x.plan(entry)
    names = [p.spec.name if p is not None else "" for p, _, _ in plan]
    if per_layer < 0:  # the period at which the launches' names repeat most (none: group by name)
        periods = range(2, len(names) // 2 + 1)
        per_layer = max(periods, key=lambda p: sum(a == b for a, b in zip(names, names[p:]))) if periods else 0
    # the first layer's first launch: where the names start repeating with the layer's period
    first = next((i for i in range(len(names)) if per_layer and i + 2 * per_layer <= len(names)
                  and names[i:i + per_layer] == names[i + per_layer:i + 2 * per_layer]), 0)
    times: dict = collections.defaultdict(list)
    info = {}
    for i, (prog, handles, names) in enumerate(plan):
        if prog is not None:
            plan[i] = (TimedProgram(prog, i, times, clock), handles, names)
            info[i] = (kernel_key(i, prog, first, per_layer), prog.spec.mem_bytes)
    return times, info


def report(times: dict, info: dict, walls: list[float], cpu_time: bool = False) -> None:
    groups: dict = collections.defaultdict(lambda: [0.0, 0, 0])
    for i, ts in times.items():
        key, nbytes = info[i]
        g = groups[key]
        g[0] += min(ts)
        g[1] += 1
        g[2] += nbytes
    total = sum(g[0] for g in groups.values())
    steps = len(walls)
    outside = [w - sum(ts[k] for ts in times.values()) for k, w in enumerate(walls)]
    # a launch's CPU time and a step's wall time do not subtract
    rest = "n/a (CPU time)" if cpu_time else f"median {np.median(outside) * 1e3:.2f} ms"
    print(f"step wall: median {np.median(walls) * 1e3:.1f} ms, min {min(walls) * 1e3:.1f} ms over {steps} steps; "
          f"kernels (each launch's fastest) {total * 1e3:.1f} ms over {sum(g[1] for g in groups.values())} launches; "
          f"outside kernels: {rest}")
    print(f"{'ms':>8s} {'%':>5s} {'n':>4s} {'MB':>8s} {'GB/s':>6s}  kernel")
    for key, (t, n, nbytes) in sorted(groups.items(), key=lambda kv: -kv[1][0]):
        if t < total * 0.002:
            continue
        print(f"{t * 1e3:8.2f} {100 * t / total:5.1f} {n:4d} {nbytes / 1e6:8.1f} {nbytes / t / 1e9:6.1f}  {key}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("file")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prefill", type=int, default=0, help="profile prompts of this many tokens instead")
    ap.add_argument("--per-layer", type=int, default=-1,
                    help="launches in one layer (0: group by name; default: the period the kernel names repeat at)")
    ap.add_argument("--cpu-time", action="store_true",
                    help="time each launch by the thread's CPU time (needs --threads 1; steadier on a busy machine)")
    args = ap.parse_args()
    if args.cpu_time and args.threads != 1:
        ap.error("--cpu-time counts the calling thread's CPU time only: use it with --threads 1")
    os.environ["POLY_THREADS"] = str(args.threads)
    from polygrad.hf import load_hf
    model = load_hf(args.file, max_batch=1, max_seq_len=520)
    vocab = model.hf_config.vocab_size
    prompt = np.random.default_rng(0).integers(0, vocab, (1, args.prefill or 32)).astype(np.int32)
    entry = "prefill" if args.prefill else "decode"

    def step(k: int) -> None:
        feeds = {"input_ids": prompt} if args.prefill else {"input_ids": prompt[:, :1], "pos": 32 + k}
        model.call(entry, feeds)["logits"].numpy()

    model.call("prefill", {"input_ids": prompt})
    for k in range(2):  # the first launches page in weights and start the thread pool
        step(k)
    times, info = instrument(model, entry, args.per_layer, time.thread_time if args.cpu_time else time.perf_counter)
    walls = []
    for k in range(args.steps):
        t0 = time.perf_counter()
        step(2 + k)
        walls.append(time.perf_counter() - t0)
    report(times, info, walls, args.cpu_time)


if __name__ == "__main__":
    main()
