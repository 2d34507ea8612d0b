"""Python's Model.load and polygrad-js's Model.load accept and reject the same bundles, file by file, each
given both as its path (read a piece at a time: a file map in Python, reads into the model's memory in
polygrad-js) and as its bytes.

The corpus (tests/bundle_corpus.py) is the crafted files (every cap of polygrad/limits.py just below and
just above its limit, deep graphs, optimizer hyperparameters of the wrong kind) with the default options,
and seeded mutations of the bundles Python saved for polygrad-js's tests with small caps. Both loaders must
raise only BundleError, and agree on every file; a disagreement names the file and both verdicts. CI runs
300 mutations; POLY_LONG_TESTS=1 runs 3,000. Skipped without `node`.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

import bundle_corpus
from polygrad import BundleError, Model, limits

ROOT = Path(__file__).resolve().parent.parent
NODE = shutil.which("node")
LONG = os.environ.get("POLY_LONG_TESTS", "") not in ("", "0")
MUTATIONS = 3000 if LONG else 300

pytestmark = pytest.mark.skipif(NODE is None, reason="node is not installed")


def python_verdict(source: bytes | Path, **options) -> dict:
    try:
        Model.load(source, **options).dispose()
    except BundleError as e:
        return {"verdict": "reject", "error": "BundleError", "message": str(e)}
    except Exception as e:  # noqa: BLE001 (any other exception is the bug this test reports)
        return {"verdict": "crash", "error": type(e).__name__, "message": str(e)}
    return {"verdict": "accept"}


def node_verdicts(folder: Path, options: dict, how: str = "path") -> dict:
    out = folder.parent / f"{folder.name}.js.{how}.json"
    proc = subprocess.run([NODE, str(ROOT / "polygrad-js" / "tools" / "verdicts.js"), str(folder), str(out),
                           json.dumps(options), how], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr
    return json.loads(out.read_text())


def disagreements(folder: Path, py_options: dict, js_options: dict) -> tuple[list[str], dict]:
    """(disagreements, Python's verdicts) over the files of a folder, each loaded four ways: by Python and by
    polygrad-js, from its path and from its bytes."""
    files = sorted(folder.glob("*.pgb"))
    verdicts = {"Python path": {f.name: python_verdict(f, **py_options) for f in files},
                "Python bytes": {f.name: python_verdict(f.read_bytes(), **py_options) for f in files},
                "polygrad-js path": node_verdicts(folder, js_options, "path"),
                "polygrad-js bytes": node_verdicts(folder, js_options, "bytes")}
    bad = []
    for ways in verdicts.values():
        assert set(ways) == {f.name for f in files}
    for f in files:
        rows = {way: v[f.name] for way, v in verdicts.items()}
        kinds = {r["verdict"] for r in rows.values()}
        if len(kinds) > 1 or "crash" in kinds:
            bad.append(f"{f.name}: " + " | ".join(f"{way} {r['verdict']} ({r.get('error', '')}: "
                                                    f"{r.get('message', '')[:120]})" for way, r in rows.items()))
    return bad, verdicts["Python path"]


def test_both_languages_share_one_table_of_limits():
    script = "const l = require('./src/limits'); console.log(JSON.stringify(l, (k, v) => typeof v === 'bigint' ? " \
             "Number(v) : v))"
    proc = subprocess.run([NODE, "-e", script], cwd=ROOT / "polygrad-js", capture_output=True, text=True, timeout=60)
    js = json.loads(proc.stdout)
    py = {k: v for k, v in vars(limits).items() if k.isupper()}
    assert js == py
    for size in (0, 704, 1 << 20, 502_081_984, 1 << 34):
        assert limits.default_max_bytes(size) == _node_eval(f"require('./src/limits').defaultMaxBytes({size})")
        assert limits.default_max_work(size) == _node_eval(f"require('./src/limits').defaultMaxWork({size})")


def _node_eval(expr: str) -> int:
    proc = subprocess.run([NODE, "-e", f"console.log(String({expr}))"], cwd=ROOT / "polygrad-js", capture_output=True,
                          text=True, timeout=60)
    return int(proc.stdout)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    return bundle_corpus.write(tmp_path_factory.mktemp("corpus"), seed=28, count=MUTATIONS)


@pytest.fixture(scope="module")
def crafted(corpus) -> tuple[list[str], dict]:
    return disagreements(corpus / "crafted", {}, {})


@pytest.fixture(scope="module")
def mutated(corpus) -> tuple[list[str], dict]:
    py_options = bundle_corpus.MUTATION_OPTIONS
    return disagreements(corpus / "mutated", py_options,
                         {"maxBytes": py_options["max_bytes"], "maxWork": py_options["max_work"]})


def test_crafted_files_get_one_verdict(crafted):
    bad, py = crafted
    assert not bad, "the loaders disagree on:\n" + "\n".join(bad)
    # the files at a limit load, those past it do not (each cap is checked, at its documented value)
    wrong = {name: v["verdict"] for name, v in py.items() if v["verdict"] != bundle_corpus.CRAFTED[name[:-4]][0]}
    assert not wrong, wrong


def test_mutated_bundles_get_one_verdict(mutated):
    bad, py = mutated
    assert not bad, f"the loaders disagree on {len(bad)} of {len(py)} files:\n" + "\n".join(bad)
    verdicts = [v["verdict"] for v in py.values()]
    assert verdicts.count("accept") > 10 and verdicts.count("reject") > len(verdicts) // 2, verdicts.count("accept")
