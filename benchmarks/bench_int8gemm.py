"""An int8 GEMM for quantized prompts (issue 30): does it pay against polygrad's float prompt kernel?

Per projection, one thread, CPU time: polygrad's float prompt kernel x @ W.T for a Q8_0 or Q4_0 weight (the
kernel nn/quant.py's QuantWeight.matmul_t gives a prompt: each weight block dequantized in the kernel,
staged panels) against the hand-written int8 GEMM of benchmarks/int8gemm_kernels.c (the activations rounded
to 8 bits per 32-block, exact int32 block sums on vpdpbusd whose 8 lanes are 8 weight rows, one float scale
per block; a staged panel of weight rows serves all prompt rows), both compiled with the CPU backend's
compiler and flags and timed alternately: each figure the median over --rounds of the best of 5 calls.
The ratio is the float kernel's time over the GEMM's plus the activations' rounding ("round").

Values, checked before timing: the GEMM against a NumPy model of exactly its arithmetic (rounded
activations bit for bit, int32 block sums exact, outputs within float32 summation order), the float kernel
against polygrad's own output of the same graph, and the GEMM against the float kernel within the
activation rounding's error (printed).

    python benchmarks/bench_int8gemm.py [--rounds 5] [--formats q4_0,q8_0] [--tokens 32,512]
"""
from __future__ import annotations

import argparse
import ctypes
import os
import re

import numpy as np

from bench_int8dot import block_operands  # noqa: E402  (this folder is on sys.path when run)

os.environ["POLY_THREADS"] = "1"  # one thread: the float kernel takes no thread index

HERE = os.path.dirname(os.path.abspath(__file__))
# GPT-2-small's fc and proj, Qwen2-0.5B's gate/up and down: (weight rows, columns)
SHAPES = ((3072, 768), (768, 3072), (4864, 896), (896, 4864))
PANEL = 16  # weight rows a staged panel holds (int8gemm_kernels.c: 8 * I8G_V)

DRIVER = r"""
#include <time.h>
static double i8g_now(void) {
  struct timespec t;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return t.tv_sec + 1e-9 * t.tv_nsec;
}
double i8g_time_float(float* y, const float* x, const unsigned char* w, int calls) {
  double best = 1e30;
  for (int k = 0; k < calls; k++) {
    double t = i8g_now();
    float_kernel(y, x, w);
    t = i8g_now() - t;
    if (t < best) best = t;
  }
  return best;
}
double i8g_time_round(const float* x, int n, int K, unsigned char* xu, float* dx, int calls) {
  double best = 1e30;
  for (int k = 0; k < calls; k++) {
    double t = i8g_now();
    i8g_round(x, n, K, xu, dx);
    t = i8g_now() - t;
    if (t < best) best = t;
  }
  return best;
}
double i8g_time_gemm(float* y, const unsigned char* xu, const float* dx, const unsigned char* w, int n, int rows,
                     int K, int q4, void* scratch, int calls) {
  double best = 1e30;
  for (int k = 0; k < calls; k++) {
    double t = i8g_now();
    if (!i8g_gemm(y, xu, dx, w, n, rows, K, q4, scratch)) return -1.0;
    t = i8g_now() - t;
    if (t < best) best = t;
  }
  return best;
}
"""


def float_kernel(qw, x: np.ndarray) -> tuple[str, np.ndarray]:
    """The source of polygrad's float prompt kernel of x @ W.T and polygrad's output."""
    from polygrad import Context
    from polygrad.engine import programs
    from polygrad.tensor import Tensor
    before = set(programs.program_cache)
    with Context(POLY_INT8_DOT=0):
        y = qw.matmul_t(Tensor(x)).numpy()
    new = [p for k, p in programs.program_cache.items() if k not in before]
    if len(new) != 1:
        raise RuntimeError(f"expected one prompt kernel, got {[p.spec.name for p in new]}")
    sig = (r"void pg_kernel\(float\* restrict data0, const float\* restrict data1, "
           r"const unsigned char\* restrict data2\)")
    if not re.search(sig, new[0].source):
        raise RuntimeError(f"the float prompt kernel's signature changed:\n{new[0].source[:400]}")
    return new[0].source, y


def build(source: str):
    from polygrad_backend_cpu.compiler import ClangCompiler
    with open(os.path.join(HERE, "int8gemm_kernels.c")) as f:
        gemm = f.read()
    src = f"#define pg_kernel float_kernel\n{source}\n#undef pg_kernel\n{gemm}\n{DRIVER}"
    lib = ctypes.CDLL(ClangCompiler().compile(src))
    for name in ("i8g_time_float", "i8g_time_round", "i8g_time_gemm"):
        getattr(lib, name).restype = ctypes.c_double
    return lib


