"""Integer dot products for quantized decode (issue 30, item 1): does an int8 x int8 matvec pay here?

Per kernel, one thread, for Q8_0 and Q4_0 weights of GPT-2-small's decode shapes (qkv 2304 x 768, fc 3072 x
768, its transpose 768 x 3072, the LM head 50257 x 768): polygrad's float matvec (POLY_INT8_DOT=0: the
weight widened to float per element, times the block scale, FMA with the float activation), polygrad's
own 8-bit route where the CPU device declares int8_dot ("polygrad": nn/quant.py's matvec kernel as the
CPU backend renders it), and the hand-written integer kernels of benchmarks/int8dot_kernels.c
(the activation rounded to 8 bits per 32-block once, the block's 32 products summed in int32, one float
scale per block), compiled with the CPU backend's compiler and flags and timed alternately, each figure
the median over --rounds of the best of 20 calls. Each ratio is the float kernel's time over the integer
kernel's plus the activation's rounding (the C i8d_quantize, "round x").

Numerics, checked before timing: the integer kernels against a NumPy model of exactly their arithmetic
(activations bit for bit; outputs within float32 summation order) and against polygrad's float kernel
within the activation rounding's error.

`--decode FMT` instead times each kernel of a GPT-2-small-shaped decode step (a random GGUF written with
bench_gguf.write_gpt2_gguf, loaded with polygrad.hf.load_hf) and prints the kernels by total time: the
share of the quantized matvecs.

    python benchmarks/bench_int8dot.py [--rounds 7] [--formats q8_0,q4_0]
    python benchmarks/bench_int8dot.py --decode q8_0
"""
from __future__ import annotations

import argparse
import collections
import ctypes
import os
import re
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
SHAPES = ((2304, 768), (3072, 768), (768, 3072), (50257, 768))
VARIANTS = ("madd", "vnni", "auto")

DRIVER = r"""
#include <time.h>
typedef int (*i8d_fn)(float*, const signed char*, const float*, const unsigned char*, int, int);
static double i8d_now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + 1e-9 * t.tv_nsec;
}
/* best of `calls` runs of polygrad's float kernel over all its thread parts, one after the other */
double i8d_time_float(float* y, const float* x, const unsigned char* w, int parts, int calls) {
  double best = 1e30;
  for (int k = 0; k < calls; k++) {
    double t = i8d_now();
    for (int p = 0; p < parts; p++) float_kernel(y, x, w, p);
    t = i8d_now() - t;
    if (t < best) best = t;
  }
  return best;
}
double i8d_time_quantize(const float* x, int C, signed char* xq, float* dx, int calls) {
  double best = 1e30;
  for (int k = 0; k < calls; k++) {
    double t = i8d_now();
    i8d_quantize(x, C, xq, dx);
    t = i8d_now() - t;
    if (t < best) best = t;
  }
  return best;
}
double i8d_time_int(i8d_fn f, float* y, const signed char* xq, const float* dx, const unsigned char* w, int R, int C,
                    int calls) {
  double best = 1e30;
  for (int k = 0; k < calls; k++) {
    double t = i8d_now();
    if (!f(y, xq, dx, w, R, C)) return -1.0;
    t = i8d_now() - t;
    if (t < best) best = t;
  }
  return best;
}
"""
ROUTE_DRIVER = r"""
#include <time.h>
double i8d_time_route(float* y, const signed char* xq, const unsigned char* w, const float* dx, int parts, int calls) {
  double best = 1e30;
  for (int k = 0; k < calls; k++) {
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int p = 0; p < parts; p++) route_kernel(y, xq, w, dx, p);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double t = (t1.tv_sec - t0.tv_sec) + 1e-9 * (t1.tv_nsec - t0.tv_nsec);
    if (t < best) best = t;
  }
  return best;
}
"""


def matvec_kernel(fmt: str, rows: int, cols: int, qw, x: np.ndarray, int8: bool):
    """polygrad's rendered source of its matvec x @ W.T (the float path, or with `int8` the 8-bit activation
    route of nn/quant.py) and the kernel's thread count."""
    from polygrad import Context
    from polygrad.engine import programs
    from polygrad.tensor import Tensor
    before = set(programs.program_cache)
    with Context(POLY_INT8_DOT=int(int8)):
        qw.matmul_t(Tensor(x[None])).realize()
    new = [p for k, p in programs.program_cache.items() if k not in before and p.spec.name == f"r_1_{rows}"]
    if len(new) != 1:
        raise RuntimeError(f"expected one matvec kernel for {fmt} {rows}x{cols}, got {[p.spec.name for p in new]}")
    prog = new[0]
    operands = (r"const signed char\* restrict data1, const unsigned char\* restrict data2, "
                r"const float\* restrict data3" if int8 else
                r"const float\* restrict data1, const unsigned char\* restrict data2")
    if not re.search(rf"void pg_kernel\(float\* restrict data0, {operands}, int tid\)", prog.source):
        raise RuntimeError(f"the {fmt} matvec kernel's signature changed (update bench_int8dot.py):\n"
                           f"{prog.source[:400]}")
    return prog.source, prog.spec.threads


