"""Cross-language tests of bundle format 2: KV-cache models saved by Python run in Node (polygrad-js).

A tiny GPT-2 made with transformers, loaded with polygrad.hf.load_hf and saved to a .pgb (version 2: `cache`
buffers, a `decode` entrypoint taking the Variable `pos` as an int, `input_ids[1, tokens]` with a Variable in
its second dimension) must give Python's logits in Node, for the prompt and for each decode step after it
(the caches persist between calls), within 1e-5 relative; a fresh load starts from zeroed caches; greedy
generation picks the same tokens; what Node saves loads in Python with the same results. A one-layer
attention with caches and two Variable dimensions (`x[batch, tokens, D]`, tests/test_model_decode.py) covers
a Variable batch. Skipped without `node`.
"""
from __future__ import annotations

import numpy as np
import pytest

from polygrad import Context, Model, bundle
from test_js import NODE, close, dec, enc, run_node

pytestmark = pytest.mark.skipif(NODE is None, reason="node is not installed")

PROMPT = np.array([[1, 5, 2, 9, 3]], np.int32)
NEXT = [7, 11, 3]  # tokens fed to decode after the prompt, at positions 5, 6, 7
GREEDY = 6


def _decode_inputs(tokens: list[int], start: int) -> list[dict]:
    return [{"input_ids": np.array([[t]], np.int32), "pos": start + i} for i, t in enumerate(tokens)]


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory):
    pytest.importorskip("transformers")
    pytest.importorskip("polygrad_hf")
    import hf_checkpoints
    from polygrad.hf import generate, load_hf
    tmp = tmp_path_factory.mktemp("gpt2")
    hf, folder = hf_checkpoints.make("gpt2", tmp / "ckpt")
    model = load_hf(folder, max_batch=1, max_seq_len=16)
    path = tmp / "gpt2.pgb"
    model.save(str(path))
    py = {"forward": model.forward(input_ids=PROMPT)["logits"].numpy()}
    py["decode"] = [model.call("decode", d)["logits"].numpy() for d in _decode_inputs(NEXT, PROMPT.shape[1])]
    py["greedy"] = generate(model, PROMPT[0], max_new_tokens=GREEDY, top_k=1).tolist()
    py["torch"] = hf_checkpoints.logits(hf, PROMPT)
    model.dispose()
    fresh = Model.load(str(path))
    py["fresh"] = fresh.call("decode", {"input_ids": np.array([[4]], np.int32), "pos": 3})["logits"].numpy()
    fresh.dispose()

    def steps(tokens: list[int], start: int) -> list[dict]:
        return [{"entry": "decode", "inputs": {"input_ids": enc(d["input_ids"])}, "args": {"pos": d["pos"]}}
                for d in _decode_inputs(tokens, start)]

    cases = []
    prompt = {"entry": "forward", "inputs": {"input_ids": enc(PROMPT)}}
    for backend in ("wasm", "js"):
        cases.append({"name": backend, "bundle": str(path), "backend": backend,
                      "calls": [prompt, *steps(NEXT, PROMPT.shape[1])],
                      **({"save": str(tmp / "from_js.pgb"), "plan": True} if backend == "wasm" else {})})
    cases.append({"name": "fresh", "bundle": str(path), "calls": steps([4], 3)})
    cases.append({"name": "greedy", "bundle": str(path), "greedy": {"prompt": enc(PROMPT), "steps": GREEDY}})
    return py, run_node(cases, tmp), tmp


@pytest.mark.parametrize("backend", ["wasm", "js"])
def test_gpt2_bundle_runs_in_node_with_the_same_logits(gpt2, backend):
    py, js, _ = gpt2
    res = js[backend]
    assert "error" not in res, res.get("error")
    logits = dec(res["calls"][0]["logits"])
    assert logits.shape == (1, PROMPT.shape[1], 61)
    close(logits, py["forward"])
    close(logits, py["torch"], rtol=1e-4)  # and transformers itself, at the HF tests' tolerance
    assert len(res["calls"]) == 1 + len(NEXT)
    for got, want in zip(res["calls"][1:], py["decode"]):  # each step reads the cache the earlier ones wrote
        assert dec(got["logits"]).shape == (1, 1, 61)
        close(dec(got["logits"]), want)
    if backend == "wasm":
        assert res["stats"]["checks"] == 0, "every access of these kernels should be proven in bounds"


