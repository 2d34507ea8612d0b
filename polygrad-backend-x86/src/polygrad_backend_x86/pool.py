"""A thread pool for THREAD kernels in our own machine code: one foreign call per launch.

Stage: running (used by runtime.X86Program). Input: a kernel's code address and one argument array per
thread index. Output: the launch, run by the calling thread (index 0) and persistent workers (1..W),
W + 1 being the running thread's POLY_THREADS at that launch (at most the kernel's split; with fewer
threads than indices, the indices run in rounds).

Why: a Python thread pool costs a future per worker and a wake-up through the GIL for every launch,
tens of microseconds, which a training step of small threaded kernels pays over and over (the CPU
backend compiles a C pool for the same reason; this backend has no compiler). So the pool is two
routines emitted here with the backend's assembler and mapped like kernels:

  worker(state, tid, seen)        run by a Python daemon thread (cffi releases the GIL, the call never
                                  returns): wait until the launch counter differs from `seen` (spin with
                                  `pause`, then sleep on a futex), run fn(args[tid]) when tid < threads,
                                  count itself done, wait again
  run(state, fn, args, threads)   store the launch, bump the counter (waking sleepers by futex only when
                                  some sleep), run fn(args[0]), then wait until every worker is done

Every worker acknowledges every launch before `run` returns, so the argument arrays (owned by the
caller) stay alive while any worker may read them and no worker can see two launches as one. Launches
are serialised by a lock; a forked child starts a pool of its own. The pool's code is never unmapped
(workers run in it until the process ends). Linux only (futex and sched_yield system calls); elsewhere,
or if the pool cannot start, runtime.py falls back to a Python thread pool.
"""
from __future__ import annotations

import os
import sys
import threading
from typing import Any, Callable

from polygrad.backend_api import launch_threads

from polygrad_backend_x86.asm import RAX, RBX, RCX, RDI, RDX, RSI, Assembler, Imm, Mem, gp
from polygrad_backend_x86.mapping import FFI, CodeMapping

# state: int64 words; the counter (a 32-bit futex word) and the done count on cache lines of their own
GEN, SLEEPERS, WORKERS = 0, 1, 2
FN, ARGS, THREADS = 8, 9, 10
DONE = 16
STATE_WORDS = 24
SPIN = 4000  # pause rounds before a worker sleeps, and before the launcher yields its core (as CPU's pool)
SYS_FUTEX, SYS_SCHED_YIELD, FUTEX_WAIT_PRIVATE, FUTEX_WAKE_PRIVATE = 202, 24, 128, 129
R10, R12, R13, R14 = 10, 12, 13, 14


def _q(base: int, word: int) -> Mem:
    return Mem(base, disp=8 * word)


def _lock(a: Assembler) -> None:
    a.insts[-1].has_lock_prefix = True


