"""Fuzzing Model.load with mutated real bundles: every input either loads or raises BundleError.

Three mutation families, thousands of cases together:
- raw bytes anywhere in the file (mostly caught by the header and the checksums);
- raw bytes of the manifest with the header's length and checksums recomputed, so the JSON and
  manifest checks see them;
- structure-aware: one value anywhere in the parsed manifest replaced by another JSON value (huge,
  negative, wrong type, nested), written back with consistent checksums, so the semantic checks
  (buffer table, kernels, entrypoints, training) see them.
Nothing may crash, hang, exhaust memory or raise another exception type. A load that succeeds must
give a usable summary.
"""
from __future__ import annotations

import json
import time
import zlib

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bundle_corpus import apply_edits
from polygrad import BundleError, Model, Tensor, Variable, bundle, nn


def _bundles() -> list[bytes]:
    Tensor.manual_seed(0)

    class Linear:
        def __init__(self):
            self.a, self.b = Tensor([0.0]), Tensor([0.0])

        def __call__(self, x):
            return {"prediction": self.a * x + self.b}
    lin = Model(Linear(), inputs={"x": Tensor.empty(5)}, targets={"y": Tensor.empty(5)},
                loss=lambda o, y: (o["prediction"] - y).square().mean())
    lin.fit({"x": [-2, -1, 0, 1, 2], "y": [-4, -1, 2, 5, 8]}, epochs=2, optimizer="sgd", lr=0.1, verbose=False)

    class MLP:
        def __init__(self):
            self.l1, self.l2 = nn.Linear(3, 4), nn.Linear(4, 2)

        def __call__(self, x):
            return {"logits": self.l2(self.l1(x).relu())}
    b = Variable("batch", 1, 8)
    mlp = Model(MLP(), inputs={"x": Tensor.empty(b, 3)}, targets={"y": Tensor.empty(b, dtype="int32")},
                loss=lambda o, y: o["logits"].sparse_categorical_crossentropy(y))
    rng = np.random.default_rng(0)
    mlp.fit({"x": rng.standard_normal((8, 3)).astype(np.float32), "y": rng.integers(0, 2, 8).astype(np.int32)},
            epochs=1, optimizer="adam", lr=0.01, verbose=False)
    out = [lin.save(), mlp.save(), mlp.save(include_optimizer=False)]
    lin.dispose()
    mlp.dispose()
    return out


BUNDLES = _bundles()


def FUZZ(n: int) -> settings:
    return settings(max_examples=n, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def _split(blob: bytes) -> tuple[bytes, bytes]:
    _, _, _, mlen, dlen, _, _ = bundle.HEADER.unpack_from(blob, 0)
    start = bundle.HEADER.size + bundle._pad(mlen)
    return blob[bundle.HEADER.size:bundle.HEADER.size + mlen], blob[start:start + dlen]


def _pack(text: bytes, data: bytes) -> bytes:
    head = bundle.HEADER.pack(bundle.MAGIC, bundle.VERSION, 0, len(text), len(data), zlib.crc32(text),
                              zlib.crc32(data))
    return head + text + b"\0" * (bundle._pad(len(text)) - len(text)) + data


def _load(blob: bytes) -> None:
    t0 = time.perf_counter()
    try:
        m = Model.load(blob, max_bytes=64 << 20)  # a mutated size may not allocate more than this
    except BundleError as e:
        assert str(e)
    else:
        s = m.summary()
        assert isinstance(s.entrypoints, list)
        m.dispose()
    assert time.perf_counter() - t0 < 5.0, "a load took over 5 s"


def test_unmodified_bundles_load():
    for b in BUNDLES:
        Model.load(b).dispose()


byte_edits = st.lists(st.tuples(st.sampled_from(["flip", "set", "insert", "delete"]), st.integers(0, 1 << 20),
                                st.integers(0, 255)), min_size=1, max_size=4)



@FUZZ(600)
@given(which=st.integers(0, len(BUNDLES) - 1), edits=byte_edits, cut=st.none() | st.integers(0, 1 << 20))
def test_raw_byte_mutations(which, edits, cut):
    blob = apply_edits(bytearray(BUNDLES[which]), edits)
    if cut is not None:
        blob = blob[:cut % (len(blob) + 1)]
    _load(bytes(blob))


@FUZZ(800)
@given(which=st.integers(0, len(BUNDLES) - 1), edits=byte_edits)
def test_manifest_byte_mutations_with_valid_checksums(which, edits):
    text, data = _split(BUNDLES[which])
    _load(_pack(bytes(apply_edits(bytearray(text), edits)), data))


json_values = st.recursive(
    st.none() | st.booleans() | st.sampled_from([0, 1, -1, 2, 7, 63, 64, 255, 2**31 - 1, 2**31, 2**32, 2**53,
                                                 2**63, 2**64, -2**31, 10**30])
    | st.integers(-5, 70) | st.floats(allow_nan=False, allow_infinity=False)
    | st.sampled_from(["", "float32", "int32", "bool", "parameter", "state", "rng", "optimizer", "gradient", "input",
                       "output", "temporary", "batch", "x", "forward", "train_step", "uop", "ADD", "DEFINE_GLOBAL",
                       "../../etc/passwd", "a" * 300, "__import__('os')"]),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.sampled_from(["name", "shape", "data", "offset",
                                                                                 "nbytes", "kernel", "args", "op"]),
                                                                inner, max_size=3),
    max_leaves=8)


