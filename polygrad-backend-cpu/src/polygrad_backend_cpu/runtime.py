"""Load compiled kernels and launch them through cffi; a THREAD kernel runs on a persistent C pool.

One FFI instance serves every kernel: each shared object is opened with ctypes only to find the
symbol's address, which is cast to a cffi function pointer of the kernel's signature (pointers, the
integer variables, and the thread index when the lowering gave the kernel a THREAD axis). Buffer
pointers are cached on the host allocations, so a launch does no address lookups.

Every kernel also has a trampoline `<name>_task(void** args, int tid)` (the CPU renderer adds it). A
Model call runs its kernels through them as a `LaunchPlan`: one cffi call to `pg_run_plan` launches them
all in order, with no Python between kernels. Threads: one cffi call to
`pg_pool_run(task, args, threads, want)` launches a kernel with `spec.threads > 1`:
the calling thread and up to want - 1 persistent pthreads (created when first wanted) share the
indices, each taking the next index left (an atomic counter), so a thread whose core is busy elsewhere
(another library's spinning threads, another process) holds back only an index it has taken: the
caller runs the rest. Between launches a worker spins (pause) for POOL_SPIN_NS, then sleeps on a
condition variable; the caller waits for indices in flight the same way. So idle workers cost no CPU.
`want` is the running thread's POLY_THREADS, read at every launch (backend_api.launch_threads), so
`Context(POLY_THREADS=1)` runs every index on the calling thread. cffi releases the GIL for the whole
call, so a launch costs one foreign call, not one Python future per thread. The pool is a small C library
compiled with the kernel compiler (cached like kernels) in a background thread the first time a
THREAD kernel loads; until it is ready, or if it cannot be built, launches use a Python thread pool.

A program owns its shared object: when the CPUProgram is garbage (polygrad.collect() dropped the
program cache and no captured graph or schedule holds it), the object is closed (dlclose) and its
mappings go away. Nothing else may keep the function pointer (the pool library is never closed).
"""
from __future__ import annotations

import _ctypes
import atexit
import ctypes
import functools
import operator
import threading
import time
import weakref
from typing import Any, Callable

import _cffi_backend
import cffi

from polygrad.backend_api import CompileError, ProgramSpec, launch_threads, run_split, thread_settings
from polygrad_backend_cpu.compiler import ClangCompiler, symbol_names

FFI = cffi.FFI()
FFI.cdef("int pg_pool_run(void* task, void** args, int threads, int want);\n"
         "int pg_run_plan(int n, void** tasks, void*** args, int* parts, int want);")
_fn_types: dict[int, Any] = {}
loaded = {"open": 0}  # shared objects currently open (tests read it)
_c_pool: Any = None  # the C pool library (False: could not be built)
_pool_builder: threading.Thread | None = None
_pool_lock = threading.Lock()
_pinned: list[Any] = []  # the pool library's ctypes handles (never closed)

