"""A thread pool for THREAD kernels in our own machine code: one foreign call per launch.

Stage: running (used by runtime.X86Program). Input: a kernel's code address and one argument array per
thread index. Output: the launch, run by the calling thread and persistent workers (1..W), W + 1 being
the running thread's POLY_THREADS at that launch (at most the kernel's split), each thread taking the
next index left until none is.

Why: a Python thread pool costs a future per worker and a wake-up through the GIL for every launch,
tens of microseconds, which a training step of small threaded kernels pays over and over (the CPU
backend compiles a C pool for the same reason; this backend has no compiler). So the pool is two
routines emitted here with the backend's assembler and mapped like kernels (and a third that reads
the time-stamp counter):

  worker(state, tid, seen)        run by a Python daemon thread (cffi releases the GIL, the call never
                                  returns): wait until the launch counter differs from `seen` (spin with
                                  `pause` for SPIN_NS, then sleep on a futex); when tid < want, take
                                  indices and run fn(args[index]) until none is left; wait again
  run(state, fn, args, threads,   store the launch and its parts-left word, bump the counter (waking
      want)                       sleepers by futex only when some sleep), take indices as the workers
                                  do, then wait until every index has ended (spin for SPIN_NS, then
                                  sleep on a futex that the worker ending a part wakes)

An index is taken by a compare-and-swap on the parts-left word, which also holds the launch counter:
a worker that comes late (its core was busy with another library's threads or another process) finds
the indices taken, by the caller if need be, and holds back only an index it took; it reads the
launch's function and arrays only after taking an index, while the launch cannot end, so the argument
arrays (owned by the caller) stay alive while any worker may read them. Launches are serialised by a
lock; a forked child starts a pool of its own. The pool's code is never unmapped (workers run in it
until the process ends). Linux only (futex system calls); elsewhere, or if the pool cannot start,
runtime.py falls back to a Python thread pool.
"""
from __future__ import annotations

import os
import sys
import threading
import time
from typing import Any, Callable

from polygrad.backend_api import launch_threads

from polygrad_backend_x86.asm import RAX, RBP, RBX, RCX, RDI, RDX, RSI, Assembler, Imm, Mem, gp
from polygrad_backend_x86.mapping import FFI, CodeMapping

# state: int64 words; the counter (a 32-bit futex word), the parts left and the done count (the
# launcher's futex word) on cache lines of their own
GEN, SLEEPERS, SPIN_TICKS = 0, 1, 2
FN, ARGS, THREADS, WANT = 8, 9, 10, 11
UNCLAIMED = 16  # (launch counter << 32) | parts not yet taken
DONE, LAUNCHER_SLEEPS = 24, 25
STATE_WORDS = 32
# How long a worker spins (pause) for the next launch, or the launcher for the parts in flight, before it
# sleeps on a futex and gives its core away (to NumPy's or PyTorch's threads, say): as CPU's pool
# (POOL_SPIN_NS), a time, counted in time-stamp-counter ticks measured against the clock when the pool
# starts. tests/test_pool_wait.py reads it.
SPIN_NS = 100_000
CLOCK_CHECK = 32  # pause rounds between reads of the time-stamp counter
SYS_FUTEX, FUTEX_WAIT_PRIVATE, FUTEX_WAKE_PRIVATE = 202, 128, 129
R8, R9, R10, R12, R13, R14 = 8, 9, 10, 12, 13, 14


def _q(base: int, word: int) -> Mem:
    return Mem(base, disp=8 * word)


def _lock(a: Assembler) -> None:
    a.insts[-1].has_lock_prefix = True


def _tsc(a: Assembler, dst: int) -> None:
    """dst = the time-stamp counter (rdtsc: clobbers rax, rdx)."""
    a.op("RDTSC")
    a.op("SHL_RM64_IMM8", gp(RDX), Imm(32))
    a.op("OR_R64_RM64", gp(RDX), gp(RAX))
    if dst != RDX:
        a.op("MOV_R64_RM64", gp(dst), gp(RDX))


