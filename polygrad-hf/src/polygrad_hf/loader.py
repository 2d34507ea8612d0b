"""load_hf: a checkpoint folder or GGUF file -> an ordinary polygrad Model with a KV cache.

Stage: user API. Input: a path (see checkpoint.py), the cache bounds, a weight dtype, a device or
runtime. Output: a `polygrad.Model` captured from decoder.Decoder with

  forward(input_ids[batch, tokens]) -> {"logits": [batch, tokens, vocab]}   (fills the KV cache)
  decode(input_ids[batch, 1], pos)  -> {"logits": [batch, 1, vocab]}        (one step at position pos)

where batch <= max_batch, tokens <= max_seq_len and pos < max_seq_len are Variables (one compiled
program per kernel, whatever their values); with max_batch=1 the batch is a fixed 1. `save()` writes
a portable .pgb bundle (format version 2: the caches are `cache` buffers, not stored).

The captured Program is cached on disk (polygrad/model/programcache.py, POLY_CACHE_DIR/programs), keyed
by the config, the bounds, the device, each weight's name, dtype, shape and block format, and polygrad's
code: a later load of a checkpoint of the same layout (any process) reads it with the weights from the
file instead of capturing, and its kernels are found lowered, rendered and compiled on disk.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
from typing import Any

import numpy as np

from polygrad import Model, Tensor, Variable, config, dtypes, limits, runtime_context
from polygrad.device import canonicalize, free_cached
from polygrad.errors import DeviceError
from polygrad.model import programcache
from polygrad.model.capture import capture_program
from polygrad.nn.quant import INT8_DOT_FORMATS, int8_dot_enabled
from polygrad.runtime import trim_heap

from polygrad_hf.checkpoint import open_checkpoint
from polygrad_hf.decoder import QUANTIZE_AT_LOAD, Decoder, constants, parameters, read_weights, storage_dtype
from polygrad_hf.errors import HFError
from polygrad_hf.quant import QuantWeight
from polygrad_hf.weights import Checkpoint

DEFAULT_MAX_SEQ_LEN = 1024


def load_hf(path: str | os.PathLike, max_batch: int = 1, max_seq_len: int | None = None, dtype: Any = None,
            device: str | None = None, runtime: Any = None) -> Model:
    """Load a GPT-2, Llama, Qwen2, Phi-3, Gemma or Gemma 2 checkpoint as a Model with a KV cache for
    `max_batch` sequences of up to `max_seq_len` tokens (default: the model's context length, at most 1024).

    `path` is a folder with config.json and model.safetensors (or a sharded model.safetensors.index.json),
    or a .gguf file. Safetensors weights may be F32, F16 or BF16. GGUF weights may be F32, F16, BF16, or
    one of llama.cpp's block formats Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K, Q8_K.

    `dtype="q8_0"`, `"q4_0"`, `"q4_1"`, `"q5_0"`, `"q5_1"` or `"q4_k"` quantizes every matrix (projections,
    embeddings, the output projection) to llama.cpp's block format as it is read (polygrad.quantize's
    rounding; a GGUF tensor already in that format is kept as stored); norms and biases stay float32, and
    so does a matrix whose input width is not a multiple of the block (32; 256 for Q4_K) (`model.hf_notes`
    lists them). Q8_0 keeps greedy tokens of small models; Q4_0 changes logits by a few percent of their
    range.

    GGUF matrices in a block format stay in their blocks on the device by default (`None`, or
    `"quantized"`): a Q4_0 file of N parameters takes about 0.56N bytes, as in the file, Q8_0 1.06N. The
    kernels that read a weight dequantize it as they load it, with the gguf package's values, and decode
    faster than float32 on CPU (benchmarks/bench_gguf.py: GPT-2 small decodes 2.2x (Q8_0) and 2.8x (Q4_0)
    float32's tok/s). Where prompts take 8-bit activations (Q8_0 and Q4_0 on a CPU with VNNI), each
    projection also keeps its scales laid out for them (float32, 4 bytes a 32-weight block: 0.125 bytes a
    parameter), made at load.
    Every other weight is float32. `"float32"` dequantizes them at load instead (4N bytes); `"float16"` or
    `"bfloat16"` holds every weight in 16 bits (2N bytes; computation stays float32, but the CPU backend
    does not vectorise kernels over 16-bit data, so float32 decodes faster there). `model.hf_notes` says
    what was kept quantized or dequantized. Memory for the caches: 2 x layers x max_batch x kv_heads x
    max_seq_len x head_dim x 4 bytes.

    >>> model = load_hf("path/to/gpt2", max_batch=1, max_seq_len=64)    # doctest: +SKIP
    >>> model.forward(input_ids=[[1, 2, 3]])["logits"].shape            # doctest: +SKIP
    (1, 3, 50257)
    """
    ck = open_checkpoint(path)
    return model_from_checkpoint(ck, max_batch, max_seq_len, dtype, device, runtime)


def _bound(name: str, value: Any, lo: int, hi: int | None) -> int:
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < lo or \
            (hi is not None and value > hi):
        limit = f"an int in {lo}..{hi}" if hi is not None else f"an int >= {lo}"
        raise HFError(f"{name} must be {limit}, got {value!r}")
    return int(value)


def _quant_notes(ck: Checkpoint, weights: dict[str, Any], wdt: Any) -> list[str]:
    """What loading did with the checkpoint's quantized weights: kept as blocks, or dequantized."""
    kept = [w for w in weights.values() if isinstance(w, QuantWeight)]
    held = sorted({raw.blocks.format for raw, _ in ck.arrays.values() if getattr(raw, "blocks", None) is not None})
    if kept:
        formats = ", ".join(sorted({w.format for w in kept}))
        floats = sorted(k for k, w in weights.items() if not isinstance(w, QuantWeight) and len(w.shape) == 2)
        left = f"; left {floats} float (rows not whole blocks)" if floats else ""
        return [f"kept {len(kept)} weights quantized ({formats}, {sum(w.nbytes for w in kept)} bytes): the "
                f"kernels that read them dequantize them{left}"]
    return [f"dequantized {', '.join(held)} weights to {wdt.name} at load"] if held else []


def _blocks_tensor(arr: np.ndarray, device: str, runtime: Any) -> Tensor:
    """A weight's uint8 blocks on `device`: on a host device, the array itself (read-only, no copy: a view
    of the GGUF file's map stays the file's pages, and a reordered copy becomes the buffer), else copied."""
    arr = np.ascontiguousarray(arr, dtype=np.uint8)  # as read_weights hands it over: no copy
    arr.flags.writeable = False  # a view of the read-only map already is; a reordered copy is ours alone
    try:
        return Tensor.from_host_view(arr, device=device, _runtime=runtime)
    except DeviceError:  # not host memory (CUDA), or POLY_DEBUG_ALLOC's guarded allocations
        return Tensor(arr, device=device, dtype=dtypes.uint8, _runtime=runtime).realize()


def model_from_checkpoint(ck: Checkpoint, max_batch: int = 1, max_seq_len: int | None = None, dtype: Any = None,
                          device: str | None = None, runtime: Any = None) -> Model:
    """The Model of an opened Checkpoint (load_hf without the reading)."""
    model = _build_model(ck, max_batch, max_seq_len, dtype, device, runtime)
    # only now, with the loader's tensors gone (a float weight's loaded copy died with _build_model's frame
    # once the Model held its own, into the reuse cache: a second copy of every weight kept resident), are
    # the cached allocations given back. They include the capture run's buffers (sized for max_seq_len,
    # mostly untouched): reused by the Model, each would be zero-filled whole, so every page of every
    # capacity became resident; fresh maps of the kernel's zero pages cost only the pages a prompt uses
    free_cached()
    trim_heap()  # the file's bytes and their conversions were host arrays: give that heap back
    return model


def _build_model(ck: Checkpoint, max_batch: int, max_seq_len: int | None, dtype: Any, device: str | None,
                 runtime: Any) -> Model:
    cfg = ck.config
    max_batch = _bound("max_batch", max_batch, 1, None)
    limit = cfg.max_positions
    max_seq_len = min(limit, DEFAULT_MAX_SEQ_LEN) if max_seq_len is None else \
        _bound(f"max_seq_len (the model's context is {limit} positions)", max_seq_len, 1, limit)
    wdt = storage_dtype(dtype)
    rt = runtime if runtime is not None else runtime_context.current()
    dev = canonicalize(device if device is not None else (rt.device if rt is not None else None))

    def convert(arr: np.ndarray) -> Tensor:
        return Tensor(arr, device=dev, dtype=wdt, _runtime=rt).realize()

    def keep_blocks(arr: np.ndarray) -> Tensor:
        return _blocks_tensor(arr, dev, rt)

    with runtime_context.using(rt):
        quantize_to = dtype.upper() if isinstance(dtype, str) and dtype in QUANTIZE_AT_LOAD else None
        # GGUF blocks stay as stored unless float32 (or a 16-bit dtype) is asked for
        keeps = dtype is None or (isinstance(dtype, str) and (dtype == "quantized" or quantize_to is not None))
        weights = read_weights(ck, convert, keep_blocks if keeps else None, quantize_to)
        consts = constants(cfg, max_seq_len, dev, ck.extras.get("rope_freqs"))
        named = parameters(weights, consts)
        key = _program_key(cfg, max_batch, max_seq_len, dev, named, weights)
        model = _cached_model(key, named, _memory_cap(cfg, max_batch, max_seq_len, named), rt, dev)
        if model is None:
            if rt is not None:
                rt.check_alive()
            dec = Decoder(cfg, weights, max_batch, max_seq_len, dev, consts=consts)
            # one sequence: a fixed batch of 1, so the kernels' outer loops are concrete
            batch = Variable("batch", 1, max_batch) if max_batch > 1 else 1
            tokens = Variable("tokens", 1, max_seq_len)
            pos = Variable("pos", 0, max_seq_len - 1)
            ids = Tensor.empty(batch, tokens, dtype=dtypes.int32, device=dev)
            step = Tensor.empty(batch, 1, dtype=dtypes.int32, device=dev)
            prog, data, device = capture_program(dec, {"input_ids": ids}, {}, None, dec.params(), rt, dec.caches,
                                                 {"prefill": (dec.prefill, {"input_ids": ids}),
                                                  "decode": (dec.decode, {"input_ids": step, "pos": pos})})
            programcache.store(key, prog, data)
            model = Model._from_program(prog, data, rt, device, adopt=True)  # the weights die with the load
    model.hf_config = cfg  # type: ignore[attr-defined]
    ck.notes.extend(_quant_notes(ck, weights, wdt))
    model.hf_notes = list(ck.notes)  # type: ignore[attr-defined]
    model.tokenizer_file = ck.tokenizer_file  # type: ignore[attr-defined]
    return model


def _program_key(cfg: Any, max_batch: int, max_seq_len: int, device: str, named: dict[str, Tensor],
                 weights: dict[str, Any]) -> str:
    """The program cache's key text: everything the capture reads besides the weights' values (the
    config, the bounds, the device, each parameter's name, dtype and shape, and the block format and
    logical shape of a quantized one: Q4_0 and Q4_K rows have the same bytes)."""
    fields = json.dumps(dataclasses.asdict(cfg), sort_keys=True, default=repr)
    tensors = ";".join(f"{k}:{t.dtype.name}:{list(t.shape)}" for k, t in named.items())
    formats = ";".join(f"{k}:{w.format}:{list(w.shape)}" for k, w in weights.items() if isinstance(w, QuantWeight))
    # a decode step's matvecs and a prompt's matmuls of these formats take 8-bit activations or not
    # (POLY_INT8_DOT, the device's int8_dot); the formats are named so an entry captured before a format
    # (or prompts) joined the route is not reused
    on_route = bool(formats) and int8_dot_enabled(device)
    prompts = int(bool(config.get("POLY_INT8_PROMPTS")))
    route = f"int8_dot={','.join(INT8_DOT_FORMATS)};int8_prompts={prompts}" if on_route else "int8_dot=0"
    return programcache.key("polygrad_hf", fields, f"max_batch={max_batch}", f"max_seq_len={max_seq_len}",
                            f"device={device}", tensors, formats, route)


def _memory_cap(cfg: Any, max_batch: int, max_seq_len: int, named: dict[str, Tensor]) -> int:
    """The most memory a cached program of these weights may ask for (a bound against a tampered entry:
    the capture itself ran with what the entry declares): 16 x the weights and caches, or the machine's
    memory where that is more (a batch of long prompts' logits alone can exceed the first)."""
    weights = sum(math.prod(t.shape) * t.dtype.itemsize for t in named.values())
    caches = 2 * cfg.num_layers * max_batch * cfg.num_kv_heads * max_seq_len * cfg.head_dim * 4
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):  # not a POSIX system
        memory = 0
    return max(limits.default_max_bytes(weights + caches), memory)


def _cached_model(key: str, named: dict[str, Tensor], max_bytes: int, runtime: Any, device: str) -> Model | None:
    """The Model of the program cached under `key` with these weights, or None (not cached, or an entry
    that does not read or fit them: it is captured again and rewritten)."""
    hit = programcache.load(key, max_bytes, named, ("forward", "prefill", "decode"))
    if hit is None:
        return None
    if runtime is not None:
        runtime.check_alive()
    return Model._from_program(*hit, runtime, device, adopt=True)  # the weights die with the load
