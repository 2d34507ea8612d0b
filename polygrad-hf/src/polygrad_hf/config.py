"""One description of a decoder-only transformer, read from a Hugging Face config.json or GGUF metadata.

Stage: checkpoint reading. Input: the parsed config.json (or the GGUF key/value metadata, see
gguf_file.py). Output: a frozen `DecoderConfig` that decoder.py builds the graph from and that
checkpoint.py checks tensor shapes against. GPT-2 ("gpt2"), Llama ("llama"), Qwen2 ("qwen2"), Phi-3
("phi3"), Gemma ("gemma") and Gemma 2 ("gemma2") are supported; anything else, and any setting of theirs
the decoder does not implement (a rope type, partial rotary dimensions, bidirectional attention), raises
UnsupportedModelError naming the file and the setting.

Every value that drives a shape is checked as it is read (`size_field`: an int in 1..2**31-1;
`number_field`: a finite epsilon or rope base) and the sizes against each other (`check_decoder`: heads
divisible by key/value heads, an even head_dim for rope, complete rope scaling), so a corrupt config is
a CheckpointError naming the key, never a ZeroDivisionError, a KeyError or NaN logits.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np

from polygrad_hf.errors import CheckpointError, UnsupportedModelError

FAMILIES = ("gpt2", "llama", "qwen2", "phi3", "gemma", "gemma2")
ROPE_TYPES = ("default", "linear", "llama3")
ROPE_TYPES_PHI3 = ("default", "longrope")  # what transformers' Phi3Config accepts
GELUS = ("gelu_pytorch_tanh", "gelu_new", "gelu")
ACTIVATIONS = {"gpt2": GELUS, "llama": ("silu",), "qwen2": ("silu",), "phi3": ("silu",), "gemma": GELUS,
               "gemma2": GELUS}
LLAMA3_KEYS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
GEMMA = ("gemma", "gemma2")
LAYER_TYPES = ("full_attention", "sliding_attention")
# every size indexes int32 positions in the kernels; a larger one only comes from a corrupt config
MAX_SIZE = 2**31 - 1


@dataclass(frozen=True)
class DecoderConfig:
    """What the graph needs: sizes, norms, position encoding, biases, tying and special tokens."""

    family: str  # one of FAMILIES
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
    # Gemma's RMSNorm scales by (1 + weight): Hugging Face files hold the weight (offset 1.0), llama.cpp's
    # converter stores 1 + weight (offset 0.0); the offset is added to every norm weight as it is read
    norm_offset: float = 0.0
    attn_scale: float | None = None  # scores' scale; None: 1 / sqrt(head_dim) (Gemma 2: query_pre_attn_scalar)
    attn_softcap: float | None = None  # Gemma 2: scores -> cap * tanh(scores / cap) before the mask
    final_softcap: float | None = None  # Gemma 2: the same on the logits
    sliding_window: int | None = None  # the layers in sliding_layers see only the last sliding_window positions
    sliding_layers: tuple[int, ...] = ()

    @property
    def uses_rope(self) -> bool:
        return self.family != "gpt2"

    @property
    def embed_scale(self) -> float | None:
        """Gemma multiplies the token embeddings by sqrt(hidden_size) (rounded to float32, as it does)."""
        return float(np.float32(math.sqrt(self.hidden_size))) if self.family in GEMMA else None

    def inv_freq(self, rope_freq_divisors: np.ndarray | None = None, max_seq_len: int | None = None) -> np.ndarray:
        """The rotary frequencies (head_dim / 2 of them), with the configured scaling applied.

        `rope_freq_divisors` (a GGUF file's rope_freqs tensor) divides them instead of a rope_scaling entry.
        LongRoPE (Phi-3) divides them by its long factors when the cache holds more than the original context
        (`max_seq_len` > original_max_position_embeddings), by its short factors otherwise: one table for
        every position, as llama.cpp does. transformers instead switches with each call's sequence length,
        so it agrees with this wherever the bound and the sequence are on the same side of that context.
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
        if kind == "longrope":
            long = max_seq_len is not None and max_seq_len > scaling["original_max_position_embeddings"]
            return inv / np.asarray(scaling["long_factor" if long else "short_factor"], np.float64)
        return inv

    @property
    def rope_attention_factor(self) -> float:
        """LongRoPE's scale of the cos/sin tables (1.0 for every other rope)."""
        return float((self.rope_scaling or {}).get("attention_factor", 1.0))


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


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def size_field(cfg: Mapping[str, Any], where: str, *names: str, default: Any = KeyError) -> int:
    """A size (width, count, length) of the config: an int in 1..MAX_SIZE, or CheckpointError naming the key."""
    v = _get(cfg, where, *names, default=default)
    if not _is_int(v) or not 0 < v <= MAX_SIZE:
        raise CheckpointError(f"{where}: {names[0]!r} must be an integer in 1..{MAX_SIZE}, got {v!r:.60}; the "
                              "config is corrupt")
    return v


def number_field(cfg: Mapping[str, Any], where: str, *names: str, default: Any = KeyError,
                 positive: bool = False) -> float:
    """A finite float setting (an epsilon, a rope base): >= 0, or > 0 when `positive`."""
    v = _get(cfg, where, *names, default=default)
    x = math.nan
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        x = float(v) if abs(v) < 1e300 else math.inf  # float() of a JSON integer of 400 digits overflows
    if not math.isfinite(x) or not (x > 0 if positive else x >= 0):
        raise CheckpointError(f"{where}: {names[0]!r} must be a finite number {'> 0' if positive else '>= 0'}, "
                              f"got {v!r:.60}")
    return x


def token_ids(v: Any, where: str, key: str) -> tuple[int, ...]:
    """An eos_token_id entry (None, one id or a list of ids) as a tuple of non-negative ints."""
    ids = () if v is None else tuple(v) if isinstance(v, (list, tuple)) else (v,)
    if not all(_is_int(x) and x >= 0 for x in ids):
        raise CheckpointError(f"{where}: {key!r} must be a token id or a list of them, got {v!r:.60}")
    return ids


def check_decoder(cfg: DecoderConfig, where: str) -> DecoderConfig:
    """The rules that tie the sizes together (each size alone is checked as it is read); returns cfg."""
    if cfg.num_heads % cfg.num_kv_heads:
        raise CheckpointError(f"{where}: {cfg.num_heads} attention heads are not a multiple of {cfg.num_kv_heads} "
                              "key/value heads")
    if cfg.family == "gpt2" and cfg.hidden_size != cfg.num_heads * cfg.head_dim:
        raise CheckpointError(f"{where}: the width {cfg.hidden_size} is not a multiple of the {cfg.num_heads} "
                              "attention heads")
    if cfg.uses_rope and cfg.head_dim % 2:
        raise CheckpointError(f"{where}: rotary position encoding needs an even head dimension, got "
                              f"{cfg.head_dim}")
    scaling = dict(cfg.rope_scaling or {})
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    keys = {"linear": ("factor",), "llama3": LLAMA3_KEYS}.get(kind, ())
    for key in keys:
        number_field(scaling, f"{where}: rope scaling", key, positive=True)
    if kind == "llama3" and not scaling["high_freq_factor"] > scaling["low_freq_factor"]:
        raise CheckpointError(f"{where}: rope scaling high_freq_factor must exceed low_freq_factor, got "
                              f"{scaling['high_freq_factor']} and {scaling['low_freq_factor']}")
    if kind == "longrope":
        _check_longrope(scaling, cfg.head_dim, where)
    for key in ("attn_scale", "attn_softcap", "final_softcap"):
        if getattr(cfg, key) is not None:
            number_field({key: getattr(cfg, key)}, where, key, positive=True)
    if cfg.sliding_layers and cfg.sliding_window is None:
        raise CheckpointError(f"{where}: sliding-window layers {list(cfg.sliding_layers)[:4]} without a "
                              "sliding_window size")
    return cfg


def _check_longrope(scaling: Mapping[str, Any], head_dim: int, where: str) -> None:
    """LongRoPE's entries: short and long factors (head_dim / 2 positive numbers each), the original context
    length and the attention factor."""
    size_field(scaling, f"{where}: rope scaling", "original_max_position_embeddings")
    number_field(scaling, f"{where}: rope scaling", "attention_factor", positive=True)
    for key in ("short_factor", "long_factor"):
        factors = scaling.get(key)
        if not isinstance(factors, (list, tuple)) or len(factors) != head_dim // 2:
            raise CheckpointError(f"{where}: rope scaling {key!r} must list {head_dim // 2} numbers (head_dim / 2), "
                                  f"got {factors!r:.60}")
        for i, v in enumerate(factors):
            number_field({f"{key}[{i}]": v}, f"{where}: rope scaling", f"{key}[{i}]", positive=True)


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
        hidden = size_field(cfg, where, "n_embd", "hidden_size")
        heads = size_field(cfg, where, "n_head", "num_attention_heads")
        act = _get(cfg, where, "activation_function", default="gelu_new")
        common: dict[str, Any] = dict(
            vocab_size=size_field(cfg, where, "vocab_size"), hidden_size=hidden,
            num_layers=size_field(cfg, where, "n_layer"),
            num_heads=heads, num_kv_heads=heads, head_dim=hidden // heads,
            intermediate_size=size_field(cfg, where, "n_inner", default=4 * hidden),
            max_positions=size_field(cfg, where, "n_positions", "n_ctx"),
            norm_eps=number_field(cfg, where, "layer_norm_epsilon", default=1e-5), activation=act,
            tie_embeddings=bool(cfg.get("tie_word_embeddings", True)), attention_bias=True, mlp_bias=True)
        for flag in ("scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn"):
            if cfg.get(flag):
                raise UnsupportedModelError(f"{where}: GPT-2 option {flag}=true is not supported")
        if cfg.get("scale_attn_weights") is False:
            raise UnsupportedModelError(f"{where}: GPT-2 option scale_attn_weights=false is not supported")
    else:
        common = _rope_family_fields(cfg, family, where)
    if common["activation"] not in ACTIVATIONS[family]:
        raise UnsupportedModelError(f"{where}: activation {common['activation']!r} is not supported for {family} "
                                    f"(supported: {list(ACTIVATIONS[family])})")
    bos = cfg.get("bos_token_id")
    return check_decoder(DecoderConfig(family=family, bos_token_id=bos if isinstance(bos, int) else None,
                                       eos_token_id=token_ids(cfg.get("eos_token_id"), where, "eos_token_id"),
                                       **common), where)


def _rope_family_fields(cfg: Mapping[str, Any], family: str, where: str) -> dict[str, Any]:
    """The DecoderConfig fields of a Llama-like config.json (every family but GPT-2)."""
    hidden = size_field(cfg, where, "hidden_size")
    heads = size_field(cfg, where, "num_attention_heads")
    kv = size_field(cfg, where, "num_key_value_heads", default=heads)
    if cfg.get("head_dim") is None and hidden < heads:
        raise CheckpointError(f"{where}: hidden_size {hidden} is smaller than num_attention_heads {heads}")
    head_dim = size_field(cfg, where, "head_dim", default=hidden // heads)
    layers = size_field(cfg, where, "num_hidden_layers")
    max_positions = size_field(cfg, where, "max_position_embeddings", default=2048)
    rope = dict(cfg.get("rope_parameters") or {})  # transformers 5 folds rope_theta into rope_parameters
    scaling = cfg.get("rope_scaling") or ({k: v for k, v in rope.items() if k != "rope_theta"} if rope else None)
    scaling = dict(scaling) if isinstance(scaling, Mapping) else None
    kind = (scaling or {}).get("rope_type", (scaling or {}).get("type", "default"))
    kind = "longrope" if family == "phi3" and kind == "su" else kind  # Phi-3's first name for it
    supported = ROPE_TYPES_PHI3 if family == "phi3" else ROPE_TYPES
    if kind not in supported:
        raise UnsupportedModelError(f"{where}: rope scaling {kind!r} is not supported for {family} "
                                    f"(supported: {list(supported)})")
    partial = (scaling or {}).get("partial_rotary_factor", cfg.get("partial_rotary_factor", 1.0))
    if partial != 1.0:
        raise UnsupportedModelError(f"{where}: partial_rotary_factor {partial!r} (rotary position encoding on "
                                    "part of each head) is not supported; only 1.0 is")
    if kind == "longrope":
        scaling = _longrope(cfg, scaling or {}, max_positions, where)
    if family == "qwen2" and cfg.get("use_sliding_window"):
        raise UnsupportedModelError(f"{where}: Qwen2 sliding-window attention is not supported")
    if cfg.get("use_bidirectional_attention"):
        raise UnsupportedModelError(f"{where}: use_bidirectional_attention=true is not supported: the decoder is "
                                    "causal")
    act = _get(cfg, where, "hidden_activation", "hidden_act", default="silu") if family in GEMMA else \
        _get(cfg, where, "hidden_act", default="silu")
    if family == "gemma" and act == "gelu":
        act = "gelu_pytorch_tanh"  # transformers reads Gemma's legacy "gelu" as the tanh approximation
    out: dict[str, Any] = dict(
        vocab_size=size_field(cfg, where, "vocab_size"), hidden_size=hidden, num_layers=layers, num_heads=heads,
        num_kv_heads=kv, head_dim=head_dim, intermediate_size=size_field(cfg, where, "intermediate_size"),
        max_positions=max_positions, norm_eps=number_field(cfg, where, "rms_norm_eps", default=1e-6),
        activation=act,
        rope_theta=number_field(cfg, where, "rope_theta", default=rope.get("rope_theta", 10000.0), positive=True),
        rope_scaling=scaling if kind != "default" else None,
        tie_embeddings=bool(cfg.get("tie_word_embeddings", family in GEMMA)),
        attention_bias=bool(cfg.get("attention_bias", family == "qwen2")),
        mlp_bias=bool(cfg.get("mlp_bias", False)), norm_offset=1.0 if family in GEMMA else 0.0)
    window = cfg.get("sliding_window") if family in ("phi3", "gemma2") else None
    if window is not None:
        out["sliding_window"] = size_field(cfg, where, "sliding_window")
        out["sliding_layers"] = tuple(range(layers)) if family == "phi3" else _sliding_layers(cfg, layers, where)
    if family == "gemma2":
        scalar = number_field(cfg, where, "query_pre_attn_scalar", default=256, positive=True)
        out["attn_scale"] = scalar ** -0.5
        for key, field_name in (("attn_logit_softcapping", "attn_softcap"),
                                ("final_logit_softcapping", "final_softcap")):
            if cfg.get(key) is not None:
                out[field_name] = number_field(cfg, where, key, positive=True)
    return out


def _sliding_layers(cfg: Mapping[str, Any], layers: int, where: str) -> tuple[int, ...]:
    """Gemma 2's windowed layers: config.json's layer_types, or (older files) every even layer."""
    types = cfg.get("layer_types")
    if types is None:
        return tuple(range(0, layers, 2))
    if not isinstance(types, list) or len(types) != layers or any(t not in LAYER_TYPES for t in types):
        raise CheckpointError(f"{where}: 'layer_types' must list {layers} entries of {list(LAYER_TYPES)}, got "
                              f"{types!r:.80}")
    return tuple(i for i, t in enumerate(types) if t == "sliding_attention")


def _longrope(cfg: Mapping[str, Any], scaling: Mapping[str, Any], max_positions: int,
              where: str) -> dict[str, Any]:
    """Phi-3's LongRoPE entries, completed as transformers completes them: the original context from the
    scaling or the config, `factor` the ratio of the two contexts unless given, and the cos/sin scale
    sqrt(1 + ln(factor) / ln(original context)) unless given (1 for a factor <= 1)."""
    original = scaling.get("original_max_position_embeddings", cfg.get("original_max_position_embeddings"))
    original = size_field({"original_max_position_embeddings": original}, f"{where}: rope scaling",
                          "original_max_position_embeddings")
    factor = scaling.get("factor")
    factor = max_positions / original if factor is None else \
        number_field(scaling, f"{where}: rope scaling", "factor", positive=True)
    attention = scaling.get("attention_factor")
    if attention is None:
        attention = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
    out = {"rope_type": "longrope", "original_max_position_embeddings": original, "attention_factor": attention}
    for key in ("short_factor", "long_factor"):
        factors = scaling.get(key)
        out[key] = tuple(factors) if isinstance(factors, (list, tuple)) else factors
    return out
