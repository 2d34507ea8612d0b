"""Grouped row reductions on CUDA (issue 35), without a GPU: softmax, log_softmax, layernorm and row
sums/maxima reduce each row with a group of threads (gpu_opts.row_group_opts: a warp, or up to 256
threads for long rows), reading along the row coalesced and combining by __shfl_xor_sync butterflies
(and shared memory across a block's warps).

Values: every kernel of a tensor expression is lowered for CUDA, rendered, and run on the CPU by
polygrad_backend_cuda.cpu_check (real threads, barriers and a per-warp rendezvous for the shuffles),
chained through INTERP buffers, against NumPy on row lengths 1, 17, 100, 767, 768, 1000, 4097 and
few or many rows. Structure: the opts, the launch and the instructions of the shapes the issue names
(4096 rows x 768, attention's 8*12*512 rows x 512), deterministic, no timing. The shuffles' emulation is
shown to catch a bad mask and a missing butterfly step; the kernels compile with NVRTC for sm_75/80/90.
"""
from __future__ import annotations

import contextlib
import os
import shutil

import numpy as np
import pytest

from polygrad import Tensor, Variable, dtypes
from polygrad.codegen import gpu_opts
from polygrad.codegen.lower import lower
from polygrad.codegen.opts import OptKind
from polygrad.contract import Capabilities
from polygrad.engine import programs
from polygrad.renderer.linearize import L, linearize

cuda = pytest.importorskip("polygrad_backend_cuda")
from polygrad_backend_cuda import capabilities, cpu_check  # noqa: E402
from polygrad_backend_cuda.launch import launch_of  # noqa: E402
from polygrad_backend_cuda.renderer import CUDARenderer  # noqa: E402
from conftest import kernels_of  # noqa: E402

needs_cxx = pytest.mark.skipif(not (shutil.which("clang++") or shutil.which("g++")), reason="no C++ compiler")
rng = np.random.default_rng(0)


class _OnCPU:
    """A CUDA kernel run by cpu_check on the buffers of a host device (in place of its own program)."""

    def __init__(self, spec, source, launch):
        self.spec, self.source, self.launch = spec, source, launch

    def __call__(self, handles, var_vals=(), timing=False):
        buffers = []
        for g, h in zip(self.spec.globals, handles):
            n = self.spec.eval_int(g.size, tuple(var_vals))
            word = np.dtype(f"u{g.dtype.itemsize}") if g.dtype in (dtypes.float16, dtypes.bfloat16) else g.dtype.np
            buffers.append(h.arr[: n * g.dtype.itemsize].view(word))
        cpu_check.run_on_cpu(self.spec, self.source, self.launch, buffers, tuple(var_vals))


@contextlib.contextmanager
def cuda_on_cpu(arch="sm_90"):
    """Inside, every kernel that tensors on INTERP realize is lowered and rendered for CUDA (`arch`) and run
    by cpu_check instead; yields the list of (spec, source, launch) it ran."""
    caps, renderer = capabilities(arch), CUDARenderer(arch)
    ran: list = []
    orig = programs.get_program

    def get(ast, device):
        spec = lower(ast, caps)
        source, launch = renderer.render(spec), launch_of(spec)
        ran.append((spec, source, launch))
        return programs.CompiledProgram(spec, device, _OnCPU(spec, source, launch), source)

    programs.get_program = get
    try:
        yield ran
    finally:
        programs.get_program = orig


def grouped(spec) -> int:
    """The GROUP amount of a lowered kernel (0: none)."""
    return next((o.amount for o in spec.opts if o.kind is OptKind.GROUP), 0)


def cuda_spec(ast, arch="sm_90"):
    return lower(ast, capabilities(arch))


def layernorm64(x):
    x = x.astype(np.float64)
    mu = x.mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + 1e-5)


# (row length, rows): the issue's odd lengths, few and many rows
ROWS = [(1, 5), (17, 3), (100, 64), (767, 2), (768, 16), (1000, 4), (4097, 2)]


