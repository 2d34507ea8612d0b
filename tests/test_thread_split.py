"""Which kernels a host device splits among threads, and what a split costs on the C pool (issues 30, 32).

- A one-row byte dot product (the quantized decode matvec) is split by its time, its weight's bytes at
  one core's read rate (Capabilities.read_gbs), against what a split costs (thread_handoff_ns), both from
  the CPU description (polygrad/hostcpu.py, POLY_CPU declares them): another declared handoff cost or
  read rate gives another split; other kernels keep the operation-count rule. Qwen2-0.5B's shapes: which
  of its decode matvecs a 2-thread device splits by default.
- The C pool takes its mutex and signals only when a thread sleeps: a launch still wakes a sleeping worker.
"""
from __future__ import annotations

import json
import os
import threading
import time

import pytest

from polygrad import Context, Tensor, dtypes
from polygrad.backend_api import Capabilities
from polygrad.codegen.host_opts import host_opts, int8_dot_lanes, streams_weight
from polygrad.codegen.opts import OptKind
from polygrad.codegen.passes import simplify_indices
from polygrad.hostcpu import ASSUMED_HANDOFF_NS, ASSUMED_READ_GBS, CpuDescription, declare, host_fields
from polygrad.nn.quant import _int8_matmul_t
from polygrad.schedule.template import schedule
from polygrad.uop.ops import Ops

from conftest import DEVICES

# Qwen2-0.5B's decode matvecs (rows, columns): k/v, q/o, gate/up, down
QWEN2 = {"k/v": (128, 896), "q/o": (896, 896), "gate/up": (4864, 896), "down": (896, 4864)}


def _caps(declared: dict, int8_dot: bool = True) -> Capabilities:
    """A 2-thread CPU device's Capabilities for a declared description (no calibration)."""
    desc = declare(CpuDescription(), declared)
    fields = host_fields(desc, "CPU", "test", desc.vector_bits, 4, stage=True)
    return Capabilities(threads=2, vector_width=desc.lanes, registers=desc.vector_registers, fma=True,
                        int8_dot=int8_dot, **fields)


