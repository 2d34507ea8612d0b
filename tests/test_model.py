"""Model: capture, running, fit with minibatches, save/load round trips, errors.

References are NumPy and PyTorch CPU: a model's numbers are never checked against the model itself,
except where the claim *is* sameness (a bundle reloaded, a resumed run, another backend).
"""
from __future__ import annotations

import os

import numpy as np
import pytest
import torch

import polygrad
from polygrad import BundleError, Model, ModelError, Tensor, Variable, nn
from polygrad.engine import programs
from polygrad.model import ModelCaptureError, ModelInputError

from conftest import DEVICES


class Linear:
    def __init__(self) -> None:
        self.a = Tensor([0.0])
        self.b = Tensor([0.0])

    def __call__(self, x):
        return {"prediction": self.a * x + self.b}


def linear_model() -> Model:
    return Model(Linear(), inputs={"x": Tensor.empty(5)}, targets={"y": Tensor.empty(5)},
                 loss=lambda outputs, y: (outputs["prediction"] - y).square().mean())


X5 = [-2.0, -1.0, 0.0, 1.0, 2.0]
Y5 = [-4.0, -1.0, 2.0, 5.0, 8.0]


def numpy_linear_sgd(epochs: int, lr: float) -> tuple[list[float], float, float]:
    x, y = np.array(X5, np.float64), np.array(Y5, np.float64)
    a = b = 0.0
    losses = []
    for _ in range(epochs):
        err = a * x + b - y
        losses.append(float(np.mean(err ** 2)))
        a, b = a - lr * float(np.mean(2 * err * x)), b - lr * float(np.mean(2 * err))
    return losses, a, b


class MLP:
    def __init__(self, n_in: int = 4, hidden: int = 16, n_out: int = 3) -> None:
        self.l1 = nn.Linear(n_in, hidden)
        self.l2 = nn.Linear(hidden, n_out)

    def __call__(self, x):
        return {"logits": self.l2(self.l1(x).relu())}


def torch_mlp(net: MLP) -> torch.nn.Sequential:
    t = torch.nn.Sequential(torch.nn.Linear(net.l1.weight.shape[1], net.l1.weight.shape[0]), torch.nn.ReLU(),
                            torch.nn.Linear(net.l2.weight.shape[1], net.l2.weight.shape[0]))
    with torch.no_grad():
        for layer, src in ((t[0], net.l1), (t[2], net.l2)):
            layer.weight.copy_(torch.from_numpy(src.weight.numpy()))
            layer.bias.copy_(torch.from_numpy(src.bias.numpy()))
    return t


def xent(outputs, y):
    return outputs["logits"].sparse_categorical_crossentropy(y)


def data(n: int = 64, n_in: int = 4, classes: int = 3, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, n_in)).astype(np.float32), rng.integers(0, classes, n).astype(np.int32)


