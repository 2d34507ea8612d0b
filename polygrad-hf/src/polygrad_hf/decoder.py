"""The decoder-only transformer (GPT-2, Llama, Qwen2, Phi-3, Gemma, Gemma 2) in Tensor ops, with a KV cache.

Stage: graph construction, captured by loader.py into a Model. Input: a DecoderConfig and the
weights as host arrays in Hugging Face names. Output: a `Decoder` with two callables over the same
weights and caches:

  forward(input_ids[batch, tokens])           -> logits[batch, tokens, vocab]; writes cache[:, :tokens]
  decode(input_ids[batch, 1], pos)            -> logits[batch, 1, vocab];      writes cache[:, pos],
                                                 attends over cache[:, :pos + 1]

`batch`, `tokens` and `pos` are bound Variables when captured, so one set of compiled kernels serves
every prompt length and every position: decoding a token costs one pass over the weights plus the
attention over the cached prefix, never a recompute of the prefix and never a compile.

Layouts (chosen once here): a projection is stored (in, out) and applied as `x @ w`; the token
embedding (vocab, width) doubles as the tied output projection (`x @ wte.T`). A weight kept quantized
(quant.QuantWeight, from a GGUF file) stays in the file's layout, rows of blocks: a projection (out, in)
applied as `x @ W.T`, a table (vocab or positions, width) looked up by rows; its dequantization is part
of the kernel that reads it. The caches are (max_batch, kv_heads, max_seq_len, head_dim) per layer for
keys and for values.

Families past Llama differ in a few places, each a branch on the config: Phi-3 fuses q/k/v into one
projection (qkv_proj) and gate/up into another (gate_up_proj), sliced after the matmul (the other
families' are joined into the same names at load, from any file: _joins; POLY_JOIN_PROJ=0 keeps them
apart); Gemma scales the embeddings by sqrt(width), gates with GELU (tanh form), and its norms scale by
1 + weight (the 1 added to the weights at load, config.norm_offset); Gemma 2 adds norms after attention
and after the MLP, its own attention scale, tanh soft-capping of the attention scores and of the logits,
and a sliding window on alternate layers (a mask table, like the causal one, sliced at the query
positions).
"""
from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np

from polygrad import Tensor, config, dtypes
from polygrad.filemap import drop_pages, root_of
from polygrad.nn.quant import block_format, quantize_rows
from polygrad.nn.quantizers import QUANTIZERS

from polygrad_hf.config import DecoderConfig
from polygrad_hf.errors import CheckpointError, HFError
from polygrad_hf.quant import QuantWeight
from polygrad_hf.weights import Blocks

Weight = Tensor | QuantWeight
QUANTIZE_AT_LOAD = tuple(name.lower() for name in QUANTIZERS)  # load_hf(dtype=...): quantized as they are read
TABLES = ("wte.weight", "wpe.weight", "embed_tokens.weight", "lm_head.weight")  # read by rows, not (in, out)

# a Llama/Qwen2 layer's Hugging Face tensor names by role
LLAMA_LAYER = {"attn_norm": "input_layernorm.weight", "mlp_norm": "post_attention_layernorm.weight",
               "q": "self_attn.q_proj.weight", "k": "self_attn.k_proj.weight", "v": "self_attn.v_proj.weight",
               "o": "self_attn.o_proj.weight", "gate": "mlp.gate_proj.weight", "up": "mlp.up_proj.weight",
               "down": "mlp.down_proj.weight"}
PHI3_FUSED = {"qkv": "self_attn.qkv_proj.weight", "gate_up": "mlp.gate_up_proj.weight"}  # replace q, k, v; gate, up
GEMMA2_NORMS = {"post_attn_norm": "post_attention_layernorm.weight", "mlp_norm": "pre_feedforward_layernorm.weight",
                "post_mlp_norm": "post_feedforward_layernorm.weight"}  # Gemma 2's names for its four norms


def _prefixed(ck: Any, name: str, prefixes: tuple[str, ...]) -> str:
    """The checkpoint's spelling of `name`: with the first prefix it holds ("model.", "transformer.", "")."""
    for p in prefixes:
        if ck.has(p + name):
            return p + name
    return prefixes[0] + name  # missing: take() names the canonical spelling


