"""Quantized GGUF weights kept in their blocks against dequantized at load: decode speed and weight memory.

Workload (issue 30): a GPT-2-small-shaped model (transformers' GPT2Config defaults: 12 layers, width 768,
12 heads, vocabulary 50257) with random weights, written with the gguf package as one file per block
format (--formats; matrices quantized, norms and biases F32, as llama.cpp's converter does; the K-quants,
which the gguf package cannot write, as raw blocks from polygrad's round-to-nearest quantizer). Each
variant is loaded with polygrad.hf.load_hf in this one process, batch 1, an 8-token prompt, then greedy
decoding; reported per variant, best of --rounds:

  weights  bytes of the model's weight buffers (Model.summary's slots, caches and constants excluded)
  prompt   milliseconds for the prompt (the forward entrypoint)
  decode   new tokens per second (the decode entrypoint over the KV cache)

Variants: the Q4_0 file with dtype="float32" (dequantized at load: the float32 baseline), then each
format's file kept quantized (the default). The Q4_0 model is also saved to a .pgb and loaded back
with Model.load's default caps (docs/bundle-format.md), and the greedy tokens of the kept and
dequantized Q4_0 models are compared.

    python benchmarks/bench_gguf.py [--rounds 2] [--new 16] [--layers 12] [--quick]
                                    [--formats Q8_0,Q4_0,Q4_K,Q5_K,Q6_K]

`--quick` is a 2-layer run. Figures on a shared machine are noisy: repeat them.
"""
from __future__ import annotations

import argparse
import os
import tempfile
import time

import numpy as np

PROMPT = 8


def add_byte_vocabulary(w, vocab: int) -> None:
    """A byte-level BPE vocabulary of `vocab` tokens on GGUF writer `w`: the 256 byte symbols, then tokens
    made by merging an earlier token with one byte symbol (two symbols first, then three, ...), one merge
    per token, as llama.cpp needs to load a file. The last token is BOS and EOS."""
    # byte-level BPE's symbols: a printable byte stands for itself, the others for code points from 256 on
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    rest = iter(range(0x100, 0x200))
    symbols = [chr(b) if b in printable else chr(next(rest)) for b in range(256)]
    tokens, merges, level = list(symbols), [], list(symbols)
    while len(tokens) < vocab:
        longer = []
        for a in level:
            for b in symbols:
                if len(tokens) == vocab:
                    break
                tokens.append(a + b)
                merges.append(f"{a} {b}")
                longer.append(a + b)
        level = longer
    w.add_tokenizer_model("gpt2")
    w.add_token_list(tokens)
    w.add_token_merges(merges)
    w.add_token_types([1] * vocab)
    w.add_bos_token_id(vocab - 1)
    w.add_eos_token_id(vocab - 1)


def _tensor_writers(w, fmt: str, rng, scale: float):
    """matrix(name, rows, cols): random normal * scale, quantized to `fmt` in llama.cpp's (out, in) layout;
    vector(name, n, value): a constant F32 vector. Both add to GGUF writer `w`."""
    import gguf
    qtype = getattr(gguf.GGMLQuantizationType, fmt)

    def matrix(name: str, rows: int, cols: int) -> None:
        from polygrad.nn.quant import quantize_rows
        data = (rng.standard_normal((rows, cols), np.float32) * scale).astype(np.float32)
        try:
            blocks = gguf.quants.quantize(data, qtype)
        except NotImplementedError:  # the K-quants: gguf cannot write them
            blocks = quantize_rows(data, fmt).reshape(rows, -1)
        w.add_tensor(name, blocks, raw_dtype=qtype)

    def vector(name: str, n: int, value: float) -> None:
        w.add_tensor(name, np.full(n, value, np.float32))
    return matrix, vector


