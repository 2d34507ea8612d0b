"""llama.cpp's block formats past Q8_0/Q4_0 (issue 30): Q4_1, Q5_0, Q5_1 and the K-quants Q4_K, Q5_K,
Q6_K, Q8_K, kept in their blocks and dequantized by the kernels that read them.

- Layout: blocks of random bytes (every bit of every scale, min and quant field; sane float scales)
  dequantize bit for bit as the `gguf` package's dequantizer reads them (Q8_K, which it lacks: ggml's
  struct read through a NumPy record dtype), on every backend, whole, by rows and by a row range; a matmul
  x @ W.T through them equals NumPy's on those values within float32 rounding, in one kernel that reads
  the uint8 blocks and no float copy of W.
- Quantizers: Q4_1/Q5_0/Q5_1 write the gguf package's bytes; the K-quants' round-to-nearest stays within
  the error its stored scales allow (derived in NumPy from the fields gguf decodes).
- Files: a tiny GPT-2 written by gguf's writer with every format in it (raw blocks for the K-quants)
  loads with the blocks kept (uint8 slots) and gives transformers' logits and greedy tokens on the file's
  values; a K-quant tensor with a bad size or offset is a CheckpointError before any weight is read.
- The mixed file's model and a module quantized by polygrad.quantize (Q5_1, Q4_K) save bundles that give
  the same outputs in Node (wasm and js).
"""
from __future__ import annotations

import struct

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

import hf_checkpoints as hc  # noqa: E402
from test_quantize import _hard_rows  # noqa: E402

import polygrad  # noqa: E402
from polygrad import Context, Model, Tensor, dtypes, nn  # noqa: E402
from polygrad.definitions.quant_formats import BY_NAME  # noqa: E402
from polygrad.nn.quant import QuantWeight, quantize_rows  # noqa: E402
from polygrad.uop.ops import Ops  # noqa: E402

SMALL = ("Q4_1", "Q5_0", "Q5_1")             # 32-weight blocks; the gguf package quantizes them
K_QUANTS = ("Q4_K", "Q5_K", "Q6_K", "Q8_K")  # 256-weight super-blocks
FORMATS = SMALL + K_QUANTS
HALF_SCALES = {"Q4_1": (0, 2), "Q5_0": (0,), "Q5_1": (0, 2), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,)}


def _random_blocks(fmt: str, rows: int, nblocks: int, seed: int = 0) -> np.ndarray:
    """(rows, nblocks, block_bytes) uint8: random bytes, with each float scale set to a random float16
    (or, for Q8_K, float32) of either sign so no value is inf or nan."""
    f = BY_NAME[fmt]
    rng = np.random.default_rng(seed)
    blocks = rng.integers(0, 256, (rows, nblocks, f.block_bytes), dtype=np.uint8)
    for at in HALF_SCALES.get(fmt, ()):
        scale = rng.uniform(-0.1, 0.1, (rows, nblocks)).astype(np.float16)
        blocks[..., at:at + 2] = scale.view(np.uint8).reshape(rows, nblocks, 2)
    if fmt == "Q8_K":
        scale = rng.uniform(-0.1, 0.1, (rows, nblocks)).astype(np.float32)
        blocks[..., 0:4] = scale.view(np.uint8).reshape(rows, nblocks, 4)
    return blocks


def _reference(blocks: np.ndarray, fmt: str) -> np.ndarray:
    rows = blocks.shape[0]
    return hc.reference_dequantize(blocks.reshape(rows, -1), fmt).reshape(rows, -1)


