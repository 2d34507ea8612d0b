"""One description of a decoder-only transformer, read from a Hugging Face config.json or GGUF metadata.

Stage: checkpoint reading. Input: the parsed config.json (or the GGUF key/value metadata, see
gguf_file.py). Output: a frozen `DecoderConfig` that decoder.py builds the graph from and that
checkpoint.py checks tensor shapes against. GPT-2 ("gpt2"), Llama ("llama") and Qwen2 ("qwen2") are
supported; anything else raises UnsupportedModelError naming the file and the model_type.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np

from polygrad_hf.errors import CheckpointError, UnsupportedModelError

FAMILIES = ("gpt2", "llama", "qwen2")
ROPE_TYPES = ("default", "linear", "llama3")
ACTIVATIONS = {"gpt2": ("gelu_new", "gelu_pytorch_tanh", "gelu"), "llama": ("silu",), "qwen2": ("silu",)}


@dataclass(frozen=True)
class DecoderConfig:
    """What the graph needs: sizes, norms, position encoding, biases, tying and special tokens."""

    family: str  # "gpt2" | "llama" | "qwen2"
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    max_positions: int
    norm_eps: float
    activation: str = "silu"
    rope_theta: float = 10000.0
    rope_scaling: Mapping[str, Any] | None = None  # {"rope_type": "llama3" | "linear", ...}
    tie_embeddings: bool = False
    attention_bias: bool = False  # biases on q/k/v (Qwen2: True)
    mlp_bias: bool = False
    bos_token_id: int | None = None
    eos_token_id: tuple[int, ...] = field(default_factory=tuple)

    @property
    def uses_rope(self) -> bool:
        return self.family != "gpt2"

    def inv_freq(self, rope_freq_divisors: np.ndarray | None = None) -> np.ndarray:
        """The rotary frequencies (head_dim / 2 of them), with the configured scaling applied.

        `rope_freq_divisors` (a GGUF file's rope_freqs tensor) divides them instead of a rope_scaling entry.
        """
        d = self.head_dim
        inv = 1.0 / (self.rope_theta ** (np.arange(0, d, 2, dtype=np.float64) / d))
        scaling = dict(self.rope_scaling or {})
        kind = scaling.get("rope_type", scaling.get("type", "default"))
        if rope_freq_divisors is not None:
            return inv / rope_freq_divisors.astype(np.float64)
        if kind == "linear":
            return inv / float(scaling["factor"])
        if kind == "llama3":
            return _llama3_inv_freq(inv, scaling)
        return inv


def _llama3_inv_freq(inv: np.ndarray, s: Mapping[str, Any]) -> np.ndarray:
    """Llama 3.1's frequency-dependent scaling: long wavelengths slowed by `factor`, short ones kept,
    a smooth blend between (the formula of Meta's reference code and transformers)."""
    factor, low, high = float(s["factor"]), float(s["low_freq_factor"]), float(s["high_freq_factor"])
    old = float(s["original_max_position_embeddings"])
    wavelen = 2 * math.pi / inv
    scaled = np.where(wavelen > old / low, inv / factor, inv)
    smooth = (old / wavelen - low) / (high - low)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= old / high) & (wavelen <= old / low)
    return np.where(medium, blended, scaled)


def _get(cfg: Mapping[str, Any], where: str, *names: str, default: Any = KeyError) -> Any:
    for n in names:
        if cfg.get(n) is not None:
            return cfg[n]
    if default is KeyError:
        raise CheckpointError(f"{where}: config lacks {' / '.join(repr(n) for n in names)}")
    return default


def _int(cfg: Mapping[str, Any], where: str, *names: str, default: Any = KeyError) -> int:
    v = _get(cfg, where, *names, default=default)
    if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
        raise CheckpointError(f"{where}: config {names[0]!r} must be a positive integer, got {v!r}")
    return v


def _eos(v: Any) -> tuple[int, ...]:
    if v is None:
        return ()
    return tuple(int(x) for x in v) if isinstance(v, (list, tuple)) else (int(v),)


def from_hf_config(cfg: Mapping[str, Any], where: str = "config.json") -> DecoderConfig:
    """A DecoderConfig from a Hugging Face config.json dict; `where` names the file in errors."""
    if not isinstance(cfg, Mapping):
        raise CheckpointError(f"{where}: expected a JSON object")
    family = cfg.get("model_type")
    if family not in FAMILIES:
        arch = cfg.get("architectures")
        raise UnsupportedModelError(f"{where}: model_type {family!r} (architectures {arch}) is not supported; "
                                    f"polygrad-hf loads {list(FAMILIES)}")
    if family == "gpt2":
        hidden = _int(cfg, where, "n_embd", "hidden_size")
        heads = _int(cfg, where, "n_head", "num_attention_heads")
        act = _get(cfg, where, "activation_function", default="gelu_new")
        if hidden % heads:
            raise CheckpointError(f"{where}: n_embd {hidden} is not a multiple of n_head {heads}")
        common: dict[str, Any] = dict(
            vocab_size=_int(cfg, where, "vocab_size"), hidden_size=hidden, num_layers=_int(cfg, where, "n_layer"),
            num_heads=heads, num_kv_heads=heads, head_dim=hidden // heads,
            intermediate_size=_int(cfg, where, "n_inner", default=4 * hidden),
            max_positions=_int(cfg, where, "n_positions", "n_ctx"),
            norm_eps=float(_get(cfg, where, "layer_norm_epsilon", default=1e-5)), activation=act,
            tie_embeddings=bool(cfg.get("tie_word_embeddings", True)), attention_bias=True, mlp_bias=True)
        for flag in ("scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn"):
            if cfg.get(flag):
                raise UnsupportedModelError(f"{where}: GPT-2 option {flag}=true is not supported")
        if cfg.get("scale_attn_weights") is False:
            raise UnsupportedModelError(f"{where}: GPT-2 option scale_attn_weights=false is not supported")
    else:
        hidden = _int(cfg, where, "hidden_size")
        heads = _int(cfg, where, "num_attention_heads")
        kv = _int(cfg, where, "num_key_value_heads", default=heads)
        head_dim = _int(cfg, where, "head_dim", default=hidden // heads)
        if heads % kv:
            raise CheckpointError(f"{where}: num_attention_heads {heads} is not a multiple of num_key_value_heads {kv}")
        rope = dict(cfg.get("rope_parameters") or {})  # transformers 5 folds rope_theta into rope_parameters
        scaling = cfg.get("rope_scaling") or ({k: v for k, v in rope.items() if k != "rope_theta"} if rope else None)
        kind = (scaling or {}).get("rope_type", (scaling or {}).get("type", "default"))
        if kind not in ROPE_TYPES:
            raise UnsupportedModelError(f"{where}: rope scaling {kind!r} is not supported "
                                        f"(supported: {list(ROPE_TYPES)})")
        if family == "qwen2" and cfg.get("use_sliding_window"):
            raise UnsupportedModelError(f"{where}: Qwen2 sliding-window attention is not supported")
        common = dict(
            vocab_size=_int(cfg, where, "vocab_size"), hidden_size=hidden,
            num_layers=_int(cfg, where, "num_hidden_layers"), num_heads=heads, num_kv_heads=kv, head_dim=head_dim,
            intermediate_size=_int(cfg, where, "intermediate_size"),
            max_positions=_int(cfg, where, "max_position_embeddings", default=2048),
            norm_eps=float(_get(cfg, where, "rms_norm_eps", default=1e-6)),
            activation=_get(cfg, where, "hidden_act", default="silu"),
            rope_theta=float(_get(cfg, where, "rope_theta", default=rope.get("rope_theta", 10000.0))),
            rope_scaling=scaling if kind != "default" else None,
            tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            attention_bias=bool(cfg.get("attention_bias", family == "qwen2")),
            mlp_bias=bool(cfg.get("mlp_bias", False)))
    if common["activation"] not in ACTIVATIONS[family]:
        raise UnsupportedModelError(f"{where}: activation {common['activation']!r} is not supported for {family} "
                                    f"(supported: {list(ACTIVATIONS[family])})")
    bos = cfg.get("bos_token_id")
    return DecoderConfig(family=family, bos_token_id=bos if isinstance(bos, int) else None,
                         eos_token_id=_eos(cfg.get("eos_token_id")), **common)
