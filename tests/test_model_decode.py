"""Model with caches, extra entrypoints and Variable arguments: incremental decoding over a KV cache.

A one-layer causal attention captured as a Model: "forward" takes x[batch, tokens, D] (two Variable
dimensions), fills the cache and returns every position; "decode" takes one new position at a bound
`pos`, writes it into the cache and attends over cache[:pos + 1]. Checked against NumPy recomputing
the whole sequence, with no kernel compiled after capture, and through a version-2 bundle.
"""
import json
import zlib

import numpy as np
import pytest

from polygrad import BundleError, Model, ModelError, Tensor, Variable, bundle
from polygrad.engine import programs
from polygrad.model import ModelInputError

D, S, B = 8, 12, 2


class Attention:
    def __init__(self, rng):
        self.wq, self.wk, self.wv = (Tensor(rng.standard_normal((D, D)).astype(np.float32) * 0.5) for _ in range(3))
        self.mask = Tensor(np.triu(np.full((S, S), -np.inf, np.float32), 1), requires_grad=False)
        self.k_cache = Tensor.zeros(B, S, D).contiguous().realize()
        self.v_cache = Tensor.zeros(B, S, D).contiguous().realize()

    def _attend(self, q, keys, values, mask=None):
        s = q @ keys.transpose(-1, -2) / np.sqrt(D)
        return (s if mask is None else s + mask).softmax(-1) @ values

    def __call__(self, x):
        b, t = x.shape[0], x.shape[1]
        self.k_cache[:b, :t].assign(x @ self.wk).realize()
        self.v_cache[:b, :t].assign(x @ self.wv).realize()
        return {"y": self._attend(x @ self.wq, self.k_cache[:b, :t], self.v_cache[:b, :t], self.mask[:t, :t])}

    def decode(self, x, pos):
        b = x.shape[0]
        self.k_cache[:b, pos:pos + 1].assign(x @ self.wk).realize()
        self.v_cache[:b, pos:pos + 1].assign(x @ self.wv).realize()
        return {"y": self._attend(x @ self.wq, self.k_cache[:b, :pos + 1], self.v_cache[:b, :pos + 1])}


def _reference(att, x):
    wq, wk, wv = (w.numpy() for w in (att.wq, att.wk, att.wv))
    q, k, v = x @ wq, x @ wk, x @ wv
    s = q @ k.transpose(0, 2, 1) / np.sqrt(D) + np.triu(np.full((x.shape[1],) * 2, -np.inf), 1)
    e = np.exp(s - s.max(-1, keepdims=True))
    return (e / e.sum(-1, keepdims=True)) @ v


def _model(att):
    batch, tokens = Variable("batch", 1, B), Variable("tokens", 1, S)
    return Model(att, inputs={"x": Tensor.empty(batch, tokens, D)},
                 params={"wq": att.wq, "wk": att.wk, "wv": att.wv, "mask": att.mask},
                 caches={"k_cache": att.k_cache, "v_cache": att.v_cache},
                 entrypoints={"decode": (att.decode, {"x": Tensor.empty(batch, 1, D),
                                                      "pos": Variable("pos", 0, S - 1)})})


def _decode_run(model, x, prompt):
    """forward on the prompt, then decode the rest one position at a time; every output vs NumPy."""
    want = _reference(_ATT, x)
    got = model.forward(x=x[:, :prompt])["y"].numpy()
    np.testing.assert_allclose(got, want[:, :prompt], rtol=1e-5, atol=1e-5)
    for p in range(prompt, x.shape[1]):
        y = model.call("decode", {"x": x[:, p:p + 1], "pos": p})["y"]
        assert y.shape == (x.shape[0], 1, D)
        np.testing.assert_allclose(y.numpy(), want[:, p:p + 1], rtol=1e-5, atol=1e-5)


_ATT = Attention(np.random.default_rng(0))