def expected_weights(cfg: DecoderConfig) -> dict[str, tuple[tuple[int, ...], bool]]:
    """{HF name (canonical prefix): (shape as stored by Hugging Face, transpose to (in, out))}."""
    E, V, F, L = cfg.hidden_size, cfg.vocab_size, cfg.intermediate_size, cfg.num_layers
    out: dict[str, tuple[tuple[int, ...], bool]] = {}
    if cfg.family == "gpt2":
        out.update({"transformer.wte.weight": ((V, E), False),
                    "transformer.wpe.weight": ((cfg.max_positions, E), False),
                    "transformer.ln_f.weight": ((E,), False), "transformer.ln_f.bias": ((E,), False)})
        for i in range(L):
            p = f"transformer.h.{i}."
            out.update({p + "ln_1.weight": ((E,), False), p + "ln_1.bias": ((E,), False),
                        p + "ln_2.weight": ((E,), False), p + "ln_2.bias": ((E,), False),
                        p + "attn.c_attn.weight": ((E, 3 * E), False), p + "attn.c_attn.bias": ((3 * E,), False),
                        p + "attn.c_proj.weight": ((E, E), False), p + "attn.c_proj.bias": ((E,), False),
                        p + "mlp.c_fc.weight": ((E, F), False), p + "mlp.c_fc.bias": ((F,), False),
                        p + "mlp.c_proj.weight": ((F, E), False), p + "mlp.c_proj.bias": ((E,), False)})
        if not cfg.tie_embeddings:
            out["lm_head.weight"] = ((V, E), False)
        return out
    H, KV, D = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    out.update({"model.embed_tokens.weight": ((V, E), False), "model.norm.weight": ((E,), False)})
    if not cfg.tie_embeddings:
        out["lm_head.weight"] = ((V, E), False)
    for i in range(L):
        p = f"model.layers.{i}."
        shapes = {"attn_norm": (E,), "mlp_norm": (E,), "q": (H * D, E), "k": (KV * D, E), "v": (KV * D, E),
                  "o": (E, H * D), "gate": (F, E), "up": (F, E), "down": (E, F), "qkv": ((H + 2 * KV) * D, E),
                  "gate_up": (2 * F, E), "post_attn_norm": (E,), "post_mlp_norm": (E,)}
        names = dict(LLAMA_LAYER)
        if cfg.family == "phi3":
            names = {k: v for k, v in names.items() if k not in ("q", "k", "v", "gate", "up")} | PHI3_FUSED
        if cfg.family == "gemma2":
            names.update(GEMMA2_NORMS)
        for key, name in names.items():
            out[p + name] = (shapes[key], len(shapes[key]) == 2)
        if cfg.attention_bias:
            out.update({p + "self_attn.q_proj.bias": ((H * D,), False), p + "self_attn.k_proj.bias": ((KV * D,), False),
                        p + "self_attn.v_proj.bias": ((KV * D,), False)})
        if cfg.mlp_bias:
            out.update({p + "mlp.gate_proj.bias": ((F,), False), p + "mlp.up_proj.bias": ((F,), False),
                        p + "mlp.down_proj.bias": ((E,), False)})
    return out


def _canonical(name: str) -> str:
    """A tensor name without its model prefix ("transformer.h.0.ln_1.weight" -> "h.0.ln_1.weight")."""
    return name.split(".", 1)[1] if name.startswith(("transformer.", "model.")) else name


def check_layer_count(ck: Any) -> None:
    """CheckpointError when the config names more layers than the checkpoint holds tensors for, before
    anything is read (a config of 10**6 layers over a 2-layer checkpoint fails here, not after listing
    every layer's tensors)."""
    lead = "h." if ck.config.family == "gpt2" else "layers."
    held = set()
    for name in ck.arrays:
        rest = _canonical(name)
        index = rest[len(lead):].split(".", 1)[0] if rest.startswith(lead) else ""
        if index.isascii() and index.isdigit():
            held.add(int(index))
    first_missing = 0
    while first_missing in held:
        first_missing += 1
    if first_missing < ck.config.num_layers:
        raise CheckpointError(f"{ck.source}: the config gives {ck.config.num_layers} layers, but the checkpoint has "
                              f"no tensors for layer {first_missing} ({first_missing} layers present); the config "
                              "and the weights do not match")