def build(source: str, route: bool = False):
    """A library of polygrad's float kernel, the hand-written integer kernels and the timing driver, or with
    `route` of polygrad's int8-route kernel and its driver (the CPU backend's compiler and flags)."""
    from polygrad_backend_cpu.compiler import ClangCompiler
    if route:
        src = f"#define pg_kernel route_kernel\n{source}\n#undef pg_kernel\n{ROUTE_DRIVER}"
        names = ("i8d_time_route",)
    else:
        with open(os.path.join(HERE, "int8dot_kernels.c")) as f:
            kernels = f.read()
        src = f"#define pg_kernel float_kernel\n{source}\n#undef pg_kernel\n{kernels}\n{DRIVER}"
        names = ("i8d_time_float", "i8d_time_quantize", "i8d_time_int")
    lib = ctypes.CDLL(ClangCompiler().compile(src))
    for name in names:
        getattr(lib, name).restype = ctypes.c_double
    return lib


def int8_dot_enabled() -> bool:
    from polygrad.nn.quant import int8_dot_enabled as enabled
    return enabled("CPU")


def ptr(a: np.ndarray) -> ctypes.c_void_p:
    return ctypes.c_void_p(a.ctypes.data)


def block_operands(xb: np.ndarray, blocks: np.ndarray, fmt: str):
    """The integer operands in NumPy: activation blocks xb (..., 32) rounded to 8 bits (xq as int64, its
    scales d, float32), and the weight blocks' scales dw (rows, nb) and values wq (rows, nb, 32) as int64."""
    d = (np.abs(xb).max(-1) / np.float32(127)).astype(np.float32)
    inv = np.where(d != 0, np.float32(1) / np.where(d != 0, d, 1), np.float32(0)).astype(np.float32)
    xq = np.rint(xb * inv[..., None]).astype(np.int64)
    dw = blocks[..., :2].copy().view(np.float16)[..., 0].astype(np.float32)
    if fmt == "q8_0":
        wq = blocks[..., 2:].view(np.int8).astype(np.int64)
    else:
        q = blocks[..., 2:]
        wq = np.concatenate([q & 15, q >> 4], axis=-1).astype(np.int64) - 8
    return xq, d, dw, wq


def numpy_model(x: np.ndarray, blocks: np.ndarray, fmt: str):
    """The integer kernels' arithmetic in NumPy: rounded activations, exact block sums, float scales."""
    xq, d, dw, wq = block_operands(x.reshape(-1, 32), blocks, fmt)
    sums = np.einsum("bi,rbi->rb", xq, wq)  # exact
    xq = xq.astype(np.int8)
    terms = sums.astype(np.float32) * (dw * d[None, :].astype(np.float32))
    return xq.reshape(-1), d.astype(np.float32), terms.sum(1, dtype=np.float64), np.abs(terms).sum(1)


def probe(fmt: str, rows: int, cols: int, rounds: int) -> dict:
    rng = np.random.default_rng(rows * 7 + cols)
    w = rng.standard_normal((rows, cols)).astype(np.float32)
    x = rng.standard_normal(cols).astype(np.float32)
    from polygrad.nn.quant import QuantWeight
    qw = QuantWeight.from_float(w, fmt)
    source, threads = matvec_kernel(fmt, rows, cols, qw, x, False)
    lib = build(source)
    route = None
    if int8_dot_enabled():  # Q8_0 and Q4_0 take the route
        route_source, route_threads = matvec_kernel(fmt, rows, cols, qw, x, True)
        route = build(route_source, route=True)
    blocks = np.ascontiguousarray(qw.blocks.numpy())
    nb = cols // 32
    xq, dx = np.zeros(cols, np.int8), np.zeros(nb, np.float32)
    y_float = np.zeros(rows, np.float32)
    lib.i8d_time_float(ptr(y_float), ptr(x), ptr(blocks), threads, 1)
    lib.i8d_time_quantize(ptr(x), cols, ptr(xq), ptr(dx), 1)
    mq, md, my, mabs = numpy_model(x, blocks, fmt)
    if not (np.array_equal(xq, mq) and np.array_equal(dx, md)):
        raise RuntimeError(f"{fmt}: rounded activations differ from the NumPy model")
    out = {"fmt": fmt, "shape": f"{rows}x{cols}"}
    for v in VARIANTS:
        y = np.zeros(rows, np.float32)
        fn = getattr(lib, f"i8d_{fmt}_{v}")
        if lib.i8d_time_int(fn, ptr(y), ptr(xq), ptr(dx), ptr(blocks), rows, cols, 1) < 0:
            out[v] = None  # the CPU lacks the instructions
            continue
        err = np.abs(y - my).max()
        if err > 1e-5 * mabs.max():
            raise RuntimeError(f"{fmt} {v}: {err} from the NumPy model (sum of |terms| up to {mabs.max()})")
        out[f"{v}_vs_float"] = float(np.abs(y - y_float).max() / np.abs(y_float).max())
        out[v] = fn
    if route is not None:
        y = np.zeros(rows, np.float32)
        route.i8d_time_route(ptr(y), ptr(xq), ptr(blocks), ptr(dx), route_threads, 1)
        if np.abs(y - my).max() > 1e-5 * mabs.max():
            raise RuntimeError(f"{fmt}: polygrad's int8 route is {np.abs(y - my).max()} from the NumPy model")
    times = collections.defaultdict(list)
    for _ in range(rounds):  # the variants alternate within each round
        times["float"].append(lib.i8d_time_float(ptr(y_float), ptr(x), ptr(blocks), threads, 20))
        times["quantize"].append(lib.i8d_time_quantize(ptr(x), cols, ptr(xq), ptr(dx), 20))
        for v in VARIANTS:
            if out[v] is not None:
                times[v].append(lib.i8d_time_int(out[v], ptr(y), ptr(xq), ptr(dx), ptr(blocks), rows, cols, 20))
        if route is not None:
            times["polygrad"].append(route.i8d_time_route(ptr(y), ptr(xq), ptr(blocks), ptr(dx), route_threads, 20))
    for k, ts in times.items():
        out[f"{k}_us"] = float(np.median(ts)) * 1e6
    return out


