"""CUDA graphs for JIT replays and Model calls, without a GPU: a fake driver (tests/cuda_fake_driver.py)
stands in for libcuda, runs each kernel it is given on INTERP with the arguments it holds at that moment,
and logs every call. Checked: a replay's kernels between two copies are one graph launched by one call,
built and instantiated once; a rebound input, a fresh Model output or a Variable's new value reaches the
graph through cuGraphExecKernelNodeSetParams (and only then); copies stay between the graphs they
separate; values match NumPy and the plain launches' bit for bit; POLY_CUDA_GRAPH=0 and a driver
without graphs run plain launches. Each scenario runs in its own process (the device registry keeps the
opened device).
"""
from __future__ import annotations

import json
import os

import pytest

pytest.importorskip("polygrad_backend_cuda")

HERE = os.path.dirname(__file__)

JIT_SCRIPT = """
import json, sys
sys.path.insert(0, {here!r})
import numpy as np
from cuda_fake_driver import install
driver = install(graphs={graphs})
from polygrad import Tensor, jit

@jit
def step(x, w):
    h = (x @ w).relu()
    a = (h * 2 + 1).realize()
    b = (a.sum(1, keepdim=True) + a).realize()        # kernels on CUDA ...
    c = b.to("INTERP") * 3                             # ... a copy out, work elsewhere, a copy back ...
    d = (c.to("CUDA") - a).exp2().realize()           # ... and CUDA kernels again
    return (d * 0.5).realize()

rng = np.random.default_rng(0)
w = Tensor(rng.standard_normal((6, 5)).astype(np.float32), device="CUDA").realize()
xs = [rng.standard_normal((4, 6)).astype(np.float32) for _ in range(3)]
bufs = [Tensor(x, device="CUDA").realize() for x in xs]
out = []
marks = []
for i in [0, 1, 2, 2, 1, 0, 0]:  # new inputs, then the same one twice in a row
    marks.append(len(driver.calls))
    got = step(bufs[i], w).numpy()
    h = np.maximum(xs[i].astype(np.float64) @ w.numpy(), 0)
    a = h * 2 + 1
    want = np.exp2((a.sum(1, keepdims=True) + a) * 3 - a) * 0.5
    out.append(float(np.abs(got - want).max() / np.abs(want).max()))
marks.append(len(driver.calls))
calls = [[c[0] for c in driver.calls[lo:hi]] for lo, hi in zip(marks, marks[1:])]
print(json.dumps({{"err": out, "calls": calls, "replays": step.stats()["replays"]}}))
"""


def _run(run_python, script: str, env: dict | None = None) -> dict:
    proc = run_python(script, env={"POLY_CUDA_GRAPH": None, **(env or {})})
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _kernel_calls(names: list[str]) -> list[str]:
    keep = ("cuLaunchKernel", "cuGraphLaunch", "cuGraphExecKernelNodeSetParams", "cuGraphInstantiate",
            "cuMemcpyDtoH", "cuMemcpyHtoD")
    return [n for n in names if n in keep]


def test_jit_replays_launch_each_run_of_kernels_as_one_graph(run_python):
    res = _run(run_python, JIT_SCRIPT.format(here=HERE, graphs=True))
    assert max(res["err"]) < 1e-5, res["err"]
    assert res["replays"] == 5
    replays = [_kernel_calls(c) for c in res["calls"][2:]]
    assert replays[0].count("cuGraphInstantiate") == 2  # the first replay builds the two graphs, once
    for k, names in enumerate(replays):
        assert "cuLaunchKernel" not in names and (k == 0 or "cuGraphInstantiate" not in names), names
        launches = [n for n in names if n == "cuGraphLaunch"]
        assert len(launches) == 2, names  # the kernels before the copy out, those after the copy back
        first, last = names.index("cuGraphLaunch"), len(names) - 1 - names[::-1].index("cuGraphLaunch")
        # the copy to INTERP reads what the first graph wrote; the copy back comes before the second graph
        assert first < names.index("cuMemcpyDtoH") < names.index("cuMemcpyHtoD") < last, names
    # replays over inputs 2 (the graphs are built over it), 2, 1, 0, 0: a node is set only when its input
    # buffer differs from the call before (x feeds the first kernel alone)
    sets = [c.count("cuGraphExecKernelNodeSetParams") for c in replays]
    assert sets == [0, 0, 1, 1, 0], sets


