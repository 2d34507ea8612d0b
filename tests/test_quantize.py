"""polygrad.quantize and load_hf(dtype="q8_0" | "q4_0"): weight-only round-to-nearest in llama.cpp's block formats.

- The blocks are byte for byte what the `gguf` package's quantizer writes (random rows of many magnitudes,
  all-zero blocks, exact rounding ties, extreme and tiny values), and their lazy dequantization equals
  gguf's dequantizer bit for bit.
- A state dict keeps its quantizable matrices as QuantWeights and everything else as it was; a module's
  Linear and Embedding weights are replaced in place and its forward equals NumPy on gguf's dequantized
  weights; a Model built from it captures, saves uint8 buffers, loads and runs in Node with the same outputs.
- Bad requests are typed errors that say what to do.
- Tiny GPT-2, Llama and Qwen2 checkpoints built by transformers, loaded at q8_0 and q4_0, give the logits
  of transformers run on gguf's dequantization of the same matrices (1e-5 of the largest); at q8_0 the
  float load's greedy tokens, and logits within Q8_TOL / Q4_TOL of the float load's largest logit.
"""
from __future__ import annotations

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

import polygrad  # noqa: E402
from polygrad import Context, Model, Tensor, bundle, dtypes, nn  # noqa: E402
from polygrad.errors import QuantizationError  # noqa: E402
from polygrad.nn import quant  # noqa: E402
from polygrad.nn.quant import QuantWeight, quantize_rows  # noqa: E402

FORMATS = ("q8_0", "q4_0")
# the tiny random checkpoints' logits against the float load, as a fraction of the largest float logit:
# measured at most 0.015 (q8_0) and 0.24 (q4_0) over GPT-2, Llama and Qwen2 at seeds 0..2 (4-bit blocks
# of near-uniform random weights); against transformers on gguf's dequantized weights they agree to 1e-6
Q8_TOL, Q4_TOL = 0.03, 0.35


def _gguf_type(fmt: str):
    return getattr(gguf.GGMLQuantizationType, fmt.upper())


def _hard_rows(seed: int = 0) -> np.ndarray:
    """(12, 128) float32: magnitudes from 1e-6 to 1e4 per row, then blocks chosen to break a careless quantizer."""
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((12, 128)) * np.exp(rng.uniform(-14, 9, (12, 1)))).astype(np.float32)
    w[0, :32] = 0.0                                             # all zero: scale 0, quants at the zero point
    w[1, :32] = np.arange(32) - 15.5                             # every x / d near a .5 tie at Q8_0's 127 levels
    w[1, 32:64] = (np.arange(32) % 16 - 8) * 0.25                # Q4_0: exact ties on the nibble grid
    w[2, :32] = 65504.0                                          # float16's largest scale
    w[2, 32:64] = -3e4
    w[2, 40] = 3e4                                               # |max| tie between signs: the first one wins
    w[3, :32] = 1e-30                                            # the scale underflows float16
    w[3, 32:64] = 0.0
    w[3, 50] = -2.5                                              # one nonzero value in the block
    w[4, :32] = 127.0 * (np.arange(32) / 31.0 - 0.5) * 2         # integer-ish grid
    return w


