"""load_hf's captured Program cached on disk (polygrad/model/programcache.py): a second process skips capture.

Each test starts from an empty program folder of its own (programcache.FOLDER) under the usual
POLY_CACHE_DIR, so the compiled kernels stay warm across tests and runs. A hit must run without capture_program and
without lowering or rendering a kernel, give the first process's logits bit for bit (and transformers'), keep
GGUF blocks as the file's read-only pages, and generate; a change of the bounds, the weights' dtype or the
config misses; a corrupt or mismatching entry is discarded and rewritten.
"""
from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
import uuid

import numpy as np
import pytest

pytest.importorskip("gguf")
pytest.importorskip("transformers")
pytest.importorskip("torch")

import hf_checkpoints as hc  # noqa: E402

from polygrad import bundle, config  # noqa: E402
from polygrad.diskcache import CacheWarning, read_entry, write_entry  # noqa: E402
from polygrad.model import programcache  # noqa: E402
from polygrad_hf import load_hf  # noqa: E402

IDS = [[5, 17, 3, 42, 9]]

# one process's load: how many captures, the caches' counters, logits, greedy tokens, and whether every
# uint8 (block) buffer of the Model is the GGUF file's read-only map
WORKER = r"""
import json, mmap, os, sys
import numpy as np
import polygrad_hf.loader as loader
from polygrad.engine import rendercache
from polygrad import dtypes
from polygrad.model import programcache
from polygrad_hf import generate, load_hf
captures = []
real = loader.capture_program
loader.capture_program = lambda *a, **k: captures.append(1) or real(*a, **k)
path = sys.argv[1]
programcache.FOLDER = sys.argv[3]
model = load_hf(path, max_seq_len=16)
logits = model.forward(input_ids=np.array(json.loads(sys.argv[2]), np.int32))["logits"].numpy()
def file_map(buf):
    base = buf.handle.arr
    while isinstance(base, np.ndarray) and base.base is not None:
        base = base.base
    base = base.obj if isinstance(base, memoryview) else base
    return isinstance(base, mmap.mmap) and len(base) == os.path.getsize(path) and buf.readonly
blocks = [model._x.bufs[i] for i, s in enumerate(model._p.slots) if s.dtype == dtypes.uint8]
tokens = generate(model, np.array(json.loads(sys.argv[2])[0]), max_new_tokens=4, top_k=1)
print(json.dumps({"captures": len(captures), "cache": programcache.stats, "rendered": rendercache.stats,
                  "logits": logits.tolist(), "blocks": len(blocks), "adopted": all(map(file_map, blocks)),
                  "tokens": np.asarray(tokens).tolist()}))
"""


@pytest.fixture
def folder(monkeypatch):
    """An empty program folder of this test's own (removed after it)."""
    name = f"programs-test-{uuid.uuid4().hex[:12]}"
    monkeypatch.setattr(programcache, "FOLDER", name)
    monkeypatch.setattr(programcache, "stats", {"hits": 0, "misses": 0, "stored": 0})
    yield os.path.join(config.cache_dir(), name)
    shutil.rmtree(os.path.join(config.cache_dir(), name), ignore_errors=True)


