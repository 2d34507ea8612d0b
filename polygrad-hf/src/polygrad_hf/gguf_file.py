"""Read a GGUF file (llama.cpp's format) as a Checkpoint in Hugging Face names and layouts.

Stage: checkpoint reading. Input: a .gguf path. Output: a checkpoint.Checkpoint whose config comes
from the GGUF metadata (`<arch>.embedding_length`, `<arch>.block_count`, ...) and whose tensors are
renamed (`blk.0.attn_q.weight` -> `model.layers.0.self_attn.q_proj.weight`) and laid out as the
Hugging Face checkpoint would hold them: llama.cpp's reordering of Llama's q/k rows is undone, GPT-2's
transposed Conv1D weights are transposed back, and a `rope_freqs` tensor (Llama 3 rope scaling) becomes
frequency divisors.

The file is parsed and checked by gguf_format.GGUFFile (polygrad-hf's own reader: no gguf package; the
vocabulary and other metadata arrays stay undecoded, tensor data stays in the file's memory map): every
count and size in range, every tensor's data inside the data section, on the file's alignment and
overlapping no other tensor. Here every metadata value that drives
a shape an integer in range and the sizes consistent (`config.size_field`, `config.check_decoder`); a
problem is a CheckpointError naming the file and the tensor or key.

Tensor types: F32, F16, BF16 and llama.cpp's block formats of polygrad/definitions/quant_formats.py
(Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K, Q8_K). A block-format matrix is offered both ways
(weights.Lazy): as its uint8 blocks in the stored (rows, cols) layout (`Lazy.blocks`, kept quantized on
the device by load_hf and dequantized by the kernels that read it, quant.py), and dequantized to float32
(`Lazy.load`, load_hf's dtype="float32" path: the 32-value formats and Q4_K..Q6_K by the `gguf` package,
needed only for that; Q8_K, which it does not decode, by quant.q8_k_floats). F32 tensors are views of
the file, F16 and BF16 are widened here. Architectures: llama, qwen2, gpt2, phi3, gemma, gemma2.

llama.cpp's converter changes some tensors and leaves some settings out, and the reader follows what
llama.cpp then does: Gemma's norm weights are stored as 1 + weight (config.norm_offset 0), Phi-3's
LongRoPE factors are the rope_factors_short/long tensors, Gemma 2's attention scale is not stored
(llama.cpp takes 1 / sqrt(head_dim), or 1 / sqrt(width / heads) for the 46-layer 27B) and its soft caps
and window fall back to llama.cpp's defaults (50, 30, 4096; alternate layers windowed, the first one
included). Phi-3's sliding window is applied to every layer as transformers does (current llama.cpp
leaves it off).
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from polygrad.filemap import drop_pages

from polygrad_hf.config import MAX_SIZE, DecoderConfig, check_decoder, number_field, size_field, token_ids
from polygrad_hf.errors import CheckpointError, UnsupportedModelError, need_package
from polygrad_hf.gguf_format import GGUFArray, GGUFFile, TensorInfo
from polygrad_hf.quant import KEPT, check_blocks, q8_k_floats
from polygrad_hf.weights import Blocks, Checkpoint, Lazy

TYPES = ("F32", "F16", "BF16", *KEPT)
ARCHS = ("llama", "qwen2", "gpt2", "phi3", "gemma", "gemma2")
ACTIVATION = {"gpt2": "gelu_new", "gemma": "gelu_pytorch_tanh", "gemma2": "gelu_pytorch_tanh"}  # others: silu
GEMMA2_DEFAULTS = {"attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0, "attention.sliding_window": 4096}
GEMMA2_27B_LAYERS = 46  # llama.cpp's test for the one Gemma 2 whose attention scale is not 1 / sqrt(head_dim)

LLAMA_NAMES = {"attn_norm.weight": "input_layernorm.weight", "ffn_norm.weight": "post_attention_layernorm.weight",
               "attn_q.weight": "self_attn.q_proj.weight", "attn_k.weight": "self_attn.k_proj.weight",
               "attn_v.weight": "self_attn.v_proj.weight", "attn_output.weight": "self_attn.o_proj.weight",
               "attn_q.bias": "self_attn.q_proj.bias", "attn_k.bias": "self_attn.k_proj.bias",
               "attn_v.bias": "self_attn.v_proj.bias", "ffn_gate.weight": "mlp.gate_proj.weight",
               "ffn_up.weight": "mlp.up_proj.weight", "ffn_down.weight": "mlp.down_proj.weight"}
GPT2_NAMES = {"attn_norm.weight": "ln_1.weight", "attn_norm.bias": "ln_1.bias", "ffn_norm.weight": "ln_2.weight",
              "ffn_norm.bias": "ln_2.bias", "attn_qkv.weight": "attn.c_attn.weight",
              "attn_qkv.bias": "attn.c_attn.bias", "attn_output.weight": "attn.c_proj.weight",
              "attn_output.bias": "attn.c_proj.bias", "ffn_up.weight": "mlp.c_fc.weight",
              "ffn_up.bias": "mlp.c_fc.bias", "ffn_down.weight": "mlp.c_proj.weight",
              "ffn_down.bias": "mlp.c_proj.bias"}
PHI3_NAMES = {**LLAMA_NAMES, "attn_qkv.weight": "self_attn.qkv_proj.weight", "ffn_up.weight": "mlp.gate_up_proj.weight"}
GEMMA2_NAMES = {**LLAMA_NAMES, "post_attention_norm.weight": "post_attention_layernorm.weight",
                "ffn_norm.weight": "pre_feedforward_layernorm.weight",
                "post_ffw_norm.weight": "post_feedforward_layernorm.weight"}
LAYER_NAMES = {"gpt2": GPT2_NAMES, "phi3": PHI3_NAMES, "gemma2": GEMMA2_NAMES}  # others: LLAMA_NAMES
GPT2_TRANSPOSED = {"attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight"}


def _hf_name(arch: str, name: str) -> str | None:
    """The Hugging Face name of a GGUF tensor, or None for one the model does not use."""
    top = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
           "output.weight": "lm_head.weight"}
    if arch == "gpt2":
        top = {"token_embd.weight": "transformer.wte.weight", "position_embd.weight": "transformer.wpe.weight",
               "output_norm.weight": "transformer.ln_f.weight", "output_norm.bias": "transformer.ln_f.bias",
               "output.weight": "lm_head.weight"}
    if name in top:
        return top[name]
    parts = name.split(".", 2)
    if len(parts) == 3 and parts[0] == "blk" and parts[1].isdigit():
        table, prefix = LAYER_NAMES.get(arch, LLAMA_NAMES), "transformer.h." if arch == "gpt2" else "model.layers."
        inner = table.get(parts[2])
        return None if inner is None else f"{prefix}{parts[1]}.{inner}"
    return None


def _unpermute(w: np.ndarray, heads: int) -> np.ndarray:
    """Undo llama.cpp's q/k row order (pairs interleaved per head) back to Hugging Face's halves. The
    shape was checked first (Checkpoint.take): rows = heads x an even head_dim (config.check_decoder)."""
    rows = w.shape[0]
    return w.reshape(heads, rows // heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _field(f: GGUFFile, key: str, path: str, default: Any = KeyError) -> Any:
    """A metadata value; an array is decoded here (only the keys the config asks for are)."""
    if key not in f.metadata:
        if default is KeyError:
            raise CheckpointError(f"{path}: GGUF metadata lacks {key!r}")
        return default
    v = f.metadata[key]
    if isinstance(v, GGUFArray):
        v = v.decode()
        return v.tolist() if isinstance(v, np.ndarray) else v
    return v


def _config(reader: GGUFFile, path: str, arch: str, shapes: dict[str, tuple[int, ...]]) -> DecoderConfig:
    keys = ("embedding_length", "attention.head_count", "attention.head_count_kv", "attention.key_length",
            "block_count", "feed_forward_length", "context_length", "attention.layer_norm_epsilon",
            "attention.layer_norm_rms_epsilon", "rope.freq_base", "rope.dimension_count", "attention.scale",
            "attention.sliding_window", "attn_logit_softcapping", "final_logit_softcapping",
            "rope.scaling.attn_factor", "rope.scaling.original_context_length")
    meta = {f"{arch}.{k}": _field(reader, f"{arch}.{k}", path, None) for k in keys}  # None reads as absent

    def size(key: str, default: Any = KeyError) -> int:
        if default is KeyError:
            _field(reader, f"{arch}.{key}", path)  # CheckpointError naming the missing key
        return size_field(meta, path, f"{arch}.{key}", default=default)

    def number(key: str, **kw: Any) -> float:
        if "default" not in kw:
            _field(reader, f"{arch}.{key}", path)
        return number_field(meta, path, f"{arch}.{key}", **kw)
    hidden, heads, layers = size("embedding_length"), size("attention.head_count"), size("block_count")
    emb = shapes.get("token_embd.weight")
    if emb is None:
        raise CheckpointError(f"{path}: tensor 'token_embd.weight' is missing")
    vocab = emb[0]
    if not 0 < vocab <= MAX_SIZE:
        raise CheckpointError(f"{path}: tensor 'token_embd.weight' has {vocab} rows (the vocabulary); expected "
                              f"1..{MAX_SIZE}")
    bos = token_ids(_field(reader, "tokenizer.ggml.bos_token_id", path, None), path, "tokenizer.ggml.bos_token_id")
    eos = _field(reader, "tokenizer.ggml.eos_token_id", path, None)
    common: dict[str, Any] = dict(
        family=arch, vocab_size=vocab, hidden_size=hidden, num_layers=layers, num_heads=heads,
        intermediate_size=size("feed_forward_length"), max_positions=size("context_length"),
        tie_embeddings="output.weight" not in shapes, bos_token_id=bos[0] if bos else None,
        eos_token_id=token_ids(eos, path, "tokenizer.ggml.eos_token_id"))
    if arch == "gpt2":
        return check_decoder(DecoderConfig(num_kv_heads=heads, head_dim=hidden // heads,
                                           norm_eps=number("attention.layer_norm_epsilon"), activation="gelu_new",
                                           attention_bias=True, mlp_bias=True, **common), path)
    if hidden < heads and meta[f"{arch}.attention.key_length"] is None:
        raise CheckpointError(f"{path}: embedding_length {hidden} is smaller than attention.head_count {heads}")
    head_dim = size("attention.key_length", hidden // heads)
    rotary = meta[f"{arch}.rope.dimension_count"]
    if rotary is not None and rotary != head_dim:
        raise UnsupportedModelError(f"{path}: {arch}.rope.dimension_count {rotary!r} rotates part of each "
                                    f"{head_dim}-wide head (partial rotary); only whole heads are supported")
    common.update(num_kv_heads=size("attention.head_count_kv", heads), head_dim=head_dim,
                  norm_eps=number("attention.layer_norm_rms_epsilon"),
                  rope_theta=number("rope.freq_base", default=10000.0, positive=True),
                  activation=ACTIVATION.get(arch, "silu"), attention_bias="blk.0.attn_q.bias" in shapes)
    if arch == "phi3":
        window = meta[f"{arch}.attention.sliding_window"]
        if window:  # 0: none (the converter's mark for Phi-4)
            common.update(sliding_window=size("attention.sliding_window"), sliding_layers=tuple(range(layers)))
        common["rope_scaling"] = _longrope(reader, path, arch, meta, shapes)
    if arch == "gemma2":
        dim = hidden // heads if layers == GEMMA2_27B_LAYERS else head_dim
        d = GEMMA2_DEFAULTS
        common.update(attn_scale=number("attention.scale", default=dim ** -0.5, positive=True),
                      attn_softcap=number("attn_logit_softcapping", default=d["attn_logit_softcapping"],
                                          positive=True),
                      final_softcap=number("final_logit_softcapping", default=d["final_logit_softcapping"],
                                           positive=True),
                      sliding_window=size("attention.sliding_window", d["attention.sliding_window"]),
                      sliding_layers=tuple(range(0, layers, 2)))
    return check_decoder(DecoderConfig(**common), path)


def _longrope(reader: GGUFFile, path: str, arch: str, meta: dict[str, Any],
              shapes: dict[str, tuple[int, ...]]) -> dict[str, Any] | None:
    """Phi-3's LongRoPE from its rope_factors_short/long tensors and rope.scaling keys, or None without them."""
    names = ("rope_factors_short.weight", "rope_factors_long.weight")
    if not any(n in shapes for n in names):
        return None
    if not all(n in shapes for n in names):
        raise CheckpointError(f"{path}: LongRoPE needs both {list(names)}; the file holds one")
    short, long = (_dequantize(reader, reader.tensors[n], path, n).reshape(-1) for n in names)
    original = size_field(meta, path, f"{arch}.rope.scaling.original_context_length")
    return {"rope_type": "longrope", "short_factor": tuple(float(v) for v in short),
            "long_factor": tuple(float(v) for v in long), "original_max_position_embeddings": original,
            "attention_factor": number_field(meta, path, f"{arch}.rope.scaling.attn_factor", default=1.0,
                                             positive=True)}