def read_weights(ck: Any, convert: Callable[[np.ndarray], Tensor],
                 keep_blocks: Callable[[np.ndarray], Tensor] | None = None,
                 quantize_to: str | None = None) -> dict[str, Weight]:
    """Every weight the config needs, checked against its shape, laid out for the graph and converted to a
    device Tensor by `convert` (one at a time, so host memory holds one converted array at once). Every
    name and shape is checked before the first tensor is read.

    With `keep_blocks`, a matrix the checkpoint holds in a block format (GGUF Q8_0, Q4_K, ...; with
    `quantize_to`, that format only) becomes a QuantWeight over `keep_blocks(its uint8 blocks)` instead, in
    the stored layout (see the module doc). With `quantize_to` ("Q8_0", "Q4_K", ...) every other matrix
    whose rows, in that layout, hold whole blocks is quantized to it as it is read; the rest stay float."""
    check_layer_count(ck)
    prefixes = ("transformer.", "") if ck.config.family == "gpt2" else ("model.", "")
    plan = []
    for name, (shape, transpose) in expected_weights(ck.config).items():
        stored = name if name == "lm_head.weight" else _prefixed(ck, _canonical(name), prefixes)
        ck.expect(stored, shape)
        blocks = ck.blocks(stored) if keep_blocks is not None and len(shape) == 2 else None
        if blocks is not None and quantize_to is not None and blocks.format != quantize_to:
            blocks = None  # another format: dequantized, then quantized to the one asked for
        if blocks is not None:
            _check_block_layout(ck, stored, name, shape, transpose, blocks)
        plan.append((name, stored, shape, transpose, blocks))
    joins = _joins(ck, plan, keep_blocks, quantize_to) if config.get("POLY_JOIN_PROJ") else {}
    parts = {entry[0] for group in joins.values() for entry in group[1] + group[2]}
    out: dict[str, Weight] = {}
    for entry in plan:  # in the plan's order: the largest reads (the embeddings) first, while little is held
        name, stored, shape, transpose, blocks = entry
        if name in joins:
            _read_joined(ck, joins[name], convert, keep_blocks, quantize_to, out)
            continue
        if name in parts:
            continue
        if blocks is not None and keep_blocks is not None:
            out[name] = QuantWeight(keep_blocks(blocks.load()), blocks.format, blocks.shape)
            continue
        arr = ck.take(stored, shape)
        if ck.config.norm_offset and name.endswith("norm.weight"):
            arr = arr + np.float32(ck.config.norm_offset)
        if quantize_to is not None and keep_blocks is not None and len(shape) == 2:
            by_rows = arr if transpose or name.endswith(TABLES) else arr.T  # (out, in) or (rows, width)
            if by_rows.shape[1] % block_format(quantize_to).block == 0:
                blocks_of = quantize_rows(by_rows, quantize_to)
                out[name] = QuantWeight(keep_blocks(blocks_of), quantize_to, tuple(by_rows.shape))
                drop_pages(arr)  # read once, into the blocks
                continue
        out[name] = convert(np.ascontiguousarray(arr.T) if transpose else arr)
        drop_pages(arr)  # the file's pages the copy read in: the model reads the copy, not them
    return out


# projections of one layer that read the same input, joined at load into one (a quantized decode step:
# 2 + 1 fewer launches a layer; float: 1), under the names Phi-3 checkpoints use: {joined name: its parts}
JOINED = {"self_attn.qkv_proj": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
          "mlp.gate_up_proj": ("mlp.gate_proj", "mlp.up_proj")}


def _kept_as(entry: tuple, keep_blocks: Any, quantize_to: str | None) -> tuple[str | None, int]:
    """(block format, row width) a projection's entry of read_weights' plan is kept in: its stored blocks,
    the format it is quantized to at load, or None (float)."""
    _, _, shape, _, blocks = entry
    if blocks is not None and keep_blocks is not None:
        return blocks.format, blocks.shape[1]
    if quantize_to is not None and keep_blocks is not None and shape[1] % block_format(quantize_to).block == 0:
        return quantize_to, shape[1]
    return None, shape[1]