# How long a pool thread spins (pause, re-check) for the next launch, or the launcher for the parts in
# flight, before it blocks and gives its core away: a training step's launches come microseconds apart
# (a futex wake-up costs tens), while another library's threads in the process (NumPy's OpenBLAS,
# PyTorch's OpenMP) may want the core. A time, not a count of pause instructions (their cost differs
# tenfold between CPU models). tests/test_pool_wait.py reads it.
POOL_SPIN_NS = 100_000
POOL_SOURCE = r"""
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>
typedef void (*pg_task)(void**, int);
#define PG_MAX_THREADS 256
#define PG_SPIN_NS @SPIN_NS@ul
#define PG_LINE _Alignas(64)
static pthread_mutex_t run_mu = PTHREAD_MUTEX_INITIALIZER, mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t wake = PTHREAD_COND_INITIALIZER, done = PTHREAD_COND_INITIALIZER;
/* The shared state sits on three cache lines: the launch (what a spinning worker needs to start a part
   comes with the one transfer that shows it a new launch), the parts not yet ended (workers end theirs
   while the launcher polls it, away from the launch line the threads take parts from), and who sleeps,
   written only around a sleep, so a launch and the last part's end read it without a transfer and take
   the mutex (to wake a sleeper) only when someone does sleep. */
static PG_LINE struct {
  atomic_ulong generation;  /* launches so far */
  /* The launch's parts not yet taken: (generation << 32) | parts left. A thread takes part `left - 1` by
     decrementing it, so any thread may run any part, and one that comes late (its core was busy) finds
     nothing left instead of holding the launch back; the generation keeps a late thread off a later launch. */
  atomic_ullong unclaimed;
  atomic_int want;          /* threads wanted: workers 1..want-1 join in */
  pg_task task;
  void** args;
} launch;
static PG_LINE atomic_int unfinished;  /* parts taken or not yet taken that have not ended */
static PG_LINE struct {
  atomic_int workers;   /* workers blocked on `wake` (or about to block: counted before they check) */
  atomic_int launcher;  /* 1 while the launcher blocks on `done` (or is about to) */
} asleep;
static int workers;
static unsigned long start_generation[PG_MAX_THREADS];  /* what a new worker has already seen */
static inline void pg_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}
static unsigned long pg_now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (unsigned long)t.tv_sec * 1000000000ul + (unsigned long)t.tv_nsec;
}
/* Whether a thread that began waiting at `*since` (0: not yet) has spun for PG_SPIN_NS; reads the clock
   every 32 rounds. */
static int pg_spun_out(unsigned spin, unsigned long* since) {
  if (spin % 32 != 31) return 0;
  unsigned long now = pg_now_ns();
  if (*since == 0) *since = now;
  return now - *since >= PG_SPIN_NS;
}
static void pg_finish_part(void) {
  /* seq_cst both ways (here: end, then read the flag; the launcher: set the flag, then read the count), so
     either this sees the launcher's flag or the launcher sees the count reach 0 before it blocks */
  if (atomic_fetch_sub(&unfinished, 1) == 1 && atomic_load(&asleep.launcher)) {
    pthread_mutex_lock(&mu);
    pthread_cond_broadcast(&done);
    pthread_mutex_unlock(&mu);
  }
}
/* Take and run parts of launch `gen` until none is left. */
static void pg_take_parts(unsigned long gen) {
  unsigned long long c = atomic_load(&launch.unclaimed);
  while ((c >> 32) == (gen & 0xffffffffull) && (c & 0xffffffffull) != 0) {
    if (!atomic_compare_exchange_weak(&launch.unclaimed, &c, c - 1)) continue;
    launch.task(launch.args, (int)((c & 0xffffffffull) - 1));  /* the launch cannot end before this part */
    pg_finish_part();
    c = atomic_load(&launch.unclaimed);
  }
}
static void* pg_worker(void* arg) {
  int tid = (int)(long)arg;
  unsigned long seen = start_generation[tid];
  for (;;) {
    unsigned long since = 0;
    for (unsigned spin = 0; atomic_load_explicit(&launch.generation, memory_order_acquire) == seen; spin++) {
      if (!pg_spun_out(spin, &since)) { pg_relax(); continue; }
      pthread_mutex_lock(&mu);
      atomic_fetch_add(&asleep.workers, 1);  /* before the check: a launch after it sees the count */
      while (atomic_load(&launch.generation) == seen) pthread_cond_wait(&wake, &mu);
      atomic_fetch_sub(&asleep.workers, 1);
      pthread_mutex_unlock(&mu);
    }
    seen = atomic_load(&launch.generation);
    if (tid < atomic_load_explicit(&launch.want, memory_order_relaxed)) pg_take_parts(seen);
  }
  return 0;
}
/* Run task(args, 0..threads-1) on at most `want` threads, each taking the next part left. */
int pg_pool_run(void* task, void** args, int threads, int want) {
  if (want > threads) want = threads;
  if (want > PG_MAX_THREADS) want = PG_MAX_THREADS;
  if (want <= 1) {
    for (int part = 0; part < threads; part++) ((pg_task)task)(args, part);
    return 1;
  }
  pthread_mutex_lock(&run_mu);
  while (workers < want - 1) {
    pthread_t t;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, 8u << 20);  /* kernels keep staged panels on the stack */
    start_generation[workers + 1] = atomic_load(&launch.generation);
    if (pthread_create(&t, &attr, pg_worker, (void*)(long)(workers + 1)) != 0) { pthread_attr_destroy(&attr); break; }
    pthread_attr_destroy(&attr);
    pthread_detach(t);
    workers++;
  }
  int n = want < workers + 1 ? want : workers + 1;  /* fewer when a worker could not start */
  unsigned long gen = atomic_load(&launch.generation) + 1;
  launch.task = (pg_task)task;
  launch.args = args;
  atomic_store_explicit(&launch.want, n, memory_order_relaxed);
  atomic_store(&unfinished, threads);
  atomic_store(&launch.unclaimed, ((unsigned long long)gen << 32) | (unsigned long long)threads);
  atomic_store(&launch.generation, gen);  /* seq_cst: a worker counted asleep before this is woken below */
  if (atomic_load(&asleep.workers)) {
    pthread_mutex_lock(&mu);
    pthread_cond_broadcast(&wake);
    pthread_mutex_unlock(&mu);
  }
  pg_take_parts(gen);
  unsigned long since = 0;
  for (unsigned spin = 0; atomic_load_explicit(&unfinished, memory_order_acquire) > 0; spin++) {
    if (!pg_spun_out(spin, &since)) { pg_relax(); continue; }
    pthread_mutex_lock(&mu);
    atomic_store(&asleep.launcher, 1);
    while (atomic_load(&unfinished) > 0) pthread_cond_wait(&done, &mu);
    atomic_store(&asleep.launcher, 0);
    pthread_mutex_unlock(&mu);
  }
  pthread_mutex_unlock(&run_mu);
  return n;
}
/* Launch n kernels in order, kernel i as pg_pool_run(tasks[i], args[i], parts[i], want) does (one part: a
   call on this thread): a Model call's kernels in one foreign call (LaunchPlan). */
int pg_run_plan(int n, void** tasks, void*** args, int* parts, int want) {
  for (int i = 0; i < n; i++) {
    if (parts[i] <= 1) ((pg_task)tasks[i])(args[i], 0);
    else pg_pool_run(tasks[i], args[i], parts[i], want);
  }
  return n;
}
""".replace("@SPIN_NS@", str(POOL_SPIN_NS))