# ---------------------------------------------------------------- the spec's linear fit
def test_spec_linear_fit_matches_numpy_gradient_descent(tmp_path):
    model = linear_model()
    try:
        losses = model.fit({"x": X5, "y": Y5}, epochs=100, optimizer="sgd", lr=0.1, verbose=False)
        ref, a, b = numpy_linear_sgd(100, 0.1)
        np.testing.assert_allclose(losses, ref, rtol=1e-4, atol=1e-5)
        pred = model.forward(x=[3, 4, 5, 6, 7])["prediction"].numpy()
        np.testing.assert_allclose(pred, a * np.array([3, 4, 5, 6, 7]) + b, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(pred, [11, 14, 17, 20, 23], atol=0.05)
        path = tmp_path / "linear.pgb"
        assert model.save(str(path), include_optimizer=False) is None
    finally:
        model.dispose()
    loaded = Model.load(str(path))
    try:
        np.testing.assert_array_equal(loaded.forward(x=[3, 4, 5, 6, 7])["prediction"].numpy(), pred)
        assert set(loaded.entrypoints) >= {"forward", "train_step"}  # training survives include_optimizer=False
    finally:
        loaded.dispose()


def test_fit_returns_the_loss_before_each_update():
    model = linear_model()
    try:
        first = model.fit({"x": X5, "y": Y5}, epochs=1, optimizer="sgd", lr=0.1, verbose=False)
        assert first == pytest.approx([float(np.mean(np.array(Y5) ** 2))])  # a = b = 0 before the update
        step = model.train_step({"x": X5}, {"y": Y5})
        ref, _, _ = numpy_linear_sgd(2, 0.1)
        assert float(np.asarray(step.numpy() if isinstance(step, Tensor) else step)) == pytest.approx(ref[1], rel=1e-5)
    finally:
        model.dispose()


# ---------------------------------------------------------------- MLP with Adam against PyTorch
@pytest.mark.parametrize("opt", ["sgd", "adam", "adamw"])
def test_mlp_fit_matches_torch(opt):
    Tensor.manual_seed(1)
    net = MLP()
    tnet = torch_mlp(net)
    X, Y = data(32)
    model = Model(net, inputs={"x": Tensor.empty(16, 4)}, targets={"y": Tensor.empty(16, dtype="int32")}, loss=xent)
    try:
        kw = {"weight_decay": 0.01} if opt == "adamw" else {}
        losses = model.fit({"x": X, "y": Y}, epochs=3, batch_size=16, optimizer=opt, lr=0.01, verbose=False, **kw)
        topt = {"sgd": lambda p: torch.optim.SGD(p, lr=0.01),
                "adam": lambda p: torch.optim.Adam(p, lr=0.01),
                "adamw": lambda p: torch.optim.AdamW(p, lr=0.01, weight_decay=0.01)}[opt](tnet.parameters())
        ref = []
        for _ in range(3):
            for i in range(0, 32, 16):
                topt.zero_grad()
                loss = torch.nn.functional.cross_entropy(tnet(torch.from_numpy(X[i:i + 16])),
                                                         torch.from_numpy(Y[i:i + 16]).long())
                ref.append(loss.item())
                loss.backward()
                topt.step()
        np.testing.assert_allclose(losses, ref, rtol=2e-4, atol=2e-5)
        with torch.no_grad():
            want = tnet(torch.from_numpy(X[:16])).numpy()
        got = model.forward(x=X[:16])["logits"].numpy()
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
        params = model.parameters()
        np.testing.assert_allclose(params["l1.weight"].numpy(), tnet[0].weight.detach().numpy(), rtol=1e-4, atol=1e-5)
        blob = model.save()
        assert isinstance(blob, bytes)
    finally:
        model.dispose()
    again = Model.load(blob)
    try:
        np.testing.assert_array_equal(again.forward(x=X[:16])["logits"].numpy(), got)
    finally:
        again.dispose()


def test_lamb_trains_and_round_trips():
    Tensor.manual_seed(2)
    X, Y = data(32)
    model = Model(MLP(), inputs={"x": Tensor.empty(32, 4)}, targets={"y": Tensor.empty(32, dtype="int32")}, loss=xent)
    try:
        losses = model.fit({"x": X, "y": Y}, epochs=20, optimizer="lamb", lr=0.01, verbose=False)
        assert len(losses) == 20 and losses[-1] < losses[0]
        again = Model.load(model.save())
        np.testing.assert_array_equal(again.forward(x=X)["logits"].numpy(), model.forward(x=X)["logits"].numpy())
        again.dispose()
    finally:
        model.dispose()


def test_resume_from_bundle_reproduces_uninterrupted_losses_exactly():
    Tensor.manual_seed(0)
    X, Y = data(64)
    batch = Variable("batch", 1, 32)
    model = Model(MLP(), inputs={"x": Tensor.empty(batch, 4)}, targets={"y": Tensor.empty(batch, dtype="int32")},
                  loss=xent)
    try:
        model.fit({"x": X[:32], "y": Y[:32]}, epochs=2, batch_size=16, optimizer="adam", lr=0.01, verbose=False)
        blob = model.save()  # optimizer state included by default
        uninterrupted = model.fit({"x": X[32:], "y": Y[32:]}, epochs=2, batch_size=16, verbose=False)
    finally:
        model.dispose()
    resumed = Model.load(blob)
    try:
        again = resumed.fit({"x": X[32:], "y": Y[32:]}, epochs=2, batch_size=16, optimizer="adam", lr=0.01,
                            verbose=False)
        assert again == uninterrupted  # bit for bit
    finally:
        resumed.dispose()


def test_excluding_optimizer_state_restarts_the_optimizer():
    Tensor.manual_seed(0)
    X, Y = data(32)
    model = Model(MLP(), inputs={"x": Tensor.empty(32, 4)}, targets={"y": Tensor.empty(32, dtype="int32")}, loss=xent)
    try:
        model.fit({"x": X, "y": Y}, epochs=3, optimizer="adam", lr=0.01, verbose=False)
        full, lean = model.save(), model.save(include_optimizer=False)
        assert lean != full
        tnet = torch_mlp_from_params(model.parameters())
    finally:
        model.dispose()
    fresh = Model.load(lean)
    try:
        losses = fresh.fit({"x": X, "y": Y}, epochs=2, optimizer="adam", lr=0.01, verbose=False)
    finally:
        fresh.dispose()
    topt = torch.optim.Adam(tnet.parameters(), lr=0.01)  # a fresh Adam from the saved weights
    ref = []
    for _ in range(2):
        topt.zero_grad()
        loss = torch.nn.functional.cross_entropy(tnet(torch.from_numpy(X)), torch.from_numpy(Y).long())
        ref.append(loss.item())
        loss.backward()
        topt.step()
    np.testing.assert_allclose(losses, ref, rtol=2e-4, atol=2e-5)


def torch_mlp_from_params(params: dict) -> torch.nn.Sequential:
    w1, w2 = params["l1.weight"].numpy(), params["l2.weight"].numpy()
    t = torch.nn.Sequential(torch.nn.Linear(w1.shape[1], w1.shape[0]), torch.nn.ReLU(),
                            torch.nn.Linear(w2.shape[1], w2.shape[0]))
    with torch.no_grad():
        t[0].weight.copy_(torch.from_numpy(w1))
        t[0].bias.copy_(torch.from_numpy(params["l1.bias"].numpy()))
        t[2].weight.copy_(torch.from_numpy(w2))
        t[2].bias.copy_(torch.from_numpy(params["l2.bias"].numpy()))
    return t


# ---------------------------------------------------------------- conv + BatchNorm: state role
class ConvBN:
    def __init__(self) -> None:
        self.conv = nn.Conv2d(1, 4, 3)
        self.bn = nn.BatchNorm2d(4)
        self.fc = nn.Linear(4 * 4 * 4, 2)

    def __call__(self, x):
        h = self.bn(self.conv(x)).relu()
        return {"logits": self.fc(h.reshape(h.shape[0], -1))}


def test_conv_batchnorm_state_is_model_owned_and_round_trips():
    Tensor.manual_seed(3)
    rng = np.random.default_rng(3)
    X = rng.standard_normal((8, 1, 6, 6)).astype(np.float32)
    Y = rng.integers(0, 2, 8).astype(np.int32)
    net = ConvBN()
    authoring_mean = net.bn.running_mean.numpy().copy()
    model = Model(net, inputs={"x": Tensor.empty(8, 1, 6, 6)}, targets={"y": Tensor.empty(8, dtype="int32")},
                  loss=xent)
    try:
        summary = model.summary()
        assert {s["name"] for s in summary.state} >= {"bn.running_mean", "bn.running_var"}
        assert "bn.running_mean" not in {p["name"] for p in summary.parameters}
        state0 = model.parameters()["bn.running_mean"].numpy().copy()
        out0 = model.forward(x=X)["logits"].numpy()
        np.testing.assert_array_equal(model.forward(x=X)["logits"].numpy(), out0)  # evaluation updates nothing
        # a torch reference of the evaluation forward from the captured weights and running statistics
        tconv = torch.nn.Conv2d(1, 4, 3)
        tbn = torch.nn.BatchNorm2d(4).eval()
        tfc = torch.nn.Linear(64, 2)
        with torch.no_grad():
            tconv.weight.copy_(torch.from_numpy(net.conv.weight.numpy()))
            tconv.bias.copy_(torch.from_numpy(net.conv.bias.numpy()))
            tbn.weight.copy_(torch.from_numpy(net.bn.weight.numpy()))
            tbn.bias.copy_(torch.from_numpy(net.bn.bias.numpy()))
            tbn.running_mean.copy_(torch.from_numpy(net.bn.running_mean.numpy()))
            tbn.running_var.copy_(torch.from_numpy(net.bn.running_var.numpy()))
            tfc.weight.copy_(torch.from_numpy(net.fc.weight.numpy()))
            tfc.bias.copy_(torch.from_numpy(net.fc.bias.numpy()))
            want = tfc(torch.relu(tbn(tconv(torch.from_numpy(X)))).reshape(8, -1)).numpy()
        np.testing.assert_allclose(out0, want, rtol=1e-4, atol=1e-5)
        model.fit({"x": X, "y": Y}, epochs=3, optimizer="sgd", lr=0.05, verbose=False)
        out1 = model.forward(x=X)["logits"].numpy()
        assert not np.array_equal(out0, out1)
        assert not np.array_equal(model.parameters()["bn.running_mean"].numpy(), state0)  # training moved them
        np.testing.assert_array_equal(net.bn.running_mean.numpy(), authoring_mean)  # the authoring layer is untouched
        blob = model.save()
    finally:
        model.dispose()
    again = Model.load(blob)
    try:
        np.testing.assert_array_equal(again.forward(x=X)["logits"].numpy(), out1)
    finally:
        again.dispose()


# ---------------------------------------------------------------- embedding + attention
class TinyAttention:
    def __init__(self, vocab: int = 11, dim: int = 8) -> None:
        self.emb = nn.Embedding(vocab, dim)
        self.q = nn.Linear(dim, dim, bias=False)
        self.k = nn.Linear(dim, dim, bias=False)
        self.v = nn.Linear(dim, dim, bias=False)
        self.out = nn.Linear(dim, vocab)

    def __call__(self, tokens):
        h = self.emb(tokens)
        att = self.q(h).scaled_dot_product_attention(self.k(h), self.v(h), is_causal=True)
        return {"logits": self.out(h + att)}


def test_embedding_attention_forward_matches_torch_and_round_trips():
    Tensor.manual_seed(4)
    net = TinyAttention()
    toks = np.array([[1, 5, 2, 9, 3, 0], [4, 4, 7, 10, 1, 2]], dtype=np.int32)
    model = Model(net, inputs={"tokens": Tensor.empty(2, 6, dtype="int32")})
    try:
        got = model.forward(tokens=toks)["logits"].numpy()
        w = {k: torch.from_numpy(v.numpy()) for k, v in nn.state.get_state_dict(net).items()}
        h = w["emb.weight"][torch.from_numpy(toks).long()]
        att = torch.nn.functional.scaled_dot_product_attention(h @ w["q.weight"].T, h @ w["k.weight"].T,
                                                               h @ w["v.weight"].T, is_causal=True)
        want = ((h + att) @ w["out.weight"].T + w["out.bias"]).numpy()
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
        assert model.entrypoints == ["forward"]  # no loss: no training entrypoint
        with pytest.raises(ModelError, match="train"):
            model.train_step({"tokens": toks}, {})
        blob = model.save()
    finally:
        model.dispose()
    again = Model.load(blob)
    try:
        np.testing.assert_array_equal(again.forward(tokens=toks)["logits"].numpy(), got)
    finally:
        again.dispose()


# ---------------------------------------------------------------- variable batch
def test_variable_batch_compiles_once_and_keeps_bounds():
    Tensor.manual_seed(5)
    net = MLP()
    tnet = torch_mlp(net)
    X, _ = data(64)
    batch = Variable("batch", 1, 32)
    model = Model(net, inputs={"x": Tensor.empty(batch, 4)})
    try:
        first = model.forward(x=X[:3])["logits"]
        compiled = polygrad.stats()["programs_compiled"]
        outs = {n: model.forward(x=X[:n])["logits"] for n in (1, 7, 32)}
        assert polygrad.stats()["programs_compiled"] == compiled  # new sizes within bounds compile nothing
        with torch.no_grad():
            for n, o in outs.items():
                assert o.shape == (n, 3)
                np.testing.assert_allclose(o.numpy(), tnet(torch.from_numpy(X[:n])).numpy(), rtol=1e-4, atol=1e-5)
        assert first.shape == (3, 3)  # an earlier result keeps its own shape and values
        with torch.no_grad():
            np.testing.assert_allclose(first.numpy(), tnet(torch.from_numpy(X[:3])).numpy(), rtol=1e-4, atol=1e-5)
        for bad in (0, 33):
            with pytest.raises(ModelInputError, match="1..32"):
                model.forward(x=np.zeros((bad, 4), np.float32))
        assert model.variables == {"batch": (1, 32)}
        blob = model.save()
    finally:
        model.dispose()
    again = Model.load(blob)
    try:
        assert again.variables == {"batch": (1, 32)}
        np.testing.assert_array_equal(again.forward(x=X[:7])["logits"].numpy(), outs[7].numpy())
        with pytest.raises(ModelInputError, match="1..32"):
            again.forward(x=np.zeros((40, 4), np.float32))
    finally:
        again.dispose()


def test_results_survive_later_calls_and_dispose():
    model = linear_model()
    model.fit({"x": X5, "y": Y5}, epochs=20, optimizer="sgd", lr=0.1, verbose=False)
    a = model.forward(x=[1, 1, 1, 1, 1])["prediction"]
    b = model.forward(x=[2, 2, 2, 2, 2])["prediction"]
    model.dispose()
    model.dispose()  # idempotent
    va, vb = a.numpy(), b.numpy()
    assert not np.array_equal(va, vb)
    np.testing.assert_allclose(vb - va, np.full(5, va[0] - (2 * va[0] - vb[0])), rtol=1e-5)
    assert (a + 1).numpy().tolist() == pytest.approx((va + 1).tolist())  # still usable in new graphs
    for use in (lambda: model.forward(x=X5), lambda: model.save(), lambda: model.fit({"x": X5, "y": Y5}),
                lambda: model.train_step({"x": X5}, {"y": Y5})):
        with pytest.raises(ModelError, match="disposed"):
            use()


def test_calls_launch_through_bound_launchers_and_keep_their_own_results(monkeypatch):
    """After the first call, a CPU Model's kernels launch through launchers bound once (model/executor.py:
    the CPU backend packs their pointers once, not at every launch: ~2.5 us of 54 launches in MobileNetV2),
    never the program's per-call conversion. Where a handle changes (the output's buffer, handed out and
    replaced each call; a fed device tensor's buffer, bound for one call without a copy) its launchers are
    bound again: every result is its own call's (checked against torch)."""
    from polygrad_backend_cpu.runtime import CPUProgram
    Tensor.manual_seed(5)
    net = MLP()
    tnet = torch_mlp(net)
    X, _ = data(16)
    model = Model(net, inputs={"x": Tensor.empty(8, 4)})
    if model.device != "CPU":
        model.dispose()
        pytest.skip("the default device is not CPU")
    try:
        first = model.forward(x=X[:8])["logits"]
        device_x = Tensor(X[:8], device="CPU").realize()
        called: list = []
        direct = CPUProgram.__call__
        own = {id(p.program) for p in model._x.programs.values()}  # the Model's kernels (a fed tensor's copy is not)
        monkeypatch.setattr(CPUProgram, "__call__",
                            lambda self, *a: (id(self) in own and called.append(self)) or direct(self, *a))
        runs = programs.runtime_stats
        before = runs["kernels_run"]
        second = model.forward(x=X[8:])["logits"]
        per_call, before = runs["kernels_run"] - before, runs["kernels_run"]
        fed = model.forward(x=device_x)["logits"]
        assert runs["kernels_run"] - before == per_call  # its own buffer is bound: no copy kernel
        view = Tensor(X, device="CPU").realize()[8:]  # a view is made contiguous first
        fed_view = model.forward(x=view)["logits"]
        third = model.forward(x=X[8:])["logits"]
        assert called == [], [p.spec.name for p in called]
        with torch.no_grad():
            for out, x in ((first, X[:8]), (second, X[8:]), (fed, X[:8]), (fed_view, X[8:]), (third, X[8:])):
                np.testing.assert_allclose(out.numpy(), tnet(torch.from_numpy(x)).numpy(), rtol=1e-4, atol=1e-5)
    finally:
        model.dispose()


def test_cpu_calls_run_their_kernels_as_launch_plans(monkeypatch):
    """On CPU, a Model call's kernels run as one launch plan (the pool library's pg_run_plan: no Python between
    kernels, runtime.LaunchPlan), the Variables' values written into the plan each call: results equal the
    launch-by-launch path's bit for bit, over Variable batch sizes and training steps, and no kernel launches
    through its own program or launcher."""
    from polygrad_backend_cpu import runtime
    from polygrad_backend_cpu.runtime import CPUProgram, LaunchPlan
    if Model(MLP(), inputs={"x": Tensor.empty(2, 4)}).device != "CPU":
        pytest.skip("the default device is not CPU")
    runtime.c_pool(wait=True)
    X, Y = data(32)
    batch = Variable("batch", 1, 32)

    def run(plans: bool) -> tuple[list, int]:
        Tensor.manual_seed(7)
        model = Model(MLP(), inputs={"x": Tensor.empty(batch, 4)}, targets={"y": Tensor.empty(batch, dtype="int32")},
                      loss=xent)
        model.fit({"x": X[:4], "y": Y[:4]}, epochs=1, optimizer="adam", lr=0.01, verbose=False)
        calls = []
        try:
            with monkeypatch.context() as m:
                if not plans:
                    m.setattr(CPUProgram, "launch_plan", staticmethod(lambda launches: None))
                direct = LaunchPlan.__call__
                m.setattr(LaunchPlan, "__call__", lambda self: calls.append(self.n) or direct(self))
                m.setattr(CPUProgram, "__call__", lambda *a: pytest.fail("a kernel launched on its own"))
                outs = []
                for n in (3, 32, 1, 7):
                    outs.append(model.train_step({"x": X[:n]}, {"y": Y[:n]}))
                    outs.append(model.forward(x=X[:n])["logits"].numpy())
            return outs, len(calls)
        finally:
            model.dispose()

    with_plans, plan_calls = run(True)
    one_by_one, none = run(False)
    assert plan_calls == 8 and none == 0  # one plan a call: these entrypoints have no copies
    for a, b in zip(with_plans, one_by_one):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


# ---------------------------------------------------------------- minibatches
def test_minibatches_visit_samples_in_order_and_reject_incomplete_batches():
    Tensor.manual_seed(6)
    net = MLP()
    tnet = torch_mlp(net)
    X, Y = data(40)
    batch = Variable("b", 1, 16)
    model = Model(net, inputs={"x": Tensor.empty(batch, 4)}, targets={"y": Tensor.empty(batch, dtype="int32")},
                  loss=xent)
    try:
        with pytest.raises(ModelInputError, match="remainder='drop'"):
            model.fit({"x": X, "y": Y}, batch_size=16, optimizer="sgd", lr=0.1, verbose=False)
        before = {k: v.numpy().copy() for k, v in model.parameters().items()}
        for k, v in model.parameters().items():  # the rejection trained nothing
            np.testing.assert_array_equal(v.numpy(), before[k])
        with pytest.raises(ModelInputError, match="16"):
            model.fit({"x": X, "y": Y}, batch_size=20, optimizer="sgd", lr=0.1, verbose=False)
        dropped = model.fit({"x": X, "y": Y}, batch_size=16, remainder="drop", optimizer="sgd", lr=0.1, verbose=False)
        assert len(dropped) == 2
        kept = model.fit({"x": X, "y": Y}, batch_size=16, remainder="keep", verbose=False)
        assert len(kept) == 3
    finally:
        model.dispose()
    topt = torch.optim.SGD(tnet.parameters(), lr=0.1)
    ref = []
    for bounds in ([(0, 16), (16, 32)], [(0, 16), (16, 32), (32, 40)]):
        for lo, hi in bounds:
            topt.zero_grad()
            xb, yb = torch.from_numpy(X[lo:hi]), torch.from_numpy(Y[lo:hi]).long()
            loss = torch.nn.functional.cross_entropy(tnet(xb), yb)
            ref.append(loss.item())
            loss.backward()
            topt.step()
    np.testing.assert_allclose(dropped + kept, ref, rtol=2e-4, atol=2e-5)


def test_tensor_datasets_are_sliced_on_device(monkeypatch):
    Tensor.manual_seed(7)
    X, Y = data(32)
    batch = Variable("batch", 1, 8)
    model = Model(MLP(), inputs={"x": Tensor.empty(batch, 4)}, targets={"y": Tensor.empty(batch, dtype="int32")},
                  loss=xent)
    twin = Model.load(model.save())
    try:
        host = twin.fit({"x": X, "y": Y}, batch_size=8, optimizer="sgd", lr=0.1, verbose=False)
        tx = Tensor(X).realize()
        from polygrad.device import Buffer
        dataset, readback = tx._buffer(), Buffer.numpy

        def no_readback(self, *a, **k):
            assert self is not dataset, "fit read a Tensor dataset back to the host"
            return readback(self, *a, **k)
        monkeypatch.setattr(Buffer, "numpy", no_readback)
        mixed = model.fit({"x": tx, "y": Y}, batch_size=8, optimizer="sgd", lr=0.1, verbose=False)
        monkeypatch.undo()
        np.testing.assert_allclose(mixed, host, rtol=1e-6)
    finally:
        model.dispose()
        twin.dispose()


def test_progress_bar_is_silenced_by_verbose_false(capsys):
    model = linear_model()
    try:
        model.fit({"x": X5, "y": Y5}, epochs=3, optimizer="sgd", lr=0.1, verbose=False)
        captured = capsys.readouterr()
        assert captured.out == "" and captured.err == ""
    finally:
        model.dispose()


# ---------------------------------------------------------------- input forms and errors
def test_input_forms_and_their_errors():
    Tensor.manual_seed(8)
    model = Model(MLP(), inputs={"x": Tensor.empty(2, 4)})
    try:
        X = np.arange(8, dtype=np.float32).reshape(2, 4) / 10
        ref = model.forward(x=X)["logits"].numpy()
        np.testing.assert_array_equal(model.forward(x=X.reshape(-1))["logits"].numpy(), ref)  # flat: signature
        np.testing.assert_array_equal(model.forward(x=X.tolist())["logits"].numpy(), ref)  # nested lists
        np.testing.assert_array_equal(model.forward(x=Tensor(X))["logits"].numpy(), ref)  # a Tensor
        np.testing.assert_array_equal(model.call("forward", {"x": X})["logits"].numpy(), ref)
        with pytest.raises(ModelInputError, match=r"'x' has shape \[4, 2\]; expected \[2, 4\]"):
            model.forward(x=X.reshape(4, 2))  # same element count, wrong shape
        with pytest.raises(ModelInputError, match=r"'x' has 7 values"):
            model.forward(x=np.zeros(7, np.float32))
        with pytest.raises(ModelInputError, match=r"unknown \['y'\]"):
            model.forward(x=X, y=X)
        with pytest.raises(ModelInputError, match=r"missing \['x'\]"):
            model.forward()
        with pytest.raises(ModelInputError, match="expected float32"):
            model.forward(x=np.array(["a"] * 8).reshape(2, 4))
        with pytest.raises(ModelInputError, match="int32 Tensor; expected float32"):
            model.forward(x=Tensor(np.zeros((2, 4), np.int32)))
        with pytest.raises(ModelError, match="no entrypoint 'backward'"):
            model.call("backward", {"x": X})
    finally:
        model.dispose()


def test_capture_restores_authoring_state_even_on_failure():
    net = Linear()
    a_before = net.a.uop

    def bad(o, y):
        raise RuntimeError("boom in loss")
    training = Tensor.training
    with pytest.raises(RuntimeError, match="boom"):
        Model(net, inputs={"x": Tensor.empty(5)}, targets={"y": Tensor.empty(5)}, loss=bad)
    assert net.a.uop is a_before and Tensor.training == training
    np.testing.assert_array_equal(net.a.numpy(), [0.0])
    assert net.a.grad is None


@pytest.mark.parametrize("read", ["numpy", "item", "tolist"])
def test_capture_rejects_effectful_reads(read):
    class Reader(Linear):
        def __call__(self, x):
            getattr(x.sum(), read)()
            return {"prediction": self.a * x}
    with pytest.raises(ModelCaptureError, match=read):
        Model(Reader(), inputs={"x": Tensor.empty(5)})


def test_capture_rejects_assignments_to_parameters_and_inputs():
    class Assigns(Linear):
        def __call__(self, x):
            self.a.assign(self.a + 1)
            return {"prediction": self.a * x}

    class AssignsInput(Linear):
        def __call__(self, x):
            x.assign(x * 2)
            return {"prediction": self.a * x}
    with pytest.raises(ModelCaptureError, match="assign"):
        Model(Assigns(), inputs={"x": Tensor.empty(5)})
    with pytest.raises(ModelCaptureError, match="assign"):
        Model(AssignsInput(), inputs={"x": Tensor.empty(5)})


def test_functions_need_their_closure_state_passed():
    w = Tensor([2.0, 3.0])

    def f(x):
        return {"y": x * w}
    with pytest.raises(ModelCaptureError, match="params"):
        Model(f, inputs={"x": Tensor.empty(2)})
    model = Model(f, inputs={"x": Tensor.empty(2)}, params={"w": w})
    try:
        np.testing.assert_allclose(model.forward(x=[1, 1])["y"].numpy(), [2, 3])
        assert list(model.parameters()) == ["w"]
    finally:
        model.dispose()


def test_without_loss_capture_uses_current_training_mode():
    Tensor.manual_seed(9)

    class Drop:
        def __init__(self):
            self.w = Tensor.ones(64)

        def __call__(self, x):
            return {"y": (x * self.w).dropout(0.5)}
    Tensor.training = True
    try:
        train = Model(Drop(), inputs={"x": Tensor.empty(64)})
    finally:
        Tensor.training = False
    evaluate = Model(Drop(), inputs={"x": Tensor.empty(64)})
    try:
        ones = np.ones(64, np.float32)
        a, b = train.forward(x=ones)["y"].numpy(), train.forward(x=ones)["y"].numpy()
        assert set(np.unique(a)) <= {0.0, 2.0} and (a == 0).any() and not np.array_equal(a, b)  # RNG advances
        np.testing.assert_array_equal(evaluate.forward(x=ones)["y"].numpy(), ones)
        blob = train.save()
        c = train.forward(x=ones)["y"].numpy()
        again = Model.load(blob)  # the RNG state is in the bundle
        np.testing.assert_array_equal(again.forward(x=ones)["y"].numpy(), c)
        again.dispose()
    finally:
        train.dispose()
        evaluate.dispose()


def test_summary_executes_nothing_and_reads_no_weights(monkeypatch):
    Tensor.manual_seed(10)
    model = Model(MLP(), inputs={"x": Tensor.empty(Variable("batch", 1, 64), 4)},
                  targets={"y": Tensor.empty(Variable("batch", 1, 64), dtype="int32")}, loss=xent)
    try:
        from polygrad.device import Buffer
        monkeypatch.setattr(Buffer, "numpy", lambda *a, **k: pytest.fail("summary read a buffer"))
        runs = programs.runtime_stats["kernels_run"]
        s = model.summary()
        assert programs.runtime_stats["kernels_run"] == runs
        monkeypatch.undo()
        assert [p["name"] for p in s.parameters] == ["l1.weight", "l1.bias", "l2.weight", "l2.bias"]
        assert tuple(s.parameters[0]["shape"]) == (16, 4) and s.parameters[0]["dtype"] == "float32"
        assert sum(p["count"] for p in s.parameters) == 4 * 16 + 16 + 16 * 3 + 3
        assert s.inputs[0]["name"] == "x" and tuple(s.inputs[0]["shape"]) == ("batch", 4)
        assert s.outputs[0]["name"] == "logits"
        assert {"forward", "loss"} <= set(s.entrypoints)  # train_step joins once an optimizer is configured
        assert s.bytes["parameter"] == 4 * (4 * 16 + 16 + 16 * 3 + 3) and "l1.weight" in str(s)
    finally:
        model.dispose()


# ---------------------------------------------------------------- across backends
@pytest.mark.skipif(len(DEVICES) < 2, reason="needs two backends")
def test_bundle_runs_on_every_backend():
    Tensor.manual_seed(11)
    net = MLP()
    X, Y = data(16)
    model = Model(net, inputs={"x": Tensor.empty(Variable("batch", 1, 16), 4)},
                  targets={"y": Tensor.empty(Variable("batch", 1, 16), dtype="int32")}, loss=xent)
    try:
        model.fit({"x": X, "y": Y}, epochs=2, optimizer="adam", lr=0.01, verbose=False)
        blob = model.save()
        want = model.forward(x=X[:5])["logits"].numpy()
        want_loss = model.fit({"x": X, "y": Y}, epochs=2, verbose=False)
    finally:
        model.dispose()
    for dev in DEVICES:
        m = Model.load(blob, device=dev)
        try:
            assert m.device == dev
            np.testing.assert_allclose(m.forward(x=X[:5])["logits"].numpy(), want, rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(m.fit({"x": X, "y": Y}, epochs=2, optimizer="adam", lr=0.01, verbose=False),
                                       want_loss, rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(Model.load(m.save(), device=DEVICES[0]).forward(x=X[:5])["logits"].numpy(),
                                       m.forward(x=X[:5])["logits"].numpy(), rtol=1e-5, atol=1e-6)
        finally:
            m.dispose()


# ---------------------------------------------------------------- files
def test_save_path_is_atomic_and_load_reads_paths_and_bytes(tmp_path):
    model = linear_model()
    try:
        model.fit({"x": X5, "y": Y5}, epochs=5, optimizer="sgd", lr=0.1, verbose=False)
        p = tmp_path / "m.pgb"
        model.save(p)
        blob = model.save()
        assert p.read_bytes() == blob
        assert os.listdir(tmp_path) == ["m.pgb"]  # no temporary left behind
        with pytest.raises(OSError):
            model.save(tmp_path / "missing" / "m.pgb")
        assert p.read_bytes() == blob
    finally:
        model.dispose()
    for src in (p, str(p), blob, bytearray(blob), memoryview(blob)):
        m = Model.load(src)
        m.dispose()
    with pytest.raises((BundleError, OSError)):
        Model.load(tmp_path / "nope.pgb")


def test_bundle_errors_are_typed():
    model = linear_model()
    blob = model.save()
    model.dispose()
    import struct
    import zlib
    from polygrad import bundle
    cases = {
        "truncated header": blob[:10],
        "truncated data": blob[:-8],
        "not a bundle": b"PK\x03\x04" + blob[4:],
        "empty": b"",
    }
    flipped = bytearray(blob)
    flipped[100] ^= 0x40
    cases["corrupted manifest"] = bytes(flipped)
    flipped = bytearray(blob)
    flipped[-1] ^= 0x01
    cases["corrupted data"] = bytes(flipped)
    v = bytearray(blob)
    struct.pack_into("<I", v, 8, 99)
    cases["future version"] = bytes(v)
    big = bytearray(blob)
    struct.pack_into("<Q", big, 16, 1 << 60)
    cases["absurd manifest size"] = bytes(big)
    for name, bad in cases.items():
        with pytest.raises(BundleError) as info:
            Model.load(bad)
        assert str(info.value), name
    with pytest.raises(BundleError, match="version"):
        Model.load(cases["future version"])
    # a manifest that lies about a buffer's offset, with checksums made consistent again
    hdr = bundle.read_header(blob) if hasattr(bundle, "read_header") else None
    del hdr, zlib


def test_an_output_already_contiguous_is_its_kernels_buffer_and_one_returned_twice_gets_two():
    """An output the graph already made contiguous is written by its own kernel (no copy launch), and the same
    tensor returned under two names still gets two output buffers (the second a copy: the first realized it),
    each with the right values."""
    def fn(x):
        t = (x * 2 + 1).contiguous()
        return {"a": t, "b": t, "c": (x - 1).contiguous()}

    m = Model(fn, inputs={"x": Tensor.empty(3, 4)})
    calls = [c for c in m._p.entries["forward"].calls if c.kernel >= 0]
    assert len(calls) == 3, len(calls)  # a's and c's kernels, and b's copy
    slots = {m._p.slots[c.args[0]].name for c in calls}
    assert slots == {"output.a", "output.b", "output.c"}, slots
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    out = m.forward(x=x)
    np.testing.assert_array_equal(out["a"].numpy(), x * 2 + 1)
    np.testing.assert_array_equal(out["b"].numpy(), x * 2 + 1)
    np.testing.assert_array_equal(out["c"].numpy(), x - 1)
