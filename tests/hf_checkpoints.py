"""Tiny Hugging Face checkpoints for the polygrad-hf tests, made with transformers (no hub access).

`make(kind, folder)` builds a randomly initialised GPT2LMHeadModel / LlamaForCausalLM /
Qwen2ForCausalLM (CONFIGS) or Phi3ForCausalLM / GemmaForCausalLM / Gemma2ForCausalLM (FAMILY_CONFIGS)
with a few layers and tiny widths and saves it with save_pretrained (config.json + model.safetensors,
or shards). `write_gguf` writes the same weights as llama.cpp's converter lays them out, through the
gguf package's own name map and writer (names, q/k row order, GPT-2 transposes, Gemma's 1 + norm
weights, Phi-3's LongRoPE factor tensors).
"""
from __future__ import annotations

import numpy as np

VOCAB = 61  # not a multiple of anything the kernels like

CONFIGS = {
    "gpt2": dict(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=64, bos_token_id=0, eos_token_id=0),
    # GQA (4 query heads share 2 key/value heads), Llama 3.1 rope scaling, untied output projection
    "llama": dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=64, rope_theta=5000.0, tie_word_embeddings=False,
                  rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                "original_max_position_embeddings": 16}),
    # tied embeddings, another rope_theta, no GQA
    "llama_tied": dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64, rope_theta=20000.0,
                       tie_word_embeddings=True),
    "qwen2": dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=True),
}


# the families past Llama; kept out of CONFIGS, which other test files build every entry of
_LONG = [1.0, 1.5, 2.0, 3.0]  # LongRoPE factors, head_dim / 2 of them
FAMILY_CONFIGS = {
    # fused qkv_proj / gate_up_proj, GQA, a sliding window on every layer shorter than the tests' sequences
    "phi3": dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, max_position_embeddings=64, original_max_position_embeddings=64,
                 sliding_window=6, pad_token_id=0, bos_token_id=1, eos_token_id=2),
    # LongRoPE: short factors up to 16 positions, long ones past them, cos/sin scaled by the attention factor
    "phi3_longrope": dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64,
                          original_max_position_embeddings=16, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                          rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0,
                                           "short_factor": [1.0, 1.1, 1.3, 1.2], "long_factor": _LONG}),
    # head_dim 16, not hidden / heads = 8; tied head; GeGLU
    "gemma": dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=1, head_dim=16, max_position_embeddings=64),
    # soft-capping small enough to bend the values; query_pre_attn_scalar not head_dim; layer 0 windowed
    "gemma2": dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=2, head_dim=16, max_position_embeddings=64, query_pre_attn_scalar=24,
                   attn_logit_softcapping=2.0, final_logit_softcapping=3.0, sliding_window=4,
                   attn_implementation="eager"),
}


def hf_model(kind: str, seed: int = 0, **overrides):
    import torch
    import transformers as tf
    torch.manual_seed(seed)
    family = kind.split("_")[0]
    cls, cfg = {"gpt2": (tf.GPT2LMHeadModel, tf.GPT2Config), "llama": (tf.LlamaForCausalLM, tf.LlamaConfig),
                "qwen2": (tf.Qwen2ForCausalLM, tf.Qwen2Config), "phi3": (tf.Phi3ForCausalLM, tf.Phi3Config),
                "gemma": (tf.GemmaForCausalLM, tf.GemmaConfig),
                "gemma2": (tf.Gemma2ForCausalLM, tf.Gemma2Config)}[family]
    model = cls(cfg(**{**{**CONFIGS, **FAMILY_CONFIGS}[kind], **overrides})).eval()
    with torch.no_grad():  # random init is small; widen it so the logits spread and greedy choices are clear
        for p in model.parameters():
            if p.ndim >= 1:
                p.add_(torch.randn_like(p) * 0.05)
    return model


def make(kind: str, folder, seed: int = 0, overrides: dict | None = None, **save):
    """(transformers model, folder) of a saved tiny checkpoint (config entries changed by `overrides`)."""
    model = hf_model(kind, seed, **(overrides or {}))
    model.save_pretrained(folder, **save)
    return model, str(folder)


def logits(model, ids: np.ndarray) -> np.ndarray:
    import torch
    with torch.no_grad():
        return model(torch.tensor(np.asarray(ids), dtype=torch.long)).logits.float().numpy()


def greedy(model, ids: np.ndarray, n: int) -> np.ndarray:
    import torch
    with torch.no_grad():
        out = model.generate(torch.tensor(ids, dtype=torch.long), max_new_tokens=n, do_sample=False,
                             eos_token_id=None, pad_token_id=0, min_new_tokens=n)
    return out.numpy()