try:  # types built without parsing C text (the first parse of any C text costs milliseconds: 5 for "void*[]")
    _VOID_P: Any = _cffi_backend.new_pointer_type(_cffi_backend.new_void_type())
    _VOID_P_ARRAY: Any = _cffi_backend.new_array_type(_cffi_backend.new_pointer_type(_VOID_P), None)
    _VALUE_P: dict[str, Any] = {t: _cffi_backend.new_pointer_type(_cffi_backend.new_primitive_type(t))
                                for t in ("int", "long long")}
except AttributeError:
    _VOID_P, _VOID_P_ARRAY, _VALUE_P = "void*", "void*[]", {"int": "int*", "long long": "long long*"}
POOL_FLAGS = ("-pthread",)
POOL_EXIT_WAIT_S = 60.0  # a process exiting mid-build finishes it, so the next process finds the pool cached


def _open_pool(path: str) -> Any:
    """The pool library at `path`, opened once more through ctypes, which never closes a library: cffi's
    object closes its handle when collected (at the latest when the interpreter exits), and workers still
    spinning in the pool's code, or woken in it, must not find it unmapped."""
    _pinned.append(ctypes.CDLL(path))
    return FFI.dlopen(path)


def _build_pool() -> None:
    global _c_pool
    try:
        _c_pool = _open_pool(ClangCompiler().compile(POOL_SOURCE, extra=POOL_FLAGS))
    except Exception:  # noqa: BLE001 - any failure: the Python pool still runs every launch
        _c_pool = False


def _cached_pool() -> Any:
    """The pool library when it is compiled already (a cache lookup and a dlopen), else None."""
    try:
        compiler = ClangCompiler()
        path = compiler.cached(compiler.key(POOL_SOURCE, POOL_FLAGS))
        return _open_pool(path) if path is not None else None
    except Exception:  # noqa: BLE001 - the background build reports failures
        return None