def _futex(a: Assembler, word: int, op: int, value_reg: int | None, count: int = 0) -> None:
    """futex(state + 8 * word, op, value_reg's low half or `count`, no timeout); clobbers rax rcx rdx rsi
    rdi r10 r11."""
    if value_reg is not None and value_reg != RDX:
        a.op("MOV_R32_RM32", gp(RDX, 32), gp(value_reg, 32))
    elif value_reg is None:
        a.op("MOV_R32_IMM32", gp(RDX, 32), Imm(count))
    a.op("LEA_R64_M", gp(RDI), _q(RBX, word))
    a.op("MOV_R32_IMM32", gp(RSI, 32), Imm(op))
    a.op("XOR_R32_RM32", gp(R10, 32), gp(R10, 32))
    a.op("MOV_R32_IMM32", gp(RAX, 32), Imm(SYS_FUTEX))
    a.op("SYSCALL")


def _take_parts(a: Assembler, gen_reg: int, finished: int, wake_launcher: bool) -> None:
    """Take and run parts of launch `gen_reg` (a 32-bit counter) until none is left, then jump to
    `finished`: decrement the parts-left word by compare-and-swap, the part index being what was left
    minus 1; a word of another launch means that launch is over. rbx = state; clobbers the caller-saved
    registers (the kernel is called)."""
    take, retry = a.label(), a.label()
    a.bind(take)
    a.op("MOV_R64_RM64", gp(RAX), _q(RBX, UNCLAIMED))
    a.bind(retry)
    a.op("MOV_R64_RM64", gp(RCX), gp(RAX))
    a.op("SHR_RM64_IMM8", gp(RCX), Imm(32))
    a.op("CMP_R32_RM32", gp(RCX, 32), gp(gen_reg, 32))
    a.jump("JNE", finished)
    a.op("MOV_R32_RM32", gp(RCX, 32), gp(RAX, 32))
    a.op("TEST_RM32_R32", gp(RCX, 32), gp(RCX, 32))
    a.jump("JE", finished)
    a.op("LEA_R64_M", gp(RCX), Mem(RAX, disp=-1))
    a.op("CMPXCHG_RM64_R64", _q(RBX, UNCLAIMED), gp(RCX))  # on failure rax = the word now
    _lock(a)
    a.jump("JNE", retry)
    a.op("MOV_R32_RM32", gp(RCX, 32), gp(RCX, 32))  # the part: the low half (zero-extended)
    a.op("MOV_R64_RM64", gp(RAX), _q(RBX, ARGS))  # the launch cannot end before this part: ARGS is its own
    a.op("MOV_R64_RM64", gp(RDI), Mem(RAX, RCX, 8))
    a.op("CALL_RM64", _q(RBX, FN))
    a.op("INC_RM64", _q(RBX, DONE))  # locked: a full fence before reading LAUNCHER_SLEEPS
    _lock(a)
    if wake_launcher:
        a.op("CMP_RM64_IMM8", _q(RBX, LAUNCHER_SLEEPS), Imm(0))
        a.jump("JE", take)
        _futex(a, DONE, FUTEX_WAKE_PRIVATE, None, 1)
    a.jump("JMP", take)


