"""conv2d's kernels (issue 32): deterministic guards for their speed, and their values against torch.

A register tile that broadcasts a strided row operand (a conv's weight, one value per output channel)
stages it per row tile (STAGE: a contiguous local array), and a big padded stride-1 conv's weight
gradient reads a padded copy of its input, so its innermost loop has no validity gate. No timings:
only the structure, and the values of forward and both gradients at odd sizes, on CPU and X86.
"""
from dataclasses import replace

import numpy as np
import pytest

from polygrad import Device, Tensor, tensor_nn
from polygrad.backend_api import Capabilities
from polygrad.codegen.lower import lower
from polygrad.codegen.passes import kernel_for_opts
from polygrad.codegen.opts import OptKind
from polygrad.device import open_device
from polygrad.renderer.linearize import L, linearize
from polygrad.schedule.template import schedule
from polygrad.uop.ops import Ops

torch = pytest.importorskip("torch")

AVX512 = Capabilities(threads=2, vector_width=16, registers=32, fma=True, stage_bytes=512 * 1024)
HOSTS = ["CPU"] + (["X86"] if Device.available("X86") else [])


def _step_kernels(x_shape, w_shape, padding, groups=1):
    """The kernels of a conv's forward, input gradient and weight gradient (in schedule order)."""
    x = Tensor.empty(*x_shape, requires_grad=True)
    w = Tensor.empty(*w_shape, requires_grad=True)
    out = x.conv2d(w, padding=padding, groups=groups)
    (out * Tensor.empty(*out.shape)).sum().backward()
    tpl, _ = schedule([out.uop, x.grad.uop, w.grad.uop])
    return [s.ast for s in tpl.steps if s.kind == "kernel"]


def _gated(spec) -> bool:
    return any(n.op is Ops.INDEX and len(n.src) > 2 for n in spec.ast.toposort())


def test_conv_tiles_stage_their_weight_per_row_tile():
    """The forward and the input gradient (a conv of the output gradient with the transposed weight,
    576 floats apart per input channel) copy each row tile's weights into one contiguous local array:
    8 output channels x 576 reduction steps, read as one group per step."""
    kernels = [lower(a, AVX512) for a in _step_kernels((8, 64, 56, 56), (64, 64, 3, 3), 1)]
    tiles = [s for s in kernels if s.ops > 1e9 and s.name.startswith("r_8_64_56_56")]
    assert len(tiles) == 2
    for spec in tiles:
        weight = next(g.slot for g in spec.globals if g.size == 64 * 64 * 9)
        assert any(o.kind is OptKind.STAGE and o.amount == weight for o in spec.opts), spec.opts
        prog = linearize(spec, vector_width=16)
        assert [x.arg for x in prog.insts if x.op is L.LOCAL] == [8 * 576]


def test_half_width_conv_tiles_take_sixteen_rows_where_the_code_generator_holds_them():
    """A 56-pixel row takes 8-lane vectors on a 16-lane device; its tile's rows (output channels) are then 16,
    not 8, where the code generator holds a 4-vector tile (tile_vectors 4: clang): 8 accumulators were just
    Zen 4's 256-bit FMA units x latency. A code generator of 2-vector tiles (X86, gcc) keeps 8 rows, and a
    tile of full vectors keeps its rows too."""
    asts = _step_kernels((8, 64, 56, 56), (64, 64, 3, 3), 1)
    clang = Capabilities(threads=2, vector_width=16, registers=32, fma=True, fma_units=1, fma_latency=4,
                         stage_bytes=512 * 1024, tile_vectors=4)
    for caps, rows in ((clang, 16), (AVX512, 8)):
        tiles = [s for s in (lower(a, caps) for a in asts) if s.name.startswith("r_8_64_56_56")]
        assert len(tiles) == 2
        for spec in tiles:
            ups = sorted(o.amount for o in spec.opts if o.kind is OptKind.UPCAST)
            assert ups == sorted([rows, 8]), spec.opts
            assert [x.arg for x in linearize(spec, vector_width=16).insts if x.op is L.LOCAL] == [rows * 576]
    # a 16-pixel row is one full 16-lane vector: its tile keeps 8 rows
    full = [lower(a, clang) for a in _step_kernels((8, 64, 16, 16), (64, 64, 3, 3), 1)]
    ups = [sorted(o.amount for o in s.opts if o.kind is OptKind.UPCAST) for s in full if s.name.startswith("r_8_64_16")]
    assert ups == [[8, 16], [8, 16]]


