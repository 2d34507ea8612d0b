"""polygrad.distributed (issue 33): data-parallel training across processes on MPI.

Each MPI test launches `mpiexec -n 2 python tests/fixtures/distributed_worker.py MODE OUT` with one thread
per rank (POLY_THREADS=1) and reads what every rank saved. References: one process on the global batch
(training), NumPy (collectives). Skipped only where mpi4py or mpiexec is missing.
"""
from __future__ import annotations

import importlib.util
import os
import pathlib
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest

import polygrad.distributed as dist
from polygrad import Tensor, dtypes
from polygrad.distributed import comm
from polygrad.errors import DistributedError, PolygradError

WORKER = pathlib.Path(__file__).parent / "fixtures" / "distributed_worker.py"
RANKS = 2


def find_mpiexec() -> str | None:
    beside = pathlib.Path(sys.executable).parent / "mpiexec"
    return str(beside) if beside.exists() else shutil.which("mpiexec")


MPIEXEC = find_mpiexec()
needs_mpi = pytest.mark.skipif(importlib.util.find_spec("mpi4py") is None or MPIEXEC is None,
                               reason="needs mpi4py and mpiexec: pip install 'polygrad[distributed]'")


def launch(mode: str, out: pathlib.Path, timeout: float = 120, **env: str) -> tuple[subprocess.CompletedProcess, float]:
    """Run the worker on RANKS ranks; (the finished process, seconds it took)."""
    full = {**os.environ, "POLY_THREADS": "1", "POLY_DIST_TIMEOUT": "30", **env}
    for name in ("PMI_SIZE", "PMI_RANK", "OMPI_COMM_WORLD_SIZE"):  # this process may itself run under a launcher
        full.pop(name, None)
    t0 = time.monotonic()
    proc = subprocess.run([MPIEXEC, "-n", str(RANKS), sys.executable, str(WORKER), mode, str(out)], env=full,
                          capture_output=True, text=True, timeout=timeout)
    return proc, time.monotonic() - t0


def results(out: pathlib.Path) -> list[dict]:
    return [dict(np.load(out / f"rank{r}.npz")) for r in range(RANKS)]


def relative(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-12))


@pytest.fixture(scope="module")
def trained_in(tmp_path_factory) -> pathlib.Path:
    out = tmp_path_factory.mktemp("train")
    proc, _ = launch("train", out)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out


@pytest.fixture(scope="module")
def trained(trained_in) -> list[dict]:
    return results(trained_in)


# ---------------------------------------------------------------- training on 2 ranks = one process, global batch
@needs_mpi
@pytest.mark.parametrize("path", ["eager_sgd", "eager_adam", "eager_wide", "fit_sgd", "fit_adam"])
def test_two_ranks_train_like_one_process_on_the_global_batch(trained, path):
    r0, r1 = trained
    names = [k[len("ref_" + path) + 1:] for k in r0 if k.startswith(f"ref_{path}_") and not k.endswith("losses")]
    assert names
    for name in names:
        ref = r0[f"ref_{path}_{name}"]
        np.testing.assert_array_equal(r0[f"{path}_{name}"], r1[f"{path}_{name}"])  # the ranks agree exactly
        assert relative(r0[f"{path}_{name}"], ref) < 1e-5, name
    if path.startswith("fit"):  # every rank returns the global mean loss of each step
        np.testing.assert_array_equal(r0[f"{path}_losses"], r1[f"{path}_losses"])
        assert relative(r0[f"{path}_losses"], r0[f"ref_{path}_losses"]) < 1e-5


@needs_mpi
def test_each_rank_runs_one_thread_and_one_bucket_per_step(trained):
    for r in trained:
        assert int(r["world_size"]) == RANKS
        assert int(r["threads"]) == 1
        assert int(r["eager_sgd_calls_per_step"]) == 1  # the MLP's gradients fit one bucket


@needs_mpi
def test_a_big_gradient_is_left_as_the_sum_and_its_mean_folded_into_the_step(trained):
    """Averager.average(defer=True): a buffer reduced in its own memory keeps the sum (no pass over it) and
    reports 1/N for the optimizer's kernel; packed buffers hold the mean. eager_wide above checks the fold."""
    r0, r1 = trained
    assert r0["defer_factors"].tolist() == [1.0 / RANKS, 1.0, 1.0]
    for i in range(3):
        operands = [np.random.default_rng(50 * r + i).standard_normal(r0[f"defer_{i}"].size).astype(np.float32)
                    for r in range(RANKS)]
        total = np.sum(operands, axis=0, dtype=np.float64)
        want = total if i == 0 else total / RANKS
        for r in (r0, r1):
            np.testing.assert_allclose(r[f"defer_{i}"], want, rtol=1e-6, atol=1e-6)


@needs_mpi
def test_save_after_distributed_fit_writes_on_rank_0_alone(trained_in):
    for name in ("sgd", "adam"):  # every rank called save(path); rank 1 wrote nothing
        assert (trained_in / f"{name}_saved_by_rank0.pgb").stat().st_size > 0
        assert not (trained_in / f"{name}_saved_by_rank1.pgb").exists()