def _worker(a: Assembler) -> None:
    """worker(rdi=state, rsi=tid, rdx=seen): never returns."""
    for r in (RBX, RBP, R12, R13, R14):  # callee-saved, and the stack 16-byte aligned for the kernel call
        a.op("PUSH_R64", gp(r))
    a.op("MOV_R64_RM64", gp(RBX), gp(RDI))
    a.op("MOV_R64_RM64", gp(R12), gp(RSI))
    a.op("MOV_R32_RM32", gp(R13, 32), gp(RDX, 32))
    wait, spin, rounds, go = a.label(), a.label(), a.label(), a.label()
    a.bind(wait)
    _tsc(a, RBP)
    a.op("ADD_R64_RM64", gp(RBP), _q(RBX, SPIN_TICKS))  # rbp: when to stop spinning
    a.bind(spin)
    a.op("MOV_R32_IMM32", gp(R14, 32), Imm(CLOCK_CHECK))
    a.bind(rounds)
    a.op("MOV_R32_RM32", gp(RAX, 32), _q(RBX, GEN))
    a.op("CMP_R32_RM32", gp(RAX, 32), gp(R13, 32))
    a.jump("JNE", go)
    a.op("PAUSE")
    a.op("DEC_RM32", gp(R14, 32))
    a.jump("JNE", rounds)
    _tsc(a, RDX)
    a.op("CMP_R64_RM64", gp(RDX), gp(RBP))
    a.jump("JB", spin)
    # sleep until the counter moves: sleepers++ first, so a launcher that bumps it afterwards wakes us
    # (and a bump between our check and the futex call makes FUTEX_WAIT return at once)
    a.op("INC_RM64", _q(RBX, SLEEPERS))
    _lock(a)
    _futex(a, GEN, FUTEX_WAIT_PRIVATE, R13)
    a.op("DEC_RM64", _q(RBX, SLEEPERS))
    _lock(a)
    a.jump("JMP", wait)
    a.bind(go)
    a.op("MOV_R32_RM32", gp(R13, 32), gp(RAX, 32))
    a.op("CMP_R64_RM64", gp(R12), _q(RBX, WANT))  # not one of the threads this launch wants
    a.jump("JGE", wait)
    _take_parts(a, R13, wait, True)


def _run(a: Assembler) -> None:
    """run(rdi=state, rsi=fn, rdx=args, rcx=threads, r8=want)."""
    for r in (RBX, R12, R13):
        a.op("PUSH_R64", gp(r))
    a.op("MOV_R64_RM64", gp(RBX), gp(RDI))
    a.op("MOV_RM64_R64", _q(RBX, FN), gp(RSI))
    a.op("MOV_RM64_R64", _q(RBX, ARGS), gp(RDX))
    a.op("MOV_RM64_R64", _q(RBX, THREADS), gp(RCX))
    a.op("MOV_RM64_R64", _q(RBX, WANT), gp(R8))
    a.op("MOV_RM64_IMM32", _q(RBX, DONE), Imm(0))
    a.op("MOV_R32_RM32", gp(R13, 32), _q(RBX, GEN))
    a.op("ADD_RM32_IMM8", gp(R13, 32), Imm(1))  # r13d: this launch's counter (launches are serialised)
    a.op("MOV_R32_RM32", gp(RAX, 32), gp(R13, 32))
    a.op("SHL_RM64_IMM8", gp(RAX), Imm(32))
    a.op("OR_R64_RM64", gp(RAX), gp(RCX))
    a.op("MOV_RM64_R64", _q(RBX, UNCLAIMED), gp(RAX))
    a.op("ADD_RM32_IMM8", Mem(RBX, disp=8 * GEN), Imm(1))  # a locked add: also a full fence
    _lock(a)
    awake = a.label()
    a.op("CMP_RM64_IMM8", _q(RBX, SLEEPERS), Imm(0))
    a.jump("JE", awake)
    _futex(a, GEN, FUTEX_WAKE_PRIVATE, None, 0x7FFFFFFF)
    a.bind(awake)
    wait, spin, rounds, sleep, done = a.label(), a.label(), a.label(), a.label(), a.label()
    _take_parts(a, R13, wait, False)
    a.bind(wait)  # parts taken by workers may still run
    _tsc(a, R12)
    a.op("ADD_R64_RM64", gp(R12), _q(RBX, SPIN_TICKS))
    a.bind(spin)
    a.op("MOV_R32_IMM32", gp(R9, 32), Imm(CLOCK_CHECK))
    a.bind(rounds)
    a.op("MOV_R64_RM64", gp(RAX), _q(RBX, DONE))
    a.op("CMP_R64_RM64", gp(RAX), _q(RBX, THREADS))
    a.jump("JGE", done)
    a.op("PAUSE")
    a.op("DEC_RM32", gp(R9, 32))
    a.jump("JNE", rounds)
    _tsc(a, RDX)
    a.op("CMP_R64_RM64", gp(RDX), gp(R12))
    a.jump("JB", spin)
    a.bind(sleep)  # a worker is slow (its core is busy elsewhere): sleep until a part ends
    a.op("INC_RM64", _q(RBX, LAUNCHER_SLEEPS))  # locked: a full fence before reading DONE
    _lock(a)
    a.op("MOV_R64_RM64", gp(RDX), _q(RBX, DONE))
    a.op("CMP_R64_RM64", gp(RDX), _q(RBX, THREADS))
    a.jump("JGE", done)
    _futex(a, DONE, FUTEX_WAIT_PRIVATE, RDX)  # returns at once when DONE moved since it was read
    a.op("MOV_RM64_IMM32", _q(RBX, LAUNCHER_SLEEPS), Imm(0))
    a.jump("JMP", wait)
    a.bind(done)
    a.op("MOV_RM64_IMM32", _q(RBX, LAUNCHER_SLEEPS), Imm(0))
    for r in (R13, R12, RBX):
        a.op("POP_R64", gp(r))
    a.op("RETNQ")


