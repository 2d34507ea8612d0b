"""Write bench/gpt2s.pgb (and bench/gpt2s.onnx): a GPT-2 small shaped checkpoint with random weights (12 layers,
width 768, 12 heads, vocab 50257; no model hub here), loaded with polygrad.hf.load_hf(max_batch=1,
max_seq_len=128) and saved as a bundle with its `forward` (prompt, every position's logits), `prefill` (prompt,
the last position's) and `decode` (one token) entrypoints. The
ONNX file is the same transformers model exported by torch with a KV cache (inputs input_ids, position_ids,
past_key_<i>/past_value_<i>; outputs logits, present_key_<i>/present_value_<i>) for the onnxruntime-node column
of bench/gpt2.js. bench/gpt2_ref.json holds the prompt's and three greedy steps' logits from transformers.

Run from the repository root: `python polygrad-js/bench/make_gpt2.py [--no-onnx] [--quant q8_0,q4_0]` (about
a minute). `--quant FMT[,FMT]` also writes bench/gpt2s_<fmt>.pgb: the same weights with load_hf(dtype=fmt) (every
matrix, the tied embedding/head and wpe included, in llama.cpp's blocks) and bench/gpt2s_<fmt>_py.json, Python
polygrad's prompt logits and greedy tokens from that bundle (bench/gpt2.js --quant fmt checks against them).
`--int8-dot` with `--quant` writes each format's bundle a second time as bench/gpt2s_<fmt>_i8.pgb (and its
_py.json), captured with POLY_INT8_DOT=1: the decode's matvecs on 8-bit activations with exact int32 block sums, the
route Python polygrad takes on a CPU with int8 dot products (needs one: VNNI here; the prompt keeps float
activations); `--int8-prompts` with `--quant` writes bench/gpt2s_<fmt>_i8p.pgb, the prompt's matmuls on the int8
route as well (POLY_INT8_PROMPTS=1, load_hf's default there). `--int8-onnx` writes bench/gpt2s_int8.onnx,
onnxruntime's dynamic quantization of gpt2s.onnx (int8 weights, activations rounded to 8 bits per tensor at run
time: MatMulInteger), how transformers.js quantizes the models it runs by default (bench/gpt2_browser.js --quant
times it beside polygrad-js's quantized bundles).
"""
from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
MAX_SEQ = 128
PROMPT = [(i * 7919 + 13) % 50257 for i in range(32)]  # 32 fixed token ids
CONFIG = dict(vocab_size=50257, n_embd=768, n_layer=12, n_head=12, n_positions=1024, bos_token_id=50256,
              eos_token_id=50256)


def hf_model():
    import torch
    import transformers as tf
    torch.manual_seed(0)
    model = tf.GPT2LMHeadModel(tf.GPT2Config(**CONFIG)).eval()
    with torch.no_grad():  # widen the random init so the logits spread and greedy choices are clear
        for p in model.parameters():
            if p.ndim >= 1:
                p.add_(torch.randn_like(p) * 0.05)
    return model