def _joins(ck: Any, plan: list, keep_blocks: Any, quantize_to: str | None) -> dict[str, tuple]:
    """The projections read_weights joins: {the first part's name: (joined name, the parts' plan entries,
    their bias entries)}. A layer's q/k/v (and gate/up) become one weight, `self_attn.qkv_proj`
    (`mlp.gate_up_proj`), whose output features are the parts' one after the other: every family with
    separate projections, whatever the file (safetensors or GGUF, float or blocks, quantized at load or
    not), so the parameter names, the program cache key and a saved bundle do not depend on it; each
    output is the same sum as the part's, so the logits are unchanged. Parts stay apart where they cannot
    be one weight: kept in different block formats (a Q4_K_M file's v in Q6_K) or one in blocks and one
    float, rows of different widths, or biases on some parts and not on the others. GPT-2's c_attn and
    Phi-3's qkv_proj/gate_up_proj already are one."""
    if ck.config.family in ("gpt2", "phi3"):
        return {}
    by_name = {entry[0]: entry for entry in plan}
    joins = {}
    for i in range(ck.config.num_layers):
        p = f"model.layers.{i}."
        for joined, names in JOINED.items():
            entries = [by_name.get(p + part + ".weight") for part in names]
            biases = [by_name.get(p + part + ".bias") for part in names]
            if any(e is None for e in entries) or len({b is None for b in biases}) != 1:
                continue
            if len({_kept_as(e, keep_blocks, quantize_to) for e in entries}) != 1:
                continue
            joins[entries[0][0]] = (p + joined, entries, [b for b in biases if b is not None])
    return joins


def _read_joined(ck: Any, join: tuple, convert: Callable[[np.ndarray], Tensor], keep_blocks: Any,
                 quantize_to: str | None, out: dict[str, Weight]) -> None:
    """One joined projection (see _joins) into `out`, its parts not kept: blocks whose parts lie one after
    another in the file's map are a view of it (no copy); otherwise the parts are read one at a time into
    the joined array (blocks as stored or quantized at load, or float (in, out) columns), which becomes the
    weight: one host copy of the whole, where reading the parts apart made a transposed copy of each."""
    joined, entries, biases = join
    fmt, width = _kept_as(entries[0], keep_blocks, quantize_to)
    total = sum(e[2][0] for e in entries)  # the parts' output features: (out, in) as stored
    if fmt is None:
        arr, at = np.empty((width, total), np.float32), 0
        for _, stored, shape, _, _ in entries:
            part = ck.take(stored, shape)
            arr[:, at:at + shape[0]] = part.T
            at += shape[0]
            drop_pages(part)
        out[joined + ".weight"] = convert(arr)
    else:
        # the stored parts' blocks (views of the map, or a part's reordered copy) when every part is stored
        loaded = [e[4].load() for e in entries] if all(e[4] is not None for e in entries) else None
        rows = _adjacent(loaded) if loaded is not None else None
        if rows is None:
            at = 0
            for k, (_, stored, shape, _, blocks) in enumerate(entries):
                part = loaded[k] if loaded is not None else \
                    blocks.load() if blocks is not None else quantize_rows(ck.take(stored, shape), fmt)
                if at == 0:
                    rows = np.empty((total, *part.shape[1:]), np.uint8)
                rows[at:at + shape[0]] = part
                at += shape[0]
                drop_pages(part)
                if loaded is not None:
                    loaded[k] = None  # a reordered copy is freed once it is in the joined rows
        out[joined + ".weight"] = QuantWeight(keep_blocks(rows), fmt, (total, width))
    if biases:
        out[joined + ".bias"] = convert(np.concatenate([ck.take(b[1], b[2]) for b in biases]))


def _adjacent(parts: list[np.ndarray]) -> np.ndarray | None:
    """The parts' rows as one view, where each part follows the one before in the same memory (a file
    that stores gate and up one after the other: no copy), else None."""
    first = parts[0]
    if not all(p.flags.c_contiguous and p.shape[1:] == first.shape[1:] and root_of(p) is root_of(first) for p in parts):
        return None
    ends = [p.__array_interface__["data"][0] + p.nbytes for p in parts[:-1]]
    if any(end != p.__array_interface__["data"][0] for end, p in zip(ends, parts[1:])):
        return None
    shape = (sum(p.shape[0] for p in parts), *first.shape[1:])
    return np.lib.stride_tricks.as_strided(first, shape=shape, writeable=False)


