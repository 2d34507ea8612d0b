"""BEAM search: results stay correct, winners are cached on disk per kernel and device, DEBUG reports."""
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from polygrad import Context, Tensor
from polygrad import diskcache
from polygrad.codegen import search
from polygrad.codegen.opts import Opt
from polygrad.codegen.passes import simplify_indices
from polygrad.diskcache import read_entry
from polygrad.engine import programs
from polygrad.schedule.template import schedule


@pytest.fixture
def fresh_caches(tmp_path, monkeypatch):
    """An empty on-disk cache and empty in-memory program/BEAM caches for one test."""
    monkeypatch.setenv("POLY_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(programs, "program_cache", {})
    monkeypatch.setattr(search, "beam_cache", {})
    return tmp_path


def _matmul_ast(m, k, n, device="INTERP"):
    t = Tensor.ones(m, k, device=device) @ Tensor.ones(k, n, device=device)
    tpl, _ = schedule([t.uop])
    return [s.ast for s in tpl.steps if s.kind == "kernel"][0]


@pytest.mark.parametrize("device,m,k,n,width", [("CPU", 4, 8, 4, 1), ("INTERP", 16, 24, 8, 2)])
def test_beam_results_match_numpy(device, m, k, n, width, fresh_caches):
    """CPU compiles every candidate with clang, so its case is small and narrow."""
    rng = np.random.default_rng(0)
    a, b = rng.random((m, k), dtype=np.float32), rng.random((k, n), dtype=np.float32)
    with Context(BEAM=width):
        c = (Tensor(a, device=device) @ Tensor(b, device=device)).numpy()
        s = Tensor(a, device=device).sum(0).numpy()
    np.testing.assert_allclose(c, a @ b, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(s, a.sum(0), rtol=1e-5, atol=1e-5)
    files = list((fresh_caches / "beam" / device).glob("*.opts"))
    assert len(files) >= 2
    data = json.loads(read_entry(str(files[0])))
    if device == "INTERP":  # no vector lanes and one thread: the space holds only the plain kernel
        assert data["candidates"] == 1 and data["opts"] == []
    else:
        assert data["candidates"] >= 2 and isinstance(data["opts"], list)


def test_every_first_level_candidate_is_correct(fresh_caches, monkeypatch):
    """Each opt the search can pick lowers to a kernel that computes the same matmul (INTERP)."""
    rng = np.random.default_rng(1)
    a, b = rng.random((8, 12), dtype=np.float32), rng.random((12, 4), dtype=np.float32)
    cands = search.candidate_opts(simplify_indices(_matmul_ast(8, 12, 4)), [])
    kinds = {o[-1].kind for o in cands}
    assert kinds == {"UPCAST", "SPLIT_REDUCE"}
    for opts in cands + [cands[0] + [Opt("UPCAST", 0, 2)]]:
        monkeypatch.setattr(programs, "program_cache", {})
        monkeypatch.setattr(search, "choose_opts", lambda ast, dev, o=opts: list(o))
        out = (Tensor(a, device="INTERP") @ Tensor(b, device="INTERP")).numpy()
        np.testing.assert_allclose(out, a @ b, rtol=1e-5, atol=1e-5, err_msg=str(opts))


def test_winner_is_loaded_from_disk_without_searching(fresh_caches, monkeypatch):
    a = np.arange(60, dtype=np.float32).reshape(6, 10)
    with Context(BEAM=2):
        first = Tensor(a, device="INTERP").max(1).numpy()
    monkeypatch.setattr(programs, "program_cache", {})
    monkeypatch.setattr(search, "beam_cache", {})

    def no_search(*args, **kwargs):
        raise AssertionError("searched again although the winner is on disk")

    monkeypatch.setattr(search, "beam_search", no_search)
    with Context(BEAM=2):
        second = Tensor(a + 1, device="INTERP").max(1).numpy()
    np.testing.assert_array_equal(first, a.max(1))
    np.testing.assert_array_equal(second, a.max(1) + 1)


def test_debug_reports_beam_choice(fresh_caches, capsys):
    with Context(BEAM=1, DEBUG=1):
        Tensor(np.ones((4, 8), np.float32), device="INTERP").sum(1).numpy()
    assert "BEAM INTERP" in capsys.readouterr().out


def test_kernel_key_depends_on_structure_device_and_width():
    a, b = _matmul_ast(4, 4, 4), _matmul_ast(4, 8, 4)
    assert search.kernel_key(a, "CPU", 2) == search.kernel_key(_matmul_ast(4, 4, 4), "CPU", 2)
    assert len({search.kernel_key(a, "CPU", 2), search.kernel_key(b, "CPU", 2),
                search.kernel_key(a, "INTERP", 2), search.kernel_key(a, "CPU", 4)}) == 4


def test_beam_zero_uses_heuristics():
    with Context(BEAM=0):
        assert search.choose_opts(_matmul_ast(4, 4, 4), "INTERP") is None


def test_second_process_pays_nothing(tmp_path):
    script = textwrap.dedent('''
        import numpy as np
        from polygrad import Tensor
        a = np.arange(96, dtype=np.float32).reshape(8, 12)
        out = (Tensor(a) @ Tensor(a.T)).numpy()
        assert np.allclose(out, a @ a.T)
    ''')
    env = dict(os.environ, POLY_CACHE_DIR=str(tmp_path), BEAM="2", DEBUG="1", DEV="INTERP")
    runs = [subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
            for _ in range(2)]
    for r in runs:
        assert r.returncode == 0, r.stderr
    assert "searched" in runs[0].stdout
    assert "searched" not in runs[1].stdout and "disk cache" in runs[1].stdout


def _forbid_search(monkeypatch):
    def no_search(*args, **kwargs):
        raise AssertionError("searched although the winner is on disk")
    monkeypatch.setattr(search, "beam_search", no_search)


def test_beam_results_land_in_the_diskcache_folder(tmp_path, monkeypatch):
    """BEAM's winners are diskcache entries: where POLY_CACHE_DIR cannot be used (a file), they go to the
    folder diskcache falls back on, with its warning, and are read back from there."""
    not_a_folder = tmp_path / "cache"
    not_a_folder.write_text("a file")
    monkeypatch.setenv("POLY_CACHE_DIR", str(not_a_folder))
    monkeypatch.setattr(programs, "program_cache", {})
    monkeypatch.setattr(search, "beam_cache", {})
    a = np.arange(60, dtype=np.float32).reshape(6, 10)
    with pytest.warns(diskcache.CacheWarning, match="cannot be used"), Context(BEAM=2):
        np.testing.assert_array_equal(Tensor(a, device="INTERP").max(1).numpy(), a.max(1))
    entries = list(Path(diskcache.cache_dir("beam", "INTERP")).glob("*.opts"))
    assert entries and all(read_entry(str(e)) is not None for e in entries)
    monkeypatch.setattr(programs, "program_cache", {})
    monkeypatch.setattr(search, "beam_cache", {})
    _forbid_search(monkeypatch)
    with Context(BEAM=2):
        np.testing.assert_array_equal(Tensor(a + 1, device="INTERP").max(1).numpy(), a.max(1) + 1)


def test_damaged_beam_entry_is_discarded_with_a_warning_and_searched_again(fresh_caches, monkeypatch):
    ast = _matmul_ast(8, 12, 4)
    with Context(BEAM=2):
        first = search.choose_opts(ast, "INTERP")
    (entry,) = (fresh_caches / "beam" / "INTERP").glob("*.opts")
    blob = bytearray(entry.read_bytes())
    blob[2] ^= 0xFF  # a flipped byte in the JSON
    entry.write_bytes(bytes(blob))
    monkeypatch.setattr(search, "beam_cache", {})
    with pytest.warns(diskcache.CacheWarning, match="checksum does not match"), Context(BEAM=2):
        assert search.choose_opts(ast, "INTERP") == first
    assert read_entry(str(entry)) is not None  # stored again, whole


def test_winner_kept_by_an_older_polygrad_is_used_and_moved(fresh_caches, monkeypatch):
    """Before the checked entries, a winner was plain JSON at beam/<device>/<key>.json: it still counts."""
    ast = _matmul_ast(8, 12, 4)
    key = search.kernel_key(ast, "INTERP", 2)
    legacy = fresh_caches / "beam" / "INTERP" / f"{key}.json"
    legacy.parent.mkdir(parents=True)
    legacy.write_text(json.dumps({"opts": [["UPCAST", 0, 2]], "time_s": 1e-5, "candidates": 7}))
    _forbid_search(monkeypatch)
    with Context(BEAM=2):
        assert search.choose_opts(ast, "INTERP") == [Opt("UPCAST", 0, 2)]
    assert not legacy.exists()
    stored = json.loads(read_entry(str(legacy.with_suffix(".opts"))))
    assert stored == {"opts": [["UPCAST", 0, 2]], "time_s": 1e-5, "candidates": 7}
