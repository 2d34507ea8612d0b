"""JIT replays run their kernels as launch plans where the device's programs offer them (engine/capture.py
`_launch_plans`): on CPU the pool library's pg_run_plan runs each run of kernels between two copies in one
foreign call. (CUDA graphs, the same path on CUDA, are tests/test_cuda_graph.py's.)
"""
from __future__ import annotations

import numpy as np
import pytest

from polygrad import Tensor, Variable, jit
from polygrad.device import Device


@pytest.mark.skipif("CPU" not in Device.installed(), reason="the CPU backend is not installed")
def test_cpu_jit_replays_run_launch_plans_between_copies(monkeypatch):
    """A replay over a Variable batch, with a copy to INTERP and back in the middle: each run of CPU kernels is
    one LaunchPlan call (nothing launches on its own), INTERP's kernel runs between them, rebound inputs and
    new batch sizes reach the plans, and the bits equal the launch-by-launch replay's."""
    from polygrad_backend_cpu import runtime
    from polygrad_backend_cpu.runtime import CPUProgram, LaunchPlan
    if runtime.c_pool(wait=True) is None:
        pytest.skip("the CPU pool library cannot be built here")
    rows = Variable("rows", 1, 16)
    rng = np.random.default_rng(0)
    w = Tensor(rng.standard_normal((8, 8)).astype(np.float32), device="CPU").realize()
    xs = [rng.standard_normal((16, 8)).astype(np.float32) for _ in range(3)]

    def run(plans: bool) -> tuple[list, list]:
        @jit
        def step(x):
            h = (x @ w).relu().realize()
            h = (h * 2 - 1).exp2().realize()
            mid = (h.to("INTERP") + 1).to("CPU")
            out = (mid.sum(1) + h.max(1)).realize()
            return (out * 0.5).realize()

        calls: list[int] = []
        outs = []
        with monkeypatch.context() as m:
            if not plans:
                m.setattr(CPUProgram, "launch_plan", staticmethod(lambda launches: None))
            direct = LaunchPlan.__call__
            m.setattr(LaunchPlan, "__call__", lambda self: calls.append(self.n) or direct(self))
            for k, n in enumerate((5, 5, 16, 1, 7, 7)):
                x = Tensor(xs[k % 3][:n], device="CPU").realize()
                if k == 2 and plans:  # from the first replay on, no CPU kernel launches on its own
                    m.setattr(CPUProgram, "__call__", lambda *a: pytest.fail("a kernel launched on its own"))
                outs.append(step(x.reshape(rows.bind(n), 8)).numpy())
                h = np.exp2(np.maximum(xs[k % 3][:n].astype(np.float64) @ w.numpy(), 0) * 2 - 1)
                np.testing.assert_allclose(outs[-1], ((h + 1).sum(1) + h.max(1)) * 0.5, rtol=1e-5)
        return outs, calls

    with_plans, calls = run(True)
    one_by_one, none = run(False)
    assert calls == [2, 2] * 4 and none == [], calls  # per replay: two CPU kernels, the copy out, INTERP, back, two
    for a, b in zip(with_plans, one_by_one):
        np.testing.assert_array_equal(a, b)


@pytest.mark.skipif("CPU" not in Device.installed(), reason="the CPU backend is not installed")
def test_a_kernel_alone_keeps_its_bound_launcher(monkeypatch):
    """A replay whose kernels are each alone between copies (or a one-kernel replay: the tiny op) makes no
    launch plan: a plan of one kernel costs more than the kernel's bound launcher."""
    from polygrad_backend_cpu import runtime
    from polygrad_backend_cpu.runtime import LaunchPlan
    if runtime.c_pool(wait=True) is None:
        pytest.skip("the CPU pool library cannot be built here")
    monkeypatch.setattr(LaunchPlan, "__init__", lambda *a: pytest.fail("a launch plan was made"))

    @jit
    def tiny(x):
        return (x + 1).realize()

    for k in range(5):
        out = tiny(Tensor(np.full(4, k, np.float32), device="CPU").realize()).numpy()
        np.testing.assert_array_equal(out, np.full(4, k + 1, np.float32))