def _worker(a: Assembler) -> None:
    """worker(rdi=state, rsi=tid, rdx=seen): never returns."""
    for r in (RBX, 5, R12, R13, R14):  # rbx rbp r12 r13 r14: callee-saved, and the stack 16-byte aligned
        a.op("PUSH_R64", gp(r))
    a.op("MOV_R64_RM64", gp(RBX), gp(RDI))
    a.op("MOV_R64_RM64", gp(R12), gp(RSI))
    a.op("MOV_R32_RM32", gp(R13, 32), gp(RDX, 32))
    wait, spin, go, skip = a.label(), a.label(), a.label(), a.label()
    a.bind(wait)
    a.op("MOV_R32_IMM32", gp(R14, 32), Imm(SPIN))
    a.bind(spin)
    a.op("MOV_R32_RM32", gp(RAX, 32), _q(RBX, GEN))
    a.op("CMP_R32_RM32", gp(RAX, 32), gp(R13, 32))
    a.jump("JNE", go)
    a.op("PAUSE")
    a.op("DEC_RM32", gp(R14, 32))
    a.jump("JNE", spin)
    # sleep until the counter moves: sleepers++ first, so a launcher that bumps it afterwards wakes us
    # (and a bump between our check and the futex call makes FUTEX_WAIT return at once)
    a.op("INC_RM64", _q(RBX, SLEEPERS))
    _lock(a)
    a.op("MOV_R32_IMM32", gp(RAX, 32), Imm(SYS_FUTEX))
    a.op("MOV_R64_RM64", gp(RDI), gp(RBX))
    a.op("MOV_R32_IMM32", gp(RSI, 32), Imm(FUTEX_WAIT_PRIVATE))
    a.op("MOV_R32_RM32", gp(RDX, 32), gp(R13, 32))
    a.op("XOR_R32_RM32", gp(R10, 32), gp(R10, 32))
    a.op("SYSCALL")
    a.op("DEC_RM64", _q(RBX, SLEEPERS))
    _lock(a)
    a.jump("JMP", wait)
    a.bind(go)
    a.op("MOV_R32_RM32", gp(R13, 32), gp(RAX, 32))
    a.op("CMP_R64_RM64", gp(R12), _q(RBX, THREADS))
    a.jump("JGE", skip)
    a.op("MOV_R64_RM64", gp(RAX), _q(RBX, ARGS))
    a.op("MOV_R64_RM64", gp(RDI), Mem(RAX, R12, 8))
    a.op("CALL_RM64", _q(RBX, FN))
    a.bind(skip)
    a.op("INC_RM64", _q(RBX, DONE))
    _lock(a)
    a.jump("JMP", wait)


def _run(a: Assembler) -> None:
    """run(rdi=state, rsi=fn, rdx=args, rcx=threads)."""
    for r in (RBX, R12, R13):
        a.op("PUSH_R64", gp(r))
    a.op("MOV_R64_RM64", gp(RBX), gp(RDI))
    a.op("MOV_RM64_R64", _q(RBX, FN), gp(RSI))
    a.op("MOV_RM64_R64", _q(RBX, ARGS), gp(RDX))
    a.op("MOV_RM64_R64", _q(RBX, THREADS), gp(RCX))
    a.op("MOV_RM64_IMM32", _q(RBX, DONE), Imm(0))
    a.op("ADD_RM32_IMM8", Mem(RBX, disp=8 * GEN), Imm(1))  # a locked add: also a full fence
    _lock(a)
    awake = a.label()
    a.op("CMP_RM64_IMM8", _q(RBX, SLEEPERS), Imm(0))
    a.jump("JE", awake)
    a.op("MOV_R32_IMM32", gp(RAX, 32), Imm(SYS_FUTEX))
    a.op("MOV_R64_RM64", gp(RDI), gp(RBX))
    a.op("MOV_R32_IMM32", gp(RSI, 32), Imm(FUTEX_WAKE_PRIVATE))
    a.op("MOV_R32_IMM32", gp(RDX, 32), Imm(0x7FFFFFFF))
    a.op("SYSCALL")
    a.bind(awake)
    a.op("MOV_R64_RM64", gp(RAX), _q(RBX, ARGS))
    a.op("MOV_R64_RM64", gp(RDI), Mem(RAX))
    a.op("CALL_RM64", _q(RBX, FN))
    wait, spin, done, yld = a.label(), a.label(), a.label(), a.label()
    a.bind(wait)
    a.op("MOV_R32_IMM32", gp(R12, 32), Imm(SPIN))
    a.bind(spin)
    a.op("MOV_R64_RM64", gp(RAX), _q(RBX, DONE))
    a.op("CMP_R64_RM64", gp(RAX), _q(RBX, WORKERS))
    a.jump("JGE", done)
    a.op("PAUSE")
    a.op("DEC_RM32", gp(R12, 32))
    a.jump("JNE", spin)
    a.bind(yld)  # a worker is slow (its core is busy elsewhere): give our core away while waiting
    a.op("MOV_R32_IMM32", gp(RAX, 32), Imm(SYS_SCHED_YIELD))
    a.op("SYSCALL")
    a.jump("JMP", wait)
    a.bind(done)
    for r in (R13, R12, RBX):
        a.op("POP_R64", gp(r))
    a.op("RETNQ")