@pytest.mark.parametrize("entry", ["decode", "forward"])
def test_matrix_products_get_lanes_and_read_x_at_w_weights_packed(gpt2, entry):
    """Decode (one row) and the prompt read each weight matrix across its rows (x @ W, GPT-2's Conv1D layout):
    every kernel that multiplies by one gets lanes and a tile, and reads a copy packed in its loop order
    (polygrad-js runtime.js packedMain; one copy per weight, shared by both entrypoints, made once on the second
    call); the head, x @ wte.T, reads its rows contiguously already and packs nothing."""
    _, js, _ = gpt2
    res = js["wasm"]
    assert "error" not in res, res.get("error")
    steps = res["plan"][entry]
    matrices = [s for s in steps if any(len(p["shape"]) == 2 and "wte" not in p["name"] and "wpe" not in p["name"]
                                        for p in s["params"])]
    assert len(matrices) == 4 * 2, [s["name"] for s in steps]  # c_attn, attn c_proj, c_fc, mlp c_proj per layer
    for s in matrices:
        assert any(o.startswith("VECTOR:4") for o in s["opts"]) and any(o.startswith("UPCAST") for o in s["opts"]), s
        assert s["packs"] == 1, s
    head = [s for s in steps if any("wte" in p["name"] for p in s["params"]) and s["name"].startswith("r_")]
    assert len(head) == 1 and "SPLIT_REDUCE:4" in head[0]["opts"] and head[0]["packs"] == 0, head
    assert res["stats"]["repacks"] == len(matrices)  # one forward, 3 decode steps: each copy filled once


def test_a_loaded_bundle_starts_with_zeroed_caches(gpt2):
    py, js, _ = gpt2
    assert "error" not in js["fresh"], js["fresh"].get("error")
    close(dec(js["fresh"]["calls"][0]["logits"]), py["fresh"])


def test_greedy_generation_in_node_picks_python_tokens(gpt2):
    py, js, _ = gpt2
    assert "error" not in js["greedy"], js["greedy"].get("error")
    assert js["greedy"]["tokens"] == py["greedy"]


def test_node_writes_a_version_2_bundle_python_reads(gpt2):
    py, _, tmp = gpt2
    raw = (tmp / "from_js.pgb").read_bytes()
    assert int.from_bytes(raw[8:12], "little") == 2
    manifest, _ = bundle.read(raw)
    assert manifest["entrypoints"]["decode"]["arguments"] == ["pos"]
    assert all("data" not in b or b["data"] is None for b in manifest["buffers"] if b["role"] == "cache")
    m = Model.load(raw)
    try:
        close(m.forward(input_ids=PROMPT)["logits"].numpy(), py["forward"])
        for d, want in zip(_decode_inputs(NEXT, PROMPT.shape[1]), py["decode"]):
            close(m.call("decode", d)["logits"].numpy(), want)
    finally:
        m.dispose()


# ---------------------------------------------------------------- a Variable batch and sequence
def test_cache_attention_with_two_variable_dimensions(tmp_path):
    from test_model_decode import _ATT, B, D, _model
    model = _model(_ATT)
    path = tmp_path / "attention.pgb"
    model.save(str(path))
    x = np.random.default_rng(3).standard_normal((B, 6, D)).astype(np.float32)
    want = [model.forward(x=x[:, :3])["y"].numpy()]
    want += [model.call("decode", {"x": x[:, p:p + 1], "pos": p})["y"].numpy() for p in range(3, 6)]
    one = model.forward(x=x[:1, :4])["y"].numpy()  # a smaller batch and prompt reuse the same buffers
    model.dispose()
    calls = [{"entry": "forward", "inputs": {"x": enc(x[:, :3])}}]
    calls += [{"entry": "decode", "inputs": {"x": enc(x[:, p:p + 1])}, "args": {"pos": p}} for p in range(3, 6)]
    calls.append({"entry": "forward", "inputs": {"x": enc(x[:1, :4])}})
    res = run_node([{"name": "att", "bundle": str(path), "calls": calls}], tmp_path)["att"]
    assert "error" not in res, res.get("error")
    for got, ref in zip(res["calls"], want + [one]):
        close(dec(got["y"]), ref)


