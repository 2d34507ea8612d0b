"""polygrad-hf on crafted files (issue 28, items 7 and 13): GGUF tensor offsets out of bounds, off the
alignment or overlapping; GGUF metadata and config.json values that drive shapes (zero, negative,
non-divisible, absurdly large, of the wrong type); a config naming far more layers than the checkpoint
holds. Each raises CheckpointError naming the file and the value before any weight is read.

The GGUF files are written by the `gguf` package's writer and patched at the byte of one tensor-info
field; the reference weights come from transformers' tiny models (tests/hf_checkpoints.py).
"""
from __future__ import annotations

import json
import struct

import numpy as np
import pytest

pytest.importorskip("transformers")
pytest.importorskip("torch")
gguf = pytest.importorskip("gguf")

import hf_checkpoints as hc  # noqa: E402

from polygrad.hf import CheckpointError, load_hf  # noqa: E402
from polygrad_hf import checkpoint  # noqa: E402


@pytest.fixture(scope="module")
def qwen2_gguf(tmp_path_factory):
    """(path of a tiny qwen2 GGUF, {tensor name: (byte of its offset field, its data offset, its bytes)})."""
    path = tmp_path_factory.mktemp("gguf") / "base.gguf"
    hc.write_gguf(hc.hf_model("qwen2"), path)
    reader = gguf.GGUFReader(str(path))
    info = {}
    for t in reader.tensors:
        at = t.field.offset + sum(int(p.nbytes) for p in t.field.parts[:-1])
        info[t.name] = (at, int(t.field.parts[-1][0]), int(t.n_bytes))
    del reader
    return path, info


def _patched(src, dst, at: int, offset: int):
    data = bytearray(src.read_bytes())
    data[at:at + 8] = struct.pack("<Q", offset)
    dst.write_bytes(bytes(data))
    return dst


def test_the_unpatched_file_loads(qwen2_gguf):
    path, _ = qwen2_gguf
    load_hf(path, max_seq_len=4).dispose()


@pytest.mark.parametrize("case, message", [
    ("max", r"'blk\.0\.attn_norm\.weight' needs bytes 18446744073709551615\.\."),  # wrapped to the byte before the data
    ("wraps_aligned", r"'blk\.0\.attn_norm\.weight' needs bytes"),
    ("off_alignment", r"'blk\.0\.attn_norm\.weight' starts at data offset \d+, not a multiple of the file's "
                      r"alignment 32"),
    ("same_offset", r"tensors '.*' and '.*' overlap in the data"),
])
def test_gguf_tensor_offsets_are_checked(tmp_path, qwen2_gguf, case, message):
    # each of these loaded silently with wrong weights, reading another tensor's bytes or the header's
    path, info = qwen2_gguf
    at, offset, nbytes = info["blk.0.attn_norm.weight"]
    _, other, other_bytes = info["blk.0.ffn_norm.weight"]
    assert other_bytes == nbytes  # two norms of one width: the reader decodes either at either offset
    value = {"max": 2**64 - 1, "wraps_aligned": 2**64 - 32, "off_alignment": offset + 1,
             "same_offset": other}[case]
    bad = _patched(path, tmp_path / f"{case}.gguf", at, value)
    with pytest.raises(CheckpointError, match=rf"{case}\.gguf: .*{message}"):
        load_hf(bad, max_seq_len=4)


@pytest.mark.parametrize("rows, message", [(0, r"'token_embd\.weight' has 0 rows \(the vocabulary\)"),
                                           (2**62, "not a readable GGUF file")])
def test_gguf_dimensions_are_checked(tmp_path, qwen2_gguf, rows, message):
    # the embedding's row count is the vocabulary: 0 loaded as a model of no tokens
    path, _ = qwen2_gguf
    reader = gguf.GGUFReader(str(path))
    t = next(t for t in reader.tensors if t.name == "token_embd.weight")
    at = t.field.offset + sum(int(p.nbytes) for p in t.field.parts[:3]) + 8  # the second dimension
    del reader
    bad = _patched(path, tmp_path / "dims.gguf", at, rows)
    with pytest.raises(CheckpointError, match=rf"dims\.gguf: .*{message}"):
        load_hf(bad, max_seq_len=4)