def _tsc_reader(a: Assembler) -> None:
    """tsc(): the time-stamp counter."""
    _tsc(a, RAX)
    a.op("RETNQ")


def pool_code() -> tuple[bytes, bytes, bytes]:
    """The machine code of `worker`, of `run` and of `tsc`."""
    out = []
    for routine in (_worker, _run, _tsc_reader):
        a = Assembler()
        routine(a)
        out.append(a.encode())
    return out[0], out[1], out[2]


def spin_ticks(tsc: Callable[[], int]) -> int:
    """SPIN_NS in time-stamp-counter ticks, measured against the clock over about half a millisecond."""
    t0, c0 = time.perf_counter_ns(), tsc()
    time.sleep(0.0005)
    t1, c1 = time.perf_counter_ns(), tsc()
    return max(1, (c1 - c0) * SPIN_NS // max(1, t1 - t0))


class Pool:
    """The process's pool: `launch(fn_addr, arrays)` runs fn(arrays[t]) for every t, index 0 here."""

    def __init__(self) -> None:
        self.mappings = tuple(CodeMapping(code, permanent=True) for code in pool_code())
        self.worker_fn = FFI.cast("void(*)(int64_t *, int64_t, int64_t)", self.mappings[0].addr)
        self.run_fn = FFI.cast("void(*)(int64_t *, int64_t, int64_t *, int64_t, int64_t)", self.mappings[1].addr)
        self.state = FFI.new(f"int64_t[{STATE_WORDS}]")
        self.state[SPIN_TICKS] = spin_ticks(FFI.cast("int64_t(*)(void)", self.mappings[2].addr))
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
        return self.workers

    def launch(self, fn: Any, fn_addr: int, arrays: list[Any]) -> int:
        """Run the kernel at fn_addr (`fn`, its cffi pointer) once per argument array, array t as thread
        index t, on `launch_threads(len(arrays))` threads (each taking the next index left); returns how
        many threads joined in."""
        return self.bound(fn, fn_addr, arrays)()

    def bound(self, fn: Any, fn_addr: int, arrays: list[Any]) -> Callable[[], int]:
        """launch(fn, fn_addr, arrays) as a call without arguments, its index table built once (a JIT
        replay keeps one per launch). The thread count n is read at each call (POLY_THREADS: a Context
        applies), workers are started when first wanted, and workers 1..n-1 take indices with the caller.
        Called in a forked child, it launches on the child's own pool."""
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
                self.run_fn(self.state, fn_addr, table, split, n)
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
