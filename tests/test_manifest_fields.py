"""Both readers and both writers follow the manifest's keys as polygrad/definitions/bundle.py lists them.

MANIFEST_FIELDS says, per manifest object, which keys a reader requires, which may be absent and from
which bundle version a key may appear; unknown keys are ignored. Here Python's Model.load and
polygrad-js's (tools/verdicts.js) each judge the same edited bundles: a required key removed (both refuse),
an unknown key added (both load), a version-2 key in a version-1 bundle (both refuse). And the bundles both
writers save hold only listed keys, and every required one. Skipped without `node`.
"""
from __future__ import annotations

import copy
import json
import shutil
import subprocess
from pathlib import Path

import pytest

import bundle_corpus
from polygrad import Model
from polygrad.definitions import bundle as definition
from test_bundle_differential import node_verdicts, python_verdict

ROOT = Path(__file__).resolve().parent.parent
NODE = shutil.which("node")
FIELDS = definition.MANIFEST_FIELDS

pytestmark = pytest.mark.skipif(NODE is None, reason="node is not installed")


def every_instance(m: dict) -> dict[str, list[dict]]:
    """{object kind: every object of that kind in manifest m}."""
    calls = [c for e in m["entrypoints"].values() for c in e["calls"]]
    return {
        "manifest": [m], "signature": [m["signature"]],
        "spec": [s for k in ("inputs", "targets", "outputs") for s in m["signature"][k]],
        "variable": m["variables"], "buffer": m["buffers"],
        "buffer_data": [b["data"] for b in m["buffers"] if isinstance(b.get("data"), dict)],
        "entrypoint": list(m["entrypoints"].values()),
        "kernel_call": [c for c in calls if "kernel" in c], "copy_call": [c for c in calls if "copy" in c],
        "training": [m["training"]], "rng": [m["rng"]],
    }


def instances(m: dict) -> dict[str, list[dict]]:
    """{object kind: the objects edited in m}: the first of each kind, every entrypoint, a stored and an
    unstored buffer."""
    every = every_instance(m)
    out = {kind: objs[:1] for kind, objs in every.items()}
    out["entrypoint"] = every["entrypoint"]
    out["buffer"] = [next(b for b in m["buffers"] if b.get("data") is not None),
                     next(b for b in m["buffers"] if b.get("data") is None)]
    return out


def with_copy(m: dict) -> dict:
    """m with a copy call at the end of forward: its first output into a fresh temporary of its size."""
    m = copy.deepcopy(m)
    out = next(iter(m["entrypoints"]["forward"]["outputs"].values()))
    src = m["buffers"][out]
    m["buffers"].append({"name": "temp.copy", "role": "temporary", "dtype": src["dtype"], "shape": [src["size"]],
                         "size": src["size"]})
    m["entrypoints"]["forward"]["calls"].append({"copy": [len(m["buffers"]) - 1, out]})
    return m


def bases() -> dict[str, tuple[dict, bytes, int]]:
    """Valid bundles: v1 with an optimizer and a copy (every manifest object), v2 with arguments and caches."""
    adam, data, version = bundle_corpus.split(bundle_corpus.base("mlp_adam.pgb"))
    out = {"v1": (with_copy(adam), data, version), "v2": bundle_corpus.split(bundle_corpus.base("decoder.pgb"))}
    missing = [kind for kind in FIELDS if not instances(out["v1"][0])[kind]]
    assert not missing, missing  # each object kind is there to edit
    return out


def cases() -> dict[str, tuple[bytes, str]]:
    """{file name: (bundle, the verdict both readers must give)}."""
    out = {}
    for base, (m, data, version) in bases().items():
        out[f"{base}_as_is.pgb"] = (bundle_corpus.repack(m, data, version), "accept")
        for kind, keys in FIELDS.items():
            for i in range(len(instances(m)[kind])):
                for key, field in keys.items():
                    edited = copy.deepcopy(m)
                    obj = instances(edited)[kind][i]
                    if field.required and key in obj:
                        del obj[key]
                        out[f"{base}_{kind}{i}_without_{key}.pgb"] = (bundle_corpus.repack(edited, data, version),
                                                                      "reject")
                edited = copy.deepcopy(m)
                instances(edited)[kind][i]["unknown_key"] = [1, {"x": None}]
                out[f"{base}_{kind}{i}_unknown_key.pgb"] = (bundle_corpus.repack(edited, data, version), "accept")
    m, data, version = bases()["v1"]
    for kind, keys in FIELDS.items():
        for key, field in keys.items():
            if field.since > version:
                edited = copy.deepcopy(m)
                instances(edited)[kind][0][key] = []
                out[f"v1_{kind}_with_{key}.pgb"] = (bundle_corpus.repack(edited, data, version), "reject")
    return out


@pytest.fixture(scope="module")
def verdicts(tmp_path_factory) -> tuple[dict, dict, dict]:
    folder = tmp_path_factory.mktemp("fields")
    want = cases()
    for name, (blob, _) in want.items():
        (folder / name).write_bytes(blob)
    js = {k: v["verdict"] for k, v in node_verdicts(folder, {}).items()}
    py = {name: python_verdict(blob)["verdict"] for name, (blob, _) in want.items()}
    return {k: v for k, (_, v) in want.items()}, py, js


def test_both_readers_require_refuse_and_ignore_as_the_definition_says(verdicts):
    want, py, js = verdicts
    wrong = [f"{k}: want {want[k]}, Python {py[k]}, polygrad-js {js[k]}" for k in sorted(want)
             if not want[k] == py[k] == js[k]]
    assert not wrong, "\n".join(wrong)
    assert sum(v == "reject" for v in want.values()) > 50  # every required key of every object kind


def check_written(m: dict) -> list[str]:
    """What in a written manifest the definition does not list, or lacks of what it requires."""
    problems = []
    for kind, objs in every_instance(m).items():
        for obj in objs:
            extra = set(obj) - set(FIELDS[kind])
            problems += [f"{kind} holds {sorted(extra)}"] if extra else []
            missing = [k for k, f in FIELDS[kind].items() if f.required and k not in obj]
            problems += [f"{kind} lacks {missing}"] if missing else []
    return problems


def test_the_python_writer_writes_the_listed_keys(tmp_path):
    for name in ("mlp_adam.pgb", "decoder.pgb"):
        m, _, _ = bundle_corpus.split(Model.load(bundle_corpus.base(name)).save())
        assert not check_written(m), (name, check_written(m))


def test_the_javascript_writer_writes_the_listed_keys(tmp_path):
    out = tmp_path / "saved.pgb"
    script = ("const { Model } = require('.'); const fs = require('fs'); "
              "const m = Model.fromBytesSync(fs.readFileSync('test/fixtures/mlp_untrained.pgb')); "
              "m.fit({ x: new Float32Array(16), y: new Int32Array(4) }, { batchSize: 4, optimizer: 'adam' }); "
              f"fs.writeFileSync({json.dumps(str(out))}, m.save())")
    proc = subprocess.run([NODE, "-e", script], cwd=ROOT / "polygrad-js", capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    m, _, _ = bundle_corpus.split(out.read_bytes())
    assert m["training"]["optimizer"]["name"] == "adam"
    assert not check_written(m), check_written(m)
