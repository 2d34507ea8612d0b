"""generate: autoregressive sampling over a Model's prefill (prompt) and decode (one token) entrypoints.

Stage: user API over a loaded Model. Input: a Model with `forward(input_ids) -> logits` and
`decode(input_ids, pos) -> logits` (what load_hf builds, or a bundle it saved; `prefill(input_ids)`, the
prompt with its last position's logits only, where it has one), prompt tokens (or a string, with a
tokenizer), sampling settings. Output: the prompt followed by the new tokens.

The prompt runs once through `prefill` (else `forward`), which fills the KV cache; each new token then runs `decode`
at its position: the same compiled kernels every step, the prefix never recomputed. Sampling happens
on the host from the last position's logits, with NumPy's Generator seeded by `seed` (reproducible).
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from polygrad_hf.errors import HFError
from polygrad_hf.tokenizer import load_tokenizer


def _check_model(model: Any) -> tuple[int, int]:
    """(max batch, max sequence length) of a generation-ready Model."""
    eps = getattr(model, "entrypoints", None)
    if eps is None or "forward" not in eps or "decode" not in eps:
        raise HFError("generate needs a Model with 'forward' and 'decode' entrypoints (input_ids -> logits), as "
                      f"load_hf makes; this one has {eps}")
    v = model.variables
    if "tokens" not in v:
        raise HFError("generate needs the Model's input_ids[batch, tokens] Variable 'tokens', as load_hf makes")
    return (v["batch"][1] if "batch" in v else 1), v["tokens"][1]


def _as_ids(tokens: Any) -> tuple[np.ndarray, bool]:
    arr = np.asarray(tokens)
    flat = arr.ndim == 1
    if flat:
        arr = arr[None, :]
    if arr.ndim != 2 or arr.shape[1] == 0 or arr.shape[0] == 0:
        raise HFError(f"tokens must be a non-empty [batch, length] (or [length]) array of token ids, got shape "
                      f"{list(np.shape(tokens))}")
    if not np.issubdtype(arr.dtype, np.integer):
        raise HFError(f"tokens must be integers, got {arr.dtype}")
    return arr.astype(np.int32), flat


def _eos_set(eos_token_id: Any) -> set[int]:
    if eos_token_id is None:
        return set()
    return {int(e) for e in (eos_token_id if isinstance(eos_token_id, (list, tuple, set)) else [eos_token_id])}


def generate(model: Any, tokens: Any, max_new_tokens: int = 20, temperature: float = 1.0, top_k: int | None = None,
             top_p: float | None = None, seed: int | None = None, eos_token_id: int | Sequence[int] | None = None,
             tokenizer: Any = None) -> Any:
    """Continue `tokens` by up to `max_new_tokens` tokens; returns prompt + new tokens, [batch, length] int32.

    Greedy (argmax) when top_k == 1 or temperature == 0; otherwise logits / temperature, restricted to the
    top_k most likely tokens and to the smallest set whose probability reaches top_p, sampled with a
    Generator seeded by `seed` (same seed, same tokens). A row stops at `eos_token_id` (an id or a list)
    and is padded with it while the others continue; generation ends when every row stopped. A 1-D
    prompt gives a 1-D result. A string prompt is encoded with `tokenizer` (default: the model's
    tokenizer.json, see load_tokenizer) and the decoded text is returned.
    """
    max_batch, max_len = _check_model(model)
    text_in = isinstance(tokens, str)
    tok = None
    if text_in:
        tok = tokenizer if tokenizer is not None else load_tokenizer(model)
        tokens = tok.encode(tokens)
    ids, flat = _as_ids(tokens)
    if not isinstance(max_new_tokens, int) or isinstance(max_new_tokens, bool) or max_new_tokens < 0:
        raise HFError(f"max_new_tokens must be a non-negative int, got {max_new_tokens!r}")
    if not isinstance(temperature, (int, float)) or temperature < 0:
        raise HFError(f"temperature must be a number >= 0, got {temperature!r}")
    if top_k is not None and (not isinstance(top_k, int) or isinstance(top_k, bool) or top_k < 1):
        raise HFError(f"top_k must be a positive int or None, got {top_k!r}")
    if top_p is not None and not (isinstance(top_p, (int, float)) and 0 < top_p <= 1):
        raise HFError(f"top_p must be in (0, 1] or None, got {top_p!r}")
    b, t = ids.shape
    if b > max_batch:
        raise HFError(f"{b} prompts exceed the model's max_batch {max_batch}; load it with load_hf(..., "
                      f"max_batch={b})")
    if t + max_new_tokens > max_len:
        raise HFError(f"{t} prompt tokens + {max_new_tokens} new ones exceed the model's max_seq_len {max_len}; load "
                      f"it with load_hf(..., max_seq_len={t + max_new_tokens}) or ask for fewer tokens")
    rng = np.random.default_rng(seed)
    eos = _eos_set(eos_token_id)
    greedy = top_k == 1 or temperature == 0
    out = [ids]
    done = np.zeros(b, dtype=bool)
    if max_new_tokens:  # the prompt: prefill's logits are its last position's only (older bundles: forward's)
        entry = "prefill" if "prefill" in model.entrypoints else "forward"
        prompt = model.call(entry, {"input_ids": ids})
        logits = prompt["logits"].numpy()[:, -1, :]
    for step in range(max_new_tokens):
        nxt = np.argmax(logits, axis=-1) if greedy else _sample(logits, temperature, top_k, top_p, rng)
        nxt = nxt.astype(np.int32)
        if eos:
            pad = next(iter(sorted(eos)))
            nxt = np.where(done, pad, nxt)
            done |= np.isin(nxt, list(eos))
        out.append(nxt[:, None])
        if done.all() or step == max_new_tokens - 1:
            break
        logits = model.call("decode", {"input_ids": nxt[:, None], "pos": t + step})["logits"].numpy()[:, -1, :]
    result = np.concatenate(out, axis=1)
    if text_in:
        return tok.decode(result[0].tolist())
    return result[0] if flat else result


def _sample(logits: np.ndarray, temperature: float, top_k: int | None, top_p: float | None,
            rng: np.random.Generator) -> np.ndarray:
    """One sampled token per row of logits [batch, vocab]."""
    z = logits.astype(np.float64) / float(temperature)
    if top_k is not None and top_k < z.shape[-1]:
        kth = np.partition(z, -top_k, axis=-1)[:, -top_k][:, None]
        z = np.where(z < kth, -np.inf, z)
    p = np.exp(z - z.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    if top_p is not None and top_p < 1:
        order = np.argsort(-p, axis=-1, kind="stable")
        sorted_p = np.take_along_axis(p, order, -1)
        before = np.cumsum(sorted_p, -1) - sorted_p  # probability of the tokens ranked above
        keep_sorted = before < top_p  # the smallest prefix reaching top_p (the top token always stays)
        keep = np.zeros_like(keep_sorted)
        np.put_along_axis(keep, order, keep_sorted, -1)
        p = np.where(keep, p, 0.0)
        p /= p.sum(-1, keepdims=True)
    cdf = np.cumsum(p, -1)
    u = rng.random(p.shape[0]) * cdf[:, -1]
    return (cdf <= u[:, None]).sum(-1)  # the first token whose cumulative probability exceeds u
