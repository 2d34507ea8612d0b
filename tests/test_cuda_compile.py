"""Compile-only CUDA check (no GPU needed): every kernel of the op and nn cases is lowered for CUDA's
capabilities, rendered as CUDA C and compiled with NVRTC (the nvidia-cuda-nvrtc-cu12 wheel of the dev
extra), or nvcc where NVRTC is missing, for sm_90 (Hopper) and sm_75 (Turing: no bfloat16 cvt, no
tensor cores). A syntax or type error in the renderer fails here.

The kernels are collected the way tests/test_serialize.py does: its op and nn cases (unary, binary,
casts, reductions, matmuls, movement, indexing, creation, conv/pool/norm layers, losses, attention,
training steps) plus the nn layers and optimizers below run once on INTERP, and every AST the runtime
asks a program for is recorded. Compiling in batches keeps the whole check to seconds.
"""
from __future__ import annotations

import os

import numpy as np
import pytest

from polygrad import Context, Tensor, dtypes, nn
from polygrad.codegen.lower import lower
from polygrad.codegen.opts import OptKind
from polygrad.engine import programs

cuda = pytest.importorskip("polygrad_backend_cuda")
from polygrad_backend_cuda import capabilities, libs  # noqa: E402
from polygrad_backend_cuda.compile_check import compile_all  # noqa: E402
from polygrad_backend_cuda.compiler import nvcc_compile, nvrtc_compile  # noqa: E402
from polygrad_backend_cuda.renderer import CUDARenderer  # noqa: E402

DEV = "INTERP"


def _compiler():
    try:
        libs.nvrtc()
        return nvrtc_compile
    except libs.LibraryMissing:
        import shutil
        if shutil.which("nvcc"):
            return nvcc_compile
    pytest.skip("neither libnvrtc (pip install nvidia-cuda-nvrtc-cu12) nor nvcc is installed")


def _nn_cases():
    def layers():
        Tensor.manual_seed(0)
        x = Tensor(np.random.default_rng(0).standard_normal((2, 3, 8, 8)).astype(np.float32), device=DEV)
        conv, bn = nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4)
        emb, ln, lin = nn.Embedding(10, 6), nn.LayerNorm(6), nn.Linear(6, 5)
        with Context(TRAINING=1):
            y = bn(conv(x)).relu().mean()
            tok = lin(ln(emb(Tensor([[1, 2, 3]], device=DEV)))).sum()
            (y + tok).backward()
        return [y, tok]

    def optimizers():
        outs = []
        for make in (lambda ps: nn.optim.AdamW(ps, lr=0.01), lambda ps: nn.optim.SGD(ps, lr=0.1, nesterov=True,
                                                                                      momentum=0.9)):
            w = Tensor(np.ones((4, 3), np.float32), device=DEV, requires_grad=True)
            opt = make([w])
            with Context(TRAINING=1):
                opt.zero_grad()
                (w * w).sum().backward()
                opt.step()
            outs.append(w)
        return outs

    def long_reductions():  # long enough for grouped (shared-memory) reductions
        x = Tensor(np.random.default_rng(1).standard_normal((4, 4096)).astype(np.float32), device=DEV)
        h = x.cast(dtypes.float16)  # half reductions accumulate in float32 (issue 28 item 11)
        return [x.sum(), x.softmax(1), x.max(1), h.sum(1), (x * x).mean().sqrt(), h.mean(1), h.var(1),
                h.layernorm(), x.cast(dtypes.bfloat16).std(1), h * 70000.0]

    return {"nn_layers": layers, "nn_optimizers": optimizers, "long_reductions": long_reductions}


@pytest.fixture(scope="module")
def kernels():
    """Every kernel AST the op and nn cases schedule (collected on INTERP)."""
    import tests.test_serialize as ops
    seen: dict = {}
    orig = programs.get_program

    def record(ast, device):
        seen.setdefault(ast, None)
        return orig(ast, device)

    programs.get_program = record
    saved = os.environ.get("DEV")
    os.environ["DEV"] = DEV  # layers create their parameters on the default device
    try:
        for name, fn in {**ops.CASES, **_nn_cases()}.items():
            out = fn()
            for t in out if isinstance(out, (list, tuple)) else [out]:
                if isinstance(t, Tensor):
                    t.realize()
    finally:
        programs.get_program = orig
        if saved is None:
            os.environ.pop("DEV", None)
        else:
            os.environ["DEV"] = saved
    return list(seen)


def _render_all(asts, arch):
    caps, renderer = capabilities(arch), CUDARenderer(arch)
    return [renderer.render(lower(ast, caps)) for ast in asts]


