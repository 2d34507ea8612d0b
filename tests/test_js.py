"""Cross-language tests: Python saves a zoo of bundles, the JavaScript package (polygrad-js) runs them.

For each model, Node loads the bundle Python wrote and must match Python's outputs (within 1e-5 relative to
the output's scale: reductions may be summed in another order), a JavaScript fine-tune must follow Python's
loss trajectory step for step, and what JavaScript saves must load in Python with the same results.
One Node process runs every case (tools/run_cases.js), so the module stays fast. Skipped without `node`.
"""
from __future__ import annotations

import base64
import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from polygrad import Model, Tensor, Variable, nn
from test_model import ConvBN  # the conv + BatchNorm net of the Model tests
from test_model import TinyAttention as ModelTestsAttention

ROOT = Path(__file__).resolve().parent.parent
JS = ROOT / "polygrad-js"
NODE = shutil.which("node")
pytestmark = pytest.mark.skipif(NODE is None, reason="node is not installed")


def enc(a: np.ndarray) -> dict:
    a = np.ascontiguousarray(a)
    name = {np.float32: "float32", np.int32: "int32", np.float64: "float64", np.int64: "int64"}[a.dtype.type]
    data = base64.b64encode(a.astype(a.dtype.newbyteorder("<")).tobytes()).decode()
    return {"dtype": name, "shape": list(a.shape), "data": data}


def dec(obj: dict) -> np.ndarray:
    raw = base64.b64decode(obj["data"])
    return np.frombuffer(raw, dtype=np.dtype(obj["dtype"]).newbyteorder("<")).reshape(obj["shape"])


def close(got: np.ndarray, ref: np.ndarray, rtol: float = 1e-5) -> None:
    """Within rtol of each element, or of the output's largest magnitude (reductions change order)."""
    got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    assert got.shape == ref.shape, (got.shape, ref.shape)
    scale = float(np.max(np.abs(ref))) if ref.size else 0.0
    bad = np.abs(got - ref) > rtol * np.abs(ref) + rtol * scale
    assert not bad.any(), f"{bad.sum()} elements differ beyond {rtol}: {got[bad][:5]} vs {ref[bad][:5]}"