def _metadata_gguf(path, arch: str = "qwen2", **overrides):
    """A GGUF holding the metadata of a 1-layer model (a key set to None is left out, a value given as
    (value, GGUFValueType) is written with that type) and only a token embedding: the config is read
    before any other tensor is looked for."""
    T = gguf.GGUFValueType
    meta = {"embedding_length": (32, T.UINT32), "block_count": (1, T.UINT32), "feed_forward_length": (64, T.UINT32),
            "context_length": (64, T.UINT32), "attention.head_count": (4, T.UINT32),
            "attention.layer_norm_rms_epsilon": (1e-6, T.FLOAT32), "attention.layer_norm_epsilon": (1e-5, T.FLOAT32)}
    meta.update(overrides)
    w = gguf.GGUFWriter(str(path), arch)
    for key, v in meta.items():
        if v is not None:
            value, kind = v
            w.add_key_value(key if key.startswith("tokenizer.") else f"{arch}.{key}", value, kind)
    w.add_tensor("token_embd.weight", np.ones((8, 32), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


T = gguf.GGUFValueType


@pytest.mark.parametrize("arch, key, value, message", [
    ("qwen2", "attention.head_count", (0, T.UINT32), r"'qwen2\.attention\.head_count' must be an integer in "
                                                     r"1\.\.2147483647, got 0"),  # was ZeroDivisionError
    ("gpt2", "attention.head_count", (0, T.UINT32), r"'gpt2\.attention\.head_count' must be an integer"),
    ("qwen2", "attention.head_count", (-4, T.INT32), r"'qwen2\.attention\.head_count' .* got -4"),
    ("qwen2", "attention.head_count", ("4", T.STRING), r"'qwen2\.attention\.head_count' .* got '4'"),
    ("qwen2", "attention.head_count", (4.0, T.FLOAT32), r"'qwen2\.attention\.head_count' .* got 4\.0"),
    ("qwen2", "attention.head_count_kv", (3, T.UINT32), "4 attention heads are not a multiple of 3 key/value heads"),
    ("qwen2", "attention.head_count_kv", (0, T.UINT32), r"'qwen2\.attention\.head_count_kv' must be"),
    ("qwen2", "embedding_length", (2**40, T.UINT64), r"'qwen2\.embedding_length' .* got 1099511627776"),
    ("qwen2", "embedding_length", (2, T.UINT32), "embedding_length 2 is smaller than attention.head_count 4"),
    ("qwen2", "attention.key_length", (7, T.UINT32), "even head dimension, got 7"),
    ("gpt2", "embedding_length", (30, T.UINT32), "width 30 is not a multiple of the 4 attention heads"),
    ("qwen2", "block_count", (0, T.UINT32), r"'qwen2\.block_count' must be"),
    ("qwen2", "context_length", (-1, T.INT64), r"'qwen2\.context_length' must be"),
    ("qwen2", "feed_forward_length", ([64], T.ARRAY), r"'qwen2\.feed_forward_length' must be"),
    ("qwen2", "attention.layer_norm_rms_epsilon", (float("nan"), T.FLOAT32), r"rms_epsilon' must be a finite"),
    ("qwen2", "attention.layer_norm_rms_epsilon", (-1.0, T.FLOAT32), r"rms_epsilon' must be a finite number >= 0"),
    ("gpt2", "attention.layer_norm_epsilon", ("x", T.STRING), r"'gpt2\.attention\.layer_norm_epsilon' must be"),
    ("qwen2", "rope.freq_base", (0.0, T.FLOAT32), r"'qwen2\.rope\.freq_base' must be a finite number > 0"),
    ("qwen2", "tokenizer.ggml.eos_token_id", ("x", T.STRING), "'tokenizer.ggml.eos_token_id' must be a token id"),
    ("qwen2", "block_count", None, r"GGUF metadata lacks 'qwen2\.block_count'"),
])
def test_gguf_metadata_that_drives_shapes_is_checked(tmp_path, arch, key, value, message):
    path = _metadata_gguf(tmp_path / "meta.gguf", arch, **{key: value})
    with pytest.raises(CheckpointError, match=rf"meta\.gguf: .*{message}"):
        load_hf(path, max_seq_len=4)


def _llama_folder(tmp_path, **cfg):
    _, folder = hc.make("llama", tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config.update(cfg)
    (tmp_path / "config.json").write_text(json.dumps(config))
    return folder


@pytest.mark.parametrize("change, message", [
    (dict(rms_norm_eps="x"), r"'rms_norm_eps' must be a finite number >= 0, got 'x'"),  # was float()'s ValueError
    (dict(rope_theta=0), r"'rope_theta' must be a finite number > 0"),  # gave inf frequencies, NaN logits
    (dict(rope_theta=10**400), r"'rope_theta' must be a finite number > 0"),
    (dict(eos_token_id=["x"]), r"'eos_token_id' must be a token id"),  # was int()'s ValueError
    (dict(hidden_size=2**40), r"'hidden_size' must be an integer in 1\.\.2147483647"),
    (dict(num_attention_heads=64, head_dim=None), "hidden_size 32 is smaller than num_attention_heads 64"),
    (dict(head_dim=7), "even head dimension, got 7"),
    (dict(rope_scaling={"rope_type": "llama3", "factor": 8.0, "high_freq_factor": 4.0,
                        "original_max_position_embeddings": 16}),  # was a KeyError building the model
     r"rope scaling: config lacks 'low_freq_factor'"),
    (dict(rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 4.0, "high_freq_factor": 4.0,
                        "original_max_position_embeddings": 16}),  # divided by high - low = 0
     "high_freq_factor must exceed low_freq_factor"),
    (dict(rope_scaling={"rope_type": "linear", "factor": "2"}), r"rope scaling: 'factor' must be"),
])
def test_config_values_that_drive_shapes_are_checked(tmp_path, change, message):
    folder = _llama_folder(tmp_path, **change)
    with pytest.raises(CheckpointError, match=rf"config\.json: .*{message}"):
        load_hf(folder, max_seq_len=4)


@pytest.fixture
def reads(monkeypatch):
    """How many tensors the checkpoint readers converted or dequantized."""
    from polygrad_hf import gguf_file
    count = [0]
    for module, name in ((checkpoint, "to_float32"), (gguf_file, "_dequantize")):
        def counting(*args, _real=getattr(module, name)):
            count[0] += 1
            return _real(*args)
        monkeypatch.setattr(module, name, counting)
    return count


def test_a_config_with_a_million_layers_fails_before_reading_any_weight(tmp_path, reads):
    # it listed 12 million expected tensors and read both real layers before naming layer 2 (75 s)
    _, folder = hc.make("gpt2", tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "n_layer": 10**6}))
    with pytest.raises(CheckpointError, match=r"the config gives 1000000 layers, but the checkpoint has no tensors for "
                                              r"layer 2 \(2 layers present\)"):
        load_hf(folder, max_seq_len=4)
    assert reads[0] == 0