CLANG_AVX512 = Capabilities(threads=2, vector_width=16, registers=32, fma=True, fma_units=1, fma_latency=4,
                            stage_bytes=512 * 1024, tile_vectors=4, l1_bytes=32 * 1024, masked_vectors=True)


@pytest.mark.parametrize("channels,pixels", [(128, 28), (256, 14)])
def test_deep_convs_over_short_rows_get_register_tiles(channels, pixels):
    """A 3x3 conv over 128 channels at 28 x 28 (256 at 14 x 14: ResNet's later stages): 28 or 14 pixels take
    no 16- or 8-lane vectors and the padded tile's column panel outgrows the L1, so forward and input
    gradient got no tile at all (lanes along the strided channels: 11-34x slower); now the padded tile,
    from the L2. The weight gradient's dot tile takes 16 padded lanes along both rows."""
    asts = _step_kernels((8, channels, pixels, pixels), (channels, channels, 3, 3), 1)
    specs = [lower(a, CLANG_AVX512) for a in asts]
    convs = [s for s in specs if s.name.startswith(f"r_8_{channels}")]
    assert len(convs) == 2
    for spec in convs:
        padded = -(-pixels // 16) * 16
        assert (OptKind.PADTO, padded) in [(o.kind, o.amount) for o in spec.opts], spec.opts
        assert any(o.kind is OptKind.UPCAST and o.amount == 8 for o in spec.opts), spec.opts  # rows: channels
    # both rows are padded to 16 masked lanes (PADTO of the reduce range): 28 -> 32 (it had 4 lanes, 1.6x slower),
    # 14 -> 16 (it had scalar chains, 6x slower, and one chain before that, 7x more)
    (dw,) = [s for s in specs if s.name.startswith(f"r_{channels}_{channels}_3_3")]
    lanes = [o.amount for o in dw.opts if o.kind is OptKind.SPLIT_REDUCE]
    pads = [o.amount for o in dw.opts if o.kind is OptKind.PADTO]
    assert (lanes, pads) == ([16], [16]), dw.opts
    assert sorted(o.amount for o in dw.opts if o.kind is OptKind.UPCAST) == [2, 3, 4], dw.opts


def test_a_quarter_vector_stays_where_padding_would_waste_more_or_no_masked_moves():
    """The weight gradient over a 28-pixel row keeps 4 lanes without masked vector moves; over 20 pixels, padding
    to 32 in 16 lanes (12 of 32 wasted) or to 24 in 8 (4 of 24) would waste more than 1/8: 4 lanes."""
    def dw_lanes(pixels, caps):
        specs = [lower(a, caps) for a in _step_kernels((2, 16, pixels, pixels), (16, 16, 3, 3), 1)]
        (dw,) = [s for s in specs if s.name.startswith("r_16_16_3_3")]
        return [(o.kind, o.amount) for o in dw.opts if o.kind in (OptKind.PADTO, OptKind.SPLIT_REDUCE)]
    assert dw_lanes(28, replace(CLANG_AVX512, masked_vectors=False)) == [(OptKind.SPLIT_REDUCE, 4)]
    assert dw_lanes(20, CLANG_AVX512) == [(OptKind.SPLIT_REDUCE, 4)]
    assert dw_lanes(28, CLANG_AVX512) == [(OptKind.PADTO, 16), (OptKind.SPLIT_REDUCE, 16)]


X86_AVX512 = replace(CLANG_AVX512, tile_vectors=2, stage_bytes=0)


@pytest.mark.parametrize("caps", [CLANG_AVX512, X86_AVX512], ids=["clang", "x86"])
@pytest.mark.parametrize("channels", [512, 64])
def test_seven_pixel_rows_take_a_short_row_tile(caps, channels):
    """A 3x3 conv at 7 x 7 (ResNet's last stage: 512 channels, whose column panel outgrows the L1; 64, whose panel
    fits it): a 7-pixel row padded to 8 masked lanes (16 would waste 9 of them), 4 output channels as rows and the
    map's 7 rows of pixels whole, 28 accumulators, for forward and input gradient alike. Before, both had lanes
    along the strided input channels (83x and 136x torch's time at 512). Without masked moves, no padding."""
    asts = [a for a in _step_kernels((8, channels, 7, 7), (channels, channels, 3, 3), 1)
            if lower(a, None).name.startswith(f"r_8_{channels}_7_7")]
    assert len(asts) == 2
    up, pad = OptKind.UPCAST, OptKind.PADTO
    for ast in asts:
        spec = lower(ast, caps)
        opts = [(o.kind, o.axis, o.amount) for o in spec.opts if o.kind is not OptKind.THREAD]
        # ranges: 0 images, 1 output channels, 2 pixel rows, 3 pixels of a row
        assert opts == [(up, 1, 4), (up, 2, 7), (pad, 3, 8), (up, 3, 8)], spec.opts
        no_mask = lower(ast, replace(caps, masked_vectors=False))
        assert OptKind.PADTO not in [o.kind for o in no_mask.opts], no_mask.opts


def test_pointwise_convs_at_seven_pixels_take_the_short_row_tile():
    """A 1x1 conv over a 7 x 7 map (ResNet-50's last stage: 512 -> 2048 channels): its forward had lanes along
    the strided input channels; the short-row tile applies to it as to a 3x3 conv."""
    x, w = Tensor.empty(8, 512, 7, 7), Tensor.empty(2048, 512, 1, 1)
    (ast,) = [s.ast for s in schedule([x.conv2d(w).uop])[0].steps if s.kind == "kernel"]
    opts = [(o.kind, o.amount) for o in lower(ast, CLANG_AVX512).opts if o.kind is not OptKind.THREAD]
    assert opts == [(OptKind.UPCAST, 4), (OptKind.UPCAST, 7), (OptKind.PADTO, 8), (OptKind.UPCAST, 8)], opts


@pytest.mark.parametrize("device", [d for d in ("CPU", "INTERP", "X86") if Device.available(d)])
@pytest.mark.parametrize("pixels", [7, 28])
def test_short_row_tiles_equal_torch_on_every_host(device, pixels, monkeypatch):
    """Forward and both gradients of a 3x3 conv over 12 channels at 7 x 7 (the short-row tile: 4 channels x 7
    rows x 8 padded lanes; the weight gradient in 8 padded lanes) and 28 x 28 (the weight gradient in 16 lanes,
    28 -> 32) with the opts the heuristics choose for an AVX-512 device with masked moves, whatever this
    device's, equal torch's (INTERP: the IR's reference semantics)."""
    from polygrad.codegen.host_opts import host_opts
    from polygrad.engine import programs
    monkeypatch.setattr(programs, "program_cache", {})
    monkeypatch.setattr(programs, "choose_opts", lambda ast, dev: host_opts(kernel_for_opts(ast), CLANG_AVX512))
    asts = _step_kernels((2, 12, pixels, pixels), (12, 12, 3, 3), 1)
    chosen = [[(o.kind, o.amount) for o in lower(a, CLANG_AVX512).opts] for a in asts]
    tiles = {7: (OptKind.UPCAST, 7), 28: (OptKind.SPLIT_REDUCE, 16)}
    assert any(tiles[pixels] in c and (OptKind.PADTO, 16 if pixels == 28 else 8) in c for c in chosen), chosen
    rng = np.random.default_rng(pixels + 1)
    xn = rng.standard_normal((2, 12, pixels, pixels)).astype(np.float32)
    wn = (rng.standard_normal((12, 12, 3, 3)) * 0.2).astype(np.float32)
    _padded_conv_step_equals_torch(device, xn, wn, rng, atol=1e-4)


@pytest.mark.parametrize("masked", [True, False])
def test_weight_gradient_over_seven_pixel_rows_takes_padded_lanes(masked):
    """A 3x3 conv over 512 channels at 7 x 7 (ResNet's last stage): its weight gradient's 7-pixel rows are padded
    to 8 masked lanes where the device loads a vector with its last lanes gated off as one move (5x faster than
    the scalar chains on one Zen 4 core's pair of threads); without masked moves the scalar chains stay."""
    caps = CLANG_AVX512 if masked else replace(CLANG_AVX512, masked_vectors=False)
    (dw,) = [s for s in (lower(a, caps) for a in _step_kernels((8, 512, 7, 7), (512, 512, 3, 3), 1))
             if s.name.startswith("r_512_512_3_3")]
    kinds = [(o.kind, o.amount) for o in dw.opts if o.kind in (OptKind.PADTO, OptKind.SPLIT_REDUCE)]
    assert kinds == ([(OptKind.PADTO, 8), (OptKind.SPLIT_REDUCE, 8)] if masked else []), dw.opts


@pytest.mark.parametrize("device", HOSTS)
@pytest.mark.parametrize("pixels", [28, 14, 7])
def test_deep_short_row_conv_equals_torch(device, pixels):
    """Forward and both gradients of a 3x3 conv over 64 channels at 28 x 28 (its padded tile's panel, 576 x 16
    floats, outgrows a 32 KiB L1; its weight gradient's dot tile in 4 lanes), at 14 x 14 and 7 x 7 (the weight
    gradient's rows padded to 16 and 8 masked lanes) equal torch's."""
    rng = np.random.default_rng(pixels)
    xn = rng.standard_normal((2, 64, pixels, pixels)).astype(np.float32)
    wn = (rng.standard_normal((64, 64, 3, 3)) * 0.1).astype(np.float32)
    _padded_conv_step_equals_torch(device, xn, wn, rng, atol=1e-3)


def test_small_reuse_rows_are_not_staged():
    """An MLP's 512 x 512 weight gradient (x.T @ g over a batch of 128) serves 8 column tiles per row
    tile: copying its strided rows costs more than it saves, so the tile stays as it was."""
    x, g = Tensor.empty(128, 512), Tensor.empty(128, 512)
    (ast,) = [s.ast for s in schedule([(x.T @ g).uop])[0].steps if s.kind == "kernel"]
    assert OptKind.STAGE not in [o.kind for o in lower(ast, AVX512).opts]


def test_big_padded_conv_weight_gradient_reads_a_padded_copy():
    """Forward, input gradient, a copy of the padded input, and a weight gradient that reads the copy:
    no gated load in the weight gradient, so no border test in its innermost loop (before, its masked
    loads computed a lane mask per 8 pixels). A small conv keeps its three kernels, and so does a big
    depthwise one (9 multiply-adds per copied value)."""
    asts = _step_kernels((8, 64, 56, 56), (64, 64, 3, 3), 1)
    specs = [lower(a, AVX512) for a in asts]
    assert len(specs) == 4
    (copy,) = [s for s in specs if not any(n.op is Ops.REDUCE for n in s.ast.toposort())]
    assert max(g.size for g in copy.globals if g.written) == 8 * 64 * 58 * 58
    (dw,) = [s for s in specs if s.name.startswith("r_64_64_3_3")]
    assert not _gated(dw)
    assert "pg_gload" not in open_device("CPU").render(lower(asts[specs.index(dw)], open_device("CPU").capabilities))
    assert len(_step_kernels((2, 8, 16, 16), (8, 8, 3, 3), 1)) == 3
    assert len(_step_kernels((8, 256, 56, 56), (256, 1, 3, 3), 1, groups=256)) == 3


def test_weight_gradient_tile_unrolls_the_kernel_columns():
    """The weight gradient's dot tile holds the 3 kernel columns whole (the input read at w + kw: the three
    vectors share cache lines, the output gradient's vector serves all three) beside 4 x 2 channels: 24
    accumulators. A 7-wide kernel's columns are too many to unroll: its tile stays 4 x 4 channels."""
    def dw_opts(k, pad):
        asts = _step_kernels((8, 64, 56, 56), (64, 64, k, k), pad)
        spec = next(s for s in map(lambda a: lower(a, AVX512), asts) if s.name.startswith(f"r_64_64_{k}_{k}"))
        return [(o.kind, o.amount) for o in spec.opts if o.kind is not OptKind.THREAD]
    up, split = OptKind.UPCAST, OptKind.SPLIT_REDUCE
    assert dw_opts(3, 1) == [(up, 4), (up, 2), (up, 3), (split, 8)]
    assert dw_opts(7, 3) == [(up, 4), (up, 4), (split, 8)]


CASES = [  # (x shape, w shape, conv2d keywords)
    ((2, 6, 13, 11), (8, 6, 3, 3), dict(padding=1)),
    ((2, 6, 13, 11), (8, 6, 3, 3), dict(padding=0)),
    ((2, 6, 13, 11), (8, 6, 3, 3), dict(padding=2, dilation=2)),
    ((2, 6, 13, 11), (8, 6, 3, 3), dict(padding=(1, 2, 0, 1))),
    ((2, 6, 13, 11), (8, 6, 3, 3), dict(stride=2, padding=1)),
    ((2, 6, 13, 11), (8, 3, 3, 3), dict(padding=1, groups=2)),
    ((2, 6, 13, 11), (8, 6, 1, 1), dict(padding=1)),
    ((1, 4, 17, 15), (5, 4, 7, 7), dict(padding=3)),
    ((2, 6, 16, 16), (8, 6, 3, 3), dict(padding=1)),  # weight gradients tiled with the kernel columns
    ((2, 8, 24, 24), (8, 8, 3, 3), dict(padding=1)),
]


@pytest.mark.parametrize("device", HOSTS)
@pytest.mark.parametrize("case,copy", [(i, True) for i in range(len(CASES))] + [(len(CASES) - 1, False)])
def test_conv_forward_and_gradients_equal_torch(device, case, copy, monkeypatch):
    """Forward, input and weight gradients equal torch's at odd sizes, strides, paddings (asymmetric too),
    dilation and groups, with the weight gradient reading a padded copy (its size threshold set to 0),
    and for the last case also reading the padded view (gated loads in the kernel-column tile)."""
    monkeypatch.setattr(tensor_nn, "WEIGHT_GRAD_PAD_COPY_MIN_WORK", 0 if copy else 1 << 60)
    x_shape, w_shape, kw = CASES[case]
    rng = np.random.default_rng(case)
    xn = rng.standard_normal(x_shape).astype(np.float32)
    wn = (rng.standard_normal(w_shape) * 0.3).astype(np.float32)
    pad = kw.get("padding", 0)
    tkw = dict(kw, padding=pad if isinstance(pad, int) else 0)
    xt = torch.tensor(xn, requires_grad=True)
    xpt = xt if isinstance(pad, int) else torch.nn.functional.pad(xt, pad)
    wt = torch.tensor(wn, requires_grad=True)
    ref = torch.nn.functional.conv2d(xpt, wt, **tkw)
    gn = rng.standard_normal(ref.shape).astype(np.float32)
    ref.backward(torch.tensor(gn))
    x = Tensor(xn, device=device, requires_grad=True)
    w = Tensor(wn, device=device, requires_grad=True)
    out = x.conv2d(w, **kw)
    (out * Tensor(gn, device=device)).sum().backward()
    for got, want in ((out, ref), (x.grad, xt.grad), (w.grad, wt.grad)):
        np.testing.assert_allclose(got.numpy(), want.detach().numpy(), rtol=1e-4, atol=1e-4)


def test_staged_conv_equals_torch_on_this_cpu():
    """A conv big enough for the heuristics to stage its weight and copy its padded input (48 x 48
    pixels, 32 -> 64 channels): the three results equal torch's on the machine at hand."""
    rng = np.random.default_rng(7)
    xn = rng.standard_normal((2, 32, 48, 48)).astype(np.float32)
    wn = (rng.standard_normal((64, 32, 3, 3)) * 0.1).astype(np.float32)
    x, w = Tensor(xn, device="CPU", requires_grad=True), Tensor(wn, device="CPU", requires_grad=True)
    out = x.conv2d(w, padding=1)
    caps = open_device("CPU").capabilities
    if caps.vector_width >= 8:
        fwd = lower(schedule([out.uop])[0].steps[0].ast, caps)
        assert OptKind.STAGE in [o.kind for o in fwd.opts], fwd.opts
    gn = rng.standard_normal(out.shape).astype(np.float32)
    (out * Tensor(gn, device="CPU")).sum().backward()
    xt, wt = torch.tensor(xn, requires_grad=True), torch.tensor(wn, requires_grad=True)
    ref = torch.nn.functional.conv2d(xt, wt, padding=1)
    ref.backward(torch.tensor(gn))
    for got, want in ((out, ref), (x.grad, xt.grad), (w.grad, wt.grad)):
        np.testing.assert_allclose(got.numpy(), want.detach().numpy(), rtol=1e-4, atol=1e-3)


def test_a_variable_batch_conv_trains_through_the_padded_copy():
    """A Model over a Variable batch whose conv is big enough (at the batch's bound) for the weight
    gradient's padded copy: the size test counts the bound (a symbolic size failed to compare), and a
    fit step at a smaller batch equals torch's SGD step."""
    from polygrad import Model, Variable, nn

    class Net:
        def __init__(self):
            self.c = nn.Conv2d(16, 16, 3, padding=1)

        def __call__(self, x):
            return {"y": self.c(x).relu().mean((2, 3))}

    Tensor.manual_seed(0)
    net = Net()
    w0, b0 = net.c.weight.numpy(), net.c.bias.numpy()
    batch = Variable("batch", 1, 8)
    assert 8 * 16 * 32 * 32 * 9 * 16 >= tensor_nn.WEIGHT_GRAD_PAD_COPY_MIN_WORK
    model = Model(net, inputs={"x": Tensor.empty(batch, 16, 32, 32)}, targets={"t": Tensor.empty(batch, 16)},
                  loss=lambda o, t: ((o["y"] - t) ** 2).mean())
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 16, 32, 32)).astype(np.float32)
    t = np.ones((3, 16), np.float32)
    try:
        loss = model.fit({"x": x, "t": t}, batch_size=3, optimizer="sgd", lr=0.1, verbose=False)[0]
        got = model.parameters()["c.weight"].numpy()
    finally:
        model.dispose()
    w = torch.tensor(w0, requires_grad=True)
    y = torch.nn.functional.conv2d(torch.tensor(x), w, torch.tensor(b0), padding=1).relu().mean((2, 3))
    ref = ((y - torch.tensor(t)) ** 2).mean()
    ref.backward()
    assert abs(loss - ref.item()) <= 1e-5 * abs(ref.item())
    step = (w - 0.1 * w.grad).detach().numpy() - w0
    np.testing.assert_allclose(got - w0, step, rtol=1e-3, atol=1e-4 * np.abs(step).max())


def _padded_conv_step_equals_torch(device, xn, wn, rng, atol: float) -> None:
    """Forward, input and weight gradients of a 3x3 conv (padding 1) on `device` equal torch's."""
    x, w = Tensor(xn, device=device, requires_grad=True), Tensor(wn, device=device, requires_grad=True)
    out = x.conv2d(w, padding=1)
    gn = rng.standard_normal(out.shape).astype(np.float32)
    (out * Tensor(gn, device=device)).sum().backward()
    xt, wt = torch.tensor(xn, requires_grad=True), torch.tensor(wn, requires_grad=True)
    ref = torch.nn.functional.conv2d(xt, wt, padding=1)
    ref.backward(torch.tensor(gn))
    for got, want in ((out, ref), (x.grad, xt.grad), (w.grad, wt.grad)):
        np.testing.assert_allclose(got.numpy(), want.detach().numpy(), rtol=1e-4, atol=atol)