def run_node(cases: list[dict], tmp: Path) -> dict:
    plan, out = tmp / "plan.json", tmp / "results.json"
    plan.write_text(json.dumps({"cases": cases}))
    proc = subprocess.run([NODE, str(JS / "tools" / "run_cases.js"), str(plan), str(out)], capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    return json.loads(out.read_text())


def forward_in_node(data: bytes, inputs: dict[str, np.ndarray], tmp: Path,
                    backends: tuple[str, ...] = ("wasm", "js")) -> dict[str, dict[str, np.ndarray]]:
    """{backend: {output: array}} of one forward call of the bundle `data` in Node on each backend (skips
    the test without node; fails on any load or call error)."""
    if NODE is None:
        pytest.skip("node is not installed")
    path = tmp / "forward_in_node.pgb"
    path.write_bytes(data)
    calls = [{"entry": "forward", "inputs": {k: enc(v) for k, v in inputs.items()}}]
    res = run_node([{"name": b, "bundle": str(path), "backend": b, "calls": calls} for b in backends], tmp)
    for b in backends:
        assert "error" not in res[b], res[b].get("error")
    return {b: {k: dec(v) for k, v in res[b]["calls"][0].items()} for b in backends}


# ---------------------------------------------------------------- the zoo
class MLP:
    def __init__(self, i: int = 6, h: int = 16, o: int = 3):
        self.l1, self.l2 = nn.Linear(i, h), nn.Linear(h, o)

    def __call__(self, x):
        return {"logits": self.l2(self.l1(x).relu())}


class TinyAttention(ModelTestsAttention):
    """test_model's embedding + causal attention net, with a log-softmax (exp and log kernels) on top."""

    def __call__(self, tokens):
        return {"logits": super().__call__(tokens)["logits"].log_softmax(-1)}


class DropoutMLP(MLP):
    def __init__(self):
        super().__init__()
        self.drop = nn.Dropout(0.3)

    def __call__(self, x):
        return {"logits": self.l2(self.drop(self.l1(x).relu()))}


class LinearSpec:
    def __init__(self):
        self.a, self.b = Tensor([0.0]), Tensor([0.0])

    def __call__(self, x):
        return {"prediction": self.a * x + self.b}


def xent(o, y):
    return o["logits"].sparse_categorical_crossentropy(y)


@pytest.fixture(scope="module")
def zoo(tmp_path_factory):
    """{name: (bundle path, inputs, Python outputs, extra)} for every model of the zoo."""
    tmp = tmp_path_factory.mktemp("zoo")
    rng = np.random.default_rng(0)
    out: dict = {}

    def keep(name: str, model: Model, inputs: dict, save_kw: dict | None = None, **extra) -> None:
        path = tmp / f"{name}.pgb"
        model.save(str(path), **(save_kw or {}))
        outs = {k: v.numpy() for k, v in model.forward(**inputs).items()}
        out[name] = (path, inputs, outs, extra)

    Tensor.manual_seed(0)
    lin = Model(LinearSpec(), inputs={"x": Tensor.empty(5)}, targets={"y": Tensor.empty(5)},
                loss=lambda o, y: (o["prediction"] - y).square().mean())
    lin.fit({"x": [-2, -1, 0, 1, 2], "y": [-4, -1, 2, 5, 8]}, epochs=100, optimizer="sgd", lr=0.1, verbose=False)
    keep("linear", lin, {"x": np.array([3, 4, 5, 6, 7], np.float32)}, {"include_optimizer": False})
    lin.dispose()

    Tensor.manual_seed(1)
    X = rng.standard_normal((8, 6)).astype(np.float32)
    mlp = Model(MLP(), inputs={"x": Tensor.empty(8, 6)})
    keep("mlp", mlp, {"x": X})
    mlp.dispose()

    Tensor.manual_seed(3)
    Xc = rng.standard_normal((4, 1, 6, 6)).astype(np.float32)
    Yc = rng.integers(0, 2, 4).astype(np.int32)
    conv = Model(ConvBN(), inputs={"x": Tensor.empty(4, 1, 6, 6)}, targets={"y": Tensor.empty(4, dtype="int32")},
                 loss=xent)
    conv.fit({"x": Xc, "y": Yc}, epochs=2, optimizer="sgd", lr=0.05, verbose=False)  # moves the running stats
    keep("conv_batchnorm", conv, {"x": Xc})
    conv.dispose()

    Tensor.manual_seed(4)
    toks = np.array([[1, 5, 2, 9, 3, 0], [4, 4, 7, 10, 1, 2]], dtype=np.int32)
    att = Model(TinyAttention(), inputs={"tokens": Tensor.empty(2, 6, dtype="int32")})
    keep("embedding_attention", att, {"tokens": toks})
    att.dispose()

    Tensor.manual_seed(5)
    batch = Variable("batch", 1, 32)
    Xv = rng.standard_normal((24, 6)).astype(np.float32)
    Yv = rng.integers(0, 3, 24).astype(np.int32)
    var = Model(MLP(), inputs={"x": Tensor.empty(batch, 6)}, targets={"y": Tensor.empty(batch, dtype="int32")},
                loss=xent)
    keep("variable_batch", var, {"x": Xv[:5]}, data={"x": Xv, "y": Yv})
    out["variable_batch_rows"] = {k: var.forward(x=Xv[:n])["logits"].numpy() for k, n in (("1", 1), ("32", 24))}
    var.dispose()

    Tensor.manual_seed(6)
    adam = Model(MLP(), inputs={"x": Tensor.empty(batch, 6)}, targets={"y": Tensor.empty(batch, dtype="int32")},
                 loss=xent)
    adam.fit({"x": Xv[:16], "y": Yv[:16]}, epochs=2, batch_size=8, optimizer="adam", lr=0.01, verbose=False)
    keep("adam_trained", adam, {"x": Xv[:7]}, data={"x": Xv, "y": Yv})
    out["adam_trained"][3]["resumed"] = adam.fit({"x": Xv, "y": Yv}, epochs=2, batch_size=8, verbose=False)
    adam.dispose()

    try:
        from polygrad import models
    except ImportError:
        models = None
    if models is not None and hasattr(models, "Sequential"):
        seq = models.Sequential({"input": {"name": "x", "shape": [6]}, "batch": 4, "seed": 7,
                                 "layers": [{"type": "linear", "out_features": 8, "activation": "relu"},
                                            {"type": "linear", "out_features": 3}],
                                 "output": "logits", "loss": "cross_entropy"})
        keep("sequential", seq, {"x": X[:4]})
        seq.dispose()
    return out


ZOO = ["linear", "mlp", "conv_batchnorm", "embedding_attention", "variable_batch", "adam_trained", "sequential"]


@pytest.fixture(scope="module")
def forward_results(zoo, tmp_path_factory):
    cases = []
    for name in ZOO:
        if name not in zoo:
            continue
        path, inputs, _, _ = zoo[name]
        for backend in ("wasm", "js"):
            cases.append({"name": f"{name}/{backend}", "bundle": str(path), "backend": backend,
                          "forward": {k: enc(np.asarray(v)) for k, v in inputs.items()}})
    path = zoo["variable_batch"][0]
    X = zoo["variable_batch"][3]["data"]["x"]
    for rows in ("1", "32"):
        n = 1 if rows == "1" else 24
        cases.append({"name": f"variable_batch_rows/{rows}", "bundle": str(path), "forward": {"x": enc(X[:n])}})
    return run_node(cases, tmp_path_factory.mktemp("fwd"))


@pytest.mark.parametrize("backend", ["wasm", "js"])
@pytest.mark.parametrize("name", ZOO)
def test_node_forward_matches_python(zoo, forward_results, name, backend):
    if name not in zoo:
        pytest.skip("polygrad.models.Sequential is not available")
    res = forward_results[f"{name}/{backend}"]
    assert "error" not in res, res.get("error")
    _, _, want, _ = zoo[name]
    assert set(res["outputs"]) == set(want)
    for k, ref in want.items():
        close(dec(res["outputs"][k]), ref)
    if backend == "wasm":
        assert res["stats"]["checks"] == 0, "every access of these kernels should be proven in bounds"


def test_variable_leading_dimension_within_bounds(zoo, forward_results):
    for rows in ("1", "32"):
        res = forward_results[f"variable_batch_rows/{rows}"]
        assert "error" not in res, res.get("error")
        close(dec(res["outputs"]["logits"]), zoo["variable_batch_rows"][rows])


def test_spec_prediction_is_bit_exact(zoo, forward_results):
    got = dec(forward_results["linear/wasm"]["outputs"]["prediction"])
    np.testing.assert_array_equal(got, zoo["linear"][2]["prediction"])


@pytest.fixture(scope="module")
def training(zoo, tmp_path_factory):
    """Python fine-tunes fresh loads of the bundles; Node does the same; both save."""
    tmp = tmp_path_factory.mktemp("train")
    X, Y = zoo["variable_batch"][3]["data"]["x"], zoo["variable_batch"][3]["data"]["y"]
    plans = {"sgd": {"optimizer": "sgd", "lr": 0.1}, "adam": {"optimizer": "adam", "lr": 0.01},
             "adamw": {"optimizer": "adamw", "lr": 0.01, "weight_decay": 0.05}}
    py, cases = {}, []
    for tag, opts in plans.items():
        m = Model.load(str(zoo["variable_batch"][0]))
        kw = {k: v for k, v in opts.items()}
        py[tag] = m.fit({"x": X, "y": Y}, epochs=2, batch_size=8, verbose=False, **kw)
        py[f"{tag}/after"] = m.forward(x=X[:5])["logits"].numpy()
        m.dispose()
        js_opts = {("weightDecay" if k == "weight_decay" else k): v for k, v in opts.items()}
        cases.append({"name": tag, "bundle": str(zoo["variable_batch"][0]), "save": str(tmp / f"{tag}.pgb"),
                      "fit": {"data": {"x": enc(X), "y": enc(Y)}, "options": {"epochs": 2, "batchSize": 8, **js_opts}},
                      "forward": {"x": enc(X[:5])}})
    # dropout: the bundle's RNG state (seed, counter) gives Python and Node the same masks, step by step
    Tensor.manual_seed(8)
    drop = Model(DropoutMLP(), inputs={"x": Tensor.empty(8, 6)}, targets={"y": Tensor.empty(8, dtype="int32")},
                 loss=xent)
    drop.save(str(tmp / "dropout.pgb"))
    drop.dispose()
    m = Model.load(str(tmp / "dropout.pgb"))
    py["dropout"] = m.fit({"x": X[:16], "y": Y[:16]}, epochs=2, batch_size=8, optimizer="sgd", lr=0.1, verbose=False)
    m.dispose()
    cases.append({"name": "dropout", "bundle": str(tmp / "dropout.pgb"),
                  "fit": {"data": {"x": enc(X[:16]), "y": enc(Y[:16])},
                          "options": {"epochs": 2, "batchSize": 8, "optimizer": "sgd", "lr": 0.1}}})
    # weights packed for the few-rows variant (polygrad-js/src/pack.js): the second of two batch-1 forwards
    # before the fit makes the packed copies; the second of two after it must see the trained weights
    Tensor.manual_seed(10)
    Xw = np.random.default_rng(10).standard_normal((16, 32)).astype(np.float32)
    Yw = np.random.default_rng(11).integers(0, 4, 16).astype(np.int32)
    wide = Model(MLP(32, 16, 4), inputs={"x": Tensor.empty(batch := Variable("batch", 1, 16), 32)},
                 targets={"y": Tensor.empty(batch, dtype="int32")}, loss=xent)
    wide.save(str(tmp / "wide.pgb"))
    py["wide/before"] = wide.forward(x=Xw[:1])["logits"].numpy()
    py["wide"] = wide.fit({"x": Xw, "y": Yw}, epochs=2, batch_size=8, optimizer="sgd", lr=0.1, verbose=False)
    py["wide/after"] = wide.forward(x=Xw[:1])["logits"].numpy()
    wide.dispose()
    cases.append({"name": "wide", "bundle": str(tmp / "wide.pgb"), "repeat": 2, "before": {"x": enc(Xw[:1])},
                  "fit": {"data": {"x": enc(Xw), "y": enc(Yw)},
                          "options": {"epochs": 2, "batchSize": 8, "optimizer": "sgd", "lr": 0.1}},
                  "forward": {"x": enc(Xw[:1])}})
    # a weight over nn/optim.py's SOLO_NUMEL keeps its own Adam moments: optim.js must lay out the same
    # buffers, or the bundle Node saves could not resume in Python
    Tensor.manual_seed(12)
    Xb = np.random.default_rng(12).standard_normal((16, 200)).astype(np.float32)
    Yb = np.random.default_rng(13).integers(0, 3, 16).astype(np.int32)
    big = Model(MLP(200, 100, 3), inputs={"x": Tensor.empty(8, 200)}, targets={"y": Tensor.empty(8, dtype="int32")},
                loss=xent)
    big.save(str(tmp / "big.pgb"))
    big.dispose()
    m = Model.load(str(tmp / "big.pgb"))
    py["big"] = m.fit({"x": Xb, "y": Yb}, epochs=2, batch_size=8, optimizer="adam", lr=0.01, verbose=False)
    py["big/after"] = m.forward(x=Xb[:8])["logits"].numpy()
    m.save(str(tmp / "big_py.pgb"))
    py["big/resumed"] = m.fit({"x": Xb, "y": Yb}, epochs=1, batch_size=8, verbose=False)
    m.dispose()
    cases.append({"name": "big", "bundle": str(tmp / "big.pgb"), "save": str(tmp / "big_js.pgb"),
                  "fit": {"data": {"x": enc(Xb), "y": enc(Yb)},
                          "options": {"epochs": 2, "batchSize": 8, "optimizer": "adam", "lr": 0.01}},
                  "forward": {"x": enc(Xb[:8])}})
    cases.append({"name": "resume", "bundle": str(zoo["adam_trained"][0]),
                  "fit": {"data": {"x": enc(X), "y": enc(Y)}, "options": {"epochs": 2, "batchSize": 8}}})
    Xc = np.random.default_rng(9).standard_normal((4, 1, 6, 6)).astype(np.float32)
    Yc = np.array([0, 1, 1, 0], np.int32)
    m = Model.load(str(zoo["conv_batchnorm"][0]))
    py["conv"] = m.fit({"x": Xc, "y": Yc}, epochs=3, optimizer="sgd", lr=0.05, verbose=False)
    m.dispose()
    cases.append({"name": "conv", "bundle": str(zoo["conv_batchnorm"][0]),
                  "fit": {"data": {"x": enc(Xc), "y": enc(Yc)},
                          "options": {"epochs": 3, "optimizer": "sgd", "lr": 0.05}}})
    return py, run_node(cases, tmp), tmp


@pytest.mark.parametrize("tag", ["sgd", "adam", "adamw", "conv", "dropout", "wide"])
def test_js_fine_tune_follows_python_loss_trajectory(training, tag):
    py, js, _ = training
    assert "error" not in js[tag], js[tag].get("error")
    got, want = np.array(js[tag]["losses"]), np.array(py[tag])
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5)


