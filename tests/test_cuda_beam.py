"""BEAM over the GPU opts (codegen/gpu_search.py) on CUDA's Capabilities, without a GPU: the candidate
lists of a matmul, a half matmul, a reduction and an elementwise kernel; every candidate two steps deep
renders and compiles with NVRTC for sm_80; a few run on the CPU check (polygrad_backend_cuda.cpu_check)
and give NumPy's values; the disk cache's key holds the architecture (and TF32 allowed); a fake timer's
fastest candidate wins, and a second process reads it from the cache without timing anything.
"""
from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest

from polygrad import Tensor
from polygrad.codegen import search
from polygrad.codegen.gpu_search import MAX_BLOCK_THREADS, gpu_candidates
from polygrad.codegen.lower import default_opts, lower
from polygrad.codegen.opts import Opt, OptKind
from polygrad.codegen.passes import kernel_for_opts
from polygrad.contract import Capabilities

cuda = pytest.importorskip("polygrad_backend_cuda")
from polygrad_backend_cuda import capabilities  # noqa: E402
from polygrad_backend_cuda.compile_check import compile_all  # noqa: E402
from polygrad_backend_cuda.launch import launch_of  # noqa: E402
from polygrad_backend_cuda.renderer import CUDARenderer  # noqa: E402
from conftest import kernels_of  # noqa: E402
from tests.test_cuda_compile import _compiler  # noqa: E402
from tests.test_cuda_cpu_check import run  # noqa: E402

HERE = os.path.dirname(__file__)
CAPS = capabilities("sm_80")
rng = np.random.default_rng(0)
A = rng.standard_normal((64, 48)).astype(np.float32)
B = rng.standard_normal((48, 80)).astype(np.float32)
R = rng.standard_normal((8, 4096)).astype(np.float32)


def interp(x):
    return Tensor(x, device="INTERP")


# name -> (what to schedule, its inputs, NumPy's value)
KERNELS = {
    "matmul": (lambda: (interp(A) @ interp(B)).realize(), (A, B), lambda: A.astype(np.float64) @ B),
    "half_matmul": (lambda: (interp(A.astype(np.float16)) @ interp(B.astype(np.float16))).realize(),
                    (A.astype(np.float16), B.astype(np.float16)), None),
    "row_sum": (lambda: interp(R).sum(1).realize(), (R,), lambda: R.astype(np.float64).sum(1)),
    "elementwise": (lambda: (interp(A) * 2 + 1).realize(), (A,), lambda: A * np.float32(2) + np.float32(1)),
}


def kernel(name):
    return kernels_of(KERNELS[name][0])[-1]


def steps(opts):
    return [(o.kind.value, o.amount) for o in opts]


def test_candidate_lists_on_cuda_capabilities():
    first = {name: gpu_candidates(kernel_for_opts(kernel(name)), [], CAPS) for name in KERNELS}
    kinds = {name: {o.kind for c in cands for o in c} for name, cands in first.items()}
    # a float32 matmul: both shared-memory tiles, register tiles, block shapes; no TF32 unasked, no GROUP
    # (48 is no multiple of a group)
    assert [c for c in first["matmul"] if c[0].kind is OptKind.TILE] == [
        [Opt(OptKind.TILE, 2, 64)], [Opt(OptKind.TILE, 2, 128)]]
    assert kinds["matmul"] == {OptKind.TILE, OptKind.UPCAST, OptKind.LOCAL}
    assert [Opt(OptKind.TC, 2, 16)] in first["half_matmul"] and OptKind.TILE not in kinds["half_matmul"]
    assert [steps(c) for c in first["row_sum"] if c[0].kind is OptKind.GROUP] == [
        [("GROUP", 256)], [("GROUP", 128)], [("GROUP", 64)], [("GROUP", 32)]]
    assert kinds["elementwise"] == {OptKind.UPCAST, OptKind.LOCAL}
    # POLY_ALLOW_TF32=1 adds TF32 tensor cores for the float32 matmul
    from polygrad import Context
    with Context(POLY_ALLOW_TF32=1):
        assert [Opt(OptKind.TC, 2, 8)] in gpu_candidates(kernel_for_opts(kernel("matmul")), [], CAPS)
    # a template ends the list; LOCAL after LOCAL keeps a block within MAX_BLOCK_THREADS threads
    base = kernel_for_opts(kernel("elementwise"))
    assert gpu_candidates(base, [Opt(OptKind.TILE, 2, 64)], CAPS) == []
    for c in first["elementwise"]:
        for deeper in gpu_candidates(base, c, CAPS):
            locals_ = [o.amount for o in deeper if o.kind is OptKind.LOCAL]
            assert np.prod(locals_) <= MAX_BLOCK_THREADS and len(deeper) == len(c) + 1
    # host devices keep their own space (no GPU opts)
    host = Capabilities(threads=2, vector_width=8)
    assert not {o.kind for c in search.candidate_opts(base, [], host) for o in c} & {OptKind.LOCAL, OptKind.TILE}


@pytest.mark.parametrize("name", list(KERNELS))
def test_every_candidate_two_steps_deep_compiles_with_nvrtc(name):
    compile_fn = _compiler()
    ast = kernel(name)
    base = kernel_for_opts(ast)
    cands = [default_opts(base, CAPS)] + gpu_candidates(base, [], CAPS)
    cands += [d for c in list(cands) for d in gpu_candidates(base, c, CAPS)]
    sources = [CUDARenderer("sm_80").render(lower(ast, CAPS, c)) for c in cands]
    assert len(sources) > 20
    compile_all(sources, "sm_80", compile_fn)