def open_gguf(path: str) -> Checkpoint:
    """The Checkpoint of a GGUF file: header, metadata and tensor infos parsed and checked
    (gguf_format.GGUFFile), tensor data left in the file's memory map until a weight is loaded."""
    f = GGUFFile(path)
    arch = _field(f, "general.architecture", path)
    if arch not in ARCHS:
        raise UnsupportedModelError(f"{path}: GGUF architecture {arch!r} is not supported; polygrad-hf loads "
                                    f"{list(ARCHS)}")
    tensors = f.tensors
    shapes = {name: t.shape for name, t in tensors.items()}
    cfg = _config(f, path, arch, shapes)
    arrays: dict[str, tuple[Any, str]] = {}
    for name, t in tensors.items():
        kind = t.type.name
        hf = _hf_name(arch, name)
        if hf is None:
            continue
        if kind not in TYPES:
            raise UnsupportedModelError(f"{path}: tensor {name!r} is {kind}; polygrad-hf reads {list(TYPES)}")
        arrays[hf] = (_loader(f, t, path, name, hf, cfg), path)
    extras = {}
    if "rope_freqs.weight" in tensors:
        extras["rope_freqs"] = _dequantize(f, tensors["rope_freqs.weight"], path, "rope_freqs.weight").reshape(-1)
    return Checkpoint(cfg, path, arrays, extras=extras)