def pool_code() -> tuple[bytes, bytes]:
    """The machine code of `worker` and of `run`."""
    out = []
    for routine in (_worker, _run):
        a = Assembler()
        routine(a)
        out.append(a.encode())
    return out[0], out[1]


class Pool:
    """The process's pool: `launch(fn_addr, arrays)` runs fn(arrays[t]) for every t, index 0 here."""

    def __init__(self) -> None:
        worker, run = pool_code()
        self.mappings = (CodeMapping(worker, permanent=True), CodeMapping(run, permanent=True))
        self.worker_fn = FFI.cast("void(*)(int64_t *, int64_t, int64_t)", self.mappings[0].addr)
        self.run_fn = FFI.cast("void(*)(int64_t *, int64_t, int64_t *, int64_t)", self.mappings[1].addr)
        self.state = FFI.new(f"int64_t[{STATE_WORDS}]")
        self.ffi = FFI
        self.pid = os.getpid()
        self.lock = threading.Lock()
        self.workers = 0

    def grow(self, workers: int) -> int:
        """Start workers up to `workers` (thread indices 1..workers); how many there are."""
        while self.workers < workers:
            tid = self.workers + 1
            seen = int(self.state[GEN]) & 0xFFFFFFFF
            try:
                threading.Thread(target=self.worker_fn, args=(self.state, tid, seen), daemon=True,
                                 name=f"polygrad-x86-{tid}").start()
            except RuntimeError:  # no more threads: the launcher runs the remaining indices itself
                break
            self.workers = tid
            self.state[WORKERS] = tid
        return self.workers

    def launch(self, fn: Any, fn_addr: int, arrays: list[Any]) -> int:
        """Run the kernel at fn_addr (`fn`, its cffi pointer) once per argument array, array t as thread
        index t, on `launch_threads(len(arrays))` threads; returns how many ran it."""
        return self.bound(fn, fn_addr, arrays)()

    def bound(self, fn: Any, fn_addr: int, arrays: list[Any]) -> Callable[[], int]:
        """launch(fn, fn_addr, arrays) as a call without arguments, its index table built once (a JIT
        replay keeps one per launch). The thread count n is read at each call (POLY_THREADS: a Context
        applies), workers are started when first wanted; with n below the split the indices run in
        rounds of n. Called in a forked child, it launches on the child's own pool."""
        split = len(arrays)
        table = self.ffi.new("int64_t[]", [int(self.ffi.cast("intptr_t", x)) for x in arrays])

        def run() -> int:
            if self.pid != os.getpid():
                pool = shared_pool()
                if pool is None:
                    raise RuntimeError("X86 thread pool: cannot start one in this forked process")
                return pool.launch(fn, fn_addr, arrays)
            want = launch_threads(split)
            if want == 1:
                for args in arrays:
                    fn(args)
                return 1
            with self.lock:
                n = min(want, self.grow(want - 1) + 1)  # fewer when a worker could not start
                for first in range(0, split, n):
                    self.run_fn(self.state, fn_addr, table + first if first else table, min(n, split - first))
            return n
        return run


_pool: Pool | None = None
_failed = False


def shared_pool() -> Pool | None:
    """The process's pool (made on first use; a forked child makes its own), None where it cannot run."""
    global _pool, _failed
    if _pool is not None and _pool.pid == os.getpid():
        return _pool
    if _failed or not sys.platform.startswith("linux"):
        return None
    try:
        _pool = Pool()
    except Exception:  # noqa: BLE001 - no executable memory, an assembler problem: the Python pool serves
        _failed = True
        return None
    return _pool