def _finish_build() -> None:
    if _pool_builder is not None and _pool_builder.is_alive():
        _pool_builder.join(POOL_EXIT_WAIT_S)


def c_pool(wait: bool = False) -> Any:
    """The C thread pool library, or None while it is being built or if it cannot be. A cached library
    loads at once; otherwise it compiles in the background (a cold start does not wait for it: launches
    use the Python pool meanwhile), and a process that exits meanwhile finishes the build first."""
    global _pool_builder, _c_pool
    if _c_pool is None:
        with _pool_lock:
            if _pool_builder is None and _c_pool is None:
                _c_pool = _cached_pool()
                if _c_pool is None:
                    _pool_builder = threading.Thread(target=_build_pool, name="polygrad-pool-build", daemon=True)
                    _pool_builder.start()
                    atexit.register(_finish_build)
        if wait and _pool_builder is not None:
            _pool_builder.join()
    return _c_pool or None


def _fn_type(n_buffers: int, var_types: tuple[str, ...], threaded: bool) -> Any:
    key = (n_buffers, var_types, threaded)
    t = _fn_types.get(key)
    if t is None:
        names = ["void*"] * n_buffers + list(var_types) + (["int"] if threaded else [])
        try:  # built from cffi's type constructors: parsing C text costs ~0.5 ms a signature (3 ms the first)
            void = _cffi_backend.new_void_type()
            params = tuple(_cffi_backend.new_pointer_type(void) if n == "void*" else
                           _cffi_backend.new_primitive_type(n) for n in names)
            t = _cffi_backend.new_function_type(params, void, False)
        except (AttributeError, TypeError, KeyError):
            t = FFI.typeof(f"void(*)({', '.join(names) or 'void'})")
        _fn_types[key] = t
    return t


_ptr_of = operator.attrgetter("ptr")


def pointer(handle: Any) -> Any:
    p = handle.ptr
    if p is None:
        p = handle.ptr = FFI.cast(_VOID_P, handle.addr)
    return p