def numpy_model(x: np.ndarray, blocks: np.ndarray, fmt: str):
    """The GEMM's arithmetic in NumPy: (q_x + 128 as uint8, d_x, y in float64, sum of |terms| per output)."""
    n, K = x.shape
    xq, d, dw, wq = block_operands(x.reshape(n, K // 32, 32), blocks, fmt)
    sums = np.einsum("nbi,rbi->nrb", xq, wq)  # exact
    terms = sums.astype(np.float32) * (d[:, None, :] * dw[None])
    xu = (xq + 128).astype(np.uint8).reshape(n, K)
    return xu, d, terms.sum(-1, dtype=np.float64), np.abs(terms).sum(-1)


def ptr(a: np.ndarray) -> ctypes.c_void_p:
    return ctypes.c_void_p(a.ctypes.data)


def probe(fmt: str, rows: int, cols: int, n: int, rounds: int) -> dict:
    from polygrad.nn.quant import QuantWeight
    rng = np.random.default_rng(rows * 7 + cols + n)
    w = rng.standard_normal((rows, cols)).astype(np.float32)
    x = rng.standard_normal((n, cols)).astype(np.float32)
    qw = QuantWeight.from_float(w, fmt)
    source, y_poly = float_kernel(qw, x)
    lib = build(source)
    blocks = np.ascontiguousarray(qw.blocks.numpy())
    q4 = int(fmt == "q4_0")
    nb = cols // 32
    xu, dx = np.zeros((n, cols), np.uint8), np.zeros((n, nb), np.float32)
    scratch = np.zeros(cols * PANEL + nb * PANEL * 8, np.uint8)
    y_float, y_int = np.zeros((n, rows), np.float32), np.zeros((n, rows), np.float32)
    lib.i8g_time_float(ptr(y_float), ptr(x), ptr(blocks), 1)
    lib.i8g_time_round(ptr(x), n, cols, ptr(xu), ptr(dx), 1)
    if lib.i8g_time_gemm(ptr(y_int), ptr(xu), ptr(dx), ptr(blocks), n, rows, cols, q4, ptr(scratch), 1) < 0:
        raise RuntimeError("the int8 GEMM needs AVX-512 VNNI (or AVX-VNNI) and rows a multiple of its panel")
    mu, md, my, mabs = numpy_model(x, blocks, fmt)
    if not (np.array_equal(xu, mu) and np.array_equal(dx, md)):
        raise RuntimeError(f"{fmt}: rounded activations differ from the NumPy model")
    if np.abs(y_int - my).max() > 1e-5 * mabs.max():
        raise RuntimeError(f"{fmt}: the GEMM is {np.abs(y_int - my).max()} from the NumPy model")
    if np.abs(y_float - y_poly).max() > 1e-6 * np.abs(y_poly).max():
        raise RuntimeError(f"{fmt}: the float kernel compiled here differs from polygrad's output")
    times: dict[str, list[float]] = {"float": [], "round": [], "gemm": []}
    for _ in range(rounds):  # alternating
        times["float"].append(lib.i8g_time_float(ptr(y_float), ptr(x), ptr(blocks), 5))
        times["round"].append(lib.i8g_time_round(ptr(x), n, cols, ptr(xu), ptr(dx), 5))
        times["gemm"].append(lib.i8g_time_gemm(ptr(y_int), ptr(xu), ptr(dx), ptr(blocks), n, rows, cols, q4,
                                               ptr(scratch), 5))
    out = {k: float(np.median(v)) * 1e3 for k, v in times.items()}
    out["vs_float"] = float(np.abs(y_int - y_float).max() / np.abs(y_float).max())
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--formats", default="q4_0,q8_0")
    ap.add_argument("--tokens", default="32,512")
    args = ap.parse_args()
    print(f"one thread, CPU time, median of {args.rounds} rounds of best-of-5; ratio = float / (gemm + round)")
    print(f"{'fmt':5s} {'shape':>9s} {'tokens':>6s} {'float ms':>9s} {'gemm ms':>8s} {'round ms':>8s} {'ratio':>6s}"
          f"  max |gemm - float| / max |float|")
    for fmt in [f.strip().lower() for f in args.formats.split(",")]:
        for n in [int(t) for t in args.tokens.split(",")]:
            for rows, cols in SHAPES:
                r = probe(fmt, rows, cols, n, args.rounds)
                ratio = r["float"] / (r["gemm"] + r["round"])
                print(f"{fmt:5s} {rows:>4d}x{cols:<4d} {n:6d} {r['float']:9.3f} {r['gemm']:8.3f} {r['round']:8.3f} "
                      f"{ratio:5.2f}x  {r['vs_float']:.1e}", flush=True)


if __name__ == "__main__":
    main()
