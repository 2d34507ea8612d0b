"""polygrad beside llama.cpp on the same GGUF files: decode, prompt, first token and peak memory.

Workload (issue 30): a GPT-2-small-shaped model (12 layers, width 768, vocabulary 50257), or with
`--shape qwen2-0.5b` one of Qwen2-0.5B's shape (24 layers, hidden 896, 14/2 heads, vocabulary 151936,
tied embeddings), with random weights, written with the gguf package as Q8_0 and Q4_0 files
(bench_gguf.write_gpt2_gguf / write_qwen2_gguf, with a byte-level vocabulary so llama.cpp loads them;
both sides are fed token ids). Batch 1, greedy, the same
thread count on both sides. Every figure comes from a fresh process of this file (`--worker`), the
libraries alternated round by round:

  first token  seconds from the worker's start (before it imports the library) to the first token of
               a 32-token prompt: loading, capture, compiling and the prompt. polygrad's "warm" runs
               with the POLY_CACHE_DIR an earlier process filled; "cold" with an empty one
  prompt       tokens per second of a 32- and a 512-token prompt, the second run in the process; polygrad
               runs its prefill entrypoint (the last position's logits only, as llama.cpp computes)
  decode       new tokens per second after the 32-token prompt (63 steps)
  peak RSS     the worker's maximum resident set (VmHWM), in MB, over the whole run ("peak RSS") and up to
               the 512-token prompts ("RSS to 32")
  agree        greedy tokens equal to llama.cpp's, of 64 (random weights, so rounding differences
               between two dequantization orders can change a token and everything after it)

llama.cpp runs through llama-cpp-python in another interpreter (`--llama-python`, or the
LLAMA_CPP_PYTHON environment variable), e.g. a venv made with `python -m venv /tmp/llv &&
/tmp/llv/bin/pip install llama-cpp-python` (it builds llama.cpp from source: about 15 minutes). It is
never a dependency of polygrad. Without it only polygrad's columns are printed.

    python benchmarks/bench_llamacpp.py [--llama-python PATH] [--rounds 3] [--threads 2]
                                        [--shape gpt2|qwen2-0.5b] [--layers N]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

SHORT, LONG, NEW = 32, 512, 64
SHAPES = {"gpt2": ("GPT-2-small", "write_gpt2_gguf", 12), "qwen2-0.5b": ("Qwen2-0.5B", "write_qwen2_gguf", 24)}


def prompt_ids(n: int, vocab: int) -> list[int]:
    return np.random.default_rng(n).integers(0, vocab, n).tolist()


def worker_polygrad(path: str, threads: int, start: float) -> dict:
    os.environ["POLY_THREADS"] = str(threads)
    from polygrad.hf import load_hf
    model = load_hf(path, max_batch=1, max_seq_len=LONG + 8)
    vocab = model.hf_config.vocab_size

    def prompt(ids: list[int]) -> int:
        # prefill: the last position's logits only, as generate asks and as llama.cpp computes by default
        logits = model.call("prefill", {"input_ids": np.array([ids], np.int32)})["logits"].numpy()
        return int(logits[0, -1].argmax())

    short = prompt_ids(SHORT, vocab)
    nxt = prompt(short)
    out = {"first_token_s": time.perf_counter() - start}
    tokens = [nxt]
    t0 = time.perf_counter()
    for k in range(NEW - 1):
        step = model.call("decode", {"input_ids": np.array([[nxt]], np.int32), "pos": SHORT + k})
        nxt = int(step["logits"].numpy()[0, -1].argmax())
        tokens.append(nxt)
    out["decode_tok_s"] = (NEW - 1) / (time.perf_counter() - t0)
    out["peak_rss_short_mb"] = peak_rss_mb()
    for n in (SHORT, LONG):
        ids = prompt_ids(n, vocab)
        prompt(ids)  # the first run of a length compiles what it needs
        t0 = time.perf_counter()
        prompt(ids)
        out[f"prompt{n}_tok_s"] = n / (time.perf_counter() - t0)
    out["tokens"] = tokens
    return out


def worker_llama(path: str, threads: int, start: float) -> dict:
    from llama_cpp import Llama
    llm = Llama(model_path=path, n_ctx=LONG + 8, n_batch=LONG, n_ubatch=LONG, n_threads=threads,
                n_threads_batch=threads, verbose=False)
    vocab = llm.n_vocab()

    def run(ids: list[int]) -> int:
        llm.eval(ids)
        return int(np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(vocab,)).argmax())

    short = prompt_ids(SHORT, vocab)
    nxt = run(short)
    out = {"first_token_s": time.perf_counter() - start}
    tokens = [nxt]
    t0 = time.perf_counter()
    for _ in range(NEW - 1):
        nxt = run([nxt])
        tokens.append(nxt)
    out["decode_tok_s"] = (NEW - 1) / (time.perf_counter() - t0)
    out["peak_rss_short_mb"] = peak_rss_mb()
    for n in (SHORT, LONG):
        ids = prompt_ids(n, vocab)
        for timed in (False, True):
            llm.reset()
            t0 = time.perf_counter()
            run(ids)
            if timed:
                out[f"prompt{n}_tok_s"] = n / (time.perf_counter() - t0)
    out["tokens"] = tokens
    return out


def worker(lib: str, path: str, threads: int) -> None:
    start = time.perf_counter()
    out = (worker_polygrad if lib == "polygrad" else worker_llama)(path, threads, start)
    out["peak_rss_mb"] = peak_rss_mb()
    print("RESULT " + json.dumps(out), flush=True)


def peak_rss_mb() -> float:
    """This process's peak resident set (VmHWM: ru_maxrss would also count the launching process's peak,
    which Linux carries across fork and exec)."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:")) / 1024


