"""The index-simplification rule table (polygrad/definitions/symbolic_rules.py) and its two interpreters.

polygrad-core builds `symbolic_rules` from the table (uop/symbolic.py through uop/rule_table.py) and
polygrad-js interprets the rendered copy, src/generated/symbolic_rules.js (src/simplify.js through
src/ruletable.js). Checked here: the committed JavaScript copy is what the generator renders now; both
languages implement exactly the table's vocabulary of conditions, builders, values and code functions;
every row only names vocabulary and captures its pattern binds; Python's matcher holds the rows in the
table's order. tests/test_simplify_differential.py runs both simplifiers on the same expressions.
"""
from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
from pathlib import Path

import pytest

from polygrad.definitions import symbolic_rules as table
from polygrad.uop import rule_table, symbolic
from polygrad.uop.ops import Ops

ROOT = Path(__file__).resolve().parent.parent
JS = ROOT / "polygrad-js"
NODE = shutil.which("node")


def _generator():
    path = JS / "tools" / "gen" / "symbolic_rules.py"
    spec = importlib.util.spec_from_file_location("gen_symbolic_rules", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_generated_javascript_table_is_current():
    gen = _generator()
    assert gen.OUT == JS / "src" / "generated" / "symbolic_rules.js"
    assert gen.OUT.read_text() == gen.render(), (
        f"{gen.OUT} is stale: run python polygrad-js/tools/gen_all.py")


def test_python_implements_exactly_the_vocabulary():
    assert set(symbolic.CONDITIONS) == set(table.CONDITIONS)
    assert set(symbolic.CODE) == set(table.CODE)
    assert set(rule_table.BUILDERS) == set(table.BUILDERS)
    assert set(rule_table.VALUES) == set(table.VALUES)


@pytest.mark.skipif(NODE is None, reason="node is not installed")
def test_javascript_implements_exactly_the_vocabulary():
    script = ("const s = require('./src/simplify'); const r = require('./src/ruletable');"
              "console.log(JSON.stringify({CONDITIONS: Object.keys(s.CONDITIONS), CODE: Object.keys(s.CODE),"
              "BUILDERS: Object.keys(r.BUILDERS), VALUES: Object.keys(r.VALUES)}))")
    proc = subprocess.run([NODE, "-e", script], cwd=JS, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    for kind in ("CONDITIONS", "CODE", "BUILDERS", "VALUES"):
        assert set(got[kind]) == set(getattr(table, kind)), kind


def _captures(p: dict, out: set[str]) -> set[str]:
    if "name" in p:
        out.add(p["name"])
    for s in p.get("src", ()):
        _captures(s, out)
    return out


def _expression_names(e, out: dict[str, set]) -> None:
    """Builders, values and captures an expression uses."""
    if isinstance(e, str):
        out["captures"].add(e)
    elif isinstance(e, list):
        kind = e[0]
        if kind in table.VALUES:
            out["values"].add(kind)
            if kind == "arg":
                out["captures"].add(e[1])
            else:
                for v in e[1:]:
                    _expression_names(v, out)
            return
        out["builders"].add(kind)
        operands = e[2:] if kind == "alu" else e[1:]
        if kind == "alu":
            assert e[1] in Ops.__members__, e
        for v in operands:
            _expression_names(v, out)


def test_every_row_names_only_vocabulary_and_its_own_captures():
    for row in table.RULES:
        bound = _captures(row["pattern"], set())
        for op in row["pattern"].get("op", ()):
            assert op in Ops.__members__, row["doc"]
        for cond, *args in row.get("when", ()):
            assert cond in table.CONDITIONS and set(args) <= bound, row["doc"]
        if "code" in row:
            assert row["code"] in table.CODE and set(row["args"]) <= bound and "build" not in row, row["doc"]
            continue
        used = {"captures": set(), "builders": set(), "values": set()}
        _expression_names(row["build"], used)
        assert used["captures"] <= bound, row["doc"]
        assert used["builders"] <= set(table.BUILDERS) and used["values"] <= set(table.VALUES), row["doc"]


def test_python_matcher_holds_the_rows_in_order():
    rules = symbolic.symbolic_rules.rules
    assert len(rules) == len(table.RULES)
    for (pat, _), row in zip(rules, table.RULES):
        assert pat.ops == frozenset(Ops[o] for o in row["pattern"]["op"]), row["doc"]