def _paths(obj, prefix=()):
    yield prefix
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _paths(v, prefix + (i,))


MANIFESTS = [json.loads(_split(b)[0]) for b in BUNDLES]
PATHS = [list(_paths(m))[1:] for m in MANIFESTS]


@FUZZ(1000)
@given(data=st.data())
def test_structure_aware_manifest_mutations(data):
    which = data.draw(st.integers(0, len(BUNDLES) - 1))
    manifest = json.loads(json.dumps(MANIFESTS[which]))
    for _ in range(data.draw(st.integers(1, 3))):
        path = data.draw(st.sampled_from(PATHS[which]))
        parent = manifest
        try:
            for key in path[:-1]:
                parent = parent[key]
            action = data.draw(st.sampled_from(["replace", "replace", "delete", "duplicate"]))
            if action == "replace":
                parent[path[-1]] = data.draw(json_values)
            elif action == "delete":
                if isinstance(parent, dict):
                    del parent[path[-1]]
                else:
                    parent.pop(path[-1])
            elif isinstance(parent, list):
                parent.append(parent[path[-1]])
            else:
                parent[path[-1]] = [parent[path[-1]], parent[path[-1]]]
        except (KeyError, IndexError, TypeError):
            continue  # an earlier edit removed this path
    _load(_pack(json.dumps(manifest).encode(), _split(BUNDLES[which])[1]))


def _stored(m: dict) -> dict:
    return next(b for b in m["buffers"] if isinstance(b.get("data"), dict))


@pytest.mark.parametrize("edit,match", [
    (lambda m: m["buffers"][0].update(size=2**40), "size"),
    (lambda m: _stored(m)["data"].update(offset=2**40), "offset|data"),
    (lambda m: _stored(m)["data"].update(nbytes=3), "nbytes|bytes"),
    (lambda m: m["buffers"][0].update(dtype="float128"), "dtype"),
    (lambda m: m["buffers"][0].update(role="weights"), "role"),
    (lambda m: m.update(version=2), "version"),
    (lambda m: m["entrypoints"]["forward"]["calls"][0].update(kernel=999), "kernel"),
    (lambda m: m["entrypoints"]["forward"]["calls"][0].update(args=[0]), "arg|parameter|buffer"),
])
def test_targeted_manifest_lies_are_named(edit, match):
    manifest = json.loads(json.dumps(MANIFESTS[0]))
    edit(manifest)
    with pytest.raises(BundleError, match=match):
        Model.load(_pack(json.dumps(manifest).encode(), _split(BUNDLES[0])[1]))


def test_shrunken_buffer_is_caught_by_the_index_check():
    """A buffer declared smaller than a kernel reads from it must be rejected before anything runs."""
    manifest = json.loads(json.dumps(MANIFESTS[1]))
    for buf in manifest["buffers"]:
        if buf["role"] == "parameter" and buf["size"] > 1:  # a weight matrix, stored
            buf["size"] //= 2
            buf["shape"] = [buf["size"]]
            buf["data"]["nbytes"] = buf["size"] * 4
            break
    with pytest.raises(BundleError):
        Model.load(_pack(json.dumps(manifest).encode(), _split(BUNDLES[1])[1]))