def test_js_packed_weights_follow_training(training):
    py, js, _ = training
    res = js["wide"]
    assert "error" not in res, res.get("error")
    close(dec(res["before"]["logits"]), py["wide/before"])
    np.testing.assert_allclose(res["losses"], py["wide"], rtol=1e-5)
    close(dec(res["outputs"]["logits"]), py["wide/after"], rtol=1e-4)
    assert res["stats"]["repacks"] >= 4, res["stats"]  # two layers' copies, made before the fit and after it


def test_js_resumes_the_bundle_optimizer(zoo, training):
    _, js, _ = training
    assert "error" not in js["resume"], js["resume"].get("error")
    np.testing.assert_allclose(js["resume"]["losses"], zoo["adam_trained"][3]["resumed"], rtol=1e-5)


@pytest.mark.parametrize("tag", ["sgd", "adam", "adamw"])
def test_js_saves_and_python_loads(zoo, training, tag):
    py, js, tmp = training
    X, Y = zoo["variable_batch"][3]["data"]["x"], zoo["variable_batch"][3]["data"]["y"]
    m = Model.load(str(tmp / f"{tag}.pgb"))
    try:
        got = m.forward(x=X[:5])["logits"].numpy()
        close(got, py[f"{tag}/after"], rtol=1e-4)  # after 6 steps of training from either side
        close(got, dec(js[tag]["outputs"]["logits"]))
        assert m.summary().optimizer["name"] == tag
        more = m.fit({"x": X, "y": Y}, epochs=1, batch_size=8, verbose=False)  # the JS-written optimizer resumes
        assert len(more) == 3 and all(np.isfinite(more))
        assert isinstance(m.save(include_optimizer=False), bytes)
    finally:
        m.dispose()