# ---------------------------------------------------------------- quantized weights (issue 31)
Q_WIDTH = 64  # two 32-weight blocks per row of every matrix: the kernels loop over blocks


@pytest.fixture(scope="module", params=["q8_0", "q4_0"])
def quantized(request, tmp_path_factory):
    """A tiny GPT-2 quantized at load (load_hf(dtype=fmt): every matrix, the tied wte/head and wpe included),
    saved, with Python's logits (prompt, 3 decode steps) and greedy tokens, and Node's run of the bundle."""
    pytest.importorskip("transformers")
    pytest.importorskip("polygrad_hf")
    import hf_checkpoints
    from polygrad.hf import generate, load_hf
    fmt = request.param
    tmp = tmp_path_factory.mktemp(f"gpt2_{fmt}")
    _, folder = hf_checkpoints.make("gpt2", tmp / "ckpt", overrides={"n_embd": Q_WIDTH})
    # the float kernels every machine captures alike: on a CPU with VNNI a Q8_0 or Q4_0 decode would round its
    # activations to 8 bits, where another backend's last-ulp difference can round one the other way (a 1e-2
    # move of the logits, not a 1e-4 one); tests/test_int8_dot.py runs that route's kernels in Node
    with Context(POLY_INT8_DOT=0):
        model = load_hf(folder, max_batch=1, max_seq_len=16, dtype=fmt)
    path = tmp / f"gpt2_{fmt}.pgb"
    model.save(str(path))
    py = {"calls": [model.forward(input_ids=PROMPT)["logits"].numpy()]}
    py["calls"] += [model.call("decode", d)["logits"].numpy() for d in _decode_inputs(NEXT, PROMPT.shape[1])]
    py["greedy"] = generate(model, PROMPT[0], max_new_tokens=GREEDY, top_k=1).tolist()
    model.dispose()
    calls = [{"entry": "forward", "inputs": {"input_ids": enc(PROMPT)}}]
    calls += [{"entry": "decode", "inputs": {"input_ids": enc(d["input_ids"])}, "args": {"pos": d["pos"]}}
              for d in _decode_inputs(NEXT, PROMPT.shape[1])]
    # wasm only: the plain-JS backend has no lanes (tests/test_hf_quantized.py runs a Q4_0 bundle on both)
    cases = [{"name": "wasm", "bundle": str(path), "calls": calls, "plan": True},
             {"name": "greedy", "bundle": str(path), "greedy": {"prompt": enc(PROMPT), "steps": GREEDY}}]
    return fmt, path, py, run_node(cases, tmp)


def test_quantized_gpt2_runs_in_node_with_python_logits(quantized):
    _, _, py, js = quantized
    res = js["wasm"]
    assert "error" not in res, res.get("error")
    for got, want in zip(res["calls"], py["calls"], strict=True):
        close(dec(got["logits"]), want, rtol=1e-4)
    assert js["greedy"]["tokens"] == py["greedy"]


def test_quantized_bundle_holds_blocks_and_no_float_copy(quantized):
    """The bundle stores each matrix once, as its uint8 blocks (34 or 18 bytes per 32 weights): the tied
    embedding/head and wpe too, with no float32 copy beside them; its stored bytes are the blocks plus the
    norms' and biases' float32 (and the causal mask)."""
    fmt, path, _, _ = quantized
    manifest, _ = bundle.read(path.read_bytes())
    stored = [b for b in manifest["buffers"] if b["role"] in ("parameter", "state", "constant")]
    blocks = {b["name"]: b for b in stored if b["dtype"] == "uint8"}
    per_block = {"q8_0": 34, "q4_0": 18}[fmt]
    assert {"transformer.wte.weight", "transformer.wpe.weight"} <= set(blocks)
    assert sum(n.endswith(("c_attn.weight", "c_proj.weight", "c_fc.weight")) for n in blocks) == 4 * 2
    for b in blocks.values():
        assert b["shape"][-1] == per_block and b["shape"][-2] * 32 in (Q_WIDTH, 4 * Q_WIDTH), b
    floats = [b for b in stored if b["dtype"] == "float32"]
    assert all(len(b["shape"]) == 1 or b["name"] == "causal_mask" for b in floats), [b["name"] for b in floats]
    size = lambda b: b["size"] * (1 if b["dtype"] == "uint8" else 4)  # noqa: E731
    block_bytes = sum(size(b) for b in blocks.values())
    float_bytes = sum(size(b) for b in floats)
    assert float_bytes < block_bytes / 2  # biases and norms only: no dequantized matrix
    assert path.stat().st_size < 1.25 * sum(size(b) for b in stored) + 256 * 1024  # the manifest and kernels