class _WithCache:
    """forward(input_ids, position_ids, *past) -> (logits, *present) over transformers' DynamicCache."""

    @staticmethod
    def module(model):
        import torch
        from transformers import DynamicCache

        class Wrapped(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.model = model

            def forward(self, input_ids, position_ids, *past):
                cache = DynamicCache()
                for i in range(len(past) // 2):
                    cache.update(past[2 * i], past[2 * i + 1], i)
                out = self.model(input_ids=input_ids, position_ids=position_ids, past_key_values=cache,
                                 use_cache=True)
                present = []
                for layer in out.past_key_values.layers:
                    present += [layer.keys, layer.values]
                return (out.logits, *present)
        return Wrapped().eval()


def export_onnx(model, path: Path) -> None:
    import torch
    n = CONFIG["n_layer"]
    heads, dim = CONFIG["n_head"], CONFIG["n_embd"] // CONFIG["n_head"]
    past = [torch.zeros(1, heads, 3, dim) for _ in range(2 * n)]
    names = [f"past_{kind}_{i}" for i in range(n) for kind in ("key", "value")]
    outs = ["logits"] + [f"present_{kind}_{i}" for i in range(n) for kind in ("key", "value")]
    axes = {"input_ids": {1: "tokens"}, "position_ids": {1: "tokens"}, "logits": {1: "tokens"}}
    axes.update({k: {2: "past"} for k in names})
    axes.update({k: {2: "total"} for k in outs[1:]})
    ids = torch.tensor([[1, 2]])
    pos = torch.tensor([[3, 4]])
    torch.onnx.export(_WithCache.module(model), (ids, pos, *past), str(path), input_names=["input_ids",
                      "position_ids", *names], output_names=outs, dynamic_axes=axes, opset_version=17,
                      dynamo=False)


def reference(model) -> dict:
    import torch
    with torch.no_grad():
        out = model(torch.tensor([PROMPT]), use_cache=True)
        logits = [out.logits[0, -1].numpy()]
        cache, tokens = out.past_key_values, []
        for _ in range(3):
            tokens.append(int(np.argmax(logits[-1])))
            out = model(torch.tensor([[tokens[-1]]]), past_key_values=cache, use_cache=True)
            cache = out.past_key_values
            logits.append(out.logits[0, -1].numpy())
    return {"prompt": PROMPT, "tokens": tokens, "logits": [x[:64].tolist() for x in logits],
            "argmax": [int(np.argmax(x)) for x in logits]}


def python_reference(bundle, tokens: int = 16) -> dict:
    """The bundle's own logits (first 64 of the prompt's last position and of three greedy steps) and
    `tokens` greedy tokens, from Python polygrad: what polygrad-js must reproduce from the saved bundle."""
    logits = [bundle.forward(input_ids=np.array([PROMPT], np.int32))["logits"].numpy()[0, -1]]
    out = []
    for i in range(tokens):
        out.append(int(np.argmax(logits[-1])))
        step = bundle.call("decode", {"input_ids": np.array([[out[-1]]], np.int32), "pos": len(PROMPT) + i})
        logits.append(step["logits"].numpy()[0, -1])
    return {"tokens": out, "logits": [x[:64].tolist() for x in logits[:4]]}


def write_int8_dot_bundle(checkpoint: str, fmt: str, prompts: bool = False) -> None:
    """bench/gpt2s_<fmt>_i8.pgb and its _py.json: the decode's matvecs captured on the int8 route (POLY_INT8_DOT=1,
    nn/quant.py _int8_matmul_t), the prompt on float activations (POLY_INT8_PROMPTS=0). With `prompts`,
    bench/gpt2s_<fmt>_i8p.pgb: the prompt's matmuls on the multi-row int8 route too (_int8_matmul_rows, what
    load_hf takes by default on a CPU with int8 dot products; polygrad-js reads its 8-row weight panels a lane a
    row, linearize.js rowDotReduce)."""
    from polygrad import Context
    from polygrad.hf import load_hf
    from polygrad.nn.quant import int8_dot_enabled
    name = f"gpt2s_{fmt}_i8p" if prompts else f"gpt2s_{fmt}_i8"
    with Context(POLY_INT8_DOT=1, POLY_INT8_PROMPTS=int(prompts)):
        if not int8_dot_enabled("CPU"):
            raise SystemExit("--int8-dot: this CPU has no int8 dot product (VNNI), so no kernel would take the route")
        bundle = load_hf(checkpoint, max_batch=1, max_seq_len=MAX_SEQ, dtype=fmt)
        bundle.save(str(HERE / f"{name}.pgb"))
        (HERE / f"{name}_py.json").write_text(json.dumps(python_reference(bundle)))
    print(f"wrote {HERE / f'{name}.pgb'} (int8 route{', prompts too' if prompts else ''})")
    bundle.dispose()


def quantize_onnx(src: Path, dst: Path) -> None:
    """dst: onnxruntime's dynamic quantization of src (int8 weights per tensor, every MatMul and Gather)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic
    if not src.exists():
        raise SystemExit(f"{src} is missing: run make_gpt2.py without --no-onnx first")
    quantize_dynamic(str(src), str(dst), weight_type=QuantType.QInt8)
    print(f"wrote {dst}")


def main() -> None:
    from polygrad import Context
    from polygrad.hf import load_hf
    model = hf_model()
    quants = sys.argv[sys.argv.index("--quant") + 1].split(",") if "--quant" in sys.argv else []
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp)
        if "--only-quant" not in sys.argv:
            bundle = load_hf(tmp, max_batch=1, max_seq_len=MAX_SEQ)
            bundle.save(str(HERE / "gpt2s.pgb"))
            bundle.dispose()
        for fmt in quants:
            # the portable float kernels: a Q8_0 or Q4_0 decode captured on a CPU with VNNI would otherwise round its
            # activations to 8 bits (POLY_INT8_DOT), whose logits polygrad-js reproduces only to about 1e-2
            with Context(POLY_INT8_DOT=0):
                bundle = load_hf(tmp, max_batch=1, max_seq_len=MAX_SEQ, dtype=fmt)
            bundle.save(str(HERE / f"gpt2s_{fmt}.pgb"))
            (HERE / f"gpt2s_{fmt}_py.json").write_text(json.dumps(python_reference(bundle)))
            print(f"wrote {HERE / f'gpt2s_{fmt}.pgb'}: {bundle.hf_notes}")
            bundle.dispose()
            if "--int8-dot" in sys.argv:
                write_int8_dot_bundle(tmp, fmt)
            if "--int8-prompts" in sys.argv:
                write_int8_dot_bundle(tmp, fmt, prompts=True)
        if "--int8-onnx" in sys.argv:
            quantize_onnx(HERE / "gpt2s.onnx", HERE / "gpt2s_int8.onnx")
        if "--only-quant" in sys.argv:
            return
    (HERE / "gpt2_ref.json").write_text(json.dumps(reference(model)))
    if "--no-onnx" not in sys.argv:
        export_onnx(model, HERE / "gpt2s.onnx")
    print(f"wrote {HERE / 'gpt2s.pgb'}" + ("" if "--no-onnx" in sys.argv else f" and {HERE / 'gpt2s.onnx'}"))


if __name__ == "__main__":
    main()
