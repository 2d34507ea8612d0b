"""Device optimisation choices: which opts the heuristics pick and how split reductions render."""
import re

import numpy as np
import pytest

from polygrad import Context, Tensor
from polygrad.dtype import dtypes
from polygrad.engine.programs import get_program
from polygrad.schedule.template import schedule
from polygrad.uop.ops import Ops, UOp


def _programs(t: Tensor):
    tpl, _ = schedule([t.uop])
    return [get_program(step.ast, "CPU") for step in tpl.steps if step.kind == "kernel"]


def test_row_sum_gets_partial_accumulators_not_a_tile():
    x = Tensor(np.random.rand(64, 1024).astype(np.float32), device="CPU").realize()
    (prog,) = _programs(x.sum(1))
    assert [o.kind for o in prog.spec.opts] == ["SPLIT_REDUCE"]
    assert np.allclose(x.sum(1).numpy(), x.numpy().sum(1), rtol=1e-5)


def test_split_reduce_keeps_lane_loop_inside_the_reduce_loop():
    """The lane accumulators (an array, or one vector of 8 lanes on a device with vectors) are defined
    before the reduce loop and filled inside it."""
    xn = np.random.rand(8, 4096).astype(np.float32)
    x = Tensor(xn, device="CPU").realize()
    out = ((x * 2 + 1).relu() * x).sum(1)
    (prog,) = _programs(out)
    src = prog.source
    lane_acc = re.search(r"\[8\];|pg_f32x8 acc\d+ = ", src).start()
    reduce_loop = src.index("ridx")
    assert lane_acc < reduce_loop, src
    ref = (np.maximum(xn * 2 + 1, 0) * xn).sum(1)
    assert np.allclose(out.numpy(), ref, rtol=1e-5)


def _tile(rows, cols):
    """The register tile the CPU's own capabilities give a rows x cols output (lanes and registers)."""
    from polygrad.codegen.host_opts import register_tile
    from polygrad.device import open_device
    caps = open_device("CPU").capabilities
    mk = lambda n: UOp(Ops.RANGE, dtypes.int32, (UOp.const(dtypes.int32, n),), (0, "global"))  # noqa: E731
    r, v = register_tile(mk(rows), mk(cols), caps)
    return sorted(x for x in (r, v * caps.vector_width) if x > 1)


def test_matmul_gets_a_register_tile():
    a = Tensor(np.random.rand(64, 64).astype(np.float32), device="CPU").realize()
    (prog,) = _programs(a @ a)
    assert sorted(o.amount for o in prog.spec.opts if o.kind == "UPCAST") == _tile(64, 64)


def test_transposed_operand_gets_the_same_register_tile():
    """With named accumulators the strided operand no longer needs a smaller row tile (measured:
    8 rows beat 4 for x.T @ g at 1024 with clang and gcc)."""
    x = Tensor(np.random.rand(64, 32).astype(np.float32), device="CPU").realize()
    g = Tensor(np.random.rand(64, 48).astype(np.float32), device="CPU").realize()
    (prog,) = _programs(x.T @ g)
    assert sorted(o.amount for o in prog.spec.opts if o.kind == "UPCAST") == _tile(32, 48)
    assert np.allclose((x.T @ g).numpy(), x.numpy().T @ g.numpy(), rtol=1e-4)


def test_conv_epilogue_load_keeps_the_conv_tile():
    """A residual added after a convolution is read once per output, not per reduction step: the tile's
    rows stay the output channels, as without it. (Chosen by the residual, the rows were image rows: 8
    gated input loads per step instead of one, ResNet-18's block convolutions 3-4x slower.)"""
    rng = np.random.default_rng(0)
    x, r = (Tensor(rng.standard_normal((1, 16, 16, 16)).astype(np.float32), device="CPU").realize() for _ in "xr")
    w = Tensor(rng.standard_normal((16, 16, 3, 3)).astype(np.float32), device="CPU").realize()
    upcasts = lambda t: [(o.axis, o.amount) for o in _programs(t)[0].spec.opts if o.kind == "UPCAST"]  # noqa: E731
    plain = upcasts(x.conv2d(w, padding=1).relu())
    assert len(plain) == 2
    assert upcasts((x.conv2d(w, padding=1) + r).relu()) == plain
    import torch
    ref = torch.relu(torch.nn.functional.conv2d(torch.from_numpy(x.numpy()), torch.from_numpy(w.numpy()), padding=1)
                     + torch.from_numpy(r.numpy()))
    assert np.allclose((x.conv2d(w, padding=1) + r).relu().numpy(), ref.numpy(), rtol=1e-4, atol=1e-4)