# ---------------------------------------------------------------- layout and kernels
@pytest.mark.parametrize("fmt", FORMATS)
def test_dequantize_equals_the_reference_bit_for_bit(device, fmt):
    blocks = _random_blocks(fmt, 6, 2)
    hc.assert_reads_bit_exact(blocks, fmt, _reference(blocks, fmt), device, np.array([[3, 0], [5, 1]], np.int32))


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("rows", [1, 5])
def test_fused_matmul_matches_numpy(device, fmt, rows):
    """QuantWeight.matmul_t (x @ W.T summed over blocks and their groups) against NumPy in float64 on the
    reference values: within the float32 summation bound n * 2**-24 * sum|x w|."""
    blocks = _random_blocks(fmt, 8, 2, seed=rows)
    w = _reference(blocks, fmt)
    x = np.random.default_rng(9).standard_normal((rows, w.shape[1])).astype(np.float32)
    got = QuantWeight(Tensor(blocks, device=device), fmt, w.shape).matmul_t(Tensor(x, device=device)).numpy()
    want = x.astype(np.float64) @ w.T.astype(np.float64)
    bound = w.shape[1] * 2.0 ** -24 * (np.abs(x) @ np.abs(w).T)
    assert np.all(np.abs(got - want) <= bound), float(np.max(np.abs(got - want) - bound))


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("rows", [1, 5])
def test_matmul_is_one_kernel_reading_the_blocks(fmt, rows):
    """One kernel, reading the uint8 blocks; no buffer of it holds a weight's worth of floats."""
    blocks = _random_blocks(fmt, 16, 2)
    qw = QuantWeight(Tensor(blocks).realize(), fmt, (16, 2 * BY_NAME[fmt].block))
    x = Tensor(np.ones((rows, qw.shape[1]), np.float32)).realize()
    with hc.RecordedKernels() as k:
        qw.matmul_t(x).realize()
    assert len(k.asts) == 1, [a.arg for a in k.asts]
    bufs = {(u.dtype, int(np.prod(u.arg[1]))) for u in k.asts[0].toposort() if u.op is Ops.DEFINE_GLOBAL}
    assert (dtypes.uint8, blocks.size) in bufs
    assert all(not dt.is_float or n < 16 * qw.shape[1] for dt, n in bufs), bufs


@pytest.mark.parametrize("fmt", ("Q8_0", "Q4_0") + FORMATS)
def test_decode_matvec_at_odd_sizes_matches_gguf(fmt):
    """One row of x against 7 rows of 3 blocks (the decode kernel's shape, no size a power of two): the
    fused kernel within the float32 summation bound of x @ W.T on the gguf package's dequantized values (the
    float path, POLY_INT8_DOT=0: Q8_0's 8-bit activations are tests/test_int8_dot.py's)."""
    blocks = _random_blocks(fmt, 7, 3, seed=3) if fmt in FORMATS else _gguf_blocks(fmt, 7, 3)
    w = _reference(blocks, fmt)
    x = np.random.default_rng(4).standard_normal((1, w.shape[1])).astype(np.float32)
    with Context(POLY_INT8_DOT=0):
        got = QuantWeight(Tensor(blocks), fmt, w.shape).matmul_t(Tensor(x)).numpy()
    want = x.astype(np.float64) @ w.T.astype(np.float64)
    bound = w.shape[1] * 2.0 ** -24 * (np.abs(x) @ np.abs(w).T)
    assert np.all(np.abs(got - want) <= bound), float(np.max(np.abs(got - want) - bound))


def _gguf_blocks(fmt: str, rows: int, nblocks: int) -> np.ndarray:
    """(rows, nblocks, block_bytes) uint8 blocks the gguf package's quantizer writes for random weights."""
    w = np.random.default_rng(5).standard_normal((rows, nblocks * 32)).astype(np.float32)
    return gguf.quants.quantize(w, getattr(gguf.GGMLQuantizationType, fmt)).reshape(rows, nblocks, -1)


def test_q8_k_floats_for_the_dequantize_at_load_path():
    """load_hf(dtype="float32") decodes Q8_K (which the gguf package cannot) with polygrad_hf.quant.q8_k_floats."""
    from polygrad_hf.quant import q8_k_floats
    blocks = _random_blocks("Q8_K", 3, 2).reshape(3, -1)
    got, want = q8_k_floats(blocks), hc.reference_dequantize(blocks, "Q8_K")
    assert got.shape == (3, 512)
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


# ---------------------------------------------------------------- quantizers
@pytest.mark.parametrize("fmt", SMALL)
def test_small_blocks_are_byte_identical_to_gguf(fmt):
    for seed in range(3):
        w = _hard_rows(seed)
        want = gguf.quants.quantize(w, getattr(gguf.GGMLQuantizationType, fmt))
        np.testing.assert_array_equal(quantize_rows(w, fmt).reshape(want.shape), want)


def _k_bound(blocks: np.ndarray, fmt: str, w: np.ndarray) -> np.ndarray:
    """The largest error round-to-nearest may leave per weight, from the stored fields (as gguf reads
    them): half the sub-block's step, plus how far the rounded 6-bit (int8) scales move the levels' ends
    from the ideal ones (half a unit of d per step, times the levels' count, and half a unit of dmin)."""
    if fmt == "Q8_K":
        d = blocks[:, :4].copy().view(np.float32)
        return np.repeat(0.5 * d, 256, axis=1)
    if fmt == "Q6_K":
        d = blocks[:, 208:210].copy().view(np.float16).astype(np.float32)
        sc = blocks[:, 192:208].view(np.int8).astype(np.float32)
        return np.repeat(0.5 * d * sc + 15.5 * d, 16, axis=1)
    d = blocks[:, 0:2].copy().view(np.float16).astype(np.float32)
    dmin = blocks[:, 2:4].copy().view(np.float16).astype(np.float32)
    sc, m = gguf.quants.Q4_K.get_scale_min(blocks[:, 4:16])
    levels = 16 if fmt == "Q4_K" else 32
    return np.repeat(0.5 * d * sc + 0.5 * dmin + (levels - 1) / 2 * d, 32, axis=1)