def run_probe(formats: list[str], rounds: int) -> None:
    print(f"one thread, median of {rounds} rounds of best-of-20; ratio = float / (int kernel + activation rounding)")
    shown = ("polygrad",) + VARIANTS
    print(f"{'fmt':5s} {'shape':>10s} {'float us':>9s} {'round x':>8s} " +
          " ".join(f"{v + ' us':>11s} {'ratio':>6s}" for v in shown) + "  max |int - float| / max |float|")
    for fmt in formats:
        for rows, cols in SHAPES:
            r = probe(fmt, rows, cols, rounds)
            cells = []
            for v in shown:
                if v + "_us" not in r:
                    cells.append(f"{'n/a':>11s} {'':>6s}")
                else:
                    cells.append(f"{r[v + '_us']:11.1f} {r['float_us'] / (r[v + '_us'] + r['quantize_us']):5.2f}x")
            errs = ", ".join(f"{v} {r[v + '_vs_float']:.1e}" for v in VARIANTS if r[v] is not None)
            print(f"{fmt:5s} {r['shape']:>10s} {r['float_us']:9.1f} {r['quantize_us']:8.2f} " + " ".join(cells) +
                  f"  {errs}", flush=True)


def profile_decode(fmt: str, rounds: int) -> None:
    """Each kernel of a decode step timed alone (median of `rounds`), summed by kernel name."""
    sys.path.insert(0, HERE)
    from bench_gguf import write_gpt2_gguf

    from polygrad.hf import load_hf
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, f"gpt2_{fmt}.gguf")
        write_gpt2_gguf(path, fmt.upper(), 12, tokenizer=True)
        model = load_hf(path, max_batch=1, max_seq_len=64)
    ids = np.random.default_rng(0).integers(0, 50257, 8)
    model.call("prefill", {"input_ids": ids[None].astype(np.int32)})
    for k in range(3):
        model.call("decode", {"input_ids": np.array([[5]], np.int32), "pos": 8 + k})
    plan = model._x.plan("decode")
    times = collections.defaultdict(list)
    for _ in range(rounds):
        for i, (prog, handles, names) in enumerate(plan):
            if prog is None:
                continue
            t0 = time.perf_counter()
            prog.program(handles, tuple(11 for _ in names), False)
            times[(i, prog.spec.name)].append(time.perf_counter() - t0)
    by_name: dict[str, list] = collections.defaultdict(lambda: [0.0, 0])
    for (_, name), ts in times.items():
        by_name[name][0] += float(np.median(ts))
        by_name[name][1] += 1
    total = sum(t for t, _ in by_name.values())
    print(f"{fmt}: {len(times)} kernels, {total * 1e3:.2f} ms a decode step (sum of per-kernel medians, "
          f"POLY_THREADS={os.environ.get('POLY_THREADS', 'default')})")
    for name, (t, n) in sorted(by_name.items(), key=lambda kv: -kv[1][0])[:10]:
        print(f"  {name:32s} x{n:<3d} {t * 1e3:8.3f} ms {100 * t / total:5.1f}%")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--formats", default="q8_0,q4_0")
    ap.add_argument("--decode", metavar="FMT", help="profile a GPT-2-small-shaped decode step instead")
    args = ap.parse_args()
    if args.decode:
        profile_decode(args.decode.lower(), args.rounds)
    else:
        run_probe([f.strip().lower() for f in args.formats.split(",")], args.rounds)


if __name__ == "__main__":
    main()
