"""Register tiles for window reductions and short conv maps (issue 34, conv nets' speed).

Depthwise convolutions and poolings (codegen/window_opts.py) get vector lanes along the output row, padded
where the lanes do not divide it, and rows along the channels; a matmul-like tile over a map nothing even
divides (7 x 7) gets an odd row count; a deep one (3x3 over 256 channels at 14 x 14) a whole row of pixels
per column vector. The CPU renderer reads such rows with AVX-512 masked loads, stores and gathers. The
guards check the structure (no timings); the values are checked against torch at odd sizes on CPU, X86 and
INTERP, on this machine's capabilities and on forced AVX2-like ones.
"""
import dataclasses
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from polygrad import Device, Tensor
from polygrad.backend_api import Capabilities
from polygrad.codegen.lower import lower
from polygrad.codegen.opts import Opt, OptKind
from polygrad.device import open_device
from polygrad.renderer.linearize import L, linearize
from polygrad.schedule.template import schedule

torch = pytest.importorskip("torch")

AVX512 = Capabilities(threads=2, vector_width=16, registers=32, fma=True, stage_bytes=512 * 1024, tile_vectors=4,
                      fma_units=1, fma_latency=4, l1_bytes=32 * 1024)
AVX2 = Capabilities(threads=2, vector_width=8, registers=16, fma=True, fma_units=2, fma_latency=4,
                    l1_bytes=32 * 1024)
STRIDED = dataclasses.replace(AVX512, strided_lanes=True, masked_vectors=True)  # the CPU backend's AVX-512 declaration
DEVICES = ["CPU", "INTERP"] + (["X86"] if Device.available("X86") else [])
UP, PAD = OptKind.UPCAST, OptKind.PADTO


def _spec(t: Tensor, caps: Capabilities):
    """The last kernel of t's schedule, lowered for caps."""
    asts = [s.ast for s in schedule([t.uop])[0].steps if s.kind == "kernel"]
    return lower(asts[-1], caps)


def _tile(spec) -> list[tuple[OptKind, int]]:
    return [(o.kind, o.amount) for o in spec.opts if o.kind is not OptKind.THREAD]


