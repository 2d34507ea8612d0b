"""x @ W over a prompt's token count (a Variable, as every prompt kernel of a captured model runs), against
the same product over constant rows: milliseconds of this thread's CPU time a product, median of --reps.

A prompt's matmuls run with the token count known only at run time; this times them at a few counts for a
few weight widths, the way the captured prefill runs them, beside the constant-rows kernel compiled for each
count. Run one checkout against another by putting its packages first on PYTHONPATH.

    python benchmarks/bench_prompt_matmul.py [--k 896] [--n 2304 4864 9728] [--tokens 1 4 16 64 128]
                                             [--threads 1] [--reps 11]
"""
from __future__ import annotations

import argparse
import os
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--k", type=int, default=896)
    ap.add_argument("--n", type=int, nargs="*", default=[2304, 4864, 9728])
    ap.add_argument("--tokens", type=int, nargs="*", default=[1, 4, 16, 64, 128])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--reps", type=int, default=11)
    args = ap.parse_args()
    os.environ["POLY_THREADS"] = str(args.threads)
    import numpy as np

    from polygrad import Tensor, Variable
    from polygrad.device import open_device
    rng = np.random.default_rng(0)
    top = max(args.tokens)
    x = Tensor(rng.standard_normal((top, args.k)).astype(np.float32)).realize()
    tokens = Variable("tokens", 1, top)
    caps = open_device("CPU").capabilities

    def cpu_ms(fn) -> float:
        for _ in range(3):
            fn()
        times = []
        for _ in range(args.reps):
            t0 = time.thread_time()
            fn()
            times.append(time.thread_time() - t0)
        return 1e3 * sorted(times)[len(times) // 2]

    print(f"k {args.k}, {args.threads} thread(s), CPU ms a product (this thread), median of {args.reps}; "
          f"L2 {caps.l2_bytes >> 10} KiB, L3 {getattr(caps, 'l3_bytes', 0) >> 20} MiB")
    print("n      W MB  rows      " + "  ".join(f"{t:>8}" for t in args.tokens))
    for n in args.n:
        w = Tensor(rng.standard_normal((args.k, n)).astype(np.float32)).realize()
        mb = args.k * n * 4 / 1e6
        sym = [cpu_ms(lambda t=t: (x[:tokens.bind(t)] @ w).realize()) for t in args.tokens]
        fixed = [cpu_ms(lambda t=t: (x[:t] @ w).realize()) for t in args.tokens]
        print(f"{n:<6} {mb:5.1f}  Variable  " + "  ".join(f"{v:8.2f}" for v in sym))
        print(f"{'':<6} {'':5}  constant  " + "  ".join(f"{v:8.2f}" for v in fixed))


if __name__ == "__main__":
    main()