def test_js_adam_state_of_a_big_weight_resumes_in_python(training):
    """optim.js lays out Adam's moments as nn/optim.py does (a 200x100 weight alone, the rest in one flat
    group): the losses agree step by step, and Python resumes the optimizer Node saved."""
    py, js, tmp = training
    assert "error" not in js["big"], js["big"].get("error")
    np.testing.assert_allclose(js["big"]["losses"], py["big"], rtol=1e-5)
    close(dec(js["big"]["outputs"]["logits"]), py["big/after"], rtol=1e-4)
    layouts = []
    for name in ("big_py.pgb", "big_js.pgb"):
        saved = Model.load(str(tmp / name))
        layouts.append([(s.name, s.shape) for s in saved._p.slots if s.role == "optimizer"])
        saved.dispose()
    assert layouts[0] == layouts[1]
    assert (20000,) in [shape for _, shape in layouts[0]]  # the big weight's own moments
    m = Model.load(str(tmp / "big_js.pgb"))
    try:
        assert m.summary().optimizer["name"] == "adam"
        X = np.random.default_rng(12).standard_normal((16, 200)).astype(np.float32)
        Y = np.random.default_rng(13).integers(0, 3, 16).astype(np.int32)
        np.testing.assert_allclose(m.fit({"x": X, "y": Y}, epochs=1, batch_size=8, verbose=False), py["big/resumed"],
                                   rtol=1e-5)
    finally:
        m.dispose()