@needs_cxx
@pytest.mark.parametrize("n,rows", ROWS)
def test_softmax_log_softmax_layernorm_and_row_reductions_match_numpy(n, rows):
    x = (rng.standard_normal((rows, n)) * 3).astype(np.float32)
    x64 = x.astype(np.float64)
    e = np.exp(x64 - x64.max(1, keepdims=True))
    with cuda_on_cpu() as ran:
        t = Tensor(x, device="INTERP").realize()
        got = {"softmax": t.softmax(1).numpy(), "log_softmax": t.log_softmax(1).numpy(),
               "layernorm": t.layernorm(eps=1e-5).numpy(), "sum": t.sum(1).numpy(), "max": t.max(1).numpy()}
    np.testing.assert_allclose(got["softmax"], e / e.sum(1, keepdims=True), rtol=2e-5, atol=1e-7)
    np.testing.assert_allclose(got["log_softmax"], (x64 - x64.max(1, keepdims=True)) - np.log(e.sum(1, keepdims=True)),
                               rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(got["layernorm"], layernorm64(x), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(got["sum"], x64.sum(1), rtol=1e-5, atol=1e-4)
    np.testing.assert_array_equal(got["max"], x.max(1))
    groups = {grouped(spec) for spec, _, _ in ran if any(n.op.name == "REDUCE" for n in spec.ast.toposort())}
    if n >= gpu_opts.ROW_MIN:  # every row reduction grouped: a warp, or 128 threads for 4097 (32 each)
        assert groups == {128 if n > 4096 else 32}, groups
        assert any("__shfl_xor_sync" in src for _, src, _ in ran)
    else:
        assert groups <= {0}, groups


@needs_cxx
def test_sibling_reductions_over_one_row_share_the_group():
    """sum + max of the same rows is one kernel with two reductions: both grouped over the same threads."""
    x = rng.standard_normal((24, 1000)).astype(np.float32)
    with cuda_on_cpu() as ran:
        got = (Tensor(x, device="INTERP").sum(1) + Tensor(x, device="INTERP").max(1)).numpy()
    (spec, src, launch) = ran[-1]
    assert grouped(spec) == 32 and launch.block == (32, 8, 1) and launch.warp == 32
    assert src.count("__shfl_xor_sync") == 10  # two butterflies of five steps
    np.testing.assert_allclose(got, x.astype(np.float64).sum(1) + x.max(1), rtol=1e-5, atol=1e-4)
    with cuda_on_cpu() as ran:  # std * mean: its second kernel has two reductions
        got = (Tensor(x, device="INTERP").std(1) * Tensor(x, device="INTERP").mean(1)).numpy()
    pairs = [(spec, src) for spec, src, _ in ran if sum(n.op.name == "REDUCE" for n in spec.ast.toposort()) == 4]
    assert len(pairs) == 1 and grouped(pairs[0][0]) == 32  # two grouped reductions, each over its partial
    assert pairs[0][1].count("__shfl_xor_sync") == 10
    np.testing.assert_allclose(got, x.astype(np.float64).std(1, ddof=1) * x.astype(np.float64).mean(1), rtol=1e-4,
                               atol=1e-6)


@needs_cxx
def test_symbolic_row_lengths():
    """A softmax over a Variable's columns (a prompt's tokens): grouped by the row's largest length, the last
    pass padded at run time (loads clamped to the row, the identity added), rows shorter than the group too."""
    n = Variable("n", 1, 2048)
    for cols in (5, 100, 1000):
        x = rng.standard_normal((6, cols)).astype(np.float32)
        with cuda_on_cpu() as ran:
            got = Tensor(x, device="INTERP").reshape(6, n.bind(cols)).softmax(1).numpy()
        assert [grouped(spec) for spec, _, _ in ran] == [64, 64, 0]
        e = np.exp(x.astype(np.float64) - x.max(1, keepdims=True))
        np.testing.assert_allclose(got, e / e.sum(1, keepdims=True), rtol=2e-5, atol=1e-7)


@needs_cxx
def test_integer_rows():
    x = rng.integers(-1000, 1000, (8, 1000)).astype(np.int32)
    with cuda_on_cpu() as ran:
        s = Tensor(x, device="INTERP").sum(1).numpy()
        m = Tensor(x, device="INTERP").max(1).numpy()
    assert all(grouped(spec) == 32 for spec, _, _ in ran)
    np.testing.assert_array_equal(s, x.sum(1))
    np.testing.assert_array_equal(m, x.max(1))


@needs_cxx
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_groups_sharing_a_block_keep_their_own_shared_memory(dtype):
    """4 rows of 2080 (a few-output GROUP of 32 threads) in one block of 32 x 4: each row folds only its own
    threads' values (the base tree let the 4 rows race on one shared array: every row got one row's max).
    float16 maxima take the shared-memory path (no shuffle of 16-bit values), float32 the shuffles."""
    x = rng.standard_normal((4, 2080)).astype(dtype)
    with cuda_on_cpu() as ran:
        got = Tensor(x, device="INTERP").max(1).numpy()
    (spec, src, launch) = ran[-1]
    assert launch.block == (32, 4, 1) and grouped(spec) == 32
    assert ("__shfl_xor_sync" in src) == (dtype is np.float32)
    np.testing.assert_array_equal(got, x.max(1))


def test_the_issue_shapes_get_a_warp_per_row():
    """4096 rows x 768 (GPT-2's layernorm and softmax rows) and attention's 8*12*512 rows x 512: a warp per
    row, 8 rows a block, loads along the row at lidx_x + 32 * step, a 5-step butterfly, no shared memory."""
    for shape in [(4096, 768), (8 * 12 * 512, 512)]:
        asts = kernels_of(lambda: Tensor(np.zeros(shape, np.float32), device="INTERP").softmax(1).realize(), run=False)
        reduces = [a for a in asts if any(n.op.name == "REDUCE" for n in a.toposort())]
        assert len(reduces) == 2
        for ast in reduces:
            spec = cuda_spec(ast)
            launch = launch_of(spec)
            assert [(o.kind, o.amount) for o in spec.opts] == [(OptKind.GROUP, 32), (OptKind.LOCAL, 8)]
            assert launch.block == (32, 8, 1) and launch.grid == (shape[0] // 8, 1, 1) and launch.warp == 32
            src = CUDARenderer("sm_90").render(spec)
            assert src.count("__shfl_xor_sync(0xffffffffu, ") == 5 and "__shared__" not in src
            assert f"for (int ridx2 = 0; ridx2 < {shape[1] // 32}; ridx2++)" in src
            assert "(ridx2*32)" in src and "+lidx_x)" in src  # thread x reads x, x + 32, ...: coalesced
            ops = [x.op for x in linearize(spec, launch=launch).insts]
            assert ops.count(L.SHUFFLE) == 5 and L.BARRIER not in ops


def test_long_rows_take_a_block_and_short_or_column_reductions_do_not_group():
    long = kernels_of(lambda: Tensor(np.zeros((64, 4097), np.float32), device="INTERP").sum(1).realize())
    spec = cuda_spec(long[-1])
    assert grouped(spec) == 128 and launch_of(spec).block == (128, 2, 1)
    src = CUDARenderer("sm_90").render(spec)
    assert src.count("__shfl_xor_sync") == 5 and "__shared__ float smem0[8];" in src  # 4 warps x 2 rows
    assert src.count("__syncthreads();") == 2
    assert grouped(cuda_spec(kernels_of(lambda: Tensor(np.zeros((64, 65536), np.float32),
                                                       device="INTERP").sum(1).realize())[-1])) == 256
    # 17 elements a row: one thread's loop; a column sum (bias gradient): LOCAL threads over the columns
    assert not grouped(cuda_spec(kernels_of(lambda: Tensor(np.zeros((4096, 17), np.float32),
                                                           device="INTERP").sum(1).realize())[-1]))
    col = cuda_spec(kernels_of(lambda: Tensor(np.zeros((512, 768), np.float32), device="INTERP").sum(0).realize())[-1])
    assert not grouped(col) and any(o.kind is OptKind.LOCAL for o in col.opts)
    # a vector times a matrix reads the matrix's rows coalesced across outputs already: not grouped;
    # a matrix times a vector (a row per output) is
    v, w = np.zeros((1, 768), np.float32), np.zeros((768, 3072), np.float32)
    vw = kernels_of(lambda: (Tensor(v, device="INTERP") @ Tensor(w, device="INTERP")).realize())[-1]
    assert not grouped(cuda_spec(vw))
    wv = kernels_of(lambda: (Tensor(w.T.copy(), device="INTERP") @ Tensor(v.T.copy(), device="INTERP")).realize())
    assert grouped(cuda_spec(wv[-1])) == 32


def test_the_elementwise_kernel_writing_odd_rows_gets_blocks_of_threads():
    """softmax's last kernel (exp(x - max) / sum) over rows of 4097: the row range padded to 4128 (PADTO, the
    points past 4097 write nothing) and split by a warp, 8 rows a block, instead of one thread a block."""
    asts = kernels_of(lambda: Tensor(np.zeros((64, 4097), np.float32), device="INTERP").softmax(1).realize())
    spec = cuda_spec(asts[-1])
    assert [o.kind for o in spec.opts] == [OptKind.PADTO, OptKind.LOCAL, OptKind.LOCAL]
    launch = launch_of(spec)
    assert launch.block == (32, 8, 1) and launch.grid == (129, 8, 1)
    assert "if (" in CUDARenderer("sm_90").render(spec)  # the padded points' stores are gated


def test_host_devices_and_devices_without_warps_are_untouched():
    ast = kernels_of(lambda: Tensor(np.zeros((64, 768), np.float32), device="INTERP").sum(1).realize())[-1]
    host = lower(ast, Capabilities(threads=4, vector_width=8, fma=True))
    assert all(o.kind not in (OptKind.GROUP, OptKind.LOCAL) for o in host.opts)
    no_warps = Capabilities(has_local_memory=True, shared_memory_bytes=48 * 1024, vector_width=4)
    assert not grouped(lower(ast, no_warps))  # row grouping needs Capabilities.warp_size
    assert gpu_opts.row_group_opts(ast, no_warps) == []


@needs_cxx
def test_cpu_check_catches_a_bad_shuffle_mask_and_a_missing_step():
    x = rng.standard_normal((8, 768)).astype(np.float32)
    (ast,) = kernels_of(lambda: Tensor(x, device="INTERP").sum(1).realize())
    spec = cuda_spec(ast)
    src, launch = CUDARenderer("sm_90").render(spec), launch_of(spec)
    out = np.zeros(8, np.float32)
    cpu_check.run_on_cpu(spec, src, launch, [out, x.reshape(-1)])
    np.testing.assert_allclose(out, x.astype(np.float64).sum(1), rtol=1e-5, atol=1e-5)
    half_warp = src.replace("__shfl_xor_sync(0xffffffffu, ", "__shfl_xor_sync(0x0000ffffu, ")
    with pytest.raises(cpu_check.CheckError, match="mask"):
        cpu_check.run_on_cpu(spec, half_warp, launch, [out, x.reshape(-1)])
    # the butterfly's last step (lane XOR 1) dropped: each lane misses its neighbour's partial sum
    lines = src.split("\n")
    last = next(i for i, line in enumerate(lines) if "__shfl_xor_sync" in line and line.endswith(", 1);"))
    missing = "\n".join(lines[:last] + lines[last + 2:])
    assert missing.count("__shfl_xor_sync") == 4
    cpu_check.run_on_cpu(spec, missing, launch, [out, x.reshape(-1)])
    assert not np.allclose(out, x.astype(np.float64).sum(1), rtol=1e-3)


def test_row_kernels_compile_with_nvrtc():
    from test_cuda_compile import _compiler
    from polygrad_backend_cuda.compile_check import compile_all
    compile_fn = _compiler()
    x = Tensor(rng.standard_normal((8, 767)).astype(np.float32), device="INTERP").realize()
    long = Tensor(rng.standard_normal((2, 4097)).astype(np.float32), device="INTERP").realize()
    xi = Tensor(rng.integers(0, 9, (4, 1000)).astype(np.int32), device="INTERP").realize()
    asts = []
    for fn in (lambda: x.softmax(1), lambda: x.log_softmax(1), lambda: x.layernorm(), lambda: long.softmax(1),
               lambda: long.layernorm(), lambda: x.sum(1) + x.max(1), lambda: xi.sum(1), lambda: xi.max(1),
               lambda: x.cast(dtypes.float16).max(1), lambda: x.cast(dtypes.float64).sum(1),
               lambda: long.reshape(2, Variable("n", 1, 8192).bind(4097)).softmax(1)):
        asts += kernels_of(lambda: fn().realize())
    for arch in ("sm_75", "sm_80", "sm_90"):
        specs = [cuda_spec(a, arch) for a in asts]
        sources = [CUDARenderer(arch).render(s) for s in specs]
        assert sum(grouped(s) > 0 for s in specs) >= 14
        assert sum("__shfl_xor_sync" in src for src in sources) >= 13
        compile_all(sources, arch, compile_fn)


@needs_cxx
@pytest.mark.skipif(os.environ.get("POLY_LONG_TESTS", "") in ("", "0"),
                    reason="about 1 to 3 minutes on 2 cores (60 kernels through clang++): runs with POLY_LONG_TESTS=1")
def test_transformer_block_training_step_on_the_cpu_check_matches_torch():
    """One Adam step of a small pre-norm GPT-2-style block (64 wide, 2 heads, 40 tokens: layernorm rows of 64,
    softmax rows of 40, padded) with every kernel rendered for CUDA and run by the CPU check, against torch
    in float64 (test_cuda_gpu's loss and tolerances)."""
    import test_cuda_gpu as gpu
    g = np.random.default_rng(6)
    E = 64

    def normal(*dims, std=0.02):
        return (g.standard_normal(dims) * std).astype(np.float32)
    weights = [1 + normal(E, std=0.1), normal(E), normal(E, 3 * E), normal(3 * E), normal(E, E), normal(E),
               1 + normal(E, std=0.1), normal(E), normal(E, 4 * E), normal(4 * E), normal(4 * E, E), normal(E)]
    data = tuple(g.standard_normal((1, 40, E)).astype(np.float32) for _ in range(2))
    heads, gpu.GPT2_HEADS = gpu.GPT2_HEADS, 2
    try:
        with cuda_on_cpu() as ran:
            got = gpu._polygrad_step("INTERP", gpu._block_loss, weights, data)
        want = gpu._torch_step(gpu._block_loss, weights, data)
    finally:
        gpu.GPT2_HEADS = heads
    assert sum(grouped(spec) > 0 for spec, _, _ in ran) >= 8  # the layernorms', softmaxes' and their gradients' rows
    gpu._assert_same_step(got, want)