@needs_mpi
def test_fit_folds_the_mean_into_the_update_and_saves_a_plain_update(trained_in):
    """fit(distributed=True) leaves the gradients as sums and records an update that multiplies them by a
    grad-scale slot holding 1/N meanwhile (test_two_ranks_... checks the steps). The saved bundle names the
    slot, holds 1.0 in it, and every update kernel that reads a gradient reads it too; its next train_step
    in one process is torch's step from the same weights."""
    torch = pytest.importorskip("torch")
    from polygrad import Model, bundle
    blob = (trained_in / "sgd_saved_by_rank0.pgb").read_bytes()
    manifest, _ = bundle.read(blob)
    scale = manifest["training"]["grad_scale_buffer"]
    grads = {g for _, g in manifest["training"]["gradients"]}
    calls = manifest["entrypoints"]["optimizer_step"]["calls"]
    reading = [c["args"] for c in calls if "kernel" in c and grads & set(c["args"])]
    assert reading and all(scale in args for args in reading)
    model = Model.load(blob)
    assert model._x.bufs[scale].numpy().tolist() == [1.0]
    before = {k: v.numpy() for k, v in model.parameters().items()}
    rng = np.random.default_rng(3)
    batch = model._p.inputs[0].shape[0]
    x = rng.standard_normal((batch, 8)).astype(np.float32)
    y = rng.integers(0, 4, batch).astype(np.int32)
    model.train_step({"x": x}, {"y": y})
    t = {k: torch.tensor(v, requires_grad=True) for k, v in before.items()}
    hidden = torch.tanh(torch.from_numpy(x) @ t["l1.weight"].T + t["l1.bias"])
    loss = torch.nn.functional.cross_entropy(hidden @ t["l2.weight"].T + t["l2.bias"], torch.from_numpy(y).long())
    loss.backward()
    want = {k: (v - 0.01 * v.grad).detach().numpy() for k, v in t.items()}  # the worker's fit: SGD, lr 0.01
    after = {k: v.numpy() for k, v in model.parameters().items()}
    for k in want:
        assert relative(after[k] - before[k], want[k] - before[k]) < 1e-4, k
    if shutil.which("node") is None:
        return
    # polygrad-js reads the field, takes the same step, and keeps the field when it saves
    import test_js
    out = pathlib.Path(trained_in) / "from_js.pgb"
    got = test_js.run_node([{"name": "fit", "bundle": str(trained_in / "sgd_saved_by_rank0.pgb"),
                             "fit": {"data": {"x": test_js.enc(x), "y": test_js.enc(y)}, "options": {}},
                             "forward": {"x": test_js.enc(x)}, "save": str(out)}], pathlib.Path(trained_in))["fit"]
    assert "error" not in got, got.get("error")
    test_js.close(test_js.dec(got["outputs"]["logits"]), model.forward(x=x)["logits"].numpy())
    again, _ = bundle.read(out.read_bytes())
    assert again["training"]["grad_scale_buffer"] == scale