@pytest.mark.parametrize("fmt", K_QUANTS)
def test_k_quantizer_stays_within_its_levels(fmt):
    """Round to nearest: every weight within _k_bound of its value; all-zero super-blocks exact; the blocks
    decode (gguf) to a relative RMS error below the format's (measured 0.08 / 0.04 / 0.02 / 0.007 on a
    normal row: 4, 5, 6, 8 bits)."""
    rng = np.random.default_rng(1)
    w = (rng.standard_normal((8, 512)) * np.exp(rng.uniform(-8, 8, (8, 1)))).astype(np.float32)
    w[0, :256] = 0.0
    w[1, :256] = 2.5
    w[2] = np.abs(w[2])   # no negative weight: min 0
    w[3] = -np.abs(w[3])  # no positive weight
    blocks = quantize_rows(w, fmt)
    assert blocks.dtype == np.uint8 and blocks.shape == (8, 2, BY_NAME[fmt].block_bytes)
    flat = blocks.reshape(8 * 2, -1)
    back = hc.reference_dequantize(flat, fmt).reshape(w.shape)
    bound = _k_bound(flat, fmt, w).reshape(w.shape) + 1e-6 * np.abs(w).max(axis=1, keepdims=True)
    assert np.all(np.abs(back - w) <= bound), float(np.max(np.abs(back - w) - bound))
    assert np.all(back[0, :256] == 0)
    rms = np.sqrt(((back - w) ** 2).mean(axis=1) / (w ** 2).mean(axis=1))[4:]
    assert rms.max() < {"Q4_K": 0.1, "Q5_K": 0.05, "Q6_K": 0.025, "Q8_K": 0.01}[fmt], rms


# ---------------------------------------------------------------- GGUF files
# a two-layer GPT-2, 256 wide, with every format in one file (llama.cpp's Q4_K_M files mix types too)
MIXED = {"transformer.wte.weight": "Q4_1", "transformer.wpe.weight": "Q5_0",
         "transformer.h.0.attn.c_attn.weight": "Q4_K", "transformer.h.0.attn.c_proj.weight": "Q5_K",
         "transformer.h.0.mlp.c_fc.weight": "Q6_K", "transformer.h.0.mlp.c_proj.weight": "Q8_K",
         "transformer.h.1.attn.c_attn.weight": "Q5_1", "transformer.h.1.attn.c_proj.weight": "Q4_K",
         "transformer.h.1.mlp.c_fc.weight": "Q5_K", "transformer.h.1.mlp.c_proj.weight": "Q6_K"}
GGUF_NAMES = {"Q4_K": "blk.0.attn_qkv.weight", "Q5_K": "blk.0.attn_output.weight", "Q6_K": "blk.0.ffn_up.weight",
              "Q8_K": "blk.0.ffn_down.weight"}


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    """(path, the transformers model, the same model on the file's dequantized weights)."""
    import copy

    import torch
    path = tmp_path_factory.mktemp("formats") / "gpt2-mixed.gguf"
    ref = hc.hf_model("gpt2", n_embd=256, n_layer=2)
    held = hc.write_gguf(ref, path, MIXED)
    on_file = copy.deepcopy(ref)
    with torch.no_grad():
        for name, p in on_file.named_parameters():
            if name in held:
                p.copy_(torch.from_numpy(np.ascontiguousarray(held[name])))
    return str(path), ref, on_file


