"""Generation speed of polygrad-hf beside transformers on PyTorch CPU, in one run, on one checkpoint.

Workload (issue 16): a GPT-2-small-shaped model with random weights (12 layers, width 768, 12 heads,
vocabulary 50257), batch 1, a 32-token prompt, then 64 new tokens, greedy. Both sides load the same
safetensors folder (written here by transformers). Reported per side, best of --rounds:

  prompt   seconds for the prompt (polygrad: the forward entrypoint; transformers: the first forward)
  decode   new tokens per second after the prompt (polygrad: decode entrypoint over the KV cache;
           transformers: generate's cached decoding), and the greedy tokens agree.

    python benchmarks/bench_hf_generate.py [--rounds 3] [--threads 2] [--layers 12] [--quick]

`--quick` is a 2-layer, width-256 smoke run. Figures on a shared machine are noisy: repeat them.
"""
from __future__ import annotations

import argparse
import os
import tempfile
import time

import numpy as np

PROMPT, NEW = 32, 64


def make_checkpoint(folder: str, layers: int, width: int, vocab: int) -> None:
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=layers, n_embd=width, n_head=max(1, width // 64), vocab_size=vocab, n_positions=1024)
    GPT2LMHeadModel(cfg).eval().save_pretrained(folder)


def bench_transformers(folder: str, ids: np.ndarray, rounds: int) -> tuple[float, float, list[int]]:
    import torch
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    x = torch.tensor(ids, dtype=torch.long)
    prompt_s = decode_s = float("inf")
    out = None
    with torch.no_grad():
        model(x)  # warm-up
        for _ in range(rounds):
            t0 = time.perf_counter()
            model(x)
            prompt_s = min(prompt_s, time.perf_counter() - t0)
            t0 = time.perf_counter()
            out = model.generate(x, max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False, eos_token_id=None,
                                 pad_token_id=0)
            total = time.perf_counter() - t0
            decode_s = min(decode_s, total - prompt_s)  # generate = one prompt forward + NEW - 1 cached steps
    return prompt_s, (NEW - 1) / decode_s, out[0, PROMPT:].tolist()


def bench_polygrad(folder: str, ids: np.ndarray, rounds: int) -> tuple[float, float, list[int], float]:
    from polygrad.hf import load_hf
    t0 = time.perf_counter()
    model = load_hf(folder, max_batch=1, max_seq_len=PROMPT + NEW)
    load_s = time.perf_counter() - t0
    prompt_s = decode_s = float("inf")
    tokens: list[int] = []
    try:
        model.forward(input_ids=ids)  # warm-up (programs are built at load already)
        for _ in range(rounds):
            t0 = time.perf_counter()
            logits = model.forward(input_ids=ids)["logits"].numpy()
            prompt_s = min(prompt_s, time.perf_counter() - t0)
            nxt = int(logits[0, -1].argmax())
            tokens = [nxt]
            t0 = time.perf_counter()
            for k in range(NEW - 1):
                out = model.call("decode", {"input_ids": np.array([[nxt]], np.int32), "pos": PROMPT + k})
                nxt = int(out["logits"].numpy()[0, -1].argmax())
                tokens.append(nxt)
            decode_s = min(decode_s, time.perf_counter() - t0)
    finally:
        model.dispose()
    return prompt_s, (NEW - 1) / decode_s, tokens, load_s


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=int(os.environ.get("POLY_THREADS", os.cpu_count() or 1)))
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    os.environ.setdefault("POLY_THREADS", str(args.threads))
    import torch
    torch.set_num_threads(args.threads)
    layers, width, vocab = (2, 256, 50257) if args.quick else (args.layers, 768, 50257)
    ids = np.random.default_rng(0).integers(0, vocab, (1, PROMPT)).astype(np.int32)
    with tempfile.TemporaryDirectory() as folder:
        make_checkpoint(folder, layers, width, vocab)
        tp, td, ttoks = bench_transformers(folder, ids, args.rounds)
        pp, pd, ptoks, load_s = bench_polygrad(folder, ids, args.rounds)
    print(f"GPT-2 shape: {layers} layers, width {width}, vocab {vocab}; batch 1, prompt {PROMPT}, {NEW} new tokens; "
          f"{args.threads} threads; best of {args.rounds}")
    print(f"{'':14s}{'prompt (ms)':>12s}{'decode (tok/s)':>16s}")
    print(f"{'transformers':14s}{tp * 1e3:12.1f}{td:16.1f}")
    print(f"{'polygrad':14s}{pp * 1e3:12.1f}{pd:16.1f}   (load_hf {load_s:.1f} s, compiles included)")
    print(f"decode ratio polygrad/transformers: {pd / td:.2f}x; greedy tokens agree: {ptoks == ttoks}")


if __name__ == "__main__":
    main()