class CPUProgram:
    """A kernel in a shared object; call with host buffers (backend_api.HostMemory)."""

    def __init__(self, spec: ProgramSpec, path: str):
        self.spec = spec
        try:
            lib = ctypes.CDLL(path)
        except OSError as e:
            raise CompileError(f"could not load kernel {spec.name} from {path}: {e}; delete that file (or the "
                               "POLY_CACHE_DIR folder) to have it compiled again") from e
        loaded["open"] += 1
        weakref.finalize(self, _close, lib._handle).atexit = False  # the process exit unmaps it anyway
        renamed, plain = symbol_names(path)
        fn = getattr(lib, renamed, None) or getattr(lib, plain, None)
        if fn is None:
            raise CompileError(f"{path} has no function {plain}; it is not kernel {spec.name}'s shared object: delete "
                               "it (or the POLY_CACHE_DIR folder) to have it compiled again")
        addr = ctypes.cast(fn, ctypes.c_void_p).value
        self.var_types = tuple("long long" if v.dtype.itemsize == 8 else "int" for v in spec.vars)
        self.threads = spec.threads
        self.fn = FFI.cast(_fn_type(len(spec.globals), self.var_types, self.threads > 1), addr)
        # contract.Program's pointer_call: a one-thread kernel without variables is this cffi function itself
        self.pointer_call = self.fn if self.threads == 1 and not spec.vars else None
        self.task = None
        task = getattr(lib, f"{renamed}_task", None) or getattr(lib, f"{plain}_task", None)
        if task is not None:
            self.task = FFI.cast(_VOID_P, ctypes.cast(task, ctypes.c_void_p).value)
            if self.threads > 1:
                c_pool()  # start building the pool (a Model's launch plans start it too: launch_plan)

    def __call__(self, buffers: list[Any], var_vals: tuple[int, ...] = (), timing: bool = False) -> float | None:
        args = list(map(_ptr_of, buffers))  # no Python frame per launch (a list comprehension makes one)
        t0 = time.perf_counter() if timing else 0.0
        if self.threads == 1:
            try:  # (`None in args` compares every cdata pointer with None: dearer than the call)
                self.fn(*args, *var_vals)
            except TypeError:  # cffi checks every argument before it calls: nothing ran
                if None not in args:
                    raise
                self.fn(*map(pointer, buffers), *var_vals)  # a handle not cast yet
            return time.perf_counter() - t0 if timing else None
        if None in args:  # a handle not cast yet
            args = [pointer(b) for b in buffers]
        if self.task is not None and _c_pool:
            keep = [FFI.new(_VALUE_P[t], v) for t, v in zip(self.var_types, var_vals)]
            packed = FFI.new(_VOID_P_ARRAY, args + keep) if keep else FFI.new(_VOID_P_ARRAY, args)
            _c_pool.pg_pool_run(self.task, packed, self.threads, launch_threads(self.threads))
        else:
            args.extend(var_vals)
            fn = self.fn
            run_split(lambda part: fn(*args, part), self.threads)
        return time.perf_counter() - t0 if timing else None

    @staticmethod
    def launch_plan(launches: list[tuple["CPUProgram", list[Any], tuple[int, ...]]]) -> "LaunchPlan | None":
        """The launches (program, buffers, Variable values) as one LaunchPlan, or None where one cannot
        run them (the pool library not built yet, a kernel without its trampoline)."""
        if not launches or c_pool() is None or any(getattr(p, "task", None) is None for p, _, _ in launches):
            return None
        return LaunchPlan(launches)

    def bind(self, buffers: list[Any], var_vals: tuple[int, ...] = ()) -> Callable[[], Any]:
        """A launcher with these buffers and values fixed: calling it (no arguments) runs the kernel. A JIT
        replay keeps one per launch, so it converts no arguments; a one-thread kernel is a bare cffi call."""
        args = [pointer(b) for b in buffers]
        if self.threads == 1:
            return functools.partial(self.fn, *args, *var_vals)
        if self.task is not None and _c_pool and not var_vals:
            run, task, packed, split = _c_pool.pg_pool_run, self.task, FFI.new(_VOID_P_ARRAY, args), self.threads
            now = thread_settings
            # POLY_THREADS read at each launch (a Context applies; pg_pool_run caps it at the split)
            return lambda: run(task, packed, split, now.values["POLY_THREADS"])
        return functools.partial(self, list(buffers), tuple(var_vals))  # the pool may still be building


class LaunchPlan:
    """Kernels launched in order by one foreign call (`pg_run_plan` in the pool library), with no Python
    between them: a Model call's launches between two copies (model/executor.py). Launch i keeps its own
    argument array (buffer pointers, then pointers to its Variables' values, as a task takes them), which
    `set_handle` and `set_vars` patch in place; calling the plan reads POLY_THREADS, as each launch would."""

    def __init__(self, launches: list[tuple[CPUProgram, list[Any], tuple[int, ...]]]):
        self.n = len(launches)
        self.packed: list[Any] = []
        self.cells: list[list[Any]] = []
        for prog, buffers, var_vals in launches:
            cells = [FFI.new(_VALUE_P[t], v) for t, v in zip(prog.var_types, var_vals)]
            self.cells.append(cells)
            self.packed.append(FFI.new(_VOID_P_ARRAY, [pointer(b) for b in buffers] + cells))
        self.tasks = FFI.new("void*[]", [p.task for p, _, _ in launches])
        self.args = FFI.new("void**[]", self.packed)
        self.parts = FFI.new("int[]", [p.threads for p, _, _ in launches])
        self.run = c_pool().pg_run_plan

    def set_handle(self, i: int, pos: int, handle: Any) -> None:
        self.packed[i][pos] = pointer(handle)

    def set_vars(self, i: int, var_vals: tuple[int, ...]) -> None:
        for cell, v in zip(self.cells[i], var_vals):
            cell[0] = v

    def __call__(self) -> None:
        self.run(self.n, self.tasks, self.args, self.parts, thread_settings.values["POLY_THREADS"])


def _close(handle: int) -> None:
    loaded["open"] -= 1
    _ctypes.dlclose(handle)


def load_program(spec: ProgramSpec, path: str) -> CPUProgram:
    return CPUProgram(spec, path)
