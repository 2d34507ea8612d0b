"""The host thread pools (CPU's C pool, X86's machine-code pool) beside other libraries' threads (issue 32).

A worker spins only for a short, named bound after a launch, then sleeps, so an idle pool costs the
process no CPU (NumPy's and PyTorch's threads get the cores). A launch does not wait for a worker
that has not started its share: the launcher takes the parts nobody has taken. Results are checked
against NumPy; no timing is asserted (CPU time while idle is a count of work done, not a speed).
"""
from __future__ import annotations

import threading

import pytest

from polygrad import Context, Device

from conftest import run_python

HOST_DEVICES = [d for d in ("CPU", "X86") if Device.available(d)]
IDLE_S = 0.2


@pytest.mark.parametrize("device", HOST_DEVICES)
def test_an_idle_pool_uses_no_cpu(device):
    """After threaded launches, 0.2 s of idling costs the process at most a few spin bounds of CPU
    time (a worker still spinning would cost the whole 0.2 s); in a fresh process with only NumPy's
    import behind it, no BLAS call (OpenBLAS's threads spin after one)."""
    p = run_python(f'''
        import resource, time
        import numpy as np
        from polygrad import Tensor
        DEV = "{device}"
        if DEV == "CPU":
            from polygrad_backend_cpu.runtime import POOL_SPIN_NS as spin_ns, c_pool
            assert c_pool(wait=True) is not None
        else:
            from polygrad_backend_x86.pool import SPIN_NS as spin_ns

        def cpu_s():
            r = resource.getrusage(resource.RUSAGE_SELF)
            return r.ru_utime + r.ru_stime
        n = 1 << 20
        x = Tensor(np.arange(n, dtype=np.float32), device=DEV).realize()
        want = np.arange(n, dtype=np.float32) * 2 + 1
        for _ in range(20):
            assert np.array_equal((x * 2 + 1).numpy(), want)
        time.sleep(0.05)  # whatever the last launch left (a spin bound, the import's threads) ends
        before = cpu_s()
        time.sleep({IDLE_S})
        print(cpu_s() - before, spin_ns)
    ''', env={"POLY_THREADS": "2"}, timeout=120)
    assert p.returncode == 0, p.stderr
    idle_cpu_s, spin_ns = map(float, p.stdout.split())
    assert spin_ns <= 1e6  # a short bound: a millisecond at most
    assert idle_cpu_s < 0.1 * IDLE_S, f"{idle_cpu_s:.3f} s of CPU while idle for {IDLE_S} s: a worker spins"


def _launch_with_a_held_up_worker(device: str, split: int) -> list[tuple[int, int]]:
    """Launch `split` parts on 2 threads of `device`'s pool, a worker's first part held up until the
    launcher has run split - 1 parts (or 5 s): [(part, thread id)] in the order they ended."""
    launcher = threading.get_ident()
    ran: list[tuple[int, int]] = []
    others_done = threading.Event()
    lock = threading.Lock()

    def part(index: int) -> None:
        me = threading.get_ident()
        if me != launcher and not any(t == me for _, t in ran):
            others_done.wait(5.0)
        with lock:
            ran.append((index, me))
            if sum(t == launcher for _, t in ran) == split - 1:
                others_done.set()
    with Context(POLY_THREADS=2):
        if device == "CPU":
            from polygrad_backend_cpu import runtime
            pool = runtime.c_pool(wait=True)
            if pool is None:
                pytest.skip("no C compiler for the pool")
            task = runtime.FFI.callback("void(void**, int)", lambda args, index: part(index))
            assert pool.pg_pool_run(runtime.FFI.cast("void*", task), runtime.FFI.NULL, split, 2) == 2
        else:
            from polygrad_backend_x86 import pool as x86_pool
            from polygrad_backend_x86.mapping import FFI
            task = FFI.callback("void(int64_t *)", lambda args: part(int(args[0])))
            arrays = [FFI.new("int64_t[]", [i]) for i in range(split)]
            assert x86_pool.Pool().launch(task, int(FFI.cast("intptr_t", task)), arrays) == 2
    return ran


@pytest.mark.parametrize("device", HOST_DEVICES)
def test_the_launcher_takes_the_parts_a_busy_worker_has_not_started(device):
    """A worker that is held up in its first part (as if its core were busy elsewhere) holds back that
    part only: the launching thread runs the other 7 of 8, each part runs once. With parts dealt out
    in advance (worker w taking w, w + 2...), the worker would own 4 and the launch would wait."""
    split = 8
    ran = _launch_with_a_held_up_worker(device, split)
    assert sorted(i for i, _ in ran) == list(range(split))
    assert sum(t == threading.get_ident() for _, t in ran) >= split - 1, ran


def test_the_c_pool_library_stays_mapped_when_its_object_is_collected():
    """Workers run in the pool's code until the process ends (spinning after a launch, or running a
    part): the library must stay mapped when the module's objects go, as they do when the interpreter
    exits (cffi closes a library it collects: a worker still in the pool's code crashed the process)."""
    p = run_python('''
        import gc
        import os
        import numpy as np
        from polygrad import Tensor
        from polygrad_backend_cpu import runtime
        assert runtime.c_pool(wait=True) is not None
        x = Tensor(np.arange(1 << 20, dtype=np.float32), device="CPU").realize()
        assert np.array_equal((x + 1).numpy(), np.arange(1 << 20, dtype=np.float32) + 1)
        compiler = runtime.ClangCompiler()
        path = os.path.realpath(compiler.cached(compiler.key(runtime.POOL_SOURCE, runtime.POOL_FLAGS)))

        def mapped():
            with open("/proc/self/maps") as f:
                return any(line.rstrip().endswith(path) for line in f)
        assert mapped()
        runtime.__dict__.clear()  # what the interpreter's exit does to the module (its FFI, its library)
        gc.collect()
        print(mapped())
    ''', env={"POLY_THREADS": "2"}, timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["True"]
