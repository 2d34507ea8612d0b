"""Device optimisation choices: which opts the heuristics pick and how split reductions render."""
import numpy as np

from polygrad import Tensor
from polygrad.engine.realize import get_program
from polygrad.engine.schedule import schedule


def _programs(t: Tensor):
    tpl, _ = schedule([t.uop])
    return [get_program(step.ast, "CPU") for step in tpl.steps if step.kind == "kernel"]


def test_row_sum_gets_partial_accumulators_not_a_tile():
    x = Tensor(np.random.rand(64, 1024).astype(np.float32), device="CPU").realize()
    (prog,) = _programs(x.sum(1))
    assert [o.kind for o in prog.spec.opts] == ["SPLIT_REDUCE"]
    assert np.allclose(x.sum(1).numpy(), x.numpy().sum(1), rtol=1e-5)


def test_split_reduce_keeps_lane_loop_inside_the_reduce_loop():
    """The lane accumulators are an array filled inside the reduce loop (so the lanes vectorise)."""
    xn = np.random.rand(8, 4096).astype(np.float32)
    x = Tensor(xn, device="CPU").realize()
    out = ((x * 2 + 1).relu() * x).sum(1)
    (prog,) = _programs(out)
    src = prog.source
    lane_acc = src.index("[8];")
    reduce_loop = src.index("ridx")
    assert lane_acc < reduce_loop, src
    ref = (np.maximum(xn * 2 + 1, 0) * xn).sum(1)
    assert np.allclose(out.numpy(), ref, rtol=1e-5)


def test_matmul_gets_a_register_tile():
    a = Tensor(np.random.rand(64, 64).astype(np.float32), device="CPU").realize()
    (prog,) = _programs(a @ a)
    assert sorted(o.amount for o in prog.spec.opts if o.kind == "UPCAST") == [4, 16]