def test_quantized_kernels_read_uint8_blocks_in_lanes(quantized):
    """polygrad-js keeps the blocks as uint8 in its memory (no float expansion at load) and every matrix
    product reads them directly, vectorised: the reduction split into 4 lanes; at q4_0 the range of a byte's
    two nibbles unrolled (each byte loaded once for both)."""
    fmt, _, _, js = quantized
    res = js["wasm"]
    assert "error" not in res, res.get("error")
    summary = res["summary"]
    assert {s["dtype"] for s in summary["state"] if s["name"].endswith(".weight")} == {"uint8"}
    block_bytes = sum(s["count"] for s in summary["state"] if s["dtype"] == "uint8")
    dequantized = 4 * 32 * block_bytes // {"q8_0": 34, "q4_0": 18}[fmt]  # their float32 bytes
    others = sum(v for k, v in summary["bytes"].items() if k != "state")
    assert summary["memoryBytes"] < others + summary["bytes"]["state"] + dequantized // 2
    for entry in ("forward", "decode"):
        products = [s for s in res["plan"][entry] if s["blocks"] and s["name"].startswith("r_")]
        names = {n for s in products for n in s["blocks"]}
        assert sum(n.endswith(".weight") and ".h." in n for n in names) == 4 * 2 and "transformer.wte.weight" in names
        for s in products:
            assert "SPLIT_REDUCE:4" in s["opts"] and ("UNROLL:2" in s["opts"]) == (fmt == "q4_0"), s
            # in lanes, Q4_0's `nibble - 8` in int8 too (linearize.js narrowAlu), not the scalar fallback
            assert s["vectorized"], s
            assert s["packs"] == 0, s


# ---------------------------------------------------------------- a Gemma 2 bundle (issue 30)
def test_gemma2_bundle_runs_in_node_with_python_logits(tmp_path):
    """Gemma 2's parts past Llama's in a bundle: soft-capped scores and logits (tanh), the four norms, and the
    sliding-window mask sliced at the Variable positions (the prompt and decode steps pass the window of 4)."""
    pytest.importorskip("transformers")
    pytest.importorskip("polygrad_hf")
    import hf_checkpoints
    from polygrad.hf import load_hf
    ref, folder = hf_checkpoints.make("gemma2", tmp_path / "ckpt")
    model = load_hf(folder, max_batch=1, max_seq_len=16)
    path = tmp_path / "gemma2.pgb"
    model.save(str(path))
    want = [model.forward(input_ids=PROMPT)["logits"].numpy()]
    want += [model.call("decode", d)["logits"].numpy() for d in _decode_inputs(NEXT, PROMPT.shape[1])]
    model.dispose()
    close(want[0], hf_checkpoints.logits(ref, PROMPT), rtol=1e-4)  # and transformers itself
    calls = [{"entry": "forward", "inputs": {"input_ids": enc(PROMPT)}}]
    calls += [{"entry": "decode", "inputs": {"input_ids": enc(d["input_ids"])}, "args": {"pos": d["pos"]}}
              for d in _decode_inputs(NEXT, PROMPT.shape[1])]
    res = run_node([{"name": "gemma2", "bundle": str(path), "calls": calls}], tmp_path)["gemma2"]
    assert "error" not in res, res.get("error")
    for got, ref_logits in zip(res["calls"], want, strict=True):
        close(dec(got["logits"]), ref_logits)
