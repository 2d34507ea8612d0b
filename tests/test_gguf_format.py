"""polygrad-hf's GGUF reader (gguf_format.py, issue 30): against the gguf package's reader on files the
gguf package writes (every value type, arrays of strings, numbers and arrays, every tensor type
polygrad-hf keeps plus the plain ones); crafted bad files (truncated, lengths and counts past the end,
bad types, versions, duplicates, too many dimensions, sizes past 2**64) each a CheckpointError naming the
file; a GPT-2-sized vocabulary left undecoded while a model loads; a Q8_0 file loaded and run with the
gguf package blocked from importing.
"""
from __future__ import annotations

import json
import os
import struct
import subprocess
import sys

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

from polygrad.hf import CheckpointError  # noqa: E402
from polygrad_hf import gguf_format  # noqa: E402
from polygrad_hf.gguf_format import GGUFArray, GGUFFile  # noqa: E402

T = gguf.GGUFValueType
Q = gguf.GGMLQuantizationType

SCALARS = [("u8", 200, T.UINT8), ("i8", -100, T.INT8), ("u16", 60000, T.UINT16), ("i16", -30000, T.INT16),
           ("u32", 4_000_000_000, T.UINT32), ("i32", -2_000_000_000, T.INT32), ("f32", 0.1, T.FLOAT32),
           ("b", True, T.BOOL), ("s", "héllo", T.STRING), ("u64", 2**63 + 5, T.UINT64), ("i64", -(2**62), T.INT64),
           ("f64", 1e-300, T.FLOAT64)]
ARRAYS = {"strs": ["a", "", "bé ä", "x" * 300], "ints": [1, -2, 3], "floats": [0.5, -1.25],
          "bools": [True, False, True], "nested": [[1, 2], [3, 4, 5]], "strs_nested": [["a", "b"], ["c"]]}


