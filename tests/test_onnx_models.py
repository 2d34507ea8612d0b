"""polygrad.onnx.load on real architectures: ResNet-18, MobileNetV2, a BERT encoder and a GPT-2 decoder.

The vision models are tests/torch_arch.py's (torchvision's layers, 1000 classes, random weights and
BatchNorm statistics), exported by torch.onnx.export with a symbolic batch; the text models are
transformers' BertModel and GPT2LMHeadModel with tiny configs (2 layers, hidden 64, 4 heads, vocabulary
100, random weights), exported with a symbolic batch and sequence and an attention mask (GPT-2 without a
KV cache). Each loaded Model must match onnxruntime within 1e-4 relative on CPU and INTERP for two sizes
of its symbolic dimensions (one compiled model serves both), and its .pgb bundle must match in Node.
The inputs are small (64x64 images, sequences up to 16) so each test takes seconds. Skipped without onnx,
onnxruntime, torch or (for the text models) transformers.
"""
from __future__ import annotations

import functools
import io
import warnings

import numpy as np
import pytest

import polygrad
from polygrad import Model

onnx = pytest.importorskip("onnx", reason="polygrad.onnx tests need the onnx package")
ort = pytest.importorskip("onnxruntime", reason="the reference outputs come from onnxruntime")
torch = pytest.importorskip("torch", reason="the models are exported by torch.onnx")

import polygrad.onnx as pgo  # noqa: E402
import torch_arch  # noqa: E402
from test_js import NODE, close, dec, enc, run_node  # noqa: E402

DEVICES = ["CPU", "INTERP"]
VISION = ["resnet18", "mobilenet_v2"]
TEXT = ["bert", "gpt2"]
VOCAB, POSITIONS = 100, 32
BOUNDS = {"max_batch": 4, "seq": 16}  # seq <= POSITIONS: the position table is sliced by the sequence length


class BertOutputs(torch.nn.Module):
    """BertModel called with keywords (its positional order changed across transformers versions)."""

    def __init__(self, bert):
        super().__init__()
        self.bert = bert

    def forward(self, input_ids, attention_mask):
        out = self.bert(input_ids=input_ids, attention_mask=attention_mask)
        return out.last_hidden_state, out.pooler_output


class GPT2Logits(torch.nn.Module):
    """GPT2LMHeadModel's logits. The attention mask is passed so that transformers builds the causal mask
    from it (without one it looks for packed sequences with aten::diff, which torch.onnx cannot export)."""

    def __init__(self, gpt2):
        super().__init__()
        self.gpt2 = gpt2

    def forward(self, input_ids, attention_mask):
        return self.gpt2(input_ids=input_ids, attention_mask=attention_mask).logits


def _bert():
    transformers = pytest.importorskip("transformers", reason="the BERT encoder comes from transformers")
    config = transformers.BertConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=128, max_position_embeddings=POSITIONS,
                                     attn_implementation="eager")
    return BertOutputs(transformers.BertModel(config)).eval(), ["last_hidden_state", "pooler_output"]


def _gpt2():
    transformers = pytest.importorskip("transformers", reason="the GPT-2 decoder comes from transformers")
    config = transformers.GPT2Config(vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, n_positions=POSITIONS,
                                     use_cache=False, attn_implementation="eager")
    return GPT2Logits(transformers.GPT2LMHeadModel(config)).eval(), ["logits"]