def _llama_cpp_permute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf row order for Llama q/k projections."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gguf(model, path, qtype: str | dict[str, str] = "F32") -> dict[str, np.ndarray]:
    """Write `model` as a GGUF file of `qtype` (F32, F16 or a block format such as Q8_0 or Q4_K for 2-D
    weights; norms and biases stay F32 as llama.cpp keeps them); returns the state dict as the file holds
    it, dequantized (by the gguf package, or reference_dequantize), in Hugging Face names and layouts
    (what a correct reader must reproduce). `qtype` may be a {Hugging Face name: type} dict instead (types
    mixed in one file, as llama.cpp's Q4_K_M files are; a name not in it is F32). The gguf package cannot
    write the K-quants: their raw blocks
    come from polygrad's quantizer, and the values returned are still the gguf package's reading of them."""
    import gguf
    cfg = model.config
    family = cfg.model_type
    arch = {"gpt2": gguf.MODEL_ARCH.GPT2, "llama": gguf.MODEL_ARCH.LLAMA, "qwen2": gguf.MODEL_ARCH.QWEN2,
            "phi3": gguf.MODEL_ARCH.PHI3, "gemma": gguf.MODEL_ARCH.GEMMA, "gemma2": gguf.MODEL_ARCH.GEMMA2}[family]
    names = gguf.get_tensor_name_map(arch, cfg.num_hidden_layers)
    w = gguf.GGUFWriter(str(path), gguf.MODEL_ARCH_NAMES[arch])
    if family == "gpt2":
        w.add_context_length(cfg.n_positions)
        w.add_embedding_length(cfg.n_embd)
        w.add_feed_forward_length(4 * cfg.n_embd)
        w.add_block_count(cfg.n_layer)
        w.add_head_count(cfg.n_head)
        w.add_layer_norm_eps(cfg.layer_norm_epsilon)
    else:
        w.add_context_length(cfg.max_position_embeddings)
        w.add_embedding_length(cfg.hidden_size)
        w.add_feed_forward_length(cfg.intermediate_size)
        w.add_block_count(cfg.num_hidden_layers)
        w.add_head_count(cfg.num_attention_heads)
        w.add_head_count_kv(cfg.num_key_value_heads)
        w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
        w.add_rope_freq_base(float(cfg.rope_parameters["rope_theta"]))
    if family in ("gemma", "gemma2"):  # what llama.cpp's converter adds for them
        w.add_key_length(cfg.head_dim)
        w.add_value_length(cfg.head_dim)
    if family == "gemma2":
        w.add_attn_logit_softcapping(cfg.attn_logit_softcapping)
        w.add_final_logit_softcapping(cfg.final_logit_softcapping)
        w.add_sliding_window(cfg.sliding_window)
    if family == "phi3":
        _phi3_gguf_extras(w, cfg)
    held = {}
    state = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    if getattr(cfg, "tie_word_embeddings", False):
        state.pop("lm_head.weight", None)
    for hf_name, arr in state.items():
        if hf_name.endswith((".attn.bias", ".attn.masked_bias")):  # old GPT-2 mask buffers
            continue
        name = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        data = arr
        if family == "llama" and hf_name.endswith("q_proj.weight"):
            data = _llama_cpp_permute(arr, cfg.num_attention_heads)
        elif family == "llama" and hf_name.endswith("k_proj.weight"):
            data = _llama_cpp_permute(arr, cfg.num_key_value_heads)
        elif family == "gpt2" and hf_name.endswith(("c_attn.weight", "c_proj.weight", "c_fc.weight")):
            data = np.ascontiguousarray(arr.T)
        elif family in ("gemma", "gemma2") and hf_name.endswith("norm.weight"):
            data = arr + np.float32(1)  # the converter stores Gemma's norm scale 1 + weight
        if isinstance(qtype, dict):
            kind = qtype.get(hf_name, "F32")
        else:
            kind = qtype if data.ndim == 2 else "F32"
        if kind == "F32":
            w.add_tensor(name, data.astype(np.float32))
            stored = data.astype(np.float32)
        elif kind == "F16":
            w.add_tensor(name, data.astype(np.float16))
            stored = data.astype(np.float16).astype(np.float32)
        else:
            qt = getattr(gguf.GGMLQuantizationType, kind)
            q = quantize_blocks(data.astype(np.float32), kind)
            w.add_tensor(name, q, raw_dtype=qt)
            stored = reference_dequantize(q, kind).reshape(data.shape)
        held[hf_name] = _undo_layout(family, hf_name, stored, cfg)
    if family == "llama" and getattr(cfg, "rope_parameters", {}).get("rope_type") == "llama3":
        w.add_tensor("rope_freqs.weight", _llama3_factors(cfg))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return held


def quantize_blocks(w: np.ndarray, kind: str) -> np.ndarray:
    """(rows, row bytes) uint8 blocks of a float32 (rows, cols) array: the gguf package's quantizer, or
    polygrad's for the types gguf cannot write (the K-quants)."""
    import gguf
    qt = getattr(gguf.GGMLQuantizationType, kind)
    try:
        return gguf.quants.quantize(w, qt)
    except NotImplementedError:
        from polygrad.nn.quant import quantize_rows
        return quantize_rows(w, kind).reshape(w.shape[0], -1)


# ggml's block_q8_K: float d; int8 qs[256]; int16 bsums[16] (the gguf package has no Q8_K dequantizer)
Q8_K_BLOCK = np.dtype([("d", "<f4"), ("qs", "i1", 256), ("bsums", "<i2", 16)])


