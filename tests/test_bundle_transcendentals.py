"""Bundles store their kernels with EXP2/LOG2/SIN decomposed; bundles saved before still load.

`Model.save` runs the device-independent passes once (model/format.stored_kernel: index simplification,
then the transcendental decomposition), so a new bundle's kernels hold no EXP2/LOG2/SIN and no reader
needs a copy of the decomposition (docs/bundle-format.md 2.4). Checked here: a model using exp, log,
sin and sigmoid in float16, float32 and float64 saves no transcendental; Python and polygrad-js (both
validating every kernel) load it and match NumPy, Python's loaded model gives the very bits the model
gave before saving, and polygrad-js the same bits; the stored form is a fixed point of its passes; the
bundles polygrad-js's tests keep from before (test/fixtures/saved_at_20af852, which hold EXP2/LOG2) still load in
Python and give the results recorded when they were saved, and polygrad-js's frozen decomposition
turns their kernels into exactly the kernels a save stores today.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from polygrad import Model, Tensor, bundle
from polygrad.model.format import stored_kernel
from polygrad.uop.serialize import decode
from polygrad.uop.transcendental import decompose_transcendentals
from test_js import NODE, dec, enc, run_node
from test_simplify_differential import js_simplify

ROOT = Path(__file__).resolve().parent.parent
# bundles saved before kernels were stored decomposed (at 20af852), kept for exactly this
FIXTURES = ROOT / "polygrad-js" / "test" / "fixtures" / "saved_at_20af852"
TRANSCENDENTAL = {"EXP2", "LOG2", "SIN"}


class Transcendentals:
    """exp, log, sin and sigmoid of one float32 input in float32, float16 and float64."""

    def __call__(self, x):
        h, d = x.cast("float16"), x.cast("float64")
        return {"f32": x.exp() + (x.abs() + 0.5).log() + x.sin() + x.sigmoid(),
                "f16": (h.exp() + (h.abs() + 0.5).log2() + h.sin()).cast("float32"),
                "f64": (d.exp2() + (d.abs() + 0.5).log() + (d * 1e3).sin()).cast("float32")}


def reference(x: np.ndarray) -> dict[str, np.ndarray]:
    d = x.astype(np.float64)
    h = x.astype(np.float16).astype(np.float64)
    return {"f32": np.exp(d) + np.log(np.abs(d) + 0.5) + np.sin(d) + 1 / (1 + np.exp(-d)),
            "f16": np.exp(h) + np.log2(np.abs(h) + 0.5) + np.sin(h),
            "f64": np.exp2(d) + np.log(np.abs(d) + 0.5) + np.sin(d * 1e3)}


TOLERANCE = {"f32": 1e-5, "f16": 4e-3, "f64": 1e-6}  # f64 is returned as float32


def stored_ops(blob: bytes) -> set[str]:
    manifest, _ = bundle.read(blob)
    return {n[0] for n in manifest["kernels"]["nodes"]}


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    x = np.random.default_rng(0).uniform(-4, 4, (3, 40)).astype(np.float32)
    x[0, :4] = [0.0, -0.0, 1e-3, 3.5]
    model = Model(Transcendentals(), inputs={"x": Tensor.empty(3, 40)})
    before = {k: v.numpy() for k, v in model.forward(x=x).items()}
    blob = model.save()
    path = tmp_path_factory.mktemp("trans") / "transcendentals.pgb"
    path.write_bytes(blob)
    return model, blob, path, x, before


def test_saved_kernels_hold_no_transcendentals(saved):
    model, blob, _, _, _ = saved
    assert any(n.op.name in TRANSCENDENTAL for k in model._p.kernels for n in k.toposort())  # the capture has them
    assert not stored_ops(blob) & TRANSCENDENTAL


def test_python_loads_the_decomposed_bundle_bit_for_bit(saved):
    _, blob, _, x, before = saved
    loaded = Model.load(blob)
    got = {k: v.numpy() for k, v in loaded.forward(x=x).items()}
    for k, want in reference(x).items():
        np.testing.assert_allclose(got[k], want, rtol=TOLERANCE[k], atol=TOLERANCE[k])
        np.testing.assert_array_equal(got[k], before[k])  # the same IR arithmetic as before the save


@pytest.mark.skipif(NODE is None, reason="node is not installed")
def test_node_runs_the_decomposed_bundle(saved, tmp_path):
    _, _, path, x, before = saved
    cases = [{"name": b, "bundle": str(path), "backend": b, "forward": {"x": enc(x)}} for b in ("wasm", "js")]
    res = run_node(cases, tmp_path)
    for backend in ("wasm", "js"):
        assert "error" not in res[backend], res[backend].get("error")
        got = {k: dec(v) for k, v in res[backend]["outputs"].items()}
        for k, want in reference(x).items():
            np.testing.assert_allclose(got[k], want, rtol=TOLERANCE[k], atol=TOLERANCE[k])
            np.testing.assert_array_equal(got[k], before[k])


def test_stored_form_is_a_fixed_point(saved):
    model, _, _, _, _ = saved
    for k in model._p.kernels:
        once = stored_kernel(k)
        assert decompose_transcendentals(once) is once
        assert stored_kernel(once) is once  # saving a loaded model stores the same kernels


def test_bundles_saved_before_still_load_in_python():
    """The bundles saved at 20af852 are from before kernels were stored decomposed: they hold EXP2/LOG2 (so the
    frozen decomposition of polygrad-js stays tested by npm test) and give the results recorded then."""
    ref = json.loads((FIXTURES / "reference.json").read_text())
    assert stored_ops((FIXTURES / "decoder.pgb").read_bytes()) & TRANSCENDENTAL
    assert stored_ops((FIXTURES / "mlp_untrained.pgb").read_bytes()) >= {"EXP2", "LOG2"}
    r = ref["decoder"]
    ids = np.array(r["ids"], np.int32)
    m = Model.load(str(FIXTURES / "decoder.pgb"))
    np.testing.assert_allclose(m.forward(ids=ids[:, :3])["logits"].numpy(), r["forward"], rtol=1e-5, atol=1e-6)
    for i, want in enumerate(r["decode"]):
        p = 3 + i
        got = m.call("decode", {"ids": ids[:, p:p + 1], "pos": p})["logits"].numpy()
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    again = m.save()  # a re-save stores today's form
    assert not stored_ops(again) & TRANSCENDENTAL
    m.dispose()
    r = ref["mlp"]
    m = Model.load(str(FIXTURES / "mlp_untrained.pgb"))
    x = np.array(r["x"], np.float32)
    np.testing.assert_allclose(m.forward(x=x[:5])["logits"].numpy(), r["logits_untrained"], rtol=1e-5, atol=1e-6)
    m.dispose()
    m = Model.load(str(FIXTURES / "mlp_adam.pgb"))
    losses = m.fit({"x": x, "y": np.array(r["y"], np.int32)}, epochs=2, batch_size=4, verbose=False)
    np.testing.assert_allclose(losses, r["adam_resume"], rtol=1e-4)
    m.dispose()


@pytest.mark.skipif(NODE is None, reason="node is not installed")
def test_javascript_brings_older_kernels_to_the_stored_form(tmp_path):
    """compile.js decomposes an older bundle's transcendentals, then simplifies: the very kernels Python's
    save stores now, node for node (so an older bundle runs as if saved again)."""
    kernels = []
    for name in ("decoder.pgb", "embedding_sgd.pgb", "mlp_adam.pgb"):
        manifest, _ = bundle.read((FIXTURES / name).read_bytes())
        kernels += decode(manifest["kernels"])
    assert any(n.op.name in TRANSCENDENTAL for k in kernels for n in k.toposort())
    js, _ = js_simplify(kernels, tmp_path, decompose=True)
    for k, got in zip(kernels, js):
        assert got is stored_kernel(k), k.arg