def test_decode_over_the_cache_matches_full_recompute_without_compiling():
    model = _model(_ATT)
    x = np.random.default_rng(1).standard_normal((B, 9, D)).astype(np.float32)
    model.forward(x=x[:, :3])  # every program is built by now
    model.call("decode", {"x": x[:, 3:4], "pos": 3})
    compiled = programs.runtime_stats["programs_compiled"]
    _decode_run(model, x, 4)
    _decode_run(model, x[:1], 2)  # a smaller batch and another prompt length: same programs
    assert programs.runtime_stats["programs_compiled"] == compiled
    assert model.entrypoints == ["forward", "decode"]
    assert [s["name"] for s in model.summary().parameters] == ["wq", "wk", "wv"]
    assert [s["name"] for s in model.summary().state] == ["mask"]
    model.dispose()


def test_caches_start_zeroed_and_are_not_saved():
    model = _model(_ATT)
    summary = model.summary()
    assert summary.bytes["cache"] == 2 * B * S * D * 4
    x = np.random.default_rng(2).standard_normal((1, 5, D)).astype(np.float32)
    model.forward(x=x)
    data = model.save()
    manifest, _ = bundle.read(data)
    assert manifest["version"] == 2
    caches = [b for b in manifest["buffers"] if b["role"] == "cache"]
    assert [b["name"] for b in caches] == ["k_cache", "v_cache"] and not any(b.get("data") for b in caches)
    assert manifest["entrypoints"]["decode"]["arguments"] == ["pos"]
    assert manifest["signature"]["inputs"] == [{"name": "x", "dtype": "float32", "shape": ["batch", "tokens", D]}]
    loaded = Model.load(data)
    assert all(not loaded._x.bufs[k].numpy().any() for k, s in enumerate(loaded._p.slots) if s.role == "cache")
    _decode_run(loaded, x, 2)
    loaded.dispose()
    model.dispose()


def test_plain_models_still_write_version_1():
    class Scale:
        def __init__(self):
            self.w = Tensor([2.0])

        def __call__(self, x):
            return {"y": x * self.w}
    m = Model(Scale(), inputs={"x": Tensor.empty(Variable("batch", 1, 4))})
    assert bundle.read(m.save())[0]["version"] == 1
    m.dispose()


def test_variable_dimension_outputs_are_row_major_prefixes():
    class Outer:
        def __init__(self):
            self.w = Tensor(np.arange(3, dtype=np.float32) + 1)

        def __call__(self, x):  # x[rows, cols] -> [rows, cols, 3], two Variable dims
            return {"y": x.unsqueeze(-1) * self.w}
    rows, cols = Variable("rows", 1, 4), Variable("cols", 1, 5)
    m = Model(Outer(), inputs={"x": Tensor.empty(rows, cols)})
    for r, c in ((2, 3), (4, 5), (1, 1)):
        x = np.random.default_rng(r * 10 + c).standard_normal((r, c)).astype(np.float32)
        y = m.forward(x=x)["y"]
        assert y.shape == (r, c, 3)
        np.testing.assert_allclose(y.numpy(), x[..., None] * np.arange(1, 4, dtype=np.float32), rtol=1e-6)
    with pytest.raises(ModelInputError, match="2 Variable dimensions"):
        m.forward(x=np.ones(6, np.float32))
    with pytest.raises(ModelInputError, match="allows 1..5"):
        m.forward(x=np.ones((2, 6), np.float32))
    m.dispose()


def test_argument_errors_are_typed():
    model = _model(_ATT)
    x = np.zeros((1, 1, D), np.float32)
    with pytest.raises(ModelInputError, match="missing \\['pos'\\]"):
        model.call("decode", {"x": x})
    with pytest.raises(ModelInputError, match="outside Variable 'pos' bounds 0..11"):
        model.call("decode", {"x": x, "pos": S})
    with pytest.raises(ModelInputError, match="takes an int"):
        model.call("decode", {"x": x, "pos": 1.5})
    with pytest.raises(ModelError, match="no entrypoint 'decoder'"):
        model.call("decoder", {"x": x, "pos": 1})
    model.dispose()