# ---------------------------------------------------------------- collectives against NumPy
@needs_mpi
def test_collectives_match_numpy_for_every_dtype_and_op(tmp_path):
    proc, _ = launch("collectives", tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ranks = results(tmp_path)
    for dtype in ["bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64", "float16",
                  "bfloat16", "float32", "float64"]:
        xs = np.stack([r[f"{dtype}_operand"] for r in ranks])
        wide = np.float64 if dtype in ("float16", "bfloat16", "float32") else None
        expect = {"sum": xs.sum(0, dtype=wide), "max": xs.max(0), "min": xs.min(0),
                  "mean": xs.astype(np.float64).mean(0)}
        want_dtype = {"sum": Tensor.ones(2, dtype=getattr(dtypes, dtype)).sum().dtype.name,
                      "mean": Tensor.ones(2, dtype=getattr(dtypes, dtype)).mean().dtype.name,
                      "max": getattr(dtypes, dtype).name, "min": getattr(dtypes, dtype).name}
        for op, want in expect.items():
            for r in ranks:
                got = r[f"{dtype}_{op}"]
                assert str(r[f"{dtype}_{op}_dtype"]) == want_dtype[op], (dtype, op)
                if dtype in ("float16", "bfloat16") or (op == "mean" and dtype != "float64"):
                    tol = {"float16": 1e-3, "bfloat16": 1e-2}.get(dtype, 1e-6)
                    np.testing.assert_allclose(got.astype(np.float64), want, rtol=tol, atol=tol,
                                               err_msg=f"{dtype} {op}")
                else:
                    np.testing.assert_array_equal(got, want.astype(got.dtype), err_msg=f"{dtype} {op}")
        for r in ranks:
            np.testing.assert_array_equal(r[f"{dtype}_broadcast"], ranks[1][f"{dtype}_operand"])
            np.testing.assert_array_equal(r[f"{dtype}_all_gather"], np.concatenate(list(xs)))
    for r in ranks:  # mismatched operands: a DistributedError naming both ranks
        shape, dtype = str(r["mismatch_shape"]), str(r["mismatch_dtype"])
        assert "rank 0: float32[3, 4]" in shape and "rank 1: float32[4, 3]" in shape
        assert "rank 0: float32[4]" in dtype and "rank 1: int32[4]" in dtype


# ---------------------------------------------------------------- failures end the job in bounded time
@needs_mpi
@pytest.mark.parametrize("mode, expect", [("raise", "rank 1 raised ValueError"), ("kill", ""),
                                          ("hang", "did not complete within 2 s")])
def test_a_failing_rank_ends_the_job_within_60_seconds(tmp_path, mode, expect):
    proc, took = launch(mode, tmp_path, timeout=90, POLY_DIST_TIMEOUT="2")
    assert proc.returncode != 0, proc.stdout + proc.stderr
    assert took < 60
    assert expect in proc.stdout + proc.stderr
    assert not (tmp_path / "rank0.npz").exists()  # rank 0 never got past the collective


# ---------------------------------------------------------------- a world of one, without MPI
def test_a_plain_process_is_a_world_of_one():
    x = Tensor([[1.0, -2.0], [3.0, 4.0]])
    assert (dist.rank(), dist.world_size(), dist.is_main()) == (0, 1, True)
    assert dist.all_reduce(x, "mean").tolist() == x.tolist()
    assert dist.all_reduce(Tensor([1, 2], dtype=dtypes.int8), "sum").dtype == dtypes.int32
    assert dist.broadcast(x).tolist() == x.tolist()
    assert dist.all_gather(Tensor(3.0)).tolist() == [3.0]
    dist.barrier()
    with pytest.raises(DistributedError, match="op must be one of"):
        dist.all_reduce(x, "prod")
    with pytest.raises(DistributedError, match="root must be a rank"):
        dist.broadcast(x, root=1)


def test_a_realized_operand_goes_to_mpi_in_its_own_memory():
    """all_reduce reads a realized contiguous operand's buffer directly: no copy kernel (one per call before);
    a view (transpose, slice) is still made contiguous first, and the operand keeps its value."""
    from polygrad import GlobalCounters
    x = Tensor(np.arange(6, dtype=np.float32).reshape(2, 3)).realize()
    dist.all_reduce(x)
    before = GlobalCounters.kernel_count
    y = dist.all_reduce(x)
    assert GlobalCounters.kernel_count == before
    assert y.tolist() == x.tolist() and y._buffer() is not x._buffer()
    assert dist.all_reduce(x.T).tolist() == x.numpy().T.tolist()
    assert dist.all_reduce(x[:, 1]).tolist() == [1.0, 4.0]
    assert x.tolist() == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]

def test_a_launched_rank_without_mpi4py_says_how_to_install(monkeypatch):
    monkeypatch.setattr(comm, "_world", None)
    monkeypatch.setenv("PMI_SIZE", "2")
    monkeypatch.setitem(sys.modules, "mpi4py", None)  # import mpi4py fails
    with pytest.raises(DistributedError, match=r"one of 2 ranks.*pip install 'polygrad\[distributed\]'") as e:
        dist.init()
    assert isinstance(e.value, PolygradError)
    monkeypatch.delenv("PMI_SIZE")
    dist.init()  # no launcher: a world of one, mpi4py or not
    assert dist.world_size() == 1


def test_fit_distributed_in_a_world_of_one_is_plain_fit():
    from polygrad import Model, nn

    def build() -> Model:
        Tensor.manual_seed(3)
        net = nn.Linear(3, 2)
        return Model(lambda x: {"y": net(x)}, inputs={"x": Tensor.empty(4, 3)}, targets={"t": Tensor.empty(4, 2)},
                     loss=lambda out, t: (out["y"] - t).square().mean(), params=nn.state.get_parameters(net))
    rng = np.random.default_rng(0)
    data = {"x": rng.standard_normal((8, 3)).astype(np.float32), "t": rng.standard_normal((8, 2)).astype(np.float32)}
    a, b = build(), build()
    la = a.fit(data, batch_size=4, optimizer="adam", verbose=False)
    lb = b.fit(data, batch_size=4, optimizer="adam", verbose=False, distributed=True)
    assert la == lb
    for k, v in a.parameters().items():
        np.testing.assert_array_equal(v.numpy(), b.parameters()[k].numpy())


def test_a_device_without_host_memory_goes_through_host_copies(monkeypatch):
    """CUDA's path (DeviceImpl.host_memory False): collectives and averaging read host copies and write back."""
    from polygrad.distributed import buckets, collectives, hostview
    from polygrad.dtype import dtypes as dt
    monkeypatch.setattr(hostview, "host_view", lambda buf: None)
    x = Tensor([[1.0, 2.0], [3.0, 4.0]])
    assert dist.all_reduce(x, "max").tolist() == x.tolist()
    assert collectives.all_gather(x).shape == (2, 2)
    src = Tensor([1.0, 2.0, 3.0], dtype=dt.bfloat16).contiguous()._buffer()
    dst = Tensor.zeros(3, dtype=dt.bfloat16).contiguous()._buffer()
    buckets.Averager(comm.world()).average([src], [dst])
    assert dst.numpy().tolist() == src.numpy().tolist()