def test_gguf_file_of_every_format_keeps_the_blocks(mixed, tmp_path):
    """Every matrix stays uint8 blocks (types as written: the gguf reader's), and the logits and greedy tokens
    are transformers' on the file's values (gguf's dequantization; 1e-5 of the largest logit), in Python and
    from the saved bundle in Node."""
    from polygrad.hf import generate, load_hf
    path, _, on_file = mixed
    reader = gguf.GGUFReader(path)
    assert {t.tensor_type.name for t in reader.tensors if len(t.shape) == 2} == set(FORMATS)
    del reader
    model = load_hf(path, max_seq_len=16)
    try:
        assert any("kept 10 weights quantized" in n for n in model.hf_notes), model.hf_notes
        matrices = [s for s in model._p.slots if s.name.endswith("weight") and "ln_" not in s.name]
        assert len(matrices) == 10 and {s.dtype for s in matrices} == {dtypes.uint8}, matrices
        ids = np.random.default_rng(1).integers(0, hc.VOCAB, (1, 5)).astype(np.int32)
        got, want = model.forward(input_ids=ids)["logits"].numpy(), hc.logits(on_file, ids)
        assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()
        assert generate(model, ids, max_new_tokens=4, top_k=1).tolist() == hc.greedy(on_file, ids, 4).tolist()
        data = model.save()
    finally:
        model.dispose()
    from test_js import forward_in_node
    for out in forward_in_node(data, {"input_ids": ids}, tmp_path).values():
        assert np.abs(out["logits"] - want).max() <= 1e-5 * np.abs(want).max()


def _patched(path, out, name: str, part: int, value: int, extra: int = 0):
    """`path` with the little-endian uint64 in tensor `name`'s info record, field `part` (3: dimensions,
    5: data offset), at `extra` bytes into that field, set to `value`."""
    reader = gguf.GGUFReader(path)
    t = next(t for t in reader.tensors if t.name == name)
    at = t.field.offset + sum(int(p.nbytes) for p in t.field.parts[:part]) + extra
    del reader
    data = bytearray(open(path, "rb").read())
    data[at:at + 8] = struct.pack("<Q", value)
    out.write_bytes(bytes(data))
    return out


@pytest.mark.parametrize("fmt", K_QUANTS)
def test_bad_k_quant_tensors_fail_before_any_weight_is_read(mixed, fmt, tmp_path, monkeypatch):
    """Rows that are not whole super-blocks, more rows than the data holds, an offset past the data: each
    a CheckpointError naming the file, before any tensor is read or dequantized."""
    from polygrad.hf import CheckpointError, load_hf
    from polygrad_hf import gguf_file
    reads = []
    monkeypatch.setattr(gguf_file, "_dequantize", lambda *a: reads.append(a))
    monkeypatch.setattr(gguf_file, "check_blocks", lambda *a: reads.append(a))
    path, name = mixed[0], GGUF_NAMES[fmt]
    rows = _patched(path, tmp_path / "rows.gguf", name, 3, 288)  # ne[0]: not whole 256-value blocks
    with pytest.raises(CheckpointError, match=rf"rows\.gguf: tensor '{name}' is {fmt} with rows of 288 values"):
        load_hf(rows)
    for case, value, extra, part in (("tall", 2 ** 20, 8, 3), ("late", 2 ** 40, 0, 5), ("wrapped", 2 ** 64 - 64, 0, 5)):
        bad = _patched(path, tmp_path / f"{case}.gguf", name, part, value, extra)
        with pytest.raises(CheckpointError, match=rf"{case}\.gguf: (tensor '{name}' needs bytes|not a readable GGUF)"):
            load_hf(bad)
    assert reads == []


# ---------------------------------------------------------------- bundles in Node
class _Net:
    def __init__(self, width: int):
        self.embed = nn.Embedding(61, width)
        self.fc = nn.Linear(width, width)

    def __call__(self, ids):
        return {"out": self.fc(self.embed(ids)).relu()}


@pytest.mark.parametrize("fmt", ["Q5_1", "Q4_K"])
def test_quantized_module_bundle_runs_in_node(fmt, tmp_path):
    from test_js import forward_in_node
    Tensor.manual_seed(5)
    net = _Net(BY_NAME[fmt].block * (1 if fmt in K_QUANTS else 2))
    table, weight, bias = net.embed.weight.numpy(), net.fc.weight.numpy(), net.fc.bias.numpy()
    polygrad.quantize(net, fmt.lower())
    ids = np.array([[1, 60, 7]], np.int32)

    def deq(a):
        return hc.reference_dequantize(hc.quantize_blocks(a, fmt), fmt).astype(np.float64)
    want = np.maximum(deq(table)[ids] @ deq(weight).T + bias, 0)
    model = Model(net, inputs={"ids": Tensor.empty(1, 3, dtype=dtypes.int32)})
    try:
        got = model.forward(ids=ids)["out"].numpy()
        assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()
        data = model.save()
    finally:
        model.dispose()
    for out in forward_in_node(data, {"ids": ids}, tmp_path).values():
        assert np.abs(out["out"] - want).max() <= 1e-5 * np.abs(want).max()