def reference_dequantize(blocks: np.ndarray, kind: str) -> np.ndarray:
    """float32 (rows, cols) values of (rows, row bytes) uint8 blocks: the gguf package's dequantizer, and
    for Q8_K d * qs read through ggml's struct layout."""
    import gguf
    blocks = np.ascontiguousarray(blocks, dtype=np.uint8)
    if kind == "Q8_K":
        rec = blocks.reshape(-1, Q8_K_BLOCK.itemsize).view(Q8_K_BLOCK).reshape(-1)
        return (rec["d"][:, None] * rec["qs"].astype(np.float32)).reshape(blocks.shape[0], -1)
    return gguf.quants.dequantize(blocks, getattr(gguf.GGMLQuantizationType, kind))


def _phi3_gguf_extras(w, cfg) -> None:
    """The keys (and LongRoPE factor tensors) llama.cpp's converter writes for Phi-3."""
    import math
    rp = cfg.rope_parameters
    original = rp.get("original_max_position_embeddings", cfg.original_max_position_embeddings)
    w.add_rope_scaling_orig_ctx_len(original)
    w.add_rope_dimension_count(int(rp.get("partial_rotary_factor", 1.0) * cfg.hidden_size) // cfg.num_attention_heads)
    w.add_sliding_window(cfg.sliding_window or 0)
    if rp.get("rope_type") == "longrope":
        scale = cfg.max_position_embeddings / original
        w.add_rope_scaling_attn_factors(math.sqrt(1 + math.log(scale) / math.log(original)) if scale > 1 else 1.0)
        w.add_tensor("rope_factors_long.weight", np.array(rp["long_factor"], np.float32))
        w.add_tensor("rope_factors_short.weight", np.array(rp["short_factor"], np.float32))


def _undo_layout(family, hf_name, stored, cfg):
    if family == "llama" and hf_name.endswith(("q_proj.weight", "k_proj.weight")):
        heads = cfg.num_attention_heads if "q_proj" in hf_name else cfg.num_key_value_heads
        r = stored.shape[0]
        return stored.reshape(heads, r // heads // 2, 2, -1).swapaxes(1, 2).reshape(stored.shape)
    if family == "gpt2" and hf_name.endswith(("c_attn.weight", "c_proj.weight", "c_fc.weight")):
        return np.ascontiguousarray(stored.T)
    if family in ("gemma", "gemma2") and hf_name.endswith("norm.weight"):
        return stored - np.float32(1)
    return stored


def _llama3_factors(cfg) -> np.ndarray:
    """llama.cpp's rope_freqs tensor for Llama 3.1 scaling: the divisor of each rotary frequency."""
    import math
    rp = cfg.rope_parameters
    base, dim = rp["rope_theta"], cfg.hidden_size // cfg.num_attention_heads
    factor, low, high, old = rp["factor"], rp["low_freq_factor"], rp["high_freq_factor"], \
        rp["original_max_position_embeddings"]
    out = []
    for i in range(0, dim, 2):
        freq = 1.0 / (base ** (i / dim))
        wavelen = 2 * math.pi / freq
        if wavelen < old / high:
            out.append(1.0)
        elif wavelen > old / low:
            out.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def set_state(model, state: dict[str, np.ndarray]) -> None:
    """Load host arrays (HF names and layouts) into a transformers model, e.g. a GGUF's dequantized weights."""
    import torch
    sd = model.state_dict()
    with torch.no_grad():
        for k, v in state.items():
            sd[k].copy_(torch.tensor(v))
        if getattr(model.config, "tie_word_embeddings", False) and "lm_head.weight" in sd:
            emb = "transformer.wte.weight" if model.config.model_type == "gpt2" else "model.embed_tokens.weight"
            sd["lm_head.weight"].copy_(sd[emb])


class RecordedKernels:
    """The kernels get_program is asked for while active (every kernel realized, cached or not): `asts`."""

    def __enter__(self):
        from polygrad.engine import programs
        self.asts, self._orig = [], programs.get_program

        def record(ast, device):
            self.asts.append(ast)
            return self._orig(ast, device)
        programs.get_program = record
        return self

    def __exit__(self, *exc):
        from polygrad.engine import programs
        programs.get_program = self._orig


def assert_reads_bit_exact(blocks: np.ndarray, fmt: str, want: np.ndarray, device: str, ids: np.ndarray) -> None:
    """A QuantWeight over `blocks` gives `want` (the reference float32 values) bit for bit read every way a
    model reads it: whole (dequantize), as an embedding lookup of `ids` (gathers blocks, then dequantizes)
    and as a row range."""
    from polygrad import Tensor
    from polygrad.nn.quant import QuantWeight
    qw = QuantWeight(Tensor(blocks, device=device), fmt, want.shape)
    got = qw.dequantize().numpy()
    assert got.dtype == np.float32 and got.shape == want.shape
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
    np.testing.assert_array_equal(qw.rows(Tensor(ids, device=device)).numpy().view(np.uint32),
                                  want[ids].view(np.uint32))
    np.testing.assert_array_equal(qw.row_range(2, 5).numpy().view(np.uint32), want[2:5].view(np.uint32))