def _write(path, tensors: dict, alignment: int | None = None) -> None:
    w = gguf.GGUFWriter(str(path), "test")
    if alignment:
        w.add_custom_alignment(alignment)
    for key, value, kind in SCALARS:
        w.add_key_value(f"test.{key}", value, kind)
    for key, value in ARRAYS.items():
        w.add_array(f"test.{key}", value)
    w.add_key_value("test.u8s", [1, 2, 255], T.ARRAY, sub_type=T.UINT8)
    for name, (data, qtype) in tensors.items():
        w.add_tensor(name, data, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _every_tensor_type() -> dict:
    from polygrad.nn.quant import quantize_rows
    rng = np.random.default_rng(0)
    w = rng.standard_normal((4, 512)).astype(np.float32)
    out = {"f32": (w, None), "f16": (w.astype(np.float16), None), "f64": (w.astype(np.float64), None),
           "i8": (np.arange(24, dtype=np.int8).reshape(2, 3, 4), None), "i16": (np.arange(6, dtype=np.int16), None),
           "i32": (np.arange(6, dtype=np.int32).reshape(1, 1, 2, 3), None), "i64": (np.arange(3, dtype=np.int64), None),
           "bf16": (gguf.quants.quantize(w, Q.BF16), Q.BF16), "scalar": (np.ones(1, np.float32), None)}
    for fmt in ("Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1"):
        out[fmt] = (gguf.quants.quantize(w, Q[fmt]), Q[fmt])
    for fmt in ("Q4_K", "Q5_K", "Q6_K", "Q8_K"):  # gguf cannot write the K-quants: polygrad's quantizer does
        out[fmt] = (quantize_rows(w, fmt).reshape(4, -1), Q[fmt])
    out["Q2_K"] = (rng.integers(0, 256, (3, 84), dtype=np.uint8), Q.Q2_K)  # a type read but not kept
    return out


@pytest.mark.parametrize("alignment", [None, 64])
def test_reads_what_the_gguf_reader_reads(tmp_path, alignment):
    path = tmp_path / "all.gguf"
    _write(path, _every_tensor_type(), alignment)
    ref, got = gguf.GGUFReader(str(path)), GGUFFile(str(path))
    assert got.version == 3 and got.alignment == ref.alignment and got.data_offset == ref.data_offset
    keys = [k for k in ref.fields if not k.startswith("GGUF.")]
    assert list(got.metadata) == keys
    for key in keys:
        mine, want = got.metadata[key], ref.fields[key].contents()
        if isinstance(mine, GGUFArray):
            mine = mine.decode()
            if key.endswith("nested"):  # the gguf package flattens nested arrays: compare with what was written
                assert [list(np.asarray(x).tolist()) for x in mine] == ARRAYS[key.split(".")[1]]
                mine = [v for x in mine for v in np.asarray(x).tolist()]
            mine = mine.tolist() if isinstance(mine, np.ndarray) else mine
        assert mine == want and type(mine) is type(want), key
    assert list(got.tensors) == [t.name for t in ref.tensors]
    for t in ref.tensors:
        mine = got.tensors[t.name]
        assert mine.dims == tuple(int(d) for d in t.shape), t.name
        assert mine.type.name == t.tensor_type.name and mine.nbytes == int(t.n_bytes), t.name
        assert got.data_offset + mine.offset == int(t.data_offset), t.name
        data = got.data(mine)
        assert not data.flags.writeable and not data.flags.owndata  # a view of the file's memory map
        assert data.tobytes() == np.asarray(t.data).tobytes(), t.name
        if mine.type.dtype is not None and mine.type.name != "BF16":
            np.testing.assert_array_equal(data, np.asarray(t.data).reshape(mine.shape))


def test_the_type_table_is_ggml_s():
    for type_id, kind in gguf_format.TENSOR_TYPES.items():
        assert Q(type_id).name == kind.name
        assert gguf.GGML_QUANT_SIZES[Q(type_id)] == (kind.block, kind.block_bytes), kind.name
    for type_id, (name, _) in gguf_format.VALUE_TYPES.items():
        assert T(type_id).name == name


# ------------------------------------------------------------------------------------- crafted files

def _s(text: str | bytes) -> bytes:
    raw = text.encode() if isinstance(text, str) else text
    return struct.pack("<Q", len(raw)) + raw


def _kv(key: str, kind: int, payload: bytes) -> bytes:
    return _s(key) + struct.pack("<I", kind) + payload


def _info(name: str, dims: tuple[int, ...], kind: int = 0, offset: int = 0) -> bytes:
    return _s(name) + struct.pack(f"<I{len(dims)}QIQ", len(dims), *dims, kind, offset)


def _file(kvs=(), infos=(), data=b"", version: int = 3, n_tensors=None, n_kv=None, align: int = 32) -> bytes:
    head = b"GGUF" + struct.pack("<IQQ", version, len(infos) if n_tensors is None else n_tensors,
                                 len(kvs) if n_kv is None else n_kv) + b"".join(kvs) + b"".join(infos)
    return head + bytes(-len(head) % align) + data


GOOD_KVS = (_kv("general.architecture", 8, _s("test")), _kv("a.list", 9, struct.pack("<IQ", 8, 2) + _s("x") + _s("yz")))
GOOD_INFOS = (_info("t.a", (4, 2)), _info("t.b", (8,), 0, 32))
STR_ARRAY = struct.pack("<IQ", 8, 2)


CRAFTED = [
    ("magic", b"GGML" + bytes(40), r"starts with b'GGML'"),
    ("v1", _file(version=1), r"version 1, expected one of \[2, 3\]"),
    ("v4", _file(version=4), "version 4"),
    ("big_endian", _file(version=3 << 24), "big-endian"),
    ("short", b"GGUF\x03\x00", "less than the 24-byte header"),
    ("kv_count", _file(GOOD_KVS, n_kv=2**62), r"4611686018427387904 metadata entries .* cannot fit"),
    ("tensor_count", _file(GOOD_KVS, n_tensors=2**40), "1099511627776 tensors cannot fit"),
    ("key_length", _file([struct.pack("<Q", 2**63) + b"k"]), r"metadata key 0 \(9223372036854775808 bytes"),
    ("value_type", _file([_kv("k.v", 13, b"\0" * 8)]), r"metadata key 'k\.v' has value type 13"),
    ("string_value", _file([_kv("k.s", 8, struct.pack("<Q", 2**64 - 1))]), r"the value of metadata key 'k\.s'"),
    ("not_utf8", _file([_kv("k.s", 8, _s(b"\xff\xfe"))]), "is not UTF-8"),
    ("element_type", _file([_kv("k.a", 9, struct.pack("<IQ", 99, 1) + b"\0" * 8)]), r"'k\.a' has element type 99"),
    ("array_count", _file([_kv("k.a", 9, struct.pack("<IQ", 4, 2**61))]), r"metadata array 'k\.a' of 2305843009"),
    ("string_count", _file([_kv("k.a", 9, STR_ARRAY + _s("x") + struct.pack("<Q", 50))]),
     r"'k\.a': its 2 strings run past the end"),
    ("nesting", _file([_kv("k.n", 9, struct.pack("<IQ", 9, 1) * 9 + struct.pack("<IQ", 4, 0))]), "more than 8 deep"),
    ("duplicate_key", _file([GOOD_KVS[0], GOOD_KVS[0]]), r"'general\.architecture' appears twice"),
    ("alignment", _file([_kv("general.alignment", 4, struct.pack("<I", 48))]), r"'general\.alignment' must be a "
                                                                                 "power of two, got 48"),
    ("alignment_type", _file([_kv("general.alignment", 8, _s("32"))]), "power of two, got '32'"),
    ("duplicate_tensor", _file(GOOD_KVS, [GOOD_INFOS[0], _info("t.a", (8,), 0, 32)], bytes(64)),
     r"tensor 't\.a' appears twice"),
    ("n_dims", _file(GOOD_KVS, [_info("t.a", (1, 1, 1, 1, 1))], bytes(32)), r"'t\.a' has 5 dimensions"),
    ("dims_truncated", _file(GOOD_KVS, [_s("t.a") + struct.pack("<I", 4)]), r"the dimensions of tensor 't\.a'"),
    ("bytes_wrap", _file(GOOD_KVS, [_info("t.a", (2**32, 2**31))], bytes(32)),
     r"'t\.a' of dimensions \[4294967296, 2147483648\] would take 36893488147419103232 bytes"),
    ("type", _file(GOOD_KVS, [_info("t.a", (4,), 4)], bytes(32)), r"'t\.a' has ggml type 4, which is not a known"),
    ("blocks", _file(GOOD_KVS, [_info("t.q", (40, 2), 8)], bytes(96)), r"'t\.q' is Q8_0 with rows of 40 values"),
    ("block_scalar", _file(GOOD_KVS, [_info("t.q", (), 8)], bytes(32)), r"'t\.q' is Q8_0 with rows of 1 values"),
    ("past_data", _file(GOOD_KVS, GOOD_INFOS, bytes(40)), r"'t\.b' needs bytes 32\.\.64 of the data section, which "
                                                          r"holds 40"),
    ("offset_wrap", _file(GOOD_KVS, [_info("t.a", (4,), 0, 2**64 - 16)], bytes(32)), r"needs bytes "
                                                                                     r"18446744073709551600\.\."),
    ("misaligned", _file(GOOD_KVS, [_info("t.a", (4,), 0, 8)], bytes(32)), "not a multiple of the file's alignment"),
    ("overlap", _file(GOOD_KVS, [_info("t.a", (8,)), _info("t.b", (8,), 0, 0)], bytes(32)), "overlap in the data"),
]


@pytest.mark.parametrize("case, raw, message", CRAFTED, ids=[c[0] for c in CRAFTED])
def test_crafted_files_raise_checkpoint_errors(tmp_path, case, raw, message):
    path = tmp_path / f"{case}.gguf"
    path.write_bytes(raw)
    with pytest.raises(CheckpointError, match=rf"{case}\.gguf: .*{message}"):
        GGUFFile(str(path))


def test_the_crafted_base_file_reads(tmp_path):
    path = tmp_path / "good.gguf"
    path.write_bytes(_file(GOOD_KVS, GOOD_INFOS, np.arange(16, dtype=np.float32).tobytes()))
    f = GGUFFile(str(path))
    assert f.metadata["a.list"].decode() == ["x", "yz"]
    np.testing.assert_array_equal(f.data(f.tensors["t.b"]), np.arange(8, 16, dtype=np.float32))
    assert f.tensors["t.a"].shape == (2, 4)


def test_every_truncation_and_byte_flip_is_a_checkpoint_error_or_a_file(tmp_path):
    """Cut a gguf-written file at every byte of its header and flip bytes at random: each read either
    succeeds or raises CheckpointError (never IndexError, struct.error, MemoryError...)."""
    src = tmp_path / "src.gguf"
    _write(src, {"t": (np.ones((2, 32), np.float32), None), "q": (gguf.quants.quantize(np.ones((2, 32), np.float32),
                                                                                       Q.Q8_0), Q.Q8_0)})
    raw = src.read_bytes()
    header = GGUFFile(str(src)).data_offset
    path = tmp_path / "cut.gguf"
    for n in range(header):
        path.write_bytes(raw[:n])
        with pytest.raises(CheckpointError):
            GGUFFile(str(path))
    rng = np.random.default_rng(0)
    for _ in range(200):
        data = bytearray(raw)
        for at in rng.integers(0, header, 3):
            data[at] = int(rng.integers(0, 256))
        path.write_bytes(bytes(data))
        try:
            GGUFFile(str(path))
        except CheckpointError:
            pass


# ------------------------------------------------------------------------------------- laziness

def test_a_gpt2_sized_vocabulary_is_not_decoded_while_loading(tmp_path, monkeypatch):
    # the gguf package turned each of these 100,258 strings into numpy views: 8 s of GPT-2's first token
    decoded = []
    monkeypatch.setattr(gguf_format, "_read_strings", lambda *a: decoded.append(a) or [])
    tokens = [f"t{i}" for i in range(50257)]
    path = tmp_path / "vocab.gguf"
    w = gguf.GGUFWriter(str(path), "gpt2")
    for key, v in (("embedding_length", 32), ("block_count", 1), ("feed_forward_length", 64),
                   ("context_length", 64), ("attention.head_count", 4)):
        w.add_uint32(f"gpt2.{key}", v)
    w.add_float32("gpt2.attention.layer_norm_epsilon", 1e-5)
    w.add_tokenizer_model("gpt2")
    w.add_token_list(tokens)
    w.add_token_merges([f"t{i} t{i + 1}" for i in range(50001)])
    w.add_tensor("token_embd.weight", np.ones((8, 32), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    from polygrad_hf.gguf_file import open_gguf
    ck = open_gguf(str(path))
    assert ck.config.vocab_size == 8 and decoded == []
    monkeypatch.undo()
    record = GGUFFile(str(path)).metadata["tokenizer.ggml.tokens"]
    assert record.count == 50257 and record.decode() == tokens  # decoded when asked


# ------------------------------------------------------------------------------------- without gguf

BLOCKED = """
import sys, json, numpy as np
class Block:
    def find_spec(self, name, path=None, target=None):
        if name == "gguf" or name.startswith("gguf."):
            raise ImportError("gguf is blocked in this test")
sys.meta_path.insert(0, Block())
from polygrad.hf import load_hf
model = load_hf(sys.argv[1], max_batch=1, max_seq_len=8)
ids = np.array([json.loads(sys.argv[2])], np.int32)
np.save(sys.argv[3], model.forward(input_ids=ids)["logits"].numpy())
assert "gguf" not in sys.modules
"""


def test_a_q8_0_file_loads_and_runs_without_the_gguf_package(tmp_path):
    pytest.importorskip("transformers")
    import hf_checkpoints as hc
    ref = hc.hf_model("gpt2")
    path = tmp_path / "gpt2-q8.gguf"
    held = hc.write_gguf(ref, path, "Q8_0")
    twin = hc.hf_model("gpt2")
    hc.set_state(twin, held)
    ids = [1, 5, 9, 3]
    out = tmp_path / "logits.npy"
    # the float path, within 1e-4 of transformers (POLY_INT8_DOT: a prompt's 8-bit activations, test_int8_gemm.py)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "POLY_INT8_DOT": "0"}
    proc = subprocess.run([sys.executable, "-c", BLOCKED, str(path), json.dumps(ids), str(out)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    want = hc.logits(twin, np.array([ids]))
    np.testing.assert_allclose(np.load(out), want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


def test_float32_of_a_block_format_without_gguf_names_the_package(tmp_path, monkeypatch):
    # the dequantize-at-load path still takes the gguf package's decoders: its absence is said as such
    from polygrad.hf import MissingDependencyError
    from polygrad_hf.gguf_file import _dequantize
    path = tmp_path / "q8.gguf"
    _write(path, {"q": (gguf.quants.quantize(np.ones((2, 32), np.float32), Q.Q8_0), Q.Q8_0)})
    f = GGUFFile(str(path))
    monkeypatch.setitem(sys.modules, "gguf", None)  # import gguf raises ImportError
    with pytest.raises(MissingDependencyError, match="dequantizing Q8_0 GGUF tensors to float32 needs the 'gguf'"):
        _dequantize(f, f.tensors["q"], str(path), "q")


def test_the_file_is_freed_without_a_garbage_collection(tmp_path):
    # a cycle through the lazy arrays kept the map (its resident pages) alive past load_hf: +70 MB peak RSS
    import gc
    import weakref
    path = tmp_path / "all.gguf"
    _write(path, {"t": (np.ones((2, 32), np.float32), None)})
    f = GGUFFile(str(path))
    tokens = f.metadata["test.strs"]
    ref = weakref.ref(f)
    gc.disable()
    try:
        del f
        assert ref() is None
    finally:
        gc.enable()
    assert tokens.decode() == ARRAYS["strs"]  # a record outlives its file object: it holds the map