def write_qwen2_gguf(path: str, fmt: str, layers: int = 24, tokenizer: bool = False, vocab: int = 151936) -> None:
    """A random model of Qwen2-0.5B's shape (hidden 896, 14 query and 2 key/value heads of 64, MLP 4864,
    vocabulary 151936, tied embeddings, rope base 1e6; 24 layers unless `layers` says otherwise, a smaller
    `vocab` for tests) as a GGUF file whose matrices are `fmt`, under llama.cpp's qwen2 names. With
    `tokenizer`, a byte-level BPE vocabulary of that size (add_byte_vocabulary)."""
    import gguf
    E, F, V, H, KV, D = 896, 4864, vocab, 14, 2, 64
    rng = np.random.default_rng(0)
    w = gguf.GGUFWriter(path, "qwen2")
    w.add_context_length(32768)
    w.add_embedding_length(E)
    w.add_feed_forward_length(F)
    w.add_block_count(layers)
    w.add_head_count(H)
    w.add_head_count_kv(KV)
    w.add_rope_freq_base(1e6)
    w.add_layer_norm_rms_eps(1e-6)
    if tokenizer:
        add_byte_vocabulary(w, V)
    matrix, vector = _tensor_writers(w, fmt, rng, 0.02)
    matrix("token_embd.weight", V, E)  # no output.weight: the head reads the embedding (tied)
    vector("output_norm.weight", E, 1.0)
    for i in range(layers):
        b = f"blk.{i}."
        vector(b + "attn_norm.weight", E, 1.0)
        vector(b + "ffn_norm.weight", E, 1.0)
        for name, rows, cols in (("attn_q", H * D, E), ("attn_k", KV * D, E), ("attn_v", KV * D, E)):
            matrix(b + name + ".weight", rows, cols)
            vector(b + name + ".bias", rows, 0.0)
        for name, rows, cols in (("attn_output", E, H * D), ("ffn_gate", F, E), ("ffn_up", F, E),
                                 ("ffn_down", E, F)):
            matrix(b + name + ".weight", rows, cols)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write_gpt2_gguf(path: str, fmt: str, layers: int, tokenizer: bool = False) -> None:
    """A random GPT-2 (GPT2Config's sizes) as a GGUF file whose matrices are `fmt`, in llama.cpp's layout
    (projections (out, in): the transpose of GPT-2's Conv1D weights). With `tokenizer`, also a byte-level
    BPE vocabulary of the model's size (the 256 byte symbols, then one merge of two of them per token),
    which llama.cpp needs to load a file (benchmarks/bench_llamacpp.py feeds it token ids)."""
    import gguf
    from transformers import GPT2Config
    cfg = GPT2Config(n_layer=layers)
    E, V, P = cfg.n_embd, cfg.vocab_size, cfg.n_positions
    F = cfg.n_inner or 4 * E
    rng = np.random.default_rng(0)
    w = gguf.GGUFWriter(path, "gpt2")
    w.add_context_length(P)
    w.add_embedding_length(E)
    w.add_feed_forward_length(F)
    w.add_block_count(layers)
    w.add_head_count(cfg.n_head)
    w.add_layer_norm_eps(cfg.layer_norm_epsilon)
    if tokenizer:
        add_byte_vocabulary(w, V)
    matrix, vector = _tensor_writers(w, fmt, rng, cfg.initializer_range)
    matrix("token_embd.weight", V, E)
    matrix("position_embd.weight", P, E)
    vector("output_norm.weight", E, 1.0)
    vector("output_norm.bias", E, 0.0)
    for i in range(layers):
        b = f"blk.{i}."
        for norm in ("attn_norm", "ffn_norm"):
            vector(b + norm + ".weight", E, 1.0)
            vector(b + norm + ".bias", E, 0.0)
        for name, rows, cols in (("attn_qkv", 3 * E, E), ("attn_output", E, E), ("ffn_up", F, E),
                                 ("ffn_down", E, F)):
            matrix(b + name + ".weight", rows, cols)
            vector(b + name + ".bias", rows, 0.0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def weight_bytes(model) -> int:
    from polygrad_hf.decoder import JOINED, expected_weights
    names = set(expected_weights(model.hf_config))
    # and the projections read_weights joined (qkv_proj, gate_up_proj), where it did
    names |= {n.replace(part, joined) for n in names for joined, parts in JOINED.items() for part in parts}
    return sum(s.size * s.dtype.itemsize for s in model._p.slots if s.name in names)


def bench(path: str, dtype, rounds: int, new: int) -> dict:
    from polygrad.hf import load_hf
    t0 = time.perf_counter()
    model = load_hf(path, max_batch=1, max_seq_len=PROMPT + new, dtype=dtype)
    out = {"load_s": time.perf_counter() - t0, "weights": weight_bytes(model), "prompt_s": float("inf"),
           "decode_s": float("inf")}
    ids = np.random.default_rng(1).integers(0, model.hf_config.vocab_size, (1, PROMPT)).astype(np.int32)
    try:
        model.forward(input_ids=ids)  # warm-up
        for _ in range(rounds):
            t0 = time.perf_counter()
            logits = model.forward(input_ids=ids)["logits"].numpy()
            out["prompt_s"] = min(out["prompt_s"], time.perf_counter() - t0)
            nxt = int(logits[0, -1].argmax())
            tokens = [nxt]
            t0 = time.perf_counter()
            for k in range(new - 1):
                step = model.call("decode", {"input_ids": np.array([[nxt]], np.int32), "pos": PROMPT + k})
                nxt = int(step["logits"].numpy()[0, -1].argmax())
                tokens.append(nxt)
            out["decode_s"] = min(out["decode_s"], time.perf_counter() - t0)
        out["tokens"] = tokens
        out["model"] = model
    except BaseException:
        model.dispose()
        raise
    return out


def bundle_check(model, folder: str) -> str:
    from polygrad import Model
    path = os.path.join(folder, "q4.pgb")
    model.save(path)
    t0 = time.perf_counter()
    loaded = Model.load(path)  # default caps
    took = time.perf_counter() - t0
    loaded.dispose()
    return f"{os.path.getsize(path) / 1e6:.1f} MB bundle; Model.load with default caps: ok in {took:.1f} s"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--new", type=int, default=16)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--formats", default="Q8_0,Q4_0,Q4_K,Q5_K,Q6_K")
    args = ap.parse_args()
    formats = [f.strip().upper() for f in args.formats.split(",")]
    if "Q4_0" not in formats:
        formats.insert(0, "Q4_0")  # the float32 baseline and the bundle check read it
    layers = 2 if args.quick else args.layers
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        files = {}
        for fmt in formats:
            files[fmt] = os.path.join(folder, f"gpt2-{fmt}.gguf")
            write_gpt2_gguf(files[fmt], fmt, layers)
        variants = (("Q4_0 dequantized to float32", files["Q4_0"], "float32"),
                    *((f"{fmt} kept", files[fmt], "quantized") for fmt in formats))
        results = {}
        for label, path, dtype in variants:
            r = bench(path, dtype, args.rounds, args.new)
            results[label] = r
            if label != "Q4_0 kept":
                r.pop("model").dispose()
            rows.append((label, os.path.getsize(path), r))
        kept = results["Q4_0 kept"].pop("model")
        try:
            note = bundle_check(kept, folder)
        finally:
            kept.dispose()
    agree = results["Q4_0 kept"]["tokens"] == results["Q4_0 dequantized to float32"]["tokens"]
    print(f"GPT-2 shape (GPT2Config defaults, {layers} layers), random weights; batch 1, prompt {PROMPT}, "
          f"{args.new} new tokens; POLY_THREADS={os.environ.get('POLY_THREADS', 'default')}; "
          f"best of {args.rounds}")
    print(f"{'variant':30s}{'file MB':>9s}{'weights MB':>12s}{'/file':>7s}{'prompt ms':>11s}{'decode tok/s':>14s}"
          f"{'load s':>8s}")
    for label, size, r in rows:
        print(f"{label:30s}{size / 1e6:9.1f}{r['weights'] / 1e6:12.1f}{r['weights'] / size:7.2f}"
              f"{r['prompt_s'] * 1e3:11.1f}{(args.new - 1) / r['decode_s']:14.2f}{r['load_s']:8.1f}")
    print(f"greedy tokens of Q4_0 kept and dequantized agree: {agree}; {note}")


if __name__ == "__main__":
    main()
