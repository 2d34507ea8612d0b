"""Read a GGUF file (llama.cpp's format) as a Checkpoint in Hugging Face names and layouts.

Stage: checkpoint reading. Input: a .gguf path. Output: a checkpoint.Checkpoint whose config comes
from the GGUF metadata (`<arch>.embedding_length`, `<arch>.block_count`, ...) and whose tensors are
renamed (`blk.0.attn_q.weight` -> `model.layers.0.self_attn.q_proj.weight`) and laid out as the
Hugging Face checkpoint would hold them: llama.cpp's reordering of Llama's q/k rows is undone, GPT-2's
transposed Conv1D weights are transposed back, and a `rope_freqs` tensor (Llama 3 rope scaling) becomes
frequency divisors.

The file is checked before anything is read from it: every tensor's data inside the data section, on
the file's alignment and overlapping no other tensor (`_check_layout`), every metadata value that drives
a shape an integer in range and the sizes consistent (`config.size_field`, `config.check_decoder`); a
problem is a CheckpointError naming the file and the tensor or key.

Tensor types: F32, F16, BF16 and llama.cpp's block formats of polygrad/definitions/quant_formats.py
(Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K, Q8_K). A block-format matrix is offered both ways
(weights.Lazy): as its uint8 blocks in the stored (rows, cols) layout (`Lazy.blocks`, kept quantized on
the device by load_hf and dequantized by the kernels that read it, quant.py), and dequantized to float32
by the `gguf` package (`Lazy.load`, load_hf's dtype="float32" path; Q8_K, which the gguf package does not
decode, by quant.q8_k_floats). Architectures: llama, qwen2, gpt2.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from polygrad_hf.config import MAX_SIZE, DecoderConfig, check_decoder, number_field, size_field, token_ids
from polygrad_hf.errors import CheckpointError, UnsupportedModelError, need_package
from polygrad_hf.quant import KEPT, check_blocks, q8_k_floats
from polygrad_hf.weights import Blocks, Checkpoint, Lazy

TYPES = ("F32", "F16", "BF16", *KEPT)
ARCHS = ("llama", "qwen2", "gpt2")

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
        table, prefix = (GPT2_NAMES, "transformer.h.") if arch == "gpt2" else (LLAMA_NAMES, "model.layers.")
        inner = table.get(parts[2])
        return None if inner is None else f"{prefix}{parts[1]}.{inner}"
    return None


def _unpermute(w: np.ndarray, heads: int) -> np.ndarray:
    """Undo llama.cpp's q/k row order (pairs interleaved per head) back to Hugging Face's halves. The
    shape was checked first (Checkpoint.take): rows = heads x an even head_dim (config.check_decoder)."""
    rows = w.shape[0]
    return w.reshape(heads, rows // heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _field(reader: Any, key: str, path: str, default: Any = KeyError) -> Any:
    f = reader.fields.get(key)
    if f is None:
        if default is KeyError:
            raise CheckpointError(f"{path}: GGUF metadata lacks {key!r}")
        return default
    v = f.contents()
    return v


def _config(reader: Any, path: str, arch: str, shapes: dict[str, tuple[int, ...]]) -> DecoderConfig:
    keys = ("embedding_length", "attention.head_count", "attention.head_count_kv", "attention.key_length",
            "block_count", "feed_forward_length", "context_length", "attention.layer_norm_epsilon",
            "attention.layer_norm_rms_epsilon", "rope.freq_base")
    meta = {f"{arch}.{k}": _field(reader, f"{arch}.{k}", path, None) for k in keys}  # None reads as absent

    def size(key: str, default: Any = KeyError) -> int:
        if default is KeyError:
            _field(reader, f"{arch}.{key}", path)  # CheckpointError naming the missing key
        return size_field(meta, path, f"{arch}.{key}", default=default)

    def number(key: str, **kw: Any) -> float:
        if "default" not in kw:
            _field(reader, f"{arch}.{key}", path)
        return number_field(meta, path, f"{arch}.{key}", **kw)
    hidden, heads = size("embedding_length"), size("attention.head_count")
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
        family=arch, vocab_size=vocab, hidden_size=hidden, num_layers=size("block_count"), num_heads=heads,
        intermediate_size=size("feed_forward_length"), max_positions=size("context_length"),
        tie_embeddings="output.weight" not in shapes, bos_token_id=bos[0] if bos else None,
        eos_token_id=token_ids(eos, path, "tokenizer.ggml.eos_token_id"))
    if arch == "gpt2":
        return check_decoder(DecoderConfig(num_kv_heads=heads, head_dim=hidden // heads,
                                           norm_eps=number("attention.layer_norm_epsilon"), activation="gelu_new",
                                           attention_bias=True, mlp_bias=True, **common), path)
    if hidden < heads and meta[f"{arch}.attention.key_length"] is None:
        raise CheckpointError(f"{path}: embedding_length {hidden} is smaller than attention.head_count {heads}")
    return check_decoder(DecoderConfig(
        num_kv_heads=size("attention.head_count_kv", heads), head_dim=size("attention.key_length", hidden // heads),
        norm_eps=number("attention.layer_norm_rms_epsilon"), rope_theta=number("rope.freq_base", default=10000.0,
                                                                                positive=True),
        activation="silu", attention_bias="blk.0.attn_q.bias" in shapes, **common), path)


def _check_layout(gguf: Any, reader: Any, path: str) -> None:
    """Every tensor's data lies inside the data section, starts on the file's alignment and overlaps no
    other tensor's. The gguf package reads whatever the offsets say (it checks only that the bytes exist
    in the file; an offset near 2**64 wraps around to bytes before the data section)."""
    size = len(reader.data) - reader.data_offset
    spans = []
    for t in reader.tensors:
        # the tensor-info record: name length, name, dimension count, dimensions, type, offset
        dims, offset = [int(d) for d in t.field.parts[3]], int(t.field.parts[5][0])
        block, block_bytes = gguf.GGML_QUANT_SIZES[t.tensor_type]
        nbytes = math.prod(dims) // block * block_bytes  # the reader has checked the rows are whole blocks
        where = f"{path}: tensor {t.name!r}"
        if offset + nbytes > size:
            raise CheckpointError(f"{where} needs bytes {offset}..{offset + nbytes} of the data section, which holds "
                                  f"{size}; the file is truncated or corrupt")
        if offset % reader.alignment:
            raise CheckpointError(f"{where} starts at data offset {offset}, not a multiple of the file's alignment "
                                  f"{reader.alignment}; the file is corrupt")
        if nbytes:
            spans.append((offset, offset + nbytes, t.name))
    spans.sort()
    for (_, end, first), (begin, _, second) in zip(spans, spans[1:]):
        if begin < end:
            raise CheckpointError(f"{path}: tensors {first!r} and {second!r} overlap in the data; the file is corrupt")


def _check_whole_blocks(gguf: Any, fields: list[Any], path: str) -> None:
    """CheckpointError naming the tensor whose rows are not whole blocks of its type (the reader would
    raise a ValueError that names no tensor). Fields as in _check_layout: parts[1] name, [3] dims, [4] type."""
    for field in fields:
        name = bytes(field.parts[1]).decode("utf-8", "replace")
        dims, kind = [int(d) for d in field.parts[3]], int(field.parts[4][0])
        try:
            qtype = gguf.GGMLQuantizationType(kind)
        except ValueError:
            continue  # an unknown type: the reader's own error
        block = gguf.GGML_QUANT_SIZES[qtype][0]
        if dims and dims[0] % block:
            raise CheckpointError(f"{path}: tensor {name!r} is {qtype.name} with rows of {dims[0]} values, not a "
                                  f"multiple of its {block}-value block; llama.cpp writes whole blocks, so the "
                                  "file is corrupt")


def _reader(gguf: Any, path: str) -> Any:
    class Reader(gguf.GGUFReader):  # type: ignore[name-defined,misc]
        def _build_tensors(self, start_offs: int, fields: list[Any]) -> None:
            _check_whole_blocks(gguf, fields, path)
            super()._build_tensors(start_offs, fields)
    return Reader(path)


def open_gguf(path: str) -> Checkpoint:
    gguf = need_package("gguf", "gguf", "loading GGUF files")
    try:
        with np.errstate(over="ignore"):  # the reader adds offsets in uint64: _check_layout reports a wrap
            reader = _reader(gguf, path)
    except CheckpointError:
        raise
    except Exception as e:  # noqa: BLE001 (the reader raises ValueError, struct.error, IndexError...)
        raise CheckpointError(f"{path}: not a readable GGUF file ({type(e).__name__}: {e})") from None
    _check_layout(gguf, reader, path)
    arch = _field(reader, "general.architecture", path)
    if arch not in ARCHS:
        raise UnsupportedModelError(f"{path}: GGUF architecture {arch!r} is not supported; polygrad-hf loads "
                                    f"{list(ARCHS)}")
    tensors = {t.name: t for t in reader.tensors}
    shapes = {name: tuple(int(d) for d in reversed(list(t.shape))) for name, t in tensors.items()}
    cfg = _config(reader, path, arch, shapes)
    arrays: dict[str, tuple[Any, str]] = {}
    for name, t in tensors.items():
        kind = t.tensor_type.name
        hf = _hf_name(arch, name)
        if hf is None:
            continue
        if kind not in TYPES:
            raise UnsupportedModelError(f"{path}: tensor {name!r} is {kind}; polygrad-hf reads {list(TYPES)}")
        arrays[hf] = (_loader(gguf, t, path, name, hf, cfg), path)
    extras = {}
    if "rope_freqs.weight" in tensors:
        extras["rope_freqs"] = _dequantize(gguf, tensors["rope_freqs.weight"], path, "rope_freqs.weight").reshape(-1)
    return Checkpoint(cfg, path, arrays, extras=extras)


def _dequantize(gguf: Any, t: Any, path: str, name: str) -> np.ndarray:
    try:
        if t.tensor_type.name == "Q8_K":
            arr = q8_k_floats(np.asarray(t.data))
        else:
            arr = gguf.quants.dequantize(t.data, t.tensor_type)
    except Exception as e:  # noqa: BLE001
        raise CheckpointError(f"{path}: tensor {name!r} ({t.tensor_type.name}) cannot be decoded: {e}") from None
    shape = tuple(int(d) for d in reversed(list(t.shape)))
    if arr.size != int(np.prod(shape)):
        raise CheckpointError(f"{path}: tensor {name!r} holds {arr.size} values for shape {list(shape)}")
    return np.asarray(arr, dtype=np.float32).reshape(shape)


def _loader(gguf: Any, t: Any, path: str, name: str, hf: str, cfg: DecoderConfig) -> Lazy:
    shape = tuple(int(d) for d in reversed(list(t.shape)))
    transpose = cfg.family == "gpt2" and hf.split(".", 3)[-1] in GPT2_TRANSPOSED

    def load() -> np.ndarray:
        arr = _dequantize(gguf, t, path, name)
        if cfg.family == "llama" and hf.endswith(("q_proj.weight", "q_proj.bias")):
            arr = _unpermute(arr, cfg.num_heads)
        elif cfg.family == "llama" and hf.endswith(("k_proj.weight", "k_proj.bias")):
            arr = _unpermute(arr, cfg.num_kv_heads)
        elif transpose:
            arr = np.ascontiguousarray(arr.T)
        return arr
    blocks = None
    if t.tensor_type.name in KEPT and len(shape) == 2:
        kind = t.tensor_type.name
        rows, cols = shape

        def load_blocks() -> np.ndarray:
            # stored layout kept (GPT-2's Conv1D weights stay (out, in): the decoder computes x @ W.T);
            # llama.cpp's q/k row order is undone on whole rows of blocks
            arr = check_blocks(np.asarray(t.data), kind, (rows, cols), f"{path}: tensor {name!r}")
            if cfg.family == "llama" and hf.endswith("q_proj.weight"):
                arr = _unpermute(arr, cfg.num_heads)
            elif cfg.family == "llama" and hf.endswith("k_proj.weight"):
                arr = _unpermute(arr, cfg.num_kv_heads)
            return np.ascontiguousarray(arr)
        blocks = Blocks(kind, (rows, cols), load_blocks)
    return Lazy(shape[::-1] if transpose else shape, load, blocks)