def _run(path: str, folder: str) -> dict:
    # the float path, whose logits match transformers' within 1e-4 (a CPU with VNNI would round a Q4_0
    # prompt's activations to 8 bits: tests/test_int8_gemm.py)
    env = {**os.environ, "POLY_INT8_DOT": "0"}
    out = subprocess.run([sys.executable, "-c", WORKER, path, json.dumps(IDS), os.path.basename(folder)],
                         capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def q4(tmp_path_factory):
    """(path, transformers model holding the file's dequantized weights) of a tiny GPT-2 in Q4_0."""
    ref = hc.hf_model("gpt2")
    path = str(tmp_path_factory.mktemp("progcache") / "gpt2-q4_0.gguf")
    hc.set_state(ref, hc.write_gguf(ref, path, "Q4_0"))
    return path, ref


def test_a_second_process_skips_capture_and_rendering_with_the_same_logits(q4, folder):
    path, ref = q4
    first = _run(path, folder)
    second = _run(path, folder)
    assert first["captures"] == 1 and first["cache"] == {"hits": 0, "misses": 1, "stored": 1}
    assert second["captures"] == 0 and second["cache"] == {"hits": 1, "misses": 0, "stored": 0}
    assert second["rendered"]["misses"] == 0 and second["rendered"]["hits"] > 0  # nothing lowered or rendered
    assert second["logits"] == first["logits"]  # the very kernels the first process ran
    want = hc.logits(ref, np.array(IDS))
    got = np.array(second["logits"])
    assert np.abs(got - want).max() <= 1e-4 * np.abs(want).max()
    assert second["blocks"] > 0 and second["adopted"] and first["adopted"]  # the file's pages, no copy
    assert second["tokens"] == first["tokens"] == hc.greedy(ref, np.array(IDS), 4)[0].tolist()
    assert len(glob.glob(os.path.join(folder, "*.pgp"))) == 1


def test_bounds_dtype_and_config_are_part_of_the_key(folder, tmp_path):
    _, base = hc.make("gpt2", tmp_path / "a")
    _, other = hc.make("gpt2", tmp_path / "b", overrides={"layer_norm_epsilon": 1e-3})  # one config field
    _, same = hc.make("gpt2", tmp_path / "c", seed=3)  # other weights, same layout: the program fits
    counts = []
    for path, kw in [(base, {}), (base, {}), (base, {"max_seq_len": 24}), (base, {"dtype": "float16"}),
                     (other, {}), (same, {})]:
        load_hf(path, **{"max_seq_len": 16, **kw}).dispose()
        counts.append((programcache.stats["hits"], programcache.stats["misses"]))
    assert counts == [(0, 1), (1, 1), (1, 2), (1, 3), (1, 4), (2, 4)]


def test_joined_and_separate_projections_are_different_entries(folder, tmp_path):
    """A Llama's q/k/v and gate/up joined at load (qkv_proj, gate_up_proj) and kept apart (POLY_JOIN_PROJ=0,
    the names an older polygrad gave) are parameters of other names: two entries, neither read for the other."""
    _, path = hc.make("llama", tmp_path / "a")
    counts = []
    for join in (1, 0, 1, 0):
        with config.Context(POLY_JOIN_PROJ=join):
            load_hf(path, max_seq_len=16).dispose()
        counts.append((programcache.stats["hits"], programcache.stats["misses"]))
    assert counts == [(0, 1), (0, 2), (1, 2), (2, 2)]


def test_a_hit_with_other_weights_gives_their_logits(folder, tmp_path):
    """The entry holds no weights: a checkpoint of the same layout runs the cached program on its own."""
    _, a = hc.make("llama", tmp_path / "a")
    ref_b, b = hc.make("llama", tmp_path / "b", seed=5)
    load_hf(a, max_seq_len=16).dispose()
    with load_hf(b, max_seq_len=16) as model:
        got = model.forward(input_ids=np.array(IDS, np.int32))["logits"].numpy()
    assert programcache.stats == {"hits": 1, "misses": 1, "stored": 1}
    want = hc.logits(ref_b, np.array(IDS))
    assert np.abs(got - want).max() <= 1e-4 * np.abs(want).max()


def _rewrite_manifest(path: str, change) -> None:
    """Store the entry again with `change(manifest)` applied (a valid checksum over a bad program)."""
    payload = read_entry(path)
    n = int.from_bytes(payload[:4], "little")
    manifest, data = bundle.read(payload[4 + n:])
    blobs = []
    for buf in manifest["buffers"]:
        if isinstance(buf.get("data"), dict):
            off, size = buf["data"]["offset"], buf["data"]["nbytes"]
            blobs.append(bytes(data[off:off + size]))
            buf["data"] = True
    change(manifest)
    write_entry(path, payload[:4 + n] + bundle.write(manifest, blobs))


def _swap_first_call_args(manifest: dict) -> None:
    call = next(c for c in manifest["entrypoints"]["forward"]["calls"] if "kernel" in c)
    call["args"] = call["args"][::-1]


def _rename_a_weight(manifest: dict) -> None:
    buf = next(b for b in manifest["buffers"] if b["role"] in ("parameter", "state"))
    buf["name"] = "not.a.weight"


@pytest.mark.parametrize("damage", ["bytes", "program", "names"])
def test_a_damaged_entry_is_discarded_and_rewritten(folder, tmp_path, damage):
    ref, path = hc.make("gpt2", tmp_path / "m")
    load_hf(path, max_seq_len=16).dispose()
    (entry,) = glob.glob(os.path.join(folder, "*.pgp"))
    if damage == "bytes":
        with open(entry, "r+b") as f:
            f.seek(100)
            f.write(b"\xff" * 8)
    else:
        _rewrite_manifest(entry, _swap_first_call_args if damage == "program" else _rename_a_weight)
    with pytest.warns(CacheWarning):
        model = load_hf(path, max_seq_len=16)
    with model:
        got = model.forward(input_ids=np.array(IDS, np.int32))["logits"].numpy()
    assert programcache.stats == {"hits": 0, "misses": 2, "stored": 2}  # captured again and rewritten
    want = hc.logits(ref, np.array(IDS))
    assert np.abs(got - want).max() <= 1e-4 * np.abs(want).max()
    load_hf(path, max_seq_len=16).dispose()  # the rewritten entry serves the next load
    assert programcache.stats["hits"] == 1


COLD_WORKER = r"""
import json, subprocess, sys
import numpy as np
import polygrad_backend_cpu.compiler as cc_mod
runs, units, batches = [], [], []
real_run, real_build, real_many = subprocess.run, cc_mod.ClangCompiler._build, cc_mod.ClangCompiler.compile_many
subprocess.run = lambda cmd, *a, **kw: (runs.append(1) if "-c" in cmd else None) or real_run(cmd, *a, **kw)
def build(self, srcs, *a, **kw):
    units.append(sorted(srcs))
    return real_build(self, srcs, *a, **kw)
def many(self, srcs, *a, **kw):
    new = {self.key(s, *a) for s in srcs} - set(self.memory)
    batches.append(len(new))
    return real_many(self, srcs, *a, **kw)
cc_mod.ClangCompiler._build, cc_mod.ClangCompiler.compile_many = build, many
from polygrad.engine import programs
from polygrad_hf import load_hf
model = load_hf(sys.argv[1], max_seq_len=16)
logits = model.forward(input_ids=np.array(json.loads(sys.argv[2]), np.int32))["logits"].numpy()
print(json.dumps({"runs": len(runs), "units": units, "batches": batches, "logits": logits.tolist(),
                  "compiled": programs.runtime_stats["programs_compiled"]}))
"""


def test_a_load_with_an_empty_cache_compiles_each_kernel_once_in_few_runs(q4, tmp_path):
    """From an empty POLY_CACHE_DIR (issue 30's cold first token): each distinct kernel source is compiled
    once, in one compiler run per batch of new kernels (one job; tests/test_compile_batch.py has more).
    Before, kernels sharing a renderer helper failed as one unit and then compiled one run each."""
    path, ref = q4
    env = {k: v for k, v in os.environ.items() if k != "POLY_DEV"}
    env.update(POLY_CACHE_DIR=str(tmp_path / "cache"), DEV="CPU", POLY_COMPILE_JOBS="1", POLY_INT8_DOT="0")
    proc = subprocess.run([sys.executable, "-c", COLD_WORKER, path, json.dumps(IDS)], capture_output=True, text=True,
                          timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    keys = [k for unit in got["units"] for k in unit]
    assert len(keys) == len(set(keys)), "a kernel was compiled twice"
    with_new = [n for n in got["batches"] if n]
    assert got["compiled"] >= 20 and len(with_new) <= 12, got["batches"]
    assert got["runs"] == len(got["units"]) <= len(with_new) + 1, got  # + the pool library
    so = list((tmp_path / "cache" / "cpu").glob("*.so"))
    assert len(so) == len(keys)
    want = hc.logits(ref, np.array(IDS))
    assert np.abs(np.array(got["logits"]) - want).max() <= 1e-4 * np.abs(want).max()


LANE_WORKER = r"""
import json, sys
import polygrad_backend_cpu.compiler as cc_mod
import polygrad_hf.loader as loader
from polygrad.nn.quant import int8_dot_enabled
batches, laying = [], []
real_many, real_parameters = cc_mod.ClangCompiler.compile_many, loader.parameters
def many(self, srcs, *a, **kw):
    new = {self.key(s, *a) for s in srcs} - set(self.memory)
    if new and laying:
        batches.append(len(new))
    return real_many(self, srcs, *a, **kw)
def parameters(weights, consts):
    laying.append(1)
    try:
        return real_parameters(weights, consts)
    finally:
        laying.pop()
import polygrad_hf.decoder as dec
real_init = dec.Decoder.__init__
def init(self, *a, **kw):
    laying.append(1)
    try:
        real_init(self, *a, **kw)
    finally:
        laying.pop()
    caches.extend(bool(t.numpy().any()) for t in self.caches.values())
caches = []
cc_mod.ClangCompiler.compile_many, loader.parameters, dec.Decoder.__init__ = many, parameters, init
from polygrad_hf import load_hf
import numpy as np
model = load_hf(sys.argv[1], max_seq_len=16)
kept = [s for s in model._p.slots if s.name.endswith(".lane_scales")]
logits = model.forward(input_ids=np.array(json.loads(sys.argv[2]), np.int32))["logits"].numpy()
print(json.dumps({"int8": int8_dot_enabled("CPU"), "batches": batches, "kept": len(kept), "caches": caches,
                  "shapes": sorted({tuple(s.shape) for s in kept}), "logits": logits.tolist()}))
"""


def test_a_cold_load_lays_the_lane_scales_out_and_zeroes_the_cache_without_compiling(q4, tmp_path):
    """From an empty POLY_CACHE_DIR, the load lays each projection's scales out for the int8 prompt route
    (QuantWeight.keep_lane_scales) on the host (nn/quant.host_scales_by_lane) and makes the zeroed KV cache
    without a fill kernel: no kernel is compiled while the parameters and the Decoder are made. On the start
    of session 10 (fdd5dad) each weight shape's layout was a kernel of its own, compiled as its first weight
    was laid out: 4 batches of one for GPT-2 (c_attn, attn c_proj, c_fc, mlp c_proj), a compiler and a
    linker process each, one after another, and the cache's fill one more."""
    path, ref = q4
    env = {k: v for k, v in os.environ.items() if k != "POLY_DEV"}
    env.update(POLY_CACHE_DIR=str(tmp_path / "cache"), DEV="CPU", POLY_COMPILE_JOBS="2")
    proc = subprocess.run([sys.executable, "-c", LANE_WORKER, path, json.dumps(IDS)], capture_output=True,
                          text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    if not got["int8"]:
        pytest.skip("the CPU device does not declare int8_dot (no VNNI, or POLY_INT8_DOT=0): no lane scales")
    assert got["kept"] == 4 * 2 and len(got["shapes"]) == 4, got  # 2 layers of 4 projections, 4 shapes
    assert got["batches"] == [], got
    assert got["caches"] == [False] * 2 * 2, got  # k and v of 2 layers, all zeros
    want = hc.logits(ref, np.array(IDS))  # the int8 route's rounding: within its 2%
    assert np.abs(np.array(got["logits"]) - want).max() <= 2e-2 * np.abs(want).max()