def test_a_gguf_block_count_past_the_blocks_held_fails_before_reading(tmp_path, qwen2_gguf, reads):
    path, _ = qwen2_gguf
    reader = gguf.GGUFReader(str(path))
    field = reader.fields["qwen2.block_count"]
    at = field.offset + sum(int(p.nbytes) for p in field.parts[:-1])
    del reader
    data = bytearray(path.read_bytes())
    data[at:at + 4] = struct.pack("<I", 10**6)
    (tmp_path / "deep.gguf").write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=r"deep\.gguf: the config gives 1000000 layers.* no tensors for layer 2"):
        load_hf(tmp_path / "deep.gguf", max_seq_len=4)
    assert reads[0] == 0


def test_a_missing_tensor_of_the_last_layer_is_named_before_any_is_read(tmp_path, reads):
    from safetensors.numpy import load_file, save_file
    _, folder = hc.make("gpt2", tmp_path)
    weights = load_file(tmp_path / "model.safetensors")
    del weights["transformer.h.1.mlp.c_proj.bias"]
    save_file(weights, tmp_path / "model.safetensors")
    with pytest.raises(CheckpointError, match=r"tensor 'transformer\.h\.1\.mlp\.c_proj\.bias' is missing"):
        load_hf(folder, max_seq_len=4)
    assert reads[0] == 0