def _matvec_ast(rows: int, cols: int, fmt: str = "Q4_0"):
    """The kernel IR of the 8-bit route's one-row matvec over a rows x cols weight."""
    blocks = Tensor.empty(rows, cols // 32, 18 if fmt == "Q4_0" else 34, dtype=dtypes.uint8)
    tpl, _ = schedule([_int8_matmul_t(blocks, Tensor.empty(1, cols), fmt).uop])
    asts = [s.ast for s in tpl.steps if s.kind == "kernel"]
    found = [a for a in asts if int8_dot_lanes([n for n in a.toposort() if n.op is Ops.REDUCE]) is not None]
    assert len(found) == 1, [a.src for a in asts]
    return simplify_indices(found[0])


def _threads(ast, caps: Capabilities) -> int:
    return next((o.amount for o in host_opts(ast, caps) if o.kind is OptKind.THREAD), 1)


def test_the_decode_matvec_is_split_by_its_bytes_against_the_declared_handoff():
    """Qwen2's k/v matvec (128 x 896 Q4_0: 64.5 KB, 4.1 us at 16 GB/s) pays for 2 parts where a split costs
    1 us, not where it costs 3 us; a core that reads half as fast makes it worth splitting again (8.3 us),
    and a declared read rate twice as fast un-splits q/o (456 KB: 28 us at 16 GB/s, 14 at 32) at a 10 us
    handoff. The operation count alone (488k) split them all alike, whatever the machine."""
    kv, qo = _matvec_ast(*QWEN2["k/v"]), _matvec_ast(*QWEN2["q/o"])
    assert streams_weight(kv, _caps({}))
    assert _threads(kv, _caps({"thread_handoff_ns": 1000, "read_gbs": 16})) == 2
    assert _threads(kv, _caps({"thread_handoff_ns": 3000, "read_gbs": 16})) == 1
    assert _threads(kv, _caps({"thread_handoff_ns": 3000, "read_gbs": 8})) == 2
    assert _threads(qo, _caps({"thread_handoff_ns": 10_000, "read_gbs": 16})) == 2
    assert _threads(qo, _caps({"thread_handoff_ns": 10_000, "read_gbs": 32})) == 1


def test_without_the_byte_dot_products_the_operation_count_decides():
    """On a device without int8_dot the same matvec is a float kernel (dequantized in registers, not 32
    multiply-adds an instruction): its split follows the operation count, whatever the handoff cost."""
    kv = _matvec_ast(*QWEN2["k/v"])
    off = [_threads(kv, _caps({"thread_handoff_ns": h}, int8_dot=False)) for h in (1000, 100_000)]
    assert not streams_weight(kv, _caps({}, int8_dot=False))
    assert off == [2, 2]


def test_qwen2_decode_matvecs_split_by_default():
    """With the description's default read rate and handoff cost (measured on the Zen 4 VM: a split k/v
    matvec took longer than a whole one, a split q/o matvec less), a 2-thread device splits Qwen2-0.5B's
    q/o, gate/up and down decode matvecs, not its k/v (64.5 KB: 4 us at one core's read rate)."""
    caps = _caps({})
    assert caps.read_gbs == ASSUMED_READ_GBS and caps.thread_handoff_ns == ASSUMED_HANDOFF_NS
    got = {name: _threads(_matvec_ast(*shape), caps) for name, shape in QWEN2.items()}
    assert got == {"k/v": 1, "q/o": 2, "gate/up": 2, "down": 2}


DECODE_PLAN = """
import collections, json, sys
import numpy as np
sys.path.insert(0, sys.argv[1])
from bench_gguf import write_qwen2_gguf
from polygrad.hf import load_hf
path = sys.argv[2]
write_qwen2_gguf(path, "Q4_0", layers=1, vocab=512)
model = load_hf(path, max_batch=1, max_seq_len=64)
ids = np.zeros((1, 4), np.int32)
model.call("prefill", {"input_ids": ids})
model.call("decode", {"input_ids": ids[:, :1], "pos": 4})["logits"].numpy()
threads = collections.defaultdict(list)
for prog, _, _ in model._x.plan("decode"):
    if prog is not None:
        threads[prog.spec.name].append(prog.spec.threads)
print(json.dumps(threads))
"""


@pytest.mark.skipif("CPU" not in DEVICES, reason="needs the CPU backend (a C compiler)")
@pytest.mark.parametrize("handoff_ns, kv_threads", [(3000, 1), (1000, 2)])
def test_a_qwen2_decode_step_splits_the_kv_matvecs_only_where_they_pay(handoff_ns, kv_threads, tmp_path):
    """A one-layer Qwen2-0.5B-shaped Q4_0 model (vocabulary 512) on 2 threads, with a declared read rate
    (16 GB/s) and handoff cost: its decode step's k and v matvecs (128 rows) run on one thread at a 3 us
    handoff and on two at 1 us; q, o, gate, up and down (896 and 4864 rows) on two either way. The
    projections are kept apart (POLY_JOIN_PROJ=0: joined, k and v are rows of the one qkv matvec, as they
    are when a file stores v in another format)."""
    from polygrad.nn.quant import int8_dot_enabled
    if not int8_dot_enabled("CPU"):
        pytest.skip("the CPU device does not declare int8_dot (no VNNI or no clang)")
    bench = os.path.join(os.path.dirname(__file__), "..", "benchmarks")
    cpu = json.dumps({"read_gbs": 16, "thread_handoff_ns": handoff_ns})
    import subprocess
    import sys
    p = subprocess.run([sys.executable, "-c", DECODE_PLAN, bench, str(tmp_path / "qwen2.gguf")], text=True,
                       capture_output=True, timeout=600,
                       env={**os.environ, "POLY_THREADS": "2", "POLY_CPU": cpu, "POLY_CACHE_DIR": str(tmp_path),
                            "POLY_JOIN_PROJ": "0"})
    assert p.returncode == 0, p.stderr[-3000:]
    threads = json.loads(p.stdout.splitlines()[-1])
    assert threads["r_1_1_128"] == [kv_threads, kv_threads], threads  # k, v
    assert threads["r_1_1_896"].count(2) >= 3 and threads["r_1_1_4864"] == [2, 2], threads  # q, o, down; gate, up


def _pool():
    pytest.importorskip("polygrad_backend_cpu")
    from polygrad_backend_cpu import runtime
    pool = runtime.c_pool(wait=True)
    if pool is None:
        pytest.skip("no C compiler for the pool")
    return runtime, pool


@pytest.mark.skipif("CPU" not in DEVICES, reason="needs the CPU backend (a C compiler)")
def test_a_sleeping_worker_is_woken_by_the_next_launch():
    """Past its spin bound a worker sleeps (the pool takes its mutex and signals only when one does): a
    launch after 20 ms of idling still reaches it, and it runs the part the launching thread leaves."""
    runtime, pool = _pool()
    launcher = threading.get_ident()
    ran: list[tuple[int, int]] = []
    worker_ran = threading.Event()

    def part(index: int) -> None:
        me = threading.get_ident()
        if me == launcher:
            worker_ran.wait(5.0)
        else:
            worker_ran.set()
        ran.append((index, me))
    task = runtime.FFI.callback("void(void**, int)", lambda args, index: part(index))
    run = runtime.FFI.cast("void*", task)
    with Context(POLY_THREADS=2):
        for _ in range(3):
            ran.clear()
            worker_ran.clear()
            time.sleep(max(0.02, 100 * runtime.POOL_SPIN_NS * 1e-9))
            assert pool.pg_pool_run(run, runtime.FFI.NULL, 2, 2) == 2
            assert sorted(i for i, _ in ran) == [0, 1] and any(t != launcher for _, t in ran), ran


@pytest.mark.parametrize("text, field", [('{"read_gbs": 0}', "read_gbs"), ('{"read_gbs": "fast"}', "read_gbs"),
                                         ('{"thread_handoff_ns": 2.5}', "thread_handoff_ns"),
                                         ('{"thread_handoff_ns": -1}', "thread_handoff_ns")])
def test_declared_split_costs_are_checked(text, field):
    from polygrad.errors import SettingError
    from polygrad.hostcpu import parse_declared
    with pytest.raises(SettingError, match=f"POLY_CPU field '{field}'"):
        parse_declared(text)
    assert parse_declared('{"read_gbs": 12.5, "thread_handoff_ns": 2000}') == {"read_gbs": 12.5,
                                                                              "thread_handoff_ns": 2000}


def test_doctor_shows_the_split_costs_and_their_source(run_python):
    out = run_python("""
        import sys
        from polygrad.__main__ import main
        sys.exit(main(["doctor"]))
    """, env={"POLY_CPU": json.dumps({"read_gbs": 12.5, "thread_handoff_ns": 2000})})
    assert "one core reads 12.5 GB/s, a split launch costs 2000 ns [declared (POLY_CPU)]" in out.stdout, out.stderr