def _depthwise(c: int, size: int, stride: int = 1, k: int = 3) -> Tensor:
    x = Tensor.empty(1, c, size, size)
    return x.conv2d(Tensor.empty(c, 1, k, k), Tensor.empty(c), groups=c, stride=stride, padding=k // 2).relu()


def test_depthwise_conv_rows_are_vectors_padded_to_the_lanes():
    """A 14-pixel row gets one 16-lane vector (PADTO 16) and 4 channels as rows; a 7-pixel row 8 lanes, not
    16; on an 8-lane device the 14 pixels are two vectors. Before, the tile's vectors went along the
    channels, each lane a plane (196 floats) apart, or the kernel had no tile at all."""
    assert _tile(_spec(_depthwise(24, 14), AVX512)) == [(UP, 4), (PAD, 16), (UP, 16)]
    assert _tile(_spec(_depthwise(24, 7), AVX512)) == [(UP, 4), (PAD, 8), (UP, 8)]
    assert _tile(_spec(_depthwise(24, 14), AVX2)) == [(UP, 8), (PAD, 8), (UP, 8)]
    assert _tile(_spec(_depthwise(24, 56), AVX512)) == [(UP, 4), (PAD, 16), (UP, 16)]
    assert _tile(_spec(_depthwise(24, 112), AVX512)) == [(UP, 4), (UP, 16)]  # 16 divides: no padding
    spec = _spec(_depthwise(24, 14), AVX512)
    loads = [x for x in linearize(spec, vector_width=16).insts if x.op is L.LOAD and x.lanes == 16]
    assert loads and all(x.arg == "contiguous" for x in loads)  # the input row, read as one masked vector


def test_poolings_are_windows_and_matmuls_are_not():
    """Stride-1 max and average pooling get the same tile (no opts at all before); a one-row matmul over a
    short reduction (its weight read 64 apart per output) is not a window."""
    assert _tile(_spec(Tensor.empty(1, 64, 112, 112).max_pool2d(3, 1, padding=1), AVX512)) == [(UP, 4), (UP, 16)]
    assert _tile(_spec(Tensor.empty(1, 12, 28, 28).avg_pool2d(3, 1, padding=1), AVX512)) == \
        [(UP, 4), (PAD, 16), (UP, 16)]
    matmul = _spec(Tensor.empty(1, 64) @ Tensor.empty(64, 51 * 64).reshape(64, 51, 64)[:, :, 0], AVX512)
    assert PAD not in [k for k, _ in _tile(matmul)]


def test_a_seven_pixel_map_gets_seven_rows():
    """A 1x1 conv at 7 x 7 (weight contiguous along the output channels, as imported ONNX weights are):
    7 pixels x 16 channels (one vector, so 7 rows fit the registers), where no even row count divides and
    the tile was one row of 64 channels (2.6x slower)."""
    out = Tensor.empty(1, 40, 7, 7).conv2d(Tensor.empty(40, 1, 1, 48).permute(3, 0, 1, 2))
    assert _tile(_spec(out, AVX512)) == [(UP, 7), (UP, 16)]


def test_a_deep_conv_at_fourteen_pixels_gets_a_whole_row_per_vector():
    """3x3 over 256 channels: each 16-channel column panel (2304 x 64 bytes) is far bigger than the L1, so
    a row of 14 pixels shares each weight vector (2 pixels x 64 channels before, 1.8x slower); a shallow
    one whose panel fits the L1 keeps the 2 x 64 tile."""
    deep = Tensor.empty(1, 256, 14, 14).conv2d(Tensor.empty(256, 3, 3, 256).permute(3, 0, 1, 2), padding=1)
    assert _tile(_spec(deep, AVX512)) == [(UP, 14), (UP, 16)]
    shallow = Tensor.empty(1, 96, 14, 14).conv2d(Tensor.empty(96, 1, 1, 576).permute(3, 0, 1, 2))
    assert _tile(_spec(shallow, AVX512)) == [(UP, 2), (UP, 64)]


def _pointwise(cin: int, cout: int, size: int) -> Tensor:
    """A 1x1 conv with its weight stored output-channels-last, as polygrad.onnx keeps it."""
    return Tensor.empty(1, cin, size, size).conv2d(Tensor.empty(cin, 1, 1, cout).permute(3, 0, 1, 2))


def test_a_shallow_pointwise_conv_pads_its_pixel_row_to_full_vectors():
    """On a device with masked moves (the CPU backend on AVX-512, X86), a 1x1 conv over few input channels
    takes its columns from the pixel row padded to full 16-lane vectors (the padding at most 1/8 of the
    lanes), its output channels as rows, so its stores are contiguous (masked) moves. Before, 32 -> 192
    channels at 28 x 28 took 64 output channels as columns and scattered every accumulator to 16 planes
    (1.28x slower), 24 -> 144 at 56 x 56 had 8-lane vectors (1.44x slower; MobileNetV2, one thread, Zen 4).
    A deep projection (384 -> 96 at 14 x 14, its panel over the L1) keeps its tile of long rows; a 7-pixel
    row (9 of 16 lanes padding) and a device without masked moves keep theirs."""
    assert _tile(_spec(_pointwise(32, 192, 28), STRIDED)) == [(UP, 8), (PAD, 32), (UP, 32)]
    assert _tile(_spec(_pointwise(24, 144, 56), STRIDED)) == [(UP, 6), (PAD, 64), (UP, 64)]
    assert _tile(_spec(_pointwise(64, 384, 14), STRIDED)) == [(UP, 8), (PAD, 16), (UP, 16)]
    # 4 vectors' panel (144 x 64 floats) would pass the L1: 2 vectors (1.12x faster than 8-lane vectors)
    assert _tile(_spec(_pointwise(144, 24, 56), STRIDED)) == [(UP, 8), (PAD, 64), (UP, 32)]
    masked = dataclasses.replace(AVX512, masked_lanes=True, masked_vectors=True, tile_vectors=2,
                                 stage_bytes=0)  # X86's declaration
    # strided lanes alone (without the masked moves' declaration) do not pad
    unmasked = dataclasses.replace(STRIDED, masked_vectors=False)
    assert PAD not in [k for k, _ in _tile(_spec(_pointwise(32, 192, 28), unmasked))]
    assert _tile(_spec(_pointwise(32, 192, 28), masked)) == [(UP, 8), (PAD, 32), (UP, 32)]
    assert _tile(_spec(_pointwise(384, 96, 14), STRIDED)) == [(UP, 14), (UP, 16)]
    assert _tile(_spec(_pointwise(160, 960, 7), STRIDED)) == [(UP, 7), (UP, 32)]
    assert PAD not in [k for k, _ in _tile(_spec(_pointwise(32, 192, 28), AVX512))]
    stores = [x for x in linearize(_spec(_pointwise(32, 192, 28), STRIDED), vector_width=16).insts
              if x.op is L.STORE]
    assert stores and all(x.lanes == 16 for x in stores)  # one vector per row of the tile, no scatter


def test_a_tile_that_takes_every_channel_still_splits_over_threads():
    """A 1x1 conv to 32 channels at 28 x 28 (MobileNetV2's) tiles all 32 channels, leaving a channel range
    of one point outermost: the THREAD split goes to the pixel rows inside it. Before, such kernels (and
    the stem's 3x3 conv to 32 channels) ran on one thread."""
    out = Tensor.empty(1, 192, 28, 28).conv2d(Tensor.empty(192, 1, 1, 32).permute(3, 0, 1, 2))
    spec = _spec(out, AVX512)
    assert _tile(spec) == [(UP, 4), (UP, 32)]
    assert [(o.kind, o.amount) for o in spec.opts if o.kind is OptKind.THREAD] == [(OptKind.THREAD, 2)]


def test_a_few_channel_tiles_split_over_threads_by_rows():
    """A 1x1 conv from 144 to 24 channels at 56 x 56 has 3 tiles of 8 channels outermost: 2 threads would
    split them 2 to 1 (the busy one with 4/3 of an even share), so the split goes to the 56 pixel rows
    inside (axis 1). 40 channels (5 tiles) at 7 x 7 has no even range inside and keeps the tiles' split.
    (A code generator of 2-vector tiles: with 4, its 8-lane tile takes 12 rows, 2 tiles, HALF_VECTOR_ROWS.)"""
    out = Tensor.empty(1, 144, 56, 56).conv2d(Tensor.empty(144, 1, 1, 24).permute(3, 0, 1, 2))
    two = dataclasses.replace(AVX512, tile_vectors=2)
    threads = [(o.kind, o.axis, o.amount) for o in _spec(out, two).opts if o.kind is OptKind.THREAD]
    assert threads == [(OptKind.THREAD, 1, 2)]
    out = Tensor.empty(1, 576, 7, 7).conv2d(Tensor.empty(576, 1, 1, 160).permute(3, 0, 1, 2))
    spec = _spec(out, AVX512)
    assert _tile(spec) == [(UP, 7), (UP, 32)]
    assert [o.axis for o in spec.opts if o.kind is OptKind.THREAD] == [6]  # the tiles' outer range


def test_cpu_source_uses_masked_moves_and_gathers():
    """The CPU renderer's 16-lane gated loads and stores are AVX-512 masked moves (with the lane-by-lane
    code kept for other targets), 16 lanes read 2 apart are two masked loads and a shuffle, and 16 lanes
    read 3 apart are one gather."""
    if not Device.available("CPU"):
        pytest.skip("no CPU backend")
    dev = open_device("CPU")
    src = dev.render(_spec(_depthwise(24, 14), AVX512))
    assert "__builtin_ia32_loadups512_mask" in src and "__builtin_ia32_storeups512_mask" in src
    assert "pg_gstore_f32x16(data0" in src
    tile = [Opt(OptKind.UPCAST, 0, 4), Opt(OptKind.UPCAST, 2, 16)]
    asts = [s.ast for s in schedule([_depthwise(24, 64, stride=2).uop])[0].steps if s.kind == "kernel"]
    strided = dev.render(lower(asts[-1], AVX512, tile))
    assert "pg_sload_f32x16(data1" in strided and "__builtin_shufflevector(lo, hi, 0, 2, 4" in strided
    assert "pg_gather_f32x16" not in strided
    asts = [s.ast for s in schedule([_depthwise(24, 96, stride=3).uop])[0].steps if s.kind == "kernel"]
    gathered = dev.render(lower(asts[-1], AVX512, tile))
    assert "pg_gather_f32x16(data1" in gathered and "__builtin_ia32_gathersiv16sf" in gathered


def test_strided_windows_keep_their_loops():
    """A stride-2 depthwise conv or max pool is a window whose lanes would be gathers on a device without
    `strided_lanes` (X86, AVX2): it gets no tile (the plain loop ran 2.7x faster than 16 gathered lanes x 4
    channels, and 6x faster than the outer-product tile it had before: 8 rows x 8 gathered lanes)."""
    assert _tile(_spec(_depthwise(24, 112, stride=2), AVX512)) == []
    assert _tile(_spec(Tensor.empty(1, 64, 112, 112).max_pool2d(3, 2, padding=1), AVX512)) == []
    assert _tile(_spec(_depthwise(24, 112, stride=3), STRIDED)) == []  # 3 apart: gathers everywhere


def test_stride_two_windows_get_lanes_on_contiguous_loads():
    """With `strided_lanes` (the CPU backend on AVX-512), a stride-2 depthwise conv or max pool gets the
    window tile with 8 channel rows (they share each load's lane-mask arithmetic), its input row read as
    "strided" lanes (two contiguous loads and a shuffle), not gathers: MobileNetV2's 96-channel 112 -> 56
    depthwise conv ran 1.8x faster than its loop, the 576-channel 14 -> 7 one 3.8x (one thread, Zen 4)."""
    assert _tile(_spec(_depthwise(96, 112, stride=2), STRIDED)) == [(UP, 8), (PAD, 16), (UP, 16)]
    assert _tile(_spec(_depthwise(576, 14, stride=2), STRIDED)) == [(UP, 8), (PAD, 8), (UP, 8)]
    assert _tile(_spec(Tensor.empty(1, 64, 112, 112).max_pool2d(3, 2, padding=1), STRIDED)) == \
        [(UP, 8), (PAD, 16), (UP, 16)]
    prog = linearize(_spec(_depthwise(96, 112, stride=2), STRIDED), vector_width=16, strided=True)
    loads = [x for x in prog.insts if x.op is L.LOAD and x.lanes == 16]
    assert loads and all(x.arg == "strided" for x in loads)
    gathered = linearize(_spec(_depthwise(96, 112, stride=2), STRIDED), vector_width=16)  # an emitter without
    assert {x.arg for x in gathered.insts if x.op is L.LOAD and x.lanes == 16} == {"gather"}


CASES = [  # (x shape, w shape, conv2d keywords)
    ((1, 12, 14, 14), (12, 1, 3, 3), dict(padding=1, groups=12)),
    ((2, 10, 13, 11), (10, 1, 3, 3), dict(padding=1, groups=10, stride=2)),
    ((1, 6, 7, 7), (6, 1, 5, 5), dict(padding=2, groups=6)),
    ((1, 18, 9, 23), (18, 1, 3, 3), dict(padding=1, groups=18)),
    ((1, 6, 12, 12), (12, 1, 3, 3), dict(padding=1, groups=6)),  # two output channels per group
    ((1, 5, 30, 33), (5, 1, 3, 3), dict(padding=(0, 1, 1, 0), groups=5)),
    ((1, 40, 7, 7), (48, 40, 1, 1), {}),
    ((1, 48, 14, 14), (16, 48, 3, 3), dict(padding=1)),
    ((1, 9, 21, 45), (9, 1, 3, 3), dict(padding=1, groups=9, stride=2)),  # 23 pixels: two 16-lane vectors
    ((1, 4, 5, 7), (4, 1, 3, 3), dict(padding=1, groups=4, stride=2)),  # 4 pixels: 4 lanes
    ((1, 6, 8, 64), (6, 1, 2, 2), dict(groups=6, stride=2)),  # no padding: lanes read to the buffer's end
    ((1, 8, 28, 28), (16, 8, 1, 1), {}),  # pointwise: the 28-pixel row padded to 2 vectors (masked moves)
    ((1, 6, 56, 56), (12, 6, 1, 1), {}),  # a 56-pixel row padded to 4 vectors
]


def _conv_case(device: str, case: int, grad: bool) -> None:
    x_shape, w_shape, kw = CASES[case]
    rng = np.random.default_rng(case)
    xn = rng.standard_normal(x_shape).astype(np.float32)
    wn = (rng.standard_normal(w_shape) * 0.3).astype(np.float32)
    bn = rng.standard_normal(w_shape[0]).astype(np.float32)
    pad = kw.get("padding", 0)
    xt = torch.tensor(xn, requires_grad=True)
    xpt = xt if isinstance(pad, int) else torch.nn.functional.pad(xt, pad)
    ref = torch.nn.functional.conv2d(xpt, torch.tensor(wn), torch.tensor(bn),
                                     **dict(kw, padding=pad if isinstance(pad, int) else 0)).clamp(0, 6)
    x = Tensor(xn, device=device, requires_grad=grad)
    # the weight as imported ONNX weights are laid out (output channels contiguous)
    w = Tensor(np.ascontiguousarray(wn.transpose(1, 2, 3, 0)), device=device).permute(3, 0, 1, 2)
    out = x.conv2d(w, Tensor(bn, device=device), **kw).clip(0, 6)
    np.testing.assert_allclose(out.numpy(), ref.detach().numpy(), rtol=1e-4, atol=1e-4)
    if grad:
        gn = rng.standard_normal(ref.shape).astype(np.float32)
        ref.backward(torch.tensor(gn))
        (out * Tensor(gn, device=device)).sum().backward()
        np.testing.assert_allclose(x.grad.numpy(), xt.grad.numpy(), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", range(len(CASES)))
def test_convs_equal_torch(device, case):
    """Forward (bias and ReLU6 fused) and input gradient equal torch's at odd sizes, strides, asymmetric
    padding, channel counts the lanes do not divide and a channel multiplier of 2."""
    _conv_case(device, case, grad=device != "INTERP")


@pytest.mark.parametrize("device", DEVICES)
def test_max_pool_equals_torch(device):
    xn = np.random.default_rng(9).standard_normal((2, 5, 15, 17)).astype(np.float32)
    got = Tensor(xn, device=device).max_pool2d(3, 2, padding=1).numpy()
    want = torch.nn.functional.max_pool2d(torch.tensor(xn), 3, 2, padding=1).numpy()
    np.testing.assert_array_equal(got, want)


def test_convs_equal_torch_with_avx2_like_tiles(tmp_path):
    """Cases 0, 1, 3 and 6 on the CPU backend of a process whose CPU is declared with 8 lanes and 16
    registers (POLY_CPU): AVX's masked moves, two vectors per 14-pixel row, whatever this machine's width."""
    if not Device.available("CPU"):
        pytest.skip("no CPU backend")
    script = ("import sys; sys.path.insert(0, %r)\n"
              "from polygrad.device import open_device\n"
              "import test_window_tiles as t\n"
              "assert open_device('CPU').capabilities.vector_width == 8\n"
              "for case in (0, 1, 3, 6):\n"
              "    t._conv_case('CPU', case, grad=False)\n") % os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, POLY_CPU=json.dumps({"vector_bits": 256, "vector_registers": 16}),
               POLY_CACHE_DIR=str(tmp_path))
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