def _feeds(name: str, batch: int, size: int, seed: int) -> dict[str, np.ndarray]:
    """Inputs for one call: images of size x size, or token ids of length `size` with the last row padded."""
    rng = np.random.default_rng(seed)
    if name in VISION:
        return {"x": rng.standard_normal((batch, 3, size, size)).astype(np.float32)}
    mask = np.ones((batch, size), np.int64)
    if batch > 1:
        mask[-1, size // 2 + 1:] = 0
    return {"input_ids": rng.integers(0, VOCAB, (batch, size)).astype(np.int64), "attention_mask": mask}


@functools.lru_cache(maxsize=None)
def exported(name: str) -> bytes:
    """The model's ONNX file (opset 17, TorchScript exporter), built once per test process."""
    torch.manual_seed(0)
    buf = io.BytesIO()
    with warnings.catch_warnings():  # the TorchScript exporter's deprecation and tracer warnings
        warnings.simplefilter("ignore")
        if name in VISION:
            net = getattr(torch_arch, name)()
            torch.onnx.export(net, (torch.randn(2, 3, 64, 64),), buf, input_names=["x"], output_names=["y"],
                              dynamic_axes={"x": {0: "batch"}}, opset_version=17, dynamo=False)
        else:
            net, outputs = _bert() if name == "bert" else _gpt2()
            example = tuple(torch.tensor(v) for v in _feeds(name, 2, 8, seed=0).values())
            dims = {0: "batch", 1: "seq"}
            torch.onnx.export(net, example, buf, input_names=["input_ids", "attention_mask"], output_names=outputs,
                              dynamic_axes={"input_ids": dims, "attention_mask": dims}, opset_version=17,
                              dynamo=False)
    return buf.getvalue()


# (batch, image side or sequence length) of the two calls: a second size of every symbolic dimension
SIZES = {"resnet18": [(2, 64), (1, 64)], "mobilenet_v2": [(2, 64), (1, 64)],
         "bert": [(2, 8), (3, 13)], "gpt2": [(2, 8), (3, 13)]}


def reference(name: str, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    return ort.InferenceSession(exported(name), providers=["CPUExecutionProvider"]).run(None, feeds)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", VISION + TEXT)
def test_model_matches_onnxruntime(name, device):
    rt = polygrad.create(device=device)
    try:
        model = pgo.load(exported(name), runtime=rt, **BOUNDS)
        assert isinstance(model, Model) and model.entrypoints == ["forward"]
        assert model.variables == ({"batch": (1, 4)} if name in VISION else {"batch": (1, 4), "seq": (1, 16)})
        for k, (batch, size) in enumerate(SIZES[name]):
            feeds = _feeds(name, batch, size, seed=k + 1)
            outs = model.forward(**feeds)
            refs = reference(name, feeds)
            assert len(outs) == len(refs)
            for (out_name, got), ref in zip(outs.items(), refs):
                close(got.numpy(), ref, rtol=1e-4)
        model.dispose()
    finally:
        rt.dispose()


def test_sequence_longer_than_the_position_table_is_refused():
    # BERT slices its position ids by the sequence length: a bound past the table cannot be served
    with pytest.raises(pgo.OnnxError, match=f"past this axis's size {POSITIONS}.*smaller bound"):
        pgo.load(exported("bert"), max_batch=4, seq=2 * POSITIONS)


# the plain-JS executor takes about a minute for ResNet-18 at 64x64 (wasm: a fraction of a second), so
# the vision models run on wasm only there; tests/test_onnx_import.py runs a small CNN on both
NODE_BACKENDS = {"resnet18": ["wasm"], "mobilenet_v2": ["wasm"], "bert": ["wasm", "js"], "gpt2": ["wasm", "js"]}
NODE_SIZE = {"resnet18": (2, 64), "mobilenet_v2": (2, 64), "bert": (3, 11), "gpt2": (3, 11)}


@pytest.fixture(scope="module")
def node_run(tmp_path_factory):
    """run(name) -> {backend: result}: the model's bundle run by polygrad-js, once per model and process
    (one Node run per model, so parallel workers split the models instead of each running them all)."""
    if NODE is None:
        pytest.skip("node is not installed")
    tmp = tmp_path_factory.mktemp("onnx_models_js")

    @functools.lru_cache(maxsize=None)
    def run(name: str) -> dict:
        model = pgo.load(exported(name), **BOUNDS)
        path = tmp / f"{name}.pgb"
        model.save(str(path))
        model.dispose()
        feeds = {k: enc(v) for k, v in _feeds(name, *NODE_SIZE[name], seed=7).items()}
        cases = [{"name": backend, "bundle": str(path), "backend": backend, "threads": 1, "forward": feeds}
                 for backend in NODE_BACKENDS[name]]
        (tmp / name).mkdir()
        return run_node(cases, tmp / name)
    return run


@pytest.mark.parametrize("name,backend", [(n, b) for n, bs in NODE_BACKENDS.items() for b in bs])
def test_bundle_matches_onnxruntime_in_node(node_run, name, backend):
    res = node_run(name)[backend]
    assert "error" not in res, res.get("error")
    refs = reference(name, _feeds(name, *NODE_SIZE[name], seed=7))
    assert len(res["outputs"]) == len(refs)
    for got, ref in zip(res["outputs"].values(), refs):
        close(dec(got), ref, rtol=1e-4)