def test_strided_conv_takes_its_columns_from_the_output_channels():
    """A stride-2 convolution whose weight is stored output-channels-last (as polygrad.onnx keeps it): the tile's
    vector columns are the output channels (the weight's contiguous axis), not the image row, which the input
    is read along every other pixel (gathered lane by lane: ResNet-18's stem ran 7x slower)."""
    rng = np.random.default_rng(0)
    x = Tensor(rng.standard_normal((1, 3, 32, 32)).astype(np.float32), device="CPU").realize()
    w_np = rng.standard_normal((32, 3, 3, 3)).astype(np.float32)
    w = Tensor(w_np.transpose(2, 3, 1, 0).copy(), device="CPU").realize().permute(3, 2, 0, 1)
    out = x.conv2d(w, stride=2, padding=1)
    (prog,) = _programs(out)
    upcasts = [o for o in prog.spec.opts if o.kind == "UPCAST"]
    assert len(upcasts) == 2 and upcasts[-1].amount in (8, 16, 32, 64)  # the columns: channel vectors
    assert upcasts[-1].axis == 0, prog.spec.opts  # range 0: the output channels
    import torch
    ref = torch.nn.functional.conv2d(torch.from_numpy(x.numpy()), torch.from_numpy(w_np), stride=2, padding=1)
    assert np.allclose(out.numpy(), ref.numpy(), rtol=1e-4, atol=1e-4)


def test_mod_keeps_sign_when_dropping_multiples():
    """(4 - r) % 2 must not become (-r) % 2: C's % truncates, so the sign of the rest matters."""
    from polygrad.dtype import dtypes
    from polygrad.uop.ops import Ops, UOp
    from polygrad.uop.rewrite import graph_rewrite
    from polygrad.uop.symbolic import symbolic_rules
    r = UOp(Ops.RANGE, dtypes.int32, (UOp.const(dtypes.int32, 5),), (0, "global"))
    expr = (UOp.const(dtypes.int32, 4) - r) % 2
    out = graph_rewrite(expr, symbolic_rules)
    assert not (out.op is Ops.MOD and out.src[0].op is Ops.NEG), out


