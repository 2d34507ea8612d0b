"""The bundles polygrad-js's tests load are fresh, and the bundles saved before issue 29 still load.

Fresh (polygrad-js/test/fixtures/*.pgb, reference.json): what polygrad-js/tools/make_fixtures.py writes now
has the same manifests (kernels, buffers, entrypoints, training: all but the informative "producer"),
stored values within float32 rounding, and the same reference results (the trained weights and the
results come from the device that ran them, which may round differently); the crafted files
(fixtures/crafted/) are byte for byte what `tests/bundle_corpus.py --js-fixtures` writes. When this fails,
the fixtures were made by an older polygrad: run `python polygrad-js/tools/make_fixtures.py`.

Old (polygrad-js/test/fixtures/saved_at_20af852/): the bundles and results polygrad wrote at commit 20af852,
before issue 29 moved the tables into polygrad/definitions. Python loads each and reproduces its
results here; polygrad-js/test/saved.test.js does the same in JavaScript.
"""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

import bundle_corpus
from polygrad import Model, bundle
from polygrad.uop.serialize import DTYPES_BY_NAME

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "polygrad-js" / "test" / "fixtures"
OLD = FIXTURES / "saved_at_20af852"
BUNDLES = ("decoder", "embedding_sgd", "linear", "mlp_adam", "mlp_untrained", "mlp_wide")
RTOL = 1e-5


def _make_fixtures():
    spec = importlib.util.spec_from_file_location("make_fixtures", ROOT / "polygrad-js" / "tools" / "make_fixtures.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def regenerated(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("fixtures")
    _make_fixtures().main(out)
    return out


def stored_values(blob: bytes) -> dict[str, np.ndarray]:
    """{buffer name: its stored values} of a bundle."""
    manifest, body = bundle.read(blob)
    out = {}
    for b in manifest["buffers"]:
        if isinstance(b.get("data"), dict):
            dt = DTYPES_BY_NAME[b["dtype"]].np
            out[b["name"]] = np.frombuffer(bytes(body[b["data"]["offset"]:][:b["data"]["nbytes"]]), dt)
    return out


@pytest.mark.parametrize("name", BUNDLES)
def test_each_fixture_is_what_polygrad_writes_now(regenerated, name):
    committed, fresh = (FIXTURES / f"{name}.pgb").read_bytes(), (regenerated / f"{name}.pgb").read_bytes()
    (a, _), (b, _) = bundle.read(committed), bundle.read(fresh)
    a.pop("producer", None)
    b.pop("producer", None)
    hint = f"{name}.pgb is stale: run python polygrad-js/tools/make_fixtures.py"
    assert a == b, hint
    old, new = stored_values(committed), stored_values(fresh)
    assert old.keys() == new.keys(), hint
    for k in old:
        np.testing.assert_allclose(old[k], new[k], rtol=RTOL, atol=1e-7, err_msg=f"{hint} ({k})")


def test_the_reference_results_are_what_polygrad_computes_now(regenerated):
    committed = json.loads((FIXTURES / "reference.json").read_text())
    fresh = json.loads((regenerated / "reference.json").read_text())
    assert _close(committed, fresh), "reference.json is stale: run python polygrad-js/tools/make_fixtures.py"


def test_the_crafted_fixtures_are_what_the_corpus_writes_now():
    for name in bundle_corpus.JS_FIXTURES:
        assert (FIXTURES / "crafted" / f"{name}.pgb").read_bytes() == bundle_corpus.CRAFTED[name][1](), \
            f"crafted/{name}.pgb is stale: run python tests/bundle_corpus.py --js-fixtures"


def _close(a, b) -> bool:
    """Equal structure and strings; numbers equal within RTOL."""
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_close(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b))
    if isinstance(a, (int, float)) and not isinstance(a, bool):
        return isinstance(b, (int, float)) and bool(np.isclose(a, b, rtol=RTOL, atol=1e-7))
    return a == b


# ---------------------------------------------------------------------------------------------------
# bundles saved before issue 29


def results(folder: Path, ref: dict) -> dict:
    """The results reference.json records, computed from the bundles of `folder` loaded from disk."""
    load = lambda name: Model.load(str(folder / f"{name}.pgb"))  # noqa: E731
    out: dict = {}
    m = load("linear")
    out["linear"] = {"prediction": m.forward(x=ref["linear"]["x"])["prediction"].numpy().tolist()}
    m.dispose()
    x, y = np.array(ref["mlp"]["x"], np.float32), np.array(ref["mlp"]["y"], np.int32)
    m = load("mlp_untrained")
    out["mlp"] = {"logits_untrained": m.forward(x=x[:5])["logits"].numpy().tolist(),
                  "adam_first": m.fit({"x": x, "y": y}, epochs=1, batch_size=4, optimizer="adam", lr=0.01,
                                      verbose=False)}
    m.dispose()
    m = load("mlp_adam")
    out["mlp"]["adam_resume"] = m.fit({"x": x, "y": y}, epochs=2, batch_size=4, verbose=False)
    m.dispose()
    xw = np.array(ref["wide"]["x"], np.float32)
    m = load("mlp_wide")
    out["wide"] = {str(n): m.forward(x=xw[:n])["logits"].numpy().tolist() for n in (1, 3, 8)}
    m.dispose()
    ids = np.array(ref["decoder"]["ids"], np.int32)
    m = load("decoder")
    out["decoder"] = {"fresh_decode": m.call("decode", {"ids": ids[:1, 2:3], "pos": 2})["logits"].numpy().tolist()}
    out["decoder"]["forward"] = m.forward(ids=ids[:, :3])["logits"].numpy().tolist()
    out["decoder"]["decode"] = [m.call("decode", {"ids": ids[:, p:p + 1], "pos": p})["logits"].numpy().tolist()
                                for p in range(3, 6)]
    m.dispose()
    e = ref["embedding"]
    m = load("embedding_sgd")
    out["embedding"] = {"sgd": m.fit({"ids": np.array(e["ids"], np.int32), "y": np.array(e["y"], np.int32)}, epochs=3,
                                     batch_size=4, optimizer="sgd", lr=0.5, verbose=False)}
    m.dispose()
    return out


def _subset(want: dict, got: dict) -> dict:
    """The entries of `want` that `got` computes (the inputs it records are left out)."""
    return {k: _subset(want[k], v) if isinstance(v, dict) else want[k] for k, v in got.items()}


def test_bundles_saved_before_issue_29_load_and_give_their_results():
    ref = json.loads((OLD / "reference.json").read_text())
    got = results(OLD, ref)
    assert _close(_subset(ref, got), got)


def test_the_old_bundles_are_the_ones_saved_at_20af852():
    """They were written by polygrad at 20af852 (the kernel table and gradient order of that version), so
    they stay a test of loading old files however the writer changes."""
    manifest, _ = bundle.read((OLD / "mlp_adam.pgb").read_bytes())
    assert manifest["producer"] == "polygrad 0.1.0" and manifest["version"] == 1
    assert manifest["training"]["gradients"] == [[2, 8], [4, 9], [3, 10], [5, 11]]  # 20af852's order