def test_declaration_errors_are_typed():
    att = _ATT
    with pytest.raises(ModelError, match="under its own name"):
        Model(att.decode, inputs={"x": Tensor.empty(1, 1, D), "p": Variable("pos", 0, S - 1)},
              params={"wq": att.wq, "wk": att.wk, "wv": att.wv}, caches={"k": att.k_cache, "v": att.v_cache})
    with pytest.raises(ModelError, match="identifier other than"):
        Model(att, inputs={"x": Tensor.empty(1, 2, D)}, entrypoints={"loss": (att.decode, {})})
    with pytest.raises(ModelError, match="caches\\['k'\\] must be a Tensor"):
        Model(att, inputs={"x": Tensor.empty(1, 2, D)}, caches={"k": 3})


def test_version_2_fields_in_a_version_1_bundle_are_rejected():
    model = _model(_ATT)
    manifest, body = bundle.read(model.save())
    model.dispose()
    manifest["version"] = 1
    text, data = json.dumps(manifest).encode(), bytes(body)
    head = bundle.HEADER.pack(bundle.MAGIC, 1, 0, len(text), len(data), zlib.crc32(text), zlib.crc32(data))
    with pytest.raises(BundleError, match="needs bundle version 2|only the leading dimension"):
        Model.load(head + text + b"\0" * (bundle._pad(len(text)) - len(text)) + data)


class _TwoEntries:
    """Two entrypoints of two kernels each; the constants are this test's own, so its kernels are new to the
    process's program cache."""

    def __init__(self, rng):
        self.w = Tensor(rng.standard_normal((D, D)).astype(np.float32))

    def __call__(self, x):
        return {"y": ((x @ self.w).contiguous() * 1.8125).relu()}

    def other(self, x):
        return {"y": (x * 2.0625 - 0.4375).contiguous().sum(-1, keepdim=True)}


def test_capture_compiles_nothing_and_a_first_call_compiles_only_its_entrypoint(monkeypatch):
    """Model's capture run only records (realize.deferred): nothing is compiled while capturing, and the first
    call of an entrypoint compiles that entrypoint's kernels in one batch, not another's (issue 30: a cold
    load_hf waits for the prompt's kernels alone). Before, capturing compiled every entrypoint's kernels."""
    batches = []
    real = programs.get_programs

    def get_programs(asts, device):
        batches.append([a for a in asts if (a, device) not in programs.program_cache])
        return real(asts, device)
    monkeypatch.setattr(programs, "get_programs", get_programs)
    m = _TwoEntries(np.random.default_rng(3))
    tokens = Variable("tokens", 1, S)
    model = Model(m, inputs={"x": Tensor.empty(1, tokens, D)}, params={"w": m.w},
                  entrypoints={"other": (m.other, {"x": Tensor.empty(1, tokens, D)})})
    assert [b for b in batches if b] == []
    prog = model._p
    kernels = {name: {prog.kernels[c.kernel] for c in e.calls if c.kernel >= 0} for name, e in prog.entries.items()}
    assert len(kernels["forward"]) == 2 and len(kernels["other"]) == 2 and not kernels["forward"] & kernels["other"]
    x = np.random.default_rng(4).standard_normal((1, 5, D)).astype(np.float32)
    got = model.forward(x=x)["y"].numpy()
    np.testing.assert_allclose(got, np.maximum(x @ m.w.numpy() * 1.8125, 0), rtol=1e-5, atol=1e-5)
    assert [set(b) for b in batches if b] == [kernels["forward"]]  # one batch, the forward's alone
    got = model.call("other", {"x": x})["y"].numpy()
    np.testing.assert_allclose(got, (x * 2.0625 - 0.4375).sum(-1, keepdims=True), rtol=1e-5, atol=1e-5)
    assert [set(b) for b in batches if b] == [kernels["forward"], kernels["other"]]