def launch(python: str, lib: str, path: str, threads: int, env: dict) -> dict:
    proc = subprocess.run([python, os.path.abspath(__file__), "--worker", lib, path, "--threads", str(threads)],
                          env={**os.environ, **env}, capture_output=True, text=True, timeout=1800)
    line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
    if proc.returncode != 0 or line is None:
        raise RuntimeError(f"{lib} worker failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    return json.loads(line[len("RESULT "):])


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return "unknown CPU"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--llama-python", default=os.environ.get("LLAMA_CPP_PYTHON", ""))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--shape", choices=sorted(SHAPES), default="gpt2")
    ap.add_argument("--layers", type=int, default=None, help="default: the shape's own (12 or 24)")
    ap.add_argument("--formats", nargs="*", default=["Q8_0", "Q4_0"])
    ap.add_argument("--worker", nargs=2, metavar=("LIB", "FILE"))
    args = ap.parse_args()
    if args.worker:
        worker(args.worker[0], args.worker[1], args.threads)
        return
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import bench_gguf
    title, writer, default_layers = SHAPES[args.shape]
    layers = args.layers or default_layers
    llama = args.llama_python
    if not llama:
        print("no --llama-python (or LLAMA_CPP_PYTHON): llama.cpp's columns are left out")
    with tempfile.TemporaryDirectory() as folder:
        files = {}
        for fmt in args.formats:
            files[fmt] = os.path.join(folder, f"{args.shape}-{fmt}.gguf")
            getattr(bench_gguf, writer)(files[fmt], fmt, layers, tokenizer=True)
        warm_cache = os.path.join(folder, "cache")
        results: dict[tuple[str, str], list[dict]] = {}
        for fmt, path in files.items():  # fills the warm cache; not reported
            launch(sys.executable, "polygrad", path, args.threads, {"POLY_CACHE_DIR": warm_cache})
        for r in range(args.rounds):
            for fmt, path in files.items():
                cold = os.path.join(folder, f"cold{r}{fmt}")
                runs = [("polygrad (cold cache)", sys.executable, {"POLY_CACHE_DIR": cold}),
                        ("polygrad", sys.executable, {"POLY_CACHE_DIR": warm_cache})]
                if llama:
                    runs.append(("llama.cpp", llama, {}))
                for label, python, env in runs:
                    lib = "llama" if label == "llama.cpp" else "polygrad"
                    results.setdefault((fmt, label), []).append(launch(python, lib, path, args.threads, env))
        sizes = {fmt: os.path.getsize(p) / 1e6 for fmt, p in files.items()}
    print(f"{title} shape ({layers} layers), random weights, batch 1, greedy, {args.threads} threads; "
          f"{cpu_model()}; medians of {args.rounds} alternated rounds, each a fresh process")
    head = (f"{'format':6s} {'runtime':22s}{'decode tok/s':>13s}{'prompt32 tok/s':>15s}{'prompt512 tok/s':>16s}"
            f"{'first token s':>14s}{'peak RSS MB':>12s}{'RSS to 32':>10s}{'agree':>7s}")
    print(head)
    for fmt in files:
        ref = results.get((fmt, "llama.cpp"))
        for label in ("polygrad (cold cache)", "polygrad", "llama.cpp"):
            runs = results.get((fmt, label))
            if not runs:
                continue

            def med(key: str) -> float:
                return float(np.median([x[key] for x in runs]))
            agree = "-"
            if ref and label != "llama.cpp":
                agree = str(next((i for i, (a, b) in enumerate(zip(runs[0]["tokens"], ref[0]["tokens"])) if a != b),
                                 NEW))
            print(f"{fmt:6s} {label:22s}{med('decode_tok_s'):13.1f}{med('prompt32_tok_s'):15.1f}"
                  f"{med('prompt512_tok_s'):16.1f}{med('first_token_s'):14.2f}{med('peak_rss_mb'):12.0f}"
                  f"{med('peak_rss_short_mb'):10.0f}{agree:>7s}")
        if ref:
            ours, theirs = results[(fmt, "polygrad")], ref
            ratio = {k: float(np.median([x[k] for x in ours]) / np.median([x[k] for x in theirs]))
                     for k in ("decode_tok_s", "prompt32_tok_s", "prompt512_tok_s", "first_token_s", "peak_rss_mb",
                               "peak_rss_short_mb")}
            print(f"{fmt:6s} {'polygrad / llama.cpp':22s}{ratio['decode_tok_s']:12.2f}x{ratio['prompt32_tok_s']:14.2f}x"
                  f"{ratio['prompt512_tok_s']:15.2f}x{ratio['first_token_s']:13.2f}x{ratio['peak_rss_mb']:11.2f}x"
                  f"{ratio['peak_rss_short_mb']:9.2f}x")
        print(f"{fmt:6s} file {sizes[fmt]:.0f} MB")


if __name__ == "__main__":
    main()