def _check_block_layout(ck: Any, stored: str, name: str, shape: tuple[int, ...], transpose: bool,
                        blocks: Blocks) -> None:
    """A quantized matrix must have its blocks along the input features (a projection as (out, in)) or
    along the width (a table as (rows, width)), which is how llama.cpp writes them."""
    layout = shape[::-1] if transpose else shape  # the float layout: (in, out) for a projection
    want = tuple(layout) if name.endswith(TABLES) else tuple(layout[::-1])
    if tuple(blocks.shape) != want:
        raise CheckpointError(f"{ck.source}: tensor {stored!r} is stored {blocks.format} as {list(blocks.shape)}, "
                              f"not {list(want)} (blocks along the input features); load it with "
                              "dtype='float32' to dequantize it at load")


def constants(cfg: DecoderConfig, max_seq_len: int, device: str | None,
              rope_freq_divisors: np.ndarray | None = None) -> dict[str, Tensor]:
    """The graph's constant tables, realized on `device`: the causal mask, the sliding-window mask (query
    position by key position: -inf where the key is ahead or window positions or more behind) when the
    window is shorter than the cache, and the rotary cos/sin tables."""
    mask = np.triu(np.full((max_seq_len, max_seq_len), -np.inf, np.float32), 1)
    consts = {"causal_mask": Tensor(mask, device=device, requires_grad=False)}
    if cfg.sliding_layers and cfg.sliding_window is not None and cfg.sliding_window < max_seq_len:
        window = mask + np.tril(np.full((max_seq_len, max_seq_len), -np.inf, np.float32), -cfg.sliding_window)
        consts["sliding_mask"] = Tensor(window, device=device, requires_grad=False)
    if cfg.uses_rope:
        inv = cfg.inv_freq(rope_freq_divisors, max_seq_len)
        angles = np.arange(max_seq_len, dtype=np.float64)[:, None] * inv[None, :]
        scale = cfg.rope_attention_factor
        consts["rope.cos"] = Tensor((np.cos(angles) * scale).astype(np.float32), device=device, requires_grad=False)
        consts["rope.sin"] = Tensor((np.sin(angles) * scale).astype(np.float32), device=device, requires_grad=False)
    for t in consts.values():
        t.realize()
    return consts


def parameters(weights: dict[str, Weight], consts: dict[str, Tensor]) -> dict[str, Tensor]:
    """Decoder.params() of these weights and constants: a quantized weight as its uint8 blocks, and a
    projection whose prompts take 8-bit activations (QuantWeight.int8_prompts) with its scales laid out as
    that route reads them (`NAME.lane_scales`, made once here, not by every prompt; a table's, the tied
    head's included, only in the rarely run forward: laid out there per call instead of kept)."""
    out: dict[str, Tensor] = {}
    for k, w in weights.items():
        out[k] = w.blocks if isinstance(w, QuantWeight) else w
        if isinstance(w, QuantWeight) and not k.endswith(TABLES) and w.int8_prompts():
            out[f"{k}.lane_scales"] = w.keep_lane_scales()
    return {**out, **consts}