class HalfStats:
    """float16 statistics of rows whose sums pass float16's range (65504): issue 28 item 11."""

    def __call__(self, x):
        h = x.half()
        return {"mean": h.mean(-1).float(), "var": h.var(-1).float(), "ln": h.layernorm()[:, :16].float()}


def test_half_reductions_accumulate_in_float32_in_node(tmp_path):
    """The float32 accumulation of half reductions is casts in the graph, so a bundle carries it: Node's
    wasm and plain-JS executors give torch's values (the mean was inf before)."""
    import torch
    import torch.nn.functional as F
    X = (np.random.default_rng(14).standard_normal((2, 20000)) * 3 + 10).astype(np.float32)
    m = Model(HalfStats(), inputs={"x": Tensor.empty(2, 20000)})
    m.save(str(tmp_path / "half.pgb"))
    py = {k: v.numpy() for k, v in m.forward(x=X).items()}
    m.dispose()
    t = torch.tensor(X).half()
    want = {"mean": t.mean(-1).float().numpy(), "var": t.var(-1).float().numpy(),
            "ln": F.layer_norm(t, (20000,))[:, :16].float().numpy()}
    cases = [{"name": backend, "bundle": str(tmp_path / "half.pgb"), "backend": backend, "forward": {"x": enc(X)}}
             for backend in ("wasm", "js")]
    res = run_node(cases, tmp_path)
    for backend in ("wasm", "js"):
        assert "error" not in res[backend], res[backend].get("error")
        for k, ref in want.items():
            close(dec(res[backend]["outputs"][k]), ref, rtol=2e-3)
            close(py[k], ref, rtol=2e-3)


