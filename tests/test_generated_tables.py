"""polygrad-js's tables are generated from polygrad-core's definitions, and a stale one fails the suite.

polygrad-js/tools/gen_all.py renders every module of polygrad-js/tools/gen/ (see its docstring); here its
check runs, its detection of a hand edit, of a definition changed without regenerating and of a left-over
file is shown to work, every generated file is loaded in Node and compared with its definition's values,
and the tables once copied by hand into polygrad-js or a second Python module stay gone.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parent.parent
JS = ROOT / "polygrad-js"
sys.path.insert(0, str(JS / "tools"))
import gen_all  # noqa: E402 (polygrad-js/tools is not a package)
from gen import _js  # noqa: E402

NODE = shutil.which("node")


def test_every_generated_table_is_current():
    """The suite's staleness check: `gen_all.py --check` exits 0 only when every file is what its definition
    gives (run as CI would, in a fresh interpreter)."""
    proc = subprocess.run([sys.executable, str(JS / "tools" / "gen_all.py"), "--check"], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr


def test_a_hand_edited_file_is_stale(tmp_path):
    for m in gen_all.modules():
        copy = tmp_path / Path(m.OUT).name
        copy.write_text(Path(m.OUT).read_text(encoding="utf-8").replace("module.exports", "module.exports ", 1))
        assert gen_all.stale([SimpleNamespace(OUT=copy, render=m.render)]) == [copy], m.__name__
        copy.unlink()
        assert gen_all.stale([SimpleNamespace(OUT=copy, render=m.render)]) == [copy]  # a missing file is stale


@pytest.mark.parametrize("definition, name, table", [
    ("limits", "MAX_NAME", "limits.js"), ("optimizer", "SOLO_NUMEL", "optimizer.js"),
    ("ops", "NAMES", "ops.js"), ("bundle", "FORMAT", "bundle.js"), ("dtypes", "DTYPES", "dtypes.js"),
])
def test_a_definition_changed_without_regenerating_is_stale(monkeypatch, definition, name, table):
    import importlib
    mod = importlib.import_module(f"polygrad.definitions.{definition}")
    value = getattr(mod, name)
    changed = value + 1 if isinstance(value, int) else value[:-1] if isinstance(value, tuple) else value + "x"
    monkeypatch.setattr(mod, name, changed)
    assert [p.name for p in gen_all.stale()] == [table]


def test_a_file_no_generator_writes_is_reported(tmp_path):
    mods = gen_all.modules()
    assert gen_all.orphans(mods) == []
    (tmp_path / "old_table.js").write_text("'use strict'\n")
    assert [p.name for p in gen_all.orphans(mods, tmp_path)] == ["old_table.js"]


def test_every_generated_file_says_where_it_comes_from():
    for m in gen_all.modules():
        assert Path(m.OUT).parent == _js.GENERATED, m.__name__
        head = Path(m.OUT).read_text(encoding="utf-8").splitlines()[1]
        assert f"tools/gen/{Path(m.__file__).name}" in head and "do not edit" in head, head


def _plain(value):
    """Python table values as JSON: tuples as lists, BigInts tagged as polygrad-js's loader below tags them."""
    if isinstance(value, _js.BigInt):
        return {"bigint": str(int(value))}
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


@pytest.mark.skipif(NODE is None, reason="node is not installed")
def test_node_reads_the_values_of_each_definition():
    """What JavaScript gets from each generated file equals the definition's values, BigInts and floats exactly."""
    mods = [m for m in gen_all.modules() if hasattr(m, "exports")]
    script = ("const out = {}; for (const [k, f] of Object.entries(JSON.parse(process.argv[1]))) "
              "out[k] = require(f); console.log(JSON.stringify(out, (k, v) => typeof v === 'bigint' ? "
              "{ bigint: v.toString() } : v))")
    files = {m.__name__: str(m.OUT) for m in mods}
    proc = subprocess.run([NODE, "-e", script, json.dumps(files)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    for m in mods:
        assert got[m.__name__] == _plain(m.exports()), m.__name__


# literals of the tables once copied by hand (base commit 20af852): they live in polygrad/definitions and
# src/generated now, and must not come back in a hand-written module
HAND_COPIES = {
    "polygrad-js/src": ["'polygrad-bundle'", "'polygrad-kernel'", "SOLO_NUMEL = 1 << 14", "3.4028234663852886e38",
                        "0x89, 0x50, 0x47, 0x42", "weight_decay: 0.01", "'global', 'reduce', 'upcast'",
                        "'RECIPROCAL', 'SQRT', 'TRUNC'", "'parameter', 'state', 'constant'", "2n ** 48n",
                        "nesterov: 'boolean'", "bits: 8, store"],
    "polygrad-core/src/polygrad": ['FORMAT = "polygrad-bundle"', 'FORMAT = "polygrad-kernel"', '"\\x89PGB',
                                   "SOLO_NUMEL = 1 << 14", '"parameter", "state", "constant"', '"<8sIIQQII24x"',
                                   "Ops.RECIPROCAL, Ops.SQRT", '"momentum": "number"', 'DType(0, 1, "bool"',
                                   "MAX_RANGE = 2**48"],
}
HOMES = (JS / "src" / "generated", ROOT / "polygrad-core" / "src" / "polygrad" / "definitions")


def test_no_hand_copy_of_a_table_is_left():
    found = []
    for folder, needles in HAND_COPIES.items():
        for path in sorted((ROOT / folder).rglob("*.[jp][sy]")):
            if any(home in path.parents for home in HOMES):
                continue
            text = path.read_text(encoding="utf-8")
            found += [f"{path.relative_to(ROOT)}: {n}" for n in needles if n in text]
    assert not found, "tables copied by hand (read polygrad/definitions or src/generated instead):\n" + \
        "\n".join(found)