class Decoder:
    """The model as an object Model can capture: weights and caches as attributes, forward and decode."""

    def __init__(self, cfg: DecoderConfig, weights: dict[str, Weight], max_batch: int, max_seq_len: int,
                 device: str | None, rope_freq_divisors: np.ndarray | None = None,
                 consts: dict[str, Tensor] | None = None):
        self.cfg, self.w = cfg, weights
        self.max_batch, self.max_seq_len = max_batch, max_seq_len
        shape = (max_batch, cfg.num_kv_heads, max_seq_len, cfg.head_dim)
        # zeros copied in from NumPy (pages the OS zeroes), not a fill kernel: a cold load compiled one (0.3 s)
        self.caches = {f"cache.{kind}.{i}": Tensor(np.zeros(shape, np.float32), device=device)
                       for i in range(cfg.num_layers) for kind in ("k", "v")}
        self.consts = consts if consts is not None else constants(cfg, max_seq_len, device, rope_freq_divisors)

    def params(self) -> dict[str, Tensor]:
        """The Model's parameters: weights (a quantized one as its uint8 blocks) and constants."""
        return parameters(self.w, self.consts)

    # ---- the three entrypoints
    def __call__(self, input_ids: Tensor) -> dict[str, Tensor]:
        return {"logits": self._run(input_ids, 0, input_ids.shape[1])}

    def prefill(self, input_ids: Tensor) -> dict[str, Tensor]:
        """The prompt as forward runs it (the cache filled the same way), with the logits of its last position
        only (batch, 1, vocab): the head's product over every position was a quarter of a prompt's time and
        generation reads only the last row."""
        return {"logits": self._run(input_ids, 0, input_ids.shape[1], last_only=True)}

    def decode(self, input_ids: Tensor, pos: Any) -> dict[str, Tensor]:
        return {"logits": self._run(input_ids, pos, 1)}

    # ---- the graph
    def _run(self, ids: Tensor, start: Any, length: Any, last_only: bool = False) -> Tensor:
        cfg, w = self.cfg, self.w
        gpt2 = cfg.family == "gpt2"
        wte = w["transformer.wte.weight" if gpt2 else "model.embed_tokens.weight"]
        x = embed(wte, ids).cast(dtypes.float32)  # 16-bit weights: the residual stream stays float32
        if cfg.embed_scale is not None:
            x = x * cfg.embed_scale
        if gpt2:
            x = x + row_range(w["transformer.wpe.weight"], start, start + length)
        for i in range(cfg.num_layers):
            x = self._block(i, x, start, length, last_only and i == cfg.num_layers - 1)
        if gpt2:
            x = x.layernorm(eps=cfg.norm_eps) * w["transformer.ln_f.weight"] + w["transformer.ln_f.bias"]
        else:
            x = rms_norm(x, w["model.norm.weight"], cfg.norm_eps)
        head = wte if cfg.tie_embeddings else w["lm_head.weight"]
        # contiguous: see _linear
        logits = head.matmul_t(x.contiguous()) if isinstance(head, QuantWeight) else x.contiguous() @ head.T
        return logits if cfg.final_softcap is None else soft_cap(logits, cfg.final_softcap)

    def _block(self, i: int, x: Tensor, start: Any, length: Any, last_only: bool = False) -> Tensor:
        """Layer i over x (b, length, width). `last_only` (prefill's last layer): past the cache write, only the
        last position's row goes on (b, 1, width); the other rows' attention output, MLP and residual would be
        thrown away after the layer (GPT-2 small's 32-token prompt: about 5% of its time on one thread)."""
        cfg, w = self.cfg, self.w
        b = x.shape[0]
        H, KV, D = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        # Each realize() schedules only what its targets need and leaves the other lazy tensors lazy, so a
        # value read on both sides of one (the residual stream here, q below) is realized with it: computed
        # once, not again by every later realize.
        x.realize()
        if cfg.family == "gpt2":
            p = f"transformer.h.{i}."
            h = x.layernorm(eps=cfg.norm_eps) * w[p + "ln_1.weight"] + w[p + "ln_1.bias"]
            qkv = self._linear(h, p + "attn.c_attn")
            E = cfg.hidden_size
            q, k, v = qkv[..., :E], qkv[..., E:2 * E], qkv[..., 2 * E:]
        else:
            p = f"model.layers.{i}."
            h = rms_norm(x, w[p + "input_layernorm.weight"], cfg.norm_eps)
            fused = p + "self_attn.qkv_proj.weight" in w  # Phi-3's, or joined at load (_joins)
            prompt_q = not (isinstance(length, int) and length == 1) and isinstance(
                w.get(p + ("self_attn.qkv_proj.weight" if fused else "self_attn.q_proj.weight")), QuantWeight)
            # a prompt's quantized projections are kernels of their own (a decode step's already are:
            # QuantWeight.matmul_t). Fused into the rotation (which reads each output at two columns: two
            # reductions) or the cache write (the heads' permuted layout), the weight panel was not staged
            # (host_opts.decompress_stage_opts) and each row tile dequantized the weight again: Qwen2-0.5B
            # Q4_0, 32 tokens, q, k and v took 3.6, 4.4 and 4.9 ms a layer (2 threads, loaded)
            if fused:
                q, k, v = self._parts(h, p + "self_attn.qkv_proj", (H * D, KV * D, KV * D), length, prompt_q)
            else:
                q, k, v = (self._linear(h, p + f"self_attn.{n}_proj") for n in "qkv")
                if prompt_q:
                    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        q = q.reshape(b, length, H, D).permute(0, 2, 1, 3)  # (b, H, t, D)
        k = k.reshape(b, length, KV, D).permute(0, 2, 1, 3)
        v = v.reshape(b, length, KV, D).permute(0, 2, 1, 3)
        if cfg.uses_rope:
            cos = self.consts["rope.cos"][start:start + length]
            sin = self.consts["rope.sin"][start:start + length]
            q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        a = self._attend(i, q, k, v, start, length)  # (b, t, H * D)
        if last_only:
            a, x = a[:, length - 1:length], x[:, length - 1:length]
        if cfg.family == "gpt2":
            x = x + self._linear(a, p + "attn.c_proj")
            h = x.layernorm(eps=cfg.norm_eps) * w[p + "ln_2.weight"] + w[p + "ln_2.bias"]
            h = gelu(self._linear(h, p + "mlp.c_fc"), cfg.activation)
            return x + self._linear(h, p + "mlp.c_proj")
        a = self._linear(a, p + "self_attn.o_proj")
        if cfg.family != "gemma2":
            x = x + a
            return x + self._mlp(rms_norm(x, w[p + "post_attention_layernorm.weight"], cfg.norm_eps), p)
        x = x + rms_norm(a, w[p + "post_attention_layernorm.weight"], cfg.norm_eps)
        h = self._mlp(rms_norm(x, w[p + "pre_feedforward_layernorm.weight"], cfg.norm_eps), p)
        return x + rms_norm(h, w[p + "post_feedforward_layernorm.weight"], cfg.norm_eps)

    def _mlp(self, h: Tensor, p: str) -> Tensor:
        """The gated MLP: act(gate) * up, projected down (Phi-3: gate and up halves of one projection)."""
        cfg = self.cfg
        if p + "mlp.gate_up_proj.weight" in self.w:  # Phi-3's, or joined at load (_joins)
            F = cfg.intermediate_size
            gate, up = self._parts(h, p + "mlp.gate_up_proj", (F, F), h.shape[1], False)
        else:
            gate, up = self._linear(h, p + "mlp.gate_proj"), self._linear(h, p + "mlp.up_proj")
        gate = gate.silu() if cfg.activation == "silu" else gelu(gate, cfg.activation)
        return self._linear(gate * up, p + "mlp.down_proj")

    def _parts(self, x: Tensor, name: str, widths: tuple[int, ...], length: Any, own_kernel: bool) -> list[Tensor]:
        """x @ a joined projection (qkv_proj, gate_up_proj) (+ bias), as its parts' outputs of `widths`: one
        product sliced after (a decode step's one matvec; with `own_kernel`, a kernel of its own), except a
        float weight in a prompt, applied part by part over its columns, the products the parts made apart
        (a float Qwen2 of width 896, 64 tokens, 1 thread: one (896, 9728) gate/up product over a Variable
        token count took about twice the time of two (896, 4864) ones; with 64 concrete tokens, the same)."""
        edges = np.cumsum((0, *widths)).tolist()
        weight, bias = self.w[name + ".weight"], self.w.get(name + ".bias")
        if not isinstance(weight, QuantWeight) and not (isinstance(length, int) and length == 1):
            x = x.contiguous()
            outs = [x @ weight[:, a:b] for a, b in zip(edges, edges[1:])]
            return outs if bias is None else [o + bias[a:b] for o, a, b in zip(outs, edges, edges[1:])]
        y = self._linear(x, name)
        y = y.contiguous() if own_kernel else y
        return [y[..., a:b] for a, b in zip(edges, edges[1:])]

    def _linear(self, x: Tensor, name: str) -> Tensor:
        """x @ weight (+ bias). The input is realized first: fused into the matmul, an elementwise input
        (a norm, gelu, silu * up) would be recomputed once per block of output columns."""
        weight = self.w[name + ".weight"]
        if isinstance(weight, QuantWeight):  # (out, in), dequantized inside the matmul's kernel
            y = weight.matmul_t(x.contiguous())
        else:
            y = x.contiguous() @ weight
        bias = self.w.get(name + ".bias")
        return y if bias is None else y + bias

    def _attend(self, i: int, q: Tensor, k: Tensor, v: Tensor, start: Any, length: Any) -> Tensor:
        """Write this call's keys/values into the layer's cache, then attend over the cached prefix."""
        cfg = self.cfg
        b = q.shape[0]
        H, KV, D = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        kc, vc = self.caches[f"cache.k.{i}"], self.caches[f"cache.v.{i}"]
        Tensor.realize_all(q, kc[:b, :, start:start + length].assign(k), vc[:b, :, start:start + length].assign(v))
        end = start + length
        keys, values = kc[:b, :, :end].unsqueeze(2), vc[:b, :, :end].unsqueeze(2)  # (b, KV, 1, L, D)
        q = q.reshape(b, KV, H // KV, length, D)  # query heads grouped by the key head they share
        scale = cfg.attn_scale if cfg.attn_scale is not None else 1.0 / math.sqrt(D)
        scores = (q @ keys.transpose(-1, -2)) * scale  # (b, KV, g, t, L)
        if cfg.attn_softcap is not None:
            scores = soft_cap(scores, cfg.attn_softcap)
        if i in cfg.sliding_layers and "sliding_mask" in self.consts:  # the window's rows at these queries
            scores = scores + self.consts["sliding_mask"][start:end, :end]
        elif isinstance(start, int) and start == 0:  # forward: causal over the prompt (decode sees all of it)
            scores = scores + self.consts["causal_mask"][:length, :length]
        out = scores.softmax(-1) @ values  # (b, KV, g, t, D)
        return out.reshape(b, H, length, D).permute(0, 2, 1, 3).reshape(b, length, H * D)


def embed(table: Weight, ids: Tensor) -> Tensor:
    """Rows of `table` (vocab, width) at integer `ids` (any shape): ids.shape + (width,)."""
    if isinstance(table, QuantWeight):
        return table.rows(ids)
    flat = ids.reshape(-1, 1)
    rows = table.gather(0, flat.expand(flat.shape[0], table.shape[1]))
    return rows.reshape(*ids.shape, table.shape[1])


def row_range(table: Weight, start: Any, stop: Any) -> Tensor:
    """Rows start..stop of `table` (ints or Variables)."""
    return table.row_range(start, stop) if isinstance(table, QuantWeight) else table[start:stop]


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    return x * (x * x).mean(-1, keepdim=True).add(eps).rsqrt() * weight


def rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotary position embedding in the Hugging Face layout (the two halves of each head rotate together)."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return (x1 * cos - x2 * sin).cat(x2 * cos + x1 * sin, dim=-1)


def soft_cap(x: Tensor, cap: float) -> Tensor:
    """cap * tanh(x / cap): x squashed smoothly into (-cap, cap) (Gemma 2's scores and logits)."""
    return (x * (1.0 / cap)).tanh() * cap


def gelu(x: Tensor, activation: str) -> Tensor:
    return x.gelu() if activation == "gelu" else x.gelu(approximate="tanh")


def storage_dtype(name: Any) -> Any:
    """The polygrad dtype unquantized weights are kept in: float32 (default, and with "quantized" or a block
    format), float16 or bfloat16."""
    table = {None: dtypes.float32, "float32": dtypes.float32, "quantized": dtypes.float32, "float16": dtypes.float16,
             "bfloat16": dtypes.bfloat16, **{fmt: dtypes.float32 for fmt in QUANTIZE_AT_LOAD}}
    key = getattr(name, "name", name)
    key = {"float": "float32", "half": "float16"}.get(key, key)
    if key not in table:
        raise HFError(f"dtype={name!r}: weights can be kept as float32, float16 or bfloat16, 'quantized' "
                      f"(GGUF blocks as stored), or quantized at load to one of {list(QUANTIZE_AT_LOAD)}")
    return table[key]