class TanhMLP:
    def __init__(self):
        self.l1, self.l2 = nn.Linear(8, 16), nn.Linear(16, 4)

    def __call__(self, x):
        return {"y": self.l2(self.l1(x).tanh())}


def test_few_rows_float_max_compiles_in_node(tmp_path):
    """A batch of few rows runs wasm's branch-free variant of a kernel, whose float32 MAX (in tanh's
    decomposition) was emitted with f64 comparisons: the module failed to compile on one thread (threads took
    another path). Now one and two threads give Python's values."""
    b = Variable("batch", 1, 4)
    m = Model(TanhMLP(), inputs={"x": Tensor.empty(b.bind(3), 8)})
    m.save(str(tmp_path / "tanh.pgb"))
    X = np.random.default_rng(3).standard_normal((3, 8)).astype(np.float32)
    want = m.forward(x=X)["y"].numpy()
    m.dispose()
    cases = [{"name": f"t{t}", "bundle": str(tmp_path / "tanh.pgb"), "backend": "wasm", "threads": t,
              "forward": {"x": enc(X)}} for t in (1, 2)]
    res = run_node(cases, tmp_path)
    for t in (1, 2):
        assert "error" not in res[f"t{t}"], res[f"t{t}"].get("error")
        close(dec(res[f"t{t}"]["outputs"]["y"]), want)


def test_uint8_kernels_in_lanes_match_numpy(tmp_path):
    """uint8 loads take wasm lanes (widened to 32 bits, as a quantized weight's blocks are): a CAST to float32,
    a BITCAST to int8 (sign-extended), an ADD of a scalar in uint8 and in int8 (wrapped at 8 bits, as Q4_0's
    `nibble - 8` is computed) and a reduction over them match NumPy, every kernel in lanes."""
    from polygrad import dtypes
    w = np.linspace(-1, 1, 64, dtype=np.float32).reshape(4, 16)

    class Net:
        def __init__(self):
            self.w = Tensor(w)

        def __call__(self, x):
            return {"a": x.cast(dtypes.float32) * 0.5 + self.w, "b": (x + 200).cast(dtypes.float32),
                    "c": x.bitcast(dtypes.int8).cast(dtypes.float32), "d": x.cast(dtypes.float32) @ self.w.T,
                    "e": (x.bitcast(dtypes.int8) + 100).cast(dtypes.float32)}

    x = (np.arange(64) * 37 % 256).astype(np.uint8).reshape(4, 16)
    model = Model(Net(), inputs={"x": Tensor.empty(4, 16, dtype=dtypes.uint8)})
    model.save(str(tmp_path / "u8.pgb"))
    model.dispose()
    want = {"a": x * np.float32(0.5) + w, "b": (x + np.uint8(200)).astype(np.float32),
            "c": x.view(np.int8).astype(np.float32), "d": x.astype(np.float32) @ w.T,
            "e": (x.view(np.int8) + np.int8(100)).astype(np.float32)}
    data = {"dtype": "uint8", "shape": [4, 16], "data": base64.b64encode(x.tobytes()).decode()}
    res = run_node([{"name": "u8", "bundle": str(tmp_path / "u8.pgb"), "forward": {"x": data}, "plan": True}],
                   tmp_path)["u8"]
    assert "error" not in res, res.get("error")
    for k, ref in want.items():
        close(dec(res["outputs"][k]), ref)
    assert all(s["opts"][0] in ("VECTOR:4", "SPLIT_REDUCE:4") for s in res["plan"]["forward"]), res["plan"]
    assert all(s["vectorized"] for s in res["plan"]["forward"]), res["plan"]