def _dequantize(f: GGUFFile, t: TensorInfo, path: str, name: str) -> np.ndarray:
    """float32 values of a tensor in its (rows, cols) shape: F32 as a view of the file, F16 and BF16
    widened here, Q8_K by quant.q8_k_floats, the other block formats by the gguf package's decoders."""
    data, kind = f.data(t), t.type.name
    if kind == "F32":
        return data
    if kind == "F16":
        arr = data.astype(np.float32)
    elif kind == "BF16":
        arr = (data.astype(np.uint32) << 16).view(np.float32)
    else:
        gguf = None if kind == "Q8_K" else need_package("gguf", "gguf", f"dequantizing {kind} GGUF tensors to float32")
        try:
            if gguf is None:
                arr = q8_k_floats(data)
            else:
                arr = gguf.quants.dequantize(data, gguf.GGMLQuantizationType(t.type_id))
        except Exception as e:  # noqa: BLE001
            raise CheckpointError(f"{path}: tensor {name!r} ({kind}) cannot be decoded: {e}") from None
    drop_pages(data)  # the file's pages: read once, into the float32 values
    if arr.size != math.prod(t.shape):
        raise CheckpointError(f"{path}: tensor {name!r} holds {arr.size} values for shape {list(t.shape)}")
    return np.asarray(arr, dtype=np.float32).reshape(t.shape)