@pytest.mark.parametrize("chunk", [None, 5 * 128])
@pytest.mark.parametrize("fmt", FORMATS)
def test_blocks_are_byte_identical_to_gguf(fmt, chunk, monkeypatch):
    """Whole, and rounded a few rows at a time (quantize_rows' QUANTIZE_CHUNK: 5 of the 12 rows, the last
    chunk short), from a C-contiguous array and from a transposed view."""
    if chunk is not None:
        monkeypatch.setattr(quant, "QUANTIZE_CHUNK", chunk)
    for seed in range(3):
        w = _hard_rows(seed) if seed < 2 else np.ascontiguousarray(_hard_rows(seed).T).T
        want = gguf.quants.quantize(w, _gguf_type(fmt))
        got = quantize_rows(w, fmt)
        assert got.dtype == np.uint8 and got.shape == (12, 4, want.shape[1] // 4)
        assert np.array_equal(got.reshape(want.shape), want), np.argwhere(got.reshape(want.shape) != want)[:5]


@pytest.mark.parametrize("fmt", FORMATS)
def test_dequantize_equals_gguf_bit_for_bit(fmt):
    w = _hard_rows(1)[4:]  # no float16-overflowing scales: gguf's inf * 0 and ours would both be NaN
    qw = QuantWeight.from_float(Tensor(w), fmt)
    want = gguf.quants.dequantize(gguf.quants.quantize(w, _gguf_type(fmt)), _gguf_type(fmt))
    assert np.array_equal(qw.dequantize().numpy().view(np.uint32), want.astype(np.float32).view(np.uint32))


def test_state_dict_keeps_only_quantizable_matrices():
    rng = np.random.default_rng(0)
    state = {"w": Tensor(rng.standard_normal((16, 64)).astype(np.float32)),
             "b": Tensor(rng.standard_normal(16).astype(np.float32)),
             "odd": Tensor(rng.standard_normal((4, 40)).astype(np.float32)),
             "ids": Tensor(np.arange(64, dtype=np.int32).reshape(2, 32)),
             "half": Tensor(rng.standard_normal((2, 32)).astype(np.float16))}
    out = polygrad.quantize(state, "Q4_0")
    assert out is not state and set(out) == set(state)
    assert isinstance(out["w"], QuantWeight) and out["w"].format == "Q4_0" and out["w"].blocks.dtype is dtypes.uint8
    assert isinstance(out["half"], QuantWeight)  # a float16 weight is quantized from its float values
    for k in ("b", "odd", "ids"):
        assert out[k] is state[k]
    want = gguf.quants.quantize(state["w"].numpy(), _gguf_type("q4_0"))
    assert np.array_equal(out["w"].blocks.numpy().reshape(want.shape), want)
    only = polygrad.quantize(state, "q8_0", names=["half"])
    assert isinstance(only["half"], QuantWeight) and only["w"] is state["w"]


@pytest.mark.parametrize("request_, match", [
    (dict(fmt="q3_z"), "unknown quantization format 'q3_z'.*'q8_0', 'q4_0'"),
    (dict(fmt="q4_k", names=["w"]), "'w' cannot be quantized to q4_k: its rows hold 64 values.*multiple of 256"),
    (dict(names=["odd"]), "'odd' cannot be quantized to q8_0: its rows hold 40 values.*multiple of 32"),
    (dict(names=["ids"]), "'ids' .*int32 values, not floats"),
    (dict(names=["b"]), "'b' .*shape \\[16\\]; only matrices"),
    (dict(names=["nope"]), "asks for \\['nope'\\], which are not in the state dict"),
    (dict(names="w"), "names= takes a list"),
])
def test_bad_requests_are_typed_errors(request_, match):
    state = {"w": Tensor.ones(16, 64), "b": Tensor.ones(16), "odd": Tensor.ones(4, 40),
             "ids": Tensor(np.zeros((2, 32), np.int32))}
    with pytest.raises(QuantizationError, match=match):
        polygrad.quantize(state, request_.get("fmt", "q8_0"), names=request_.get("names"))


class TinyNet:
    """An embedding, two projections (the second sharing the embedding's table: tied), and a 40-wide layer
    that stays float."""

    def __init__(self):
        self.embed = nn.Embedding(61, 64)
        self.layers = [nn.Linear(64, 96), nn.Linear(96, 64)]
        self.side = nn.Linear(40, 8)
        self.head = nn.Linear(64, 61, bias=False)
        self.head.weight = self.embed.weight

    def __call__(self, ids):
        h = self.layers[1](self.layers[0](self.embed(ids)).relu())
        return {"logits": self.head(h), "side": self.side(h[..., :40])}


def _reference(net_float: dict[str, np.ndarray], fmt: str, ids: np.ndarray) -> dict[str, np.ndarray]:
    """NumPy forward in float64 on gguf's dequantized weights (the 40-wide layer as float)."""
    def deq(w):
        t = _gguf_type(fmt)
        return gguf.quants.dequantize(gguf.quants.quantize(w, t), t).astype(np.float64)
    table = deq(net_float["embed.weight"])
    h = table[ids]
    h = np.maximum(h @ deq(net_float["layers.0.weight"]).T + net_float["layers.0.bias"], 0)
    h = h @ deq(net_float["layers.1.weight"]).T + net_float["layers.1.bias"]
    side = h[..., :40] @ net_float["side.weight"].astype(np.float64).T + net_float["side.bias"]
    return {"logits": h @ table.T, "side": side}


def _close(got, want, rtol=1e-5):
    scale = float(np.abs(want).max())
    err = float(np.abs(np.asarray(got, np.float64) - want).max())
    assert err <= rtol * scale, f"max error {err:.3g} > {rtol} x {scale:.3g}"


@pytest.fixture(scope="module")
def quantized_nets():
    """{fmt: (net quantized in place, its float weights before, ids)}."""
    out = {}
    ids = np.array([[1, 5, 60, 0, 33], [7, 7, 2, 59, 11]], np.int32)
    for fmt in FORMATS:
        Tensor.manual_seed(3)
        net = TinyNet()
        before = {k: v.numpy() for k, v in nn.state.get_state_dict(net).items()}
        assert polygrad.quantize(net, fmt) is net
        out[fmt] = (net, before, ids)
    return out


@pytest.mark.parametrize("fmt", FORMATS)
def test_module_weights_replaced_in_place_and_forward_matches_numpy(quantized_nets, fmt):
    net, before, ids = quantized_nets[fmt]
    assert isinstance(net.embed.weight, QuantWeight) and net.head.weight is net.embed.weight  # tied stays tied
    assert all(isinstance(layer.weight, QuantWeight) for layer in net.layers)
    assert isinstance(net.side.weight, Tensor) and isinstance(net.layers[0].bias, Tensor)  # 40 wide; biases
    with Context(POLY_INT8_DOT=0):  # the float path (a prompt's 8-bit activations: tests/test_int8_gemm.py)
        got = {k: v.numpy() for k, v in net(Tensor(ids)).items()}
    want = _reference(before, fmt, ids)
    for k in want:
        _close(got[k], want[k])


@pytest.mark.parametrize("fmt", FORMATS)
def test_model_of_a_quantized_module_saves_blocks_and_runs_in_node(quantized_nets, fmt, tmp_path):
    net, before, ids = quantized_nets[fmt]
    want = _reference(before, fmt, ids)
    with Context(POLY_INT8_DOT=0):  # captured on the float path (a prompt's 8-bit activations: test_int8_gemm.py)
        model = Model(net, inputs={"ids": Tensor.empty(2, 5, dtype=dtypes.int32)})
        outs = {k: v.numpy() for k, v in model.forward(ids=ids).items()}
    try:
        for k, v in outs.items():
            _close(v, want[k])
        summary = model.summary()  # the blocks are not trained: "state" buffers, stored in the bundle
        kinds = {p["name"]: p["dtype"] for p in summary.parameters + summary.state}
        assert kinds["embed.weight.blocks"] == kinds["layers.0.weight.blocks"] == "uint8", kinds
        assert kinds["side.weight"] == "float32" and "head.weight.blocks" not in kinds  # tied: stored once
        with pytest.raises(QuantizationError, match="Quantize the module first, then build the Model"):
            polygrad.quantize(model, fmt)
        data = model.save()
    finally:
        model.dispose()
    manifest, _ = bundle.read(data)
    assert {b["dtype"] for b in manifest["buffers"] if b["name"].endswith(".blocks")} == {"uint8"}
    loaded = Model.load(data)
    try:
        for k, v in loaded.forward(ids=ids).items():
            _close(v.numpy(), want[k])
    finally:
        loaded.dispose()
    from test_js import forward_in_node
    for out in forward_in_node(data, {"ids": ids}, tmp_path).values():
        for k in want:
            _close(out[k], want[k])


def test_quantized_parameters_take_the_block_bytes():
    """Parameter and state bytes of a Model over the quantized module against the float one: 34/128 (Q8_0) and 18/128
    (Q4_0) of float32 for the quantized matrices, plus the float biases and the 40-wide layer."""
    sizes = {}
    for fmt in (None, *FORMATS):
        Tensor.manual_seed(0)
        net = TinyNet()
        if fmt:
            polygrad.quantize(net, fmt)
        model = Model(net, inputs={"ids": Tensor.empty(1, 3, dtype=dtypes.int32)})
        nbytes = model.summary().bytes
        sizes[fmt] = nbytes["parameter"] + nbytes["state"]
        model.dispose()
    quantized = 61 * 64 + 64 * 96 + 96 * 64  # embedding (tied head), the two projections
    rest = sizes[None] - 4 * quantized
    assert sizes["q8_0"] == rest + quantized // 32 * 34
    assert sizes["q4_0"] == rest + quantized // 32 * 18


# ---------------------------------------------------------------- load_hf(dtype="q8_0" | "q4_0")
@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """{kind: (transformers model, safetensors folder)} of tiny random GPT-2, Llama (GQA, untied) and Qwen2."""
    pytest.importorskip("transformers")
    pytest.importorskip("torch")
    import hf_checkpoints as hc
    root = tmp_path_factory.mktemp("quantize_hf")
    return {kind: hc.make(kind, root / kind) for kind in ("gpt2", "llama", "qwen2")}


def _torch_on_dequantized(ref, kind: str, fmt: str, ids: np.ndarray) -> np.ndarray:
    """transformers' logits with every matrix replaced by gguf's dequantization of its Q8_0/Q4_0 blocks, taken
    along the input features (GPT-2's Conv1D layers store (in, out): their blocks run along the transpose)."""
    import copy

    import hf_checkpoints as hc
    import torch
    model, qtype = copy.deepcopy(ref), _gguf_type(fmt)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim != 2:
                continue
            conv1d = kind == "gpt2" and ".h." in name
            rows = np.ascontiguousarray(p.numpy().T if conv1d else p.numpy())
            values = gguf.quants.dequantize(gguf.quants.quantize(rows, qtype), qtype).reshape(rows.shape)
            p.copy_(torch.from_numpy(np.ascontiguousarray(values.T if conv1d else values)))
    return hc.logits(model, ids)


def _steps(model, ids, steps=3):
    """forward's logits, then `steps` decode steps' logits."""
    out = [model.forward(input_ids=ids)["logits"].numpy()]
    for k in range(steps):
        nxt = np.array([[(7 * k + 3) % 61]], np.int32)
        out.append(model.call("decode", {"input_ids": nxt, "pos": ids.shape[1] + k})["logits"].numpy())
    return out


@pytest.mark.parametrize("kind", ["gpt2", "llama", "qwen2"])
def test_load_hf_quantizes_safetensors_at_load(checkpoints, kind):
    from polygrad.hf import generate, load_hf
    ref, folder = checkpoints[kind]
    ids = np.random.default_rng(1).integers(0, 61, (1, 5)).astype(np.int32)
    floats = load_hf(folder, max_seq_len=24)
    # the float path: with 8-bit activations (POLY_INT8_DOT, on a CPU with VNNI) the tiny llama's 8th greedy
    # token flips and a prompt's logits move by the rounding (tests/test_int8_dot.py and test_int8_gemm.py
    # bound that route's error instead)
    with Context(POLY_INT8_DOT=0):
        q8 = load_hf(folder, max_seq_len=24, dtype="q8_0")
        q4 = load_hf(folder, max_seq_len=24, dtype="q4_0")
    try:
        assert any("quantized (Q8_0" in n for n in q8.hf_notes), q8.hf_notes
        # the blocks in the Model are gguf's quantization of the checkpoint's matrix, in llama.cpp's (out, in)
        # (a Llama's q, k and v rows one after the other: joined at load into qkv_proj)
        name = "transformer.h.0.attn.c_attn.weight" if kind == "gpt2" else "model.layers.0.self_attn.qkv_proj.weight"
        sd = {k: v.detach().numpy() for k, v in ref.state_dict().items()}
        by_rows = sd[name].T if kind == "gpt2" else \
            np.concatenate([sd[f"model.layers.0.self_attn.{p}_proj.weight"] for p in "qkv"])  # Conv1D: (in, out)
        blocks = q8.parameters()[name].numpy()
        want = gguf.quants.quantize(np.ascontiguousarray(by_rows), _gguf_type("q8_0"))
        assert blocks.dtype == np.uint8 and np.array_equal(blocks.reshape(want.shape), want)
        assert {s.dtype for s in q4._p.slots if s.name == name} == {dtypes.uint8}
        want_tokens = generate(floats, ids, max_new_tokens=8, top_k=1).tolist()
        assert generate(q8, ids, max_new_tokens=8, top_k=1).tolist() == want_tokens
        float_steps = _steps(floats, ids)
        for model, fmt, tol in ((q8, "q8_0", Q8_TOL), (q4, "q4_0", Q4_TOL)):
            steps = _steps(model, ids)
            _close(steps[0], _torch_on_dequantized(ref, kind, fmt, ids))
            for got, want in zip(steps, float_steps):
                _close(got, want, tol)
    finally:
        for m in (floats, q8, q4):
            m.dispose()


def test_load_hf_names_the_formats(checkpoints):
    from polygrad.hf import HFError, load_hf
    with pytest.raises(HFError, match="quantized at load to one of \\['q8_0', 'q4_0', 'q4_1', .*'q4_k'"):
        load_hf(checkpoints["gpt2"][1], max_seq_len=8, dtype="q3_k")


def test_load_hf_q8_0_of_gguf_keeps_or_requantizes(checkpoints, tmp_path):
    """A GGUF file's Q8_0 blocks are kept as stored; an F32 GGUF file is quantized as the safetensors folder is
    (llama.cpp's q/k row order undone first): the same bytes in every block buffer (the rope tables differ
    by an ulp: the GGUF's llama3 factors are stored, not recomputed)."""
    import hf_checkpoints as hc
    from polygrad.hf import load_hf
    ref, folder = checkpoints["llama"]
    for qtype in ("Q8_0", "F32"):
        path = tmp_path / f"llama-{qtype}.gguf"
        hc.write_gguf(ref, path, qtype)
        pairs = [load_hf(path, max_seq_len=8, dtype="q8_0"),
                 load_hf(path if qtype == "Q8_0" else folder, max_seq_len=8,
                         dtype="quantized" if qtype == "Q8_0" else "q8_0")]
        try:
            got, want = (m.parameters() for m in pairs)
            assert set(got) == set(want)
            # 7 per layer (a Q8_0 file's q/k/v and gate/up joined at load: 4), embeddings, head
            assert sum(t.dtype is dtypes.uint8 for t in got.values()) >= 4 * 2 + 2
            for name in (n for n, t in got.items() if t.dtype is dtypes.uint8):
                assert np.array_equal(got[name].numpy(), want[name].numpy()), (qtype, name)
        finally:
            for m in pairs:
                m.dispose()