# a few candidates, each unlike the heuristics' choice, run on the CPU check
CHECKED = [
    ("matmul", [Opt(OptKind.TILE, 2, 128)]),
    ("matmul", [Opt(OptKind.UPCAST, 1, 4), Opt(OptKind.LOCAL, 0, 16)]),
    ("row_sum", [Opt(OptKind.GROUP, 1, 64)]),
    ("row_sum", [Opt(OptKind.UPCAST, 0, 2), Opt(OptKind.LOCAL, 2, 4)]),  # 2: the rows range UPCAST left
    ("elementwise", [Opt(OptKind.UPCAST, 1, 8), Opt(OptKind.LOCAL, 0, 8)]),
]


@pytest.mark.skipif(not (shutil.which("clang++") or shutil.which("g++")), reason="no C++ compiler")
@pytest.mark.parametrize("name,opts", CHECKED, ids=[f"{n}-{'-'.join(f'{k}{a}' for k, a in steps(o))}"
                                                    for n, o in CHECKED])
def test_candidates_give_numpys_values_on_the_cpu_check(name, opts):
    ast = kernel(name)
    assert opts in gpu_candidates(kernel_for_opts(ast), opts[:-1], CAPS)  # a candidate BEAM would time
    spec = lower(ast, CAPS, opts)
    assert list(spec.opts) == opts
    _, inputs, want = KERNELS[name]
    (got,) = run((spec, CUDARenderer("sm_80").render(spec), launch_of(spec)), *inputs)
    np.testing.assert_allclose(got.reshape(want().shape), want(), rtol=1e-5, atol=1e-4)


def test_cache_key_holds_the_architecture_and_tf32():
    ast = kernel("matmul")
    key = lambda caps: search.kernel_key(ast, "CUDA", 2, search.search_variant(caps))  # noqa: E731
    assert key(capabilities("sm_80")) != key(capabilities("sm_90"))
    from polygrad import Context
    with Context(POLY_ALLOW_TF32=1):
        assert key(capabilities("sm_80")) != search.kernel_key(ast, "CUDA", 2, "sm_80")
        assert search.search_variant(capabilities("sm_75")) == "sm_75"  # no TF32 cores: the flag changes nothing
    # host devices declare no architecture: their keys (and cached winners) stay as they were
    assert search.search_variant(Capabilities(threads=2, vector_width=8)) == ""
    assert search.kernel_key(ast, "CPU", 2, "") == search.kernel_key(ast, "CPU", 2)


BEAM_SCRIPT = """
import json, sys
sys.path.insert(0, {here!r})
import dataclasses
from conftest import kernels_of
import test_cuda_beam as t
from polygrad.codegen import search
from polygrad.codegen.opts import Opt, OptKind
from polygrad.device import open_device
from polygrad_backend_cuda import capabilities
from polygrad_backend_cuda.renderer import CUDARenderer

TARGET = [Opt(OptKind.UPCAST, 1, 4), Opt(OptKind.LOCAL, 0, 16)]
timed = []

class FakeProgram:
    \"\"\"Times itself from its opts: the longer the prefix it shares with TARGET, the faster.\"\"\"
    def __init__(self, spec):
        self.opts = list(spec.opts)
    def __call__(self, buffers, var_vals=(), timing=False):
        if {read_only}:
            raise AssertionError("timed a candidate: the winner should have come from the disk cache")
        timed.append(self.opts)
        pairs = list(zip(self.opts, TARGET))
        shared = next((k for k, (a, b) in enumerate(pairs) if a != b), len(pairs))
        return 1.0 / (1 + shared) + 0.01 * (len(self.opts) - shared)

arch = {arch!r}
impl = dataclasses.replace(open_device("INTERP"), capabilities=capabilities(arch),
                           render=CUDARenderer(arch).render, compile=lambda src: src,
                           load=lambda spec, binary: FakeProgram(spec))
search.open_device = lambda device: impl  # scratch buffers on INTERP (impl.name); the kernel is timed as CUDA's
ast = kernels_of(t.KERNELS["matmul"][0])[-1]
chosen = search.choose_opts(ast, "CUDA")
print(json.dumps({{"chosen": [[o.kind.value, o.axis, o.amount] for o in chosen], "timed": len(timed)}}))
"""


def _beam(run_python, cache: str, arch: str, read_only: bool) -> dict:
    code = BEAM_SCRIPT.format(here=HERE, arch=arch, read_only=read_only)
    proc = run_python(code, env={"POLY_CACHE_DIR": cache, "BEAM": "2", "PYTHONPATH": os.pathsep.join(
        [os.path.dirname(HERE), os.environ.get("PYTHONPATH", "")])})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_beam_picks_the_fastest_and_a_second_process_reads_the_cache(run_python, tmp_path):
    first = _beam(run_python, str(tmp_path), "sm_80", read_only=False)
    assert first["chosen"] == [["UPCAST", 1, 4], ["LOCAL", 0, 16]] and first["timed"] > 10, first
    files = list((tmp_path / "beam" / "CUDA").glob("*.opts"))
    assert len(files) == 1
    second = _beam(run_python, str(tmp_path), "sm_80", read_only=True)
    assert second == {"chosen": first["chosen"], "timed": 0}
    other_arch = _beam(run_python, str(tmp_path), "sm_90", read_only=False)  # another GPU: searched again
    assert other_arch["timed"] > 10 and len(list((tmp_path / "beam" / "CUDA").glob("*.opts"))) == 2