def _loader(f: GGUFFile, t: TensorInfo, path: str, name: str, hf: str, cfg: DecoderConfig) -> Lazy:
    shape = t.shape
    transpose = cfg.family == "gpt2" and hf.split(".", 3)[-1] in GPT2_TRANSPOSED

    def load() -> np.ndarray:
        read = _dequantize(f, t, path, name)
        arr = read
        if cfg.family == "llama" and hf.endswith(("q_proj.weight", "q_proj.bias")):
            arr = _unpermute(arr, cfg.num_heads)
        elif cfg.family == "llama" and hf.endswith(("k_proj.weight", "k_proj.bias")):
            arr = _unpermute(arr, cfg.num_kv_heads)
        elif transpose:
            arr = np.ascontiguousarray(arr.T)
        if arr is not read:
            drop_pages(read)  # an F32 tensor's pages of the file, reordered into a copy
        return arr
    blocks = None
    if t.type.name in KEPT and len(shape) == 2:
        kind = t.type.name
        rows, cols = shape

        def load_blocks() -> np.ndarray:
            # stored layout kept (GPT-2's Conv1D weights stay (out, in): the decoder computes x @ W.T);
            # llama.cpp's q/k row order is undone on whole rows of blocks
            arr = check_blocks(f.data(t), kind, (rows, cols), f"{path}: tensor {name!r}")
            if cfg.family == "llama" and hf.endswith("q_proj.weight"):
                arr = _unpermute(arr, cfg.num_heads)
            elif cfg.family == "llama" and hf.endswith("k_proj.weight"):
                arr = _unpermute(arr, cfg.num_kv_heads)
            return np.ascontiguousarray(arr)
        blocks = Blocks(kind, (rows, cols), load_blocks)
    return Lazy(shape[::-1] if transpose else shape, load, blocks)