def test_split_and_joined_index_folds_to_itself():
    """(a//c)*c + a%c + k is a + k for C's truncating division, negative a included (checked by value)."""
    from polygrad.dtype import dtypes
    from polygrad.uop.ops import Ops, UOp
    from polygrad.uop.rewrite import graph_rewrite
    from polygrad.uop.sint import sym_eval
    from polygrad.uop.symbolic import symbolic_rules
    v = UOp(Ops.DEFINE_VAR, dtypes.int32, (), ("v", -1500, 1500))
    a = v * 3 + UOp.const(dtypes.int32, 1)
    expr = (a // 784) * 784 + a % 784 + UOp.const(dtypes.int32, 7)
    out = graph_rewrite(expr, symbolic_rules)
    assert not any(n.op in (Ops.IDIV, Ops.MOD) for n in out.toposort()), out
    for x in (-1500, -262, -1, 0, 1, 261, 1500):
        assert sym_eval(expr, {v: x}) == sym_eval(out, {v: x}) == 3 * x + 8


def test_flip_repeat_cat_chain_on_interp():
    """Found by the movement-chain property test: an index needed (4 - r) % 2 with r up to 4."""
    a = np.arange(2, dtype=np.float32).reshape(2, 1)
    for device in ("INTERP", "CPU"):
        t = Tensor(a, device=device).flip(0).repeat((2, 1))
        t = t.cat(t.shrink(((0, 1), None)), dim=0).flip(0)
        assert t.numpy().ravel().tolist() == [1.0, 0.0, 1.0, 0.0, 1.0]


def test_a_reduction_as_long_as_the_vector_gets_full_width_lanes():
    """x @ W.T over 16 values (a Q8_0 block half, a head of 16) on a 16-lane device: a tile of dot products
    whose reduction is one 16-lane vector, not two 8-lane halves."""
    from polygrad.backend_api import Capabilities
    from polygrad.codegen.host_opts import host_opts
    x = Tensor(np.random.rand(8, 16).astype(np.float32), device="CPU").realize()
    w = Tensor(np.random.rand(12, 16).astype(np.float32), device="CPU").realize()
    tpl, _ = schedule([(x @ w.T).uop])
    (ast,) = [step.ast for step in tpl.steps if step.kind == "kernel"]
    for width in (16, 8):
        opts = host_opts(ast, Capabilities(threads=1, vector_width=width, registers=32))
        assert [o.amount for o in opts if o.kind == "SPLIT_REDUCE"] == [width], opts
    assert np.allclose((x @ w.T).numpy(), x.numpy() @ w.numpy().T, rtol=1e-5)


def test_a_quantized_matmul_over_an_odd_row_count_gets_lanes():
    """x @ W.T with W kept as Q8_0 blocks and a row count nothing divides (a vocabulary of 50257): no output
    range to tile, so the reduction gets vector lanes (a scalar FMA chain per row before, 9x slower)."""
    from polygrad.device import open_device
    from polygrad.nn.quant import QuantWeight
    w = np.random.default_rng(0).standard_normal((51, 64)).astype(np.float32)
    qw = QuantWeight.from_float(w, "q8_0")
    x = Tensor(np.random.default_rng(1).standard_normal((1, 64)).astype(np.float32), device="CPU").realize()
    with Context(POLY_INT8_DOT=0):  # the float path (one row's 8-bit activations: tests/test_int8_dot.py)
        (prog,) = _programs(qw.matmul_t(x))
        got = qw.matmul_t(x).numpy()
    width = open_device("CPU").capabilities.vector_width
    if width >= 4:
        opts = [(o.kind, o.amount) for o in prog.spec.opts if o.kind != "THREAD"]
        assert opts == [("SPLIT_REDUCE", 2), ("SPLIT_REDUCE", min(width, 16))], opts
    np.testing.assert_allclose(got, x.numpy() @ qw.dequantize().numpy().T, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("fmt", ["q8_0", "q4_0", "q4_k"])
def test_a_decode_matvec_reads_each_weight_row_as_one_stream(fmt):
    """x @ W.T for one row of x over a dequantized weight whose row count 4 divides: no tile of rows (its
    2 or 4 interleaved row reads held a cold Q8_0 matvec to half the memory bandwidth one stream per row
    gets), the lanes along the block's values and a second accumulator set along the range above them."""
    from polygrad.device import open_device
    from polygrad.nn.quant import QuantWeight
    cols = 512
    qw = QuantWeight.from_float(np.random.default_rng(0).standard_normal((64, cols)).astype(np.float32), fmt)
    x = Tensor(np.random.default_rng(1).standard_normal((1, cols)).astype(np.float32), device="CPU").realize()
    with Context(POLY_INT8_DOT=0):  # the float path (Q8_0's 8-bit activations: tests/test_int8_dot.py)
        (prog,) = _programs(qw.matmul_t(x))
        got = qw.matmul_t(x).numpy()
    if open_device("CPU").capabilities.vector_width >= 4:
        kinds = [o.kind for o in prog.spec.opts if o.kind != "THREAD"]
        assert kinds == ["SPLIT_REDUCE", "SPLIT_REDUCE"], prog.spec.opts
    np.testing.assert_allclose(got, x.numpy() @ qw.dequantize().numpy().T, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("fmt", ["q8_0", "q4_0"])
def test_a_decode_matvec_leaves_its_epilogue_to_a_kernel_after_it(fmt):
    """gelu(x @ W.T + b) for one row of x: the matvec is a kernel of its own with one stream per weight row,
    the bias and GELU a small kernel after it (fused, the GELU kept a tile of 4 rows: GPT-2's Q4_0 fc matvecs
    took 3x longer per decode step)."""
    from polygrad.nn.quant import QuantWeight
    cols = 256
    qw = QuantWeight.from_float(np.random.default_rng(0).standard_normal((64, cols)).astype(np.float32), fmt)
    x = Tensor(np.random.default_rng(1).standard_normal((1, cols)).astype(np.float32), device="CPU").realize()
    bias = Tensor(np.random.default_rng(2).standard_normal(64).astype(np.float32), device="CPU").realize()
    with Context(POLY_INT8_DOT=0):  # the float path (Q8_0's 8-bit activations: tests/test_int8_dot.py)
        progs = _programs((qw.matmul_t(x) + bias).gelu())
        got = (qw.matmul_t(x) + bias).gelu().numpy()
    assert [p.spec.name for p in progs] == ["r_1_64", "E_1_64"], [p.spec.name for p in progs]
    assert "UPCAST" not in [o.kind for o in progs[0].spec.opts], progs[0].spec.opts
    want = (Tensor(x.numpy() @ qw.dequantize().numpy().T) + bias).gelu().numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("fmt", ["q8_0", "q4_0"])
def test_a_quantized_matmul_is_vector_code(fmt):
    """x @ W.T over Q8_0 / Q4_0 blocks for a few rows (a prompt) vectorises: Q4_0's halves are shifts of the
    same bytes, not a select between two gated loads, which fell back to lane loops (4.5x slower)."""
    from polygrad.device import open_device
    from polygrad.nn.quant import QuantWeight
    w = np.random.default_rng(0).standard_normal((64, 128)).astype(np.float32)
    qw = QuantWeight.from_float(w, fmt)
    x = Tensor(np.random.default_rng(1).standard_normal((8, 128)).astype(np.float32), device="CPU").realize()
    with Context(POLY_INT8_DOT=0):  # the float path (a prompt's 8-bit activations: tests/test_int8_gemm.py)
        (prog,) = _programs(qw.matmul_t(x))
        if open_device("CPU").capabilities.vector_width > 1:
            assert "vectorize(disable)" not in prog.source and "pg_f32x" in prog.source, prog.source
        got = qw.matmul_t(x).numpy()
    np.testing.assert_allclose(got, x.numpy() @ qw.dequantize().numpy().T, rtol=1e-5, atol=1e-4)


def _decode_program(fmt: str, cols: int):
    """The CPU program of x @ W.T for one row of x (a decode step's matvec) over 8 rows of `fmt` blocks."""
    from polygrad.nn.quant import QuantWeight
    w = np.random.default_rng(0).standard_normal((8, cols)).astype(np.float32)
    qw = QuantWeight.from_float(w, fmt)
    x = Tensor(np.random.default_rng(1).standard_normal((1, cols)).astype(np.float32), device="CPU").realize()
    (prog,) = _programs(qw.matmul_t(x))
    np.testing.assert_allclose(qw.matmul_t(x).numpy(), x.numpy() @ qw.dequantize().numpy().T, rtol=1e-5, atol=1e-4)
    return prog


def test_q4_0_nibble_shift_is_the_group_index_not_a_table():
    """Q4_0's low and high nibbles shift by 4 * (the half's index), computed from the loop index: the kernel
    reads x and the blocks alone, with no shift-amount table, and no range guard or blend on the shift
    (a loaded amount needed both: `amount < 32 ? amount : 0` per vector, then a select of the result). The
    float path (POLY_INT8_DOT=0): on a CPU with VNNI one row's 8-bit activations take kernels of their own
    (tests/test_int8_dot.py)."""
    with Context(POLY_INT8_DOT=0):
        prog = _decode_program("q4_0", 128)
    params = re.search(r"void pg_kernel\(([^)]*)\)", prog.source).group(1)
    assert params.count("data") == 3, params  # the output, x, the blocks
    assert "?" not in prog.source.split("void pg_kernel(")[1], prog.source


def test_k_quant_decode_kernel_shifts_bytes_in_lanes():
    """Q4_K/Q5_K unpack 6-bit scales and nibbles with uint8 shifts; their amounts come from group indices
    (bounded below 8), so the bytes shift in vector lanes and the decode kernel is vector code (8-bit shift
    lanes were refused, and the kernel ran scalar, 4x slower)."""
    from polygrad.device import open_device
    if open_device("CPU").capabilities.vector_width < 4:
        pytest.skip("no vector lanes on this CPU")
    for fmt in ("q4_k", "q5_k"):
        src = _decode_program(fmt, 256).source
        assert re.search(r"pg_u8x\d+ alu\d+ = \(val\d+>>bc\d+\);", src), src
        assert "pg_f32x" in src, src


def test_narrow_shift_lanes_follow_the_amounts_bounds():
    """8- and 16-bit shifts by an amount bounded below the lane width (a group index, as the block formats'
    nibble shifts) get lanes in a matvec's body and equal NumPy: signed right shifts keep the sign, left
    shifts wrap in the narrow type. A loaded amount, which may reach the width, keeps the int-promoted
    scalar result (0 for a uint8 left shift by 8 or more)."""
    from polygrad.device import open_device
    rng = np.random.default_rng(0)
    lanes = open_device("CPU").capabilities.vector_width >= 4
    for dt, npdt in ((dtypes.uint8, np.uint8), (dtypes.int8, np.int8), (dtypes.int16, np.int16)):
        info, bits = np.iinfo(npdt), 8 * np.dtype(npdt).itemsize
        shape = (16, 256 // bits, bits)
        a = rng.integers(info.min, info.max, shape, dtype=npdt)
        xs = rng.standard_normal((1, *shape[1:])).astype(np.float32)
        amount = Tensor.arange(bits, dtype=dt, device="CPU").reshape(1, 1, bits).expand(*shape)
        for op, ref in ((lambda t: t >> amount, a >> np.arange(bits, dtype=npdt)),
                        (lambda t: t << amount, a << np.arange(bits, dtype=npdt))):
            y = (op(Tensor(a, device="CPU")).cast(dtypes.float32) * Tensor(xs, device="CPU")).sum((1, 2))
            (prog,) = _programs(y)
            if lanes:
                assert re.search(r"pg_[ui]\d+x\d+ alu\d+ = \(val\d+(>>|<<)", prog.source), prog.source
            want = (ref.astype(np.float64) * xs).sum((1, 2))
            np.testing.assert_allclose(y.numpy(), want, rtol=0, atol=1e-5 * np.abs(ref * xs).sum((1, 2)).max())
    a = rng.integers(0, 256, 64, dtype=np.uint8)
    far = np.arange(64, dtype=np.uint8) % 12  # 8..11 would be undefined in 8-bit lanes
    got = (Tensor(a, device="CPU") << Tensor(far, device="CPU")).numpy()
    np.testing.assert_array_equal(got, np.where(far < 8, a << np.minimum(far, 7), 0).astype(np.uint8))


def _gated_mlp(device: str, rows: int, cols: int, seed: int):
    """silu(x @ W_gate.T) * (x @ W_up.T) for one row of x over float32 weights (a decode step's gated MLP;
    a quantized weight's one-row matvec is a kernel of its own, nn/quant.py), and NumPy's value."""
    rng = np.random.default_rng(seed)
    wg, wu = (rng.standard_normal((rows, cols)).astype(np.float32) for _ in range(2))
    xn = rng.standard_normal((1, cols)).astype(np.float32)
    gate, up, x = (Tensor(a, device=device).realize() for a in (wg, wu, xn))
    g, u = xn @ wg.T, xn @ wu.T
    return (x @ gate.T).silu() * (x @ up.T), g / (1 + np.exp(-g)) * u


def test_a_gated_mlp_kernel_gives_both_products_lanes():
    """The gated MLP of one row is one kernel with two reductions: both run over shared ranges
    (passes.share_reduce_ranges), so the lanes chosen for the gate's reach the up product too (it was a
    scalar fmaf chain per row; at Q8_0/Q4_0, before their one-row matvecs became kernels of their own, a
    Qwen2 decode step's slowest kernel)."""
    from polygrad.codegen.passes import kernel_for_opts
    from polygrad.device import open_device
    out, want = _gated_mlp("CPU", 64, 128, 0)
    (step,) = [s for s in schedule([out.uop])[0].steps if s.kind == "kernel"]
    reduces = [n for n in kernel_for_opts(step.ast).toposort() if n.op is Ops.REDUCE]
    assert len(reduces) == 2 and reduces[0].src[1:] == reduces[1].src[1:], "the products do not share ranges"
    prog = get_program(step.ast, "CPU")
    if open_device("CPU").capabilities.vector_width >= 4:
        assert "fmaf(" not in prog.source.split("void pg_kernel(")[1], prog.source
        assert "SPLIT_REDUCE" in [o.kind for o in prog.spec.opts], prog.spec.opts
    np.testing.assert_allclose(out.numpy(), want, rtol=1e-5, atol=1e-5)


def test_a_gated_mlp_over_shared_ranges_is_exact_on_every_backend(device):
    """Each backend's code generator gets the two products over one set of ranges (share_reduce_ranges)
    and must still compute each one whole: values against NumPy."""
    out, want = _gated_mlp(device, 32, 64, 1)
    np.testing.assert_allclose(out.numpy(), want, rtol=1e-5, atol=1e-5)