@pytest.mark.parametrize("arch", ["sm_90", "sm_75"])
def test_every_op_and_nn_kernel_compiles(kernels, arch):
    compile_fn = _compiler()
    assert len(kernels) > 150, len(kernels)
    sources = _render_all(kernels, arch)
    # the GPU mapping is really exercised: launch indices, shared memory and vector accesses appear
    joined = "\n".join(sources)
    assert "blockIdx.x" in joined and "threadIdx.x" in joined
    assert "__shared__" in joined and "__syncthreads();" in joined
    assert "pg_vload<float, 4>" in joined
    assert compile_all(sources, arch, compile_fn) >= 1


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_tensor_core_and_half_kernels_compile(arch):
    """Tensor-core kernels (operands staged through shared memory by cp.async) and half kernels."""
    compile_fn = _compiler()
    caps, renderer = capabilities(arch), CUDARenderer(arch)
    rng = np.random.default_rng(0)
    asts = []
    orig = programs.get_program
    programs.get_program = lambda ast, device: asts.append(ast) or orig(ast, device)
    try:
        a = Tensor(rng.standard_normal((64, 96)).astype(np.float32), device=DEV).cast(dtypes.float16)
        b = Tensor(rng.standard_normal((96, 32)).astype(np.float32), device=DEV).cast(dtypes.float16)
        a, b = a.realize(), b.realize()
        (a @ b).realize()
        (a.T.contiguous().T @ b).cast(dtypes.float32).realize()  # strided A, float output
        (a.reshape(2, 32, 96) @ b).realize()  # a batch range
        (a.cast(dtypes.bfloat16) * 3).realize()
    finally:
        programs.get_program = orig
    specs = [lower(ast, caps) for ast in asts]
    assert sum(any(o.kind is OptKind.TC for o in s.opts) for s in specs) == 3
    sources = [renderer.render(s) for s in specs]
    assert sum("cp.async.cg.shared.global" in src for src in sources) == 3
    compile_all(sources, arch, compile_fn)


def test_compile_error_is_reported():
    compile_fn = _compiler()
    from polygrad.errors import CompileError
    with pytest.raises(CompileError, match="k0|kernel"):
        compile_all(['extern "C" __global__ void __launch_bounds__(1) broken(float* a) { a[0] = b; }'], "sm_90",
                    compile_fn)


@pytest.mark.skipif(os.environ.get("POLY_LONG_TESTS", "") in ("", "0"),
                    reason="30 to 75 s on 2 cores: runs with POLY_LONG_TESTS=1")
def test_the_speed_table_kernels_compile_at_gpt2_small_widths():
    """Every kernel of benchmarks/bench_cuda.py's rows (matmuls, the MLP Adam step, a GPT-2 training step
    and decode at GPT-2-small widths: 768 wide, 12 heads, vocabulary 50257; 2 layers, 128 tokens), run once
    on the host device, lowered for sm_80 and sm_90 and compiled: the prepared GPU run meets no NVRTC
    error. Shared-memory tiles and tensor cores are among them."""
    import importlib.util
    import shutil
    import sys
    compile_fn = _compiler()
    host = "CPU" if shutil.which("clang") else "INTERP"
    path = os.path.join(os.path.dirname(__file__), "..", "benchmarks", "bench_cuda.py")
    spec = importlib.util.spec_from_file_location("bench_cuda", path)
    bench = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = bench  # its dataclasses look their module up there
    seen: dict = {}
    orig = programs.get_program
    programs.get_program = lambda ast, device: seen.setdefault(ast, None) or orig(ast, device)
    try:
        spec.loader.exec_module(bench)
        shape = bench.GPTShape(2, 768, 12, 50257, 1024, 1, 128, 8, 2)
        weights = bench.gpt2_weights(shape)
        rows = [*bench.matmul_rows(256, host, None, "", 1), bench.mlp_row(host, None, "", 1),
                bench.gpt2_train_row(shape, weights, host, None, "", 1),
                bench.gpt2_decode_row(shape, weights, host, None, "")]
    finally:
        programs.get_program = orig
        sys.modules.pop(spec.name, None)
    assert all(row.ok for row in rows), [row.line("") for row in rows if not row.ok]
    for arch in ("sm_80", "sm_90"):
        caps, renderer = capabilities(arch), CUDARenderer(arch)
        specs = [lower(ast, caps) for ast in seen]
        kinds = {o.kind for s in specs for o in s.opts}
        assert {OptKind.TILE, OptKind.TC} <= kinds, kinds
        compile_all([renderer.render(s) for s in specs], arch, compile_fn)
