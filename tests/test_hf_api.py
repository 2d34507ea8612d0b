"""polygrad-hf's user surface: the polygrad.hf shim, download_hf, generate's sampling rules, the tokenizer
helper, and the typed errors for bad folders, files, tensors and arguments (each naming file and tensor).

Sampling is checked against transformers' logits of the sampled sequence (every token drawn with top_k
lies in that step's top k), not against polygrad itself.
"""
from __future__ import annotations

import json
import os
import struct

import numpy as np
import pytest

pytest.importorskip("transformers")
pytest.importorskip("torch")

import hf_checkpoints as hc  # noqa: E402

import polygrad.hf as hf  # noqa: E402
from polygrad.hf import CheckpointError, HFError, MissingDependencyError, UnsupportedModelError  # noqa: E402
from polygrad.hf import generate, load_hf  # noqa: E402


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory):
    """(transformers model, folder with a tokenizer.json, loaded Model with max_batch 2)."""
    folder = tmp_path_factory.mktemp("gpt2")
    ref, path = hc.make("gpt2", folder)
    tokenizers = pytest.importorskip("tokenizers")
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel({f"w{i}": i for i in range(hc.VOCAB)}, unk_token="w0"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tok.save(str(folder / "tokenizer.json"))
    model = load_hf(path, max_batch=2, max_seq_len=24)
    yield ref, path, model
    model.dispose()


# ---------------------------------------------------------------------------------------------------
# packaging and download


def test_polygrad_hf_without_the_distribution_names_the_pip_line(run_python):
    p = run_python("""
        import sys
        sys.modules["polygrad_hf"] = None  # as if polygrad-hf were not installed
        try:
            import polygrad.hf
        except ImportError as e:
            print("ERROR", e)
    """)
    assert "pip install polygrad-hf" in p.stdout, p.stdout + p.stderr


def test_polygrad_hf_is_polygrad_hf():
    import polygrad_hf
    assert hf.load_hf is polygrad_hf.load_hf and set(polygrad_hf.__all__) <= set(dir(hf))


def test_download_hf_is_snapshot_download(monkeypatch, tmp_path):
    hub = pytest.importorskip("huggingface_hub")
    calls = []
    monkeypatch.setattr(hub, "snapshot_download", lambda repo_id, **kw: calls.append((repo_id, kw)) or str(tmp_path))
    assert hf.download_hf("org/tiny", revision="main", cache_dir=str(tmp_path)) == str(tmp_path)
    repo, kw = calls[0]
    assert repo == "org/tiny" and kw["revision"] == "main" and kw["cache_dir"] == str(tmp_path)
    assert {"*.json", "*.safetensors"} <= set(kw["allow_patterns"]) and "*.bin" not in kw["allow_patterns"]
    hf.download_hf("org/gguf", allow_patterns=["*Q8_0.gguf"])
    assert calls[1][1]["allow_patterns"] == ["*Q8_0.gguf"]
    assert hf.download_hf(tmp_path) == str(tmp_path) and len(calls) == 2  # a local folder passes through
    monkeypatch.setitem(__import__("sys").modules, "huggingface_hub", None)
    with pytest.raises(MissingDependencyError, match="pip install huggingface_hub"):
        hf.download_hf("org/other")


# ---------------------------------------------------------------------------------------------------
# generate


def test_seeded_sampling_is_reproducible_and_respects_top_k(gpt2):
    ref, _, model = gpt2
    ids = np.array([[3, 1, 4, 1], [5, 9, 2, 6]], np.int32)
    a = generate(model, ids, max_new_tokens=8, temperature=1.5, top_k=3, seed=11)
    b = generate(model, ids, max_new_tokens=8, temperature=1.5, top_k=3, seed=11)
    c = generate(model, ids, max_new_tokens=8, temperature=1.5, top_k=3, seed=12)
    assert a.shape == (2, 12) and a.tolist() == b.tolist() and a.tolist() != c.tolist()
    assert (a[:, :4] == ids).all()
    logits = hc.logits(ref, a)  # transformers' view of the sampled sequences
    for step in range(4, 12):
        top3 = np.argsort(-logits[:, step - 1], axis=-1)[:, :3]
        assert all(a[r, step] in top3[r] for r in range(2)), step


def test_greedy_forms_agree(gpt2):
    ref, _, model = gpt2
    ids = np.array([[7, 8, 9]], np.int32)
    want = hc.greedy(ref, ids, 6).tolist()
    assert generate(model, ids, max_new_tokens=6, top_k=1, temperature=0.7).tolist() == want
    assert generate(model, ids, max_new_tokens=6, temperature=0).tolist() == want
    assert generate(model, ids, max_new_tokens=6, top_p=1e-9, seed=3).tolist() == want  # nucleus of one token
    assert generate(model, ids, max_new_tokens=0).tolist() == ids.tolist()


def test_eos_stops_a_row_and_pads_it(gpt2):
    ref, _, model = gpt2
    ids = np.array([[7, 8, 9], [1, 2, 3]], np.int32)
    free = hc.greedy(ref, ids, 6)
    eos = int(free[0, 5])  # the third token row 0 produces
    got = generate(model, ids, max_new_tokens=6, top_k=1, eos_token_id=[eos])
    first = list(free[0, 3:]).index(eos)
    assert got[0, :4 + first].tolist() == free[0, :4 + first].tolist()
    assert (got[0, 3 + first:] == eos).all()
    row1 = list(free[1, 3:])
    stop1 = row1.index(eos) if eos in row1 else len(row1) - 1
    assert got.shape[1] == 3 + 1 + max(first, stop1)  # generation ends when every row stopped
    assert got[1, :4 + stop1].tolist() == free[1, :4 + stop1].tolist()


def test_text_in_text_out_with_the_folders_tokenizer(gpt2):
    ref, path, model = gpt2
    tok = hf.load_tokenizer(path)
    assert tok.encode("w3 w1 w4") == [3, 1, 4] and tok.decode([3, 1, 4]) == "w3 w1 w4"
    text = generate(model, "w3 w1 w4", max_new_tokens=5, top_k=1)
    want = hc.greedy(ref, np.array([[3, 1, 4]]), 5)[0]
    assert text == " ".join(f"w{i}" for i in want)


def test_generate_rejects_what_it_cannot_do(gpt2):
    _, _, model = gpt2
    ids = np.array([[1, 2]], np.int32)
    with pytest.raises(HFError, match="max_seq_len=30"):
        generate(model, ids, max_new_tokens=28)
    with pytest.raises(HFError, match="max_batch=3"):
        generate(model, np.ones((3, 2), np.int32), max_new_tokens=1)
    for bad in (dict(top_k=0), dict(top_p=1.5), dict(temperature=-1), dict(max_new_tokens=-1)):
        with pytest.raises(HFError):
            generate(model, ids, **{"max_new_tokens": 1, **bad})
    with pytest.raises(HFError, match="integers"):
        generate(model, np.ones((1, 2), np.float32), max_new_tokens=1)

    class NotAnLM:
        entrypoints = ["forward"]
    with pytest.raises(HFError, match="'decode'"):
        generate(NotAnLM(), ids)


# ---------------------------------------------------------------------------------------------------
# errors name the file and the tensor


def _gpt2_folder(tmp_path, tensors=None, **cfg):
    ref = hc.hf_model("gpt2")
    ref.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config.update(cfg)
    (tmp_path / "config.json").write_text(json.dumps(config))
    return tmp_path


def test_unsupported_architecture_and_rope(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert", "architectures": ["BertModel"]}))
    (tmp_path / "model.safetensors").write_bytes(struct.pack("<Q", 2) + b"{}")
    with pytest.raises(UnsupportedModelError, match=r"config\.json.*'bert'"):
        load_hf(tmp_path)
    cfg = {"model_type": "llama", "hidden_size": 32, "num_attention_heads": 4, "num_hidden_layers": 1,
           "intermediate_size": 64, "vocab_size": 10, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UnsupportedModelError, match="'yarn'"):
        load_hf(tmp_path)


def test_missing_tensor_and_wrong_shape_name_file_and_tensor(tmp_path):
    from safetensors.numpy import load_file, save_file
    folder = _gpt2_folder(tmp_path)
    weights = load_file(folder / "model.safetensors")
    del weights["transformer.h.1.mlp.c_fc.bias"]
    save_file(weights, folder / "model.safetensors")
    with pytest.raises(CheckpointError, match=r"model\.safetensors: tensor 'transformer\.h\.1\.mlp\.c_fc\.bias' is "
                                              "missing"):
        load_hf(folder)
    weights["transformer.h.1.mlp.c_fc.bias"] = np.zeros(7, np.float32)
    save_file(weights, folder / "model.safetensors")
    with pytest.raises(CheckpointError, match=r"model\.safetensors: tensor 'transformer\.h\.1\.mlp\.c_fc\.bias' has "
                                              r"shape \[7\]"):
        load_hf(folder)


def test_corrupt_files_are_named(tmp_path):
    folder = _gpt2_folder(tmp_path)
    data = (folder / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(data[:len(data) // 2])
    with pytest.raises(CheckpointError, match=r"model\.safetensors: cannot read safetensors.*truncated"):
        load_hf(folder)
    (folder / "model.safetensors").write_bytes(data)
    (folder / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match=r"config\.json: not valid JSON"):
        load_hf(folder)
    os.remove(folder / "config.json")
    with pytest.raises(CheckpointError, match="config.json is missing"):
        load_hf(folder)
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + os.urandom(64))
    pytest.importorskip("gguf")
    with pytest.raises(CheckpointError, match=r"bad\.gguf: not a readable GGUF file"):
        load_hf(bad)
    with pytest.raises(CheckpointError, match="no such file"):
        load_hf(tmp_path / "nowhere")


def test_sharded_index_naming_a_missing_shard(tmp_path):
    ref = hc.hf_model("qwen2")
    ref.save_pretrained(tmp_path, max_shard_size="20KB")
    shard = sorted(tmp_path.glob("model-*.safetensors"))[-1]
    os.remove(shard)
    with pytest.raises(CheckpointError, match=rf"index\.json: shard '{shard.name}'.* is missing"):
        load_hf(tmp_path)


def test_gguf_tensor_types_outside_the_supported_set(tmp_path):
    gguf = pytest.importorskip("gguf")
    path = tmp_path / "q2k.gguf"
    w = gguf.GGUFWriter(str(path), "qwen2")
    for key, v in (("embedding_length", 32), ("block_count", 1), ("feed_forward_length", 64), ("context_length", 64),
                   ("attention.head_count", 4), ("attention.layer_norm_rms_epsilon", 1e-6)):
        (w.add_float32 if isinstance(v, float) else w.add_uint32)(f"qwen2.{key}", v)
    # Q2_K: a block format polygrad does not keep (Q4_1, used here before, is kept since the K-quants)
    w.add_tensor("token_embd.weight", np.zeros((8, 84), np.uint8), raw_dtype=gguf.GGMLQuantizationType.Q2_K)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(UnsupportedModelError, match=r"q2k\.gguf: tensor 'token_embd\.weight' is Q2_K"):
        load_hf(path)


def test_bad_bounds_and_dtype(gpt2):
    _, path, _ = gpt2
    with pytest.raises(HFError, match="context is 64"):
        load_hf(path, max_seq_len=65)
    with pytest.raises(HFError, match="max_batch"):
        load_hf(path, max_batch=0)
    with pytest.raises(HFError, match="float16"):
        load_hf(path, dtype="int8")
