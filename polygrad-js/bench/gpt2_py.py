"""Python polygrad's column of bench/gpt2.js: bench/gpt2s.pgb loaded with polygrad.Model.load on the default
device, the same 32-token prompt (ms, warm) and greedy decode (tokens/s), medians of --rounds after a warm-up.
The prompt is timed as `prefill` (the last position's logits; `forward` where the bundle lacks it) and as `forward`
(every position's logits). Prints one JSON line: {prompt, forward, tokS, check: {tokens, err, all}} (prompt: the
prefill's ms; all: the greedy tokens). Threads: the CPU
backend's own (POLY_THREADS)."""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from polygrad import Model

HERE = Path(__file__).resolve().parent


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=16)
    a = ap.parse_args()
    ref = json.loads((HERE / "gpt2_ref.json").read_text())
    prompt = np.array([ref["prompt"]], np.int32)
    model = Model.load(str(HERE / "gpt2s.pgb"))

    def rel(logits, want):
        want = np.asarray(want)
        return float(np.abs(logits[:64] - want).max() / np.abs(want).max())

    entry = "prefill" if "prefill" in model.entrypoints else "forward"
    prompts, forwards, rates, check = [], [], [], None
    for r in range(a.rounds + 1):
        t0 = time.perf_counter()
        logits = model.forward(input_ids=prompt)["logits"].numpy()[0, -1]
        f = time.perf_counter() - t0
        errs, tokens = [rel(logits, ref["logits"][0])], []
        t0 = time.perf_counter()
        logits = model.call(entry, {"input_ids": prompt})["logits"].numpy()[0, -1]
        p = time.perf_counter() - t0
        errs.append(rel(logits, ref["logits"][0]))
        t0 = time.perf_counter()
        for i in range(a.tokens):
            tokens.append(int(np.argmax(logits)))
            out = model.call("decode", {"input_ids": np.array([[tokens[-1]]], np.int32), "pos": len(ref["prompt"]) + i})
            logits = out["logits"].numpy()[0, -1]
            if i < 3:
                errs.append(rel(logits, ref["logits"][i + 1]))
        d = time.perf_counter() - t0
        if r == 0:
            n = min(len(tokens), len(ref["tokens"]))  # the reference holds the first 3
            check = {"tokens": tokens[:n] == ref["tokens"][:n], "err": max(errs), "all": tokens}
            continue
        prompts.append(p * 1000)
        forwards.append(f * 1000)
        rates.append(a.tokens / d)
    model.dispose()
    print(json.dumps({"prompt": float(np.median(prompts)), "forward": float(np.median(forwards)),
                      "tokS": float(np.median(rates)), "check": check}))


if __name__ == "__main__":
    main()