def test_jit_replays_without_graphs_launch_kernel_by_kernel(run_python):
    for env, graphs in (({"POLY_CUDA_GRAPH": "0"}, True), ({}, False)):  # switched off; a driver without graphs
        res = _run(run_python, JIT_SCRIPT.format(here=HERE, graphs=graphs), env)
        assert max(res["err"]) < 1e-5, res["err"]
        names = [n for c in res["calls"] for n in c]
        assert not any(n.startswith("cuGraph") for n in names), names
        assert all("cuLaunchKernel" in c for c in res["calls"][2:])


MODEL_SCRIPT = """
import json, os, sys
sys.path.insert(0, {here!r})
import numpy as np
from cuda_fake_driver import install
driver = install()
from polygrad import Model, Tensor, Variable, nn

class MLP:
    def __init__(self):
        self.l1, self.l2 = nn.Linear(4, 16), nn.Linear(16, 3)
    def __call__(self, x):
        return {{"logits": self.l2(self.l1(x).relu())}}

rng = np.random.default_rng(0)
X, Y = rng.standard_normal((32, 4)).astype(np.float32), rng.integers(0, 3, 32).astype(np.int32)

def run(graphs):
    os.environ["POLY_CUDA_GRAPH"] = "1" if graphs else "0"
    Tensor.manual_seed(7)
    batch = Variable("batch", 1, 32)
    model = Model(MLP(), inputs={{"x": Tensor.empty(batch, 4)}}, targets={{"y": Tensor.empty(batch, dtype="int32")}},
                  loss=lambda o, y: o["logits"].sparse_categorical_crossentropy(y))
    assert model.device == "CUDA", model.device
    outs, per_call, err = [], [], []
    for n in (3, 32, 1, 7, 7):
        mark = len(driver.calls)
        outs.append(float(model.train_step({{"x": X[:n]}}, {{"y": Y[:n]}})))
        per_call.append([c[0] for c in driver.calls[mark:]])
        mark = len(driver.calls)
        logits = model.forward(x=X[:n])["logits"].numpy()
        per_call.append([c[0] for c in driver.calls[mark:]])
        outs.append(logits.tolist())
        params = {{k: v.numpy().astype(np.float64) for k, v in model.parameters().items()}}
        w1, b1 = params["l1.weight"], params["l1.bias"]
        w2, b2 = params["l2.weight"], params["l2.bias"]
        want = np.maximum(X[:n] @ w1.T + b1, 0) @ w2.T + b2
        err.append(float(np.abs(logits - want).max()))
    model.dispose()
    return outs, per_call, err

g_outs, g_calls, g_err = run(True)
p_outs, p_calls, p_err = run(False)
print(json.dumps({{"same": g_outs == p_outs, "g_calls": g_calls, "p_calls": p_calls, "err": g_err + p_err}}))
"""


def test_model_calls_run_as_graphs_with_variables_and_rebinding(run_python):
    res = _run(run_python, MODEL_SCRIPT.format(here=HERE), {"POLY_DEV": "CUDA", "DEV": None})
    assert res["same"], "graphs and plain launches gave different bits"
    assert max(res["err"]) < 1e-5, res["err"]
    # every call: one graph launch (these entrypoints have no copies); graphs are made in the first calls
    # (the first train step configures the optimizer: train_step is planned again at the second); after
    # that no kernel launches on its own and no graph is made
    for k, names in enumerate(res["g_calls"]):
        kernels = _kernel_calls(names)
        assert kernels.count("cuGraphLaunch") == 1, names
        assert k < 3 or ("cuLaunchKernel" not in kernels and "cuGraphInstantiate" not in kernels), names
    # a call at a new batch size sets the nodes taking it; forward's output buffer is fresh every call
    # (take()), so even the same batch size sets the node that writes it, and only that one
    sets = [c.count("cuGraphExecKernelNodeSetParams") for c in res["g_calls"]]
    train, forward = sets[0::2], sets[1::2]  # batch sizes 3 (the graphs are built), 32 (train_step's again), 1, 7, 7
    assert train[:2] == [0, 0] and forward[0] == 0 and train[-1] == 0 and forward[-1] == 1, sets
    assert all(s > forward[-1] for s in forward[1:-1]) and all(s > 0 for s in train[2:-1]), sets
    for names in res["p_calls"]:
        assert not any(n.startswith("cuGraph") for n in names), names
