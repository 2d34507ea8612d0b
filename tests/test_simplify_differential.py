"""Python's and polygrad-js's index simplifiers on the same random index expressions.

Seeded random expressions of the shapes the indexing code builds (ranges, some with a Variable end,
Variables, constants; ADD, MUL, IDIV, MOD, MAX, NEG, comparisons, AND, WHERE, CAST, gated loads; flat
indices split by // and % and joined again) go through `symbolic_rules` and through polygrad-js's
`simplifyIndices` (one Node process, tools/simplify_cases.js). For random values of their ranges and
Variables, both simplified expressions must evaluate to the original's value (a reference evaluator
here, C's int32/int64 semantics), both languages must find the same bounds for the original and the
same coefficient of each range in it (`range_coeff`, which lowering and fission use), and the
JavaScript result may not cost more nodes than Python's: both interpret one rule table
(polygrad/definitions/symbolic_rules.py) with the same engine, so it is the very same expression.
CI runs 400 expressions; POLY_LONG_TESTS=1 runs 4,000. Skipped without `node`.
"""
from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
from pathlib import Path

import pytest

from polygrad.dtype import dtypes
from polygrad.uop.ops import AxisKind, Ops, UOp
from polygrad.uop.rewrite import graph_rewrite
from polygrad.uop.serialize import decode, encode
from polygrad.uop.symbolic import bounds, range_coeff, symbolic_rules

ROOT = Path(__file__).resolve().parent.parent
NODE = shutil.which("node")
LONG = os.environ.get("POLY_LONG_TESTS", "") not in ("", "0")
COUNT = 4000 if LONG else 400
SAMPLES = 12  # variable assignments each expression is evaluated at
I32, I64 = dtypes.int32, dtypes.int64

pytestmark = pytest.mark.skipif(NODE is None, reason="node is not installed")


# ---------------------------------------------------------------------------------------------------
# random index expressions

class ExprGen:
    """Random int32 index expressions over a few ranges and Variables (seeded)."""

    def __init__(self, rng: random.Random):
        self.rng = rng
        n = UOp(Ops.DEFINE_VAR, I32, (), ("n", 1, 40))
        m = UOp(Ops.DEFINE_VAR, I32, (), ("m", 0, 17))
        self.variables = [n, m]
        self.ranges = [UOp(Ops.RANGE, I32, (UOp.const(I32, e),), (k, AxisKind.GLOBAL)) for k, e in
                       enumerate((rng.randint(1, 48), rng.randint(2, 16), rng.randint(1, 9)))]
        self.ranges.append(UOp(Ops.RANGE, I32, (n,), (3, AxisKind.REDUCE)))  # a loop over a Variable's value
        self.buf = UOp(Ops.DEFINE_GLOBAL, I32, (), (0, (4096,)))

    def const(self, lo: int = -6, hi: int = 40) -> UOp:
        return UOp.const(I32, self.rng.randint(lo, hi))

    def leaf(self) -> UOp:
        r = self.rng.random()
        if r < 0.55:
            return self.rng.choice(self.ranges)
        return self.rng.choice(self.variables) if r < 0.75 else self.const()

    def expr(self, depth: int) -> UOp:
        rng = self.rng
        if depth <= 0 or rng.random() < 0.2:
            return self.leaf()
        sub = lambda: self.expr(depth - 1)  # noqa: E731
        kind = rng.choice(["add", "add", "mulc", "mulc", "mulv", "div", "div", "mod", "mod", "max", "neg",
                           "where", "recombine", "recombine", "nested_div", "nested_mod", "split", "const_left",
                           "identity", "cast_const", "gated_load"])
        if kind == "add":
            return sub() + sub()
        if kind == "mulc":
            return sub() * self.const(-2, 12)
        if kind == "mulv":
            return self.leaf() * self.leaf()
        if kind in ("div", "mod"):
            op = Ops.IDIV if kind == "div" else Ops.MOD
            return sub().alu(op, self.const(1, 16))
        if kind == "max":
            return sub().alu(Ops.MAX, sub())
        if kind == "neg":
            return sub() + (-sub())
        if kind == "where":
            return self.cond(depth - 1).where(sub(), sub())
        if kind == "recombine":  # a flat index split into two axes and joined again, maybe with more terms
            x, c = sub(), self.const(1, 12)
            terms = [(x // c) * c, x % c] + [sub() for _ in range(rng.randint(0, 2))]
            rng.shuffle(terms)
            out = terms[0]
            for t in terms[1:]:
                out = out + t
            return out
        if kind == "nested_div":
            return (sub() // self.const(1, 8)) // self.const(1, 8)
        if kind == "nested_mod":
            b = rng.randint(1, 8)
            return (sub() % UOp.const(I32, b * rng.choice([1, 2, 3, rng.randint(1, 9)]))) % UOp.const(I32, b)
        if kind == "split":  # (r*c + j) // c and % c with 0 <= j < c: the common tiled index
            r, j = rng.sample(self.ranges[:3], 2)
            c = UOp.const(I32, max(1, vend(j)) * rng.randint(1, 3))
            e = r * c + j + (self.const(0, 3) if rng.random() < 0.3 else UOp.const(I32, 0))
            return e.alu(rng.choice([Ops.IDIV, Ops.MOD]), c)
        if kind == "const_left":
            return self.const().alu(rng.choice([Ops.ADD, Ops.MUL]), sub())
        if kind == "identity":
            op, c = rng.choice([(Ops.ADD, 0), (Ops.MUL, 1), (Ops.MUL, 0), (Ops.IDIV, 1)])
            return sub().alu(op, UOp.const(I32, c))
        if kind == "cast_const":
            return UOp(Ops.CAST, I32, (UOp.const(I64, rng.randint(-2**33, 2**33)),)) % UOp.const(I32, 97)
        g = self.cond(depth - 1)  # a load gated by g, selected by g against 0 (the padded read)
        ld = UOp(Ops.LOAD, I32, (UOp(Ops.INDEX, I32, (self.buf, sub(), g)),))
        return g.where(ld, UOp.const(I32, 0))

    def cond(self, depth: int) -> UOp:
        rng = self.rng
        r = rng.random()
        if r < 0.45:
            return self.expr(depth).alu(Ops.CMPLT, self.expr(depth))
        if r < 0.6:
            return self.expr(depth).alu(rng.choice([Ops.CMPNE, Ops.CMPEQ]), self.expr(depth))
        if r < 0.75:
            return self.cond(depth - 1).alu(Ops.AND, self.cond(depth - 1))
        if r < 0.9:
            t = UOp.const(dtypes.bool, True)
            c = self.cond(depth - 1)
            return t.alu(Ops.AND, c) if rng.random() < 0.5 else c.alu(Ops.AND, t)
        return UOp.const(dtypes.bool, rng.random() < 0.5)

    def root(self) -> UOp:
        e = self.expr(self.rng.randint(1, 5))
        if self.rng.random() < 0.25:  # the int64 index of a big buffer
            e = UOp(Ops.CAST, I64, (e,)) * UOp.const(I64, self.rng.randint(1, 5)) + UOp.const(I64, 3)
        return e


def vend(r: UOp) -> int:
    return int(r.src[0].arg)


# ---------------------------------------------------------------------------------------------------
# a reference evaluator (C semantics) and a cost

def _wrap(v: int, bits: int) -> int:
    v &= (1 << bits) - 1
    return v - (1 << bits) if v >> (bits - 1) else v


def _tdiv(a: int, b: int) -> int:
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b >= 0) else -q


def evaluate(root: UOp, env: dict) -> tuple[int, bool]:
    """(value, overflowed): the value for env {('range', axis) | ('var', name): int}, each node wrapped
    to its dtype as C computes; overflowed says some node's exact value did not fit its dtype."""
    val: dict[UOp, int] = {}
    over = False
    for n in root.toposort():
        s = [val.get(x) for x in n.src]
        op = n.op
        if op is Ops.CONST:
            v = int(n.arg)
        elif op is Ops.RANGE:
            v = env[("range", n.arg[0])]
        elif op is Ops.DEFINE_VAR:
            v = env[("var", n.arg[0])]
        elif op in (Ops.DEFINE_GLOBAL, Ops.INDEX):
            v = 0
        elif op is Ops.LOAD:  # the buffer holds 7*i + 3 at index i; a gated-off load gives 0
            ix = n.src[0]
            gate = len(ix.src) < 3 or val[ix.src[2]]
            v = 7 * val[ix.src[1]] + 3 if gate else 0
        elif op is Ops.ADD:
            v = s[0] + s[1]
        elif op is Ops.MUL:
            v = s[0] * s[1]
        elif op is Ops.NEG:
            v = -s[0]
        elif op is Ops.IDIV:
            v = _tdiv(s[0], s[1])
        elif op is Ops.MOD:
            v = s[0] - s[1] * _tdiv(s[0], s[1])
        elif op is Ops.MAX:
            v = max(s)
        elif op is Ops.CMPLT:
            v = int(s[0] < s[1])
        elif op is Ops.CMPNE:
            v = int(s[0] != s[1])
        elif op is Ops.CMPEQ:
            v = int(s[0] == s[1])
        elif op is Ops.AND:
            v = s[0] & s[1]
        elif op is Ops.OR:
            v = s[0] | s[1]
        elif op is Ops.WHERE:
            v = s[1] if s[0] else s[2]
        elif op is Ops.CAST:
            v = s[0]
        else:
            raise AssertionError(f"no reference semantics for {op}")
        if n.dtype is dtypes.bool:
            v = int(v != 0)
        elif n.dtype is not None and n.dtype.is_int:
            w = _wrap(v, 8 * n.dtype.itemsize)
            over |= w != v and op is not Ops.CAST
            v = w
        val[n] = v
    return val[root], over


_INFIX = {Ops.ADD: "+", Ops.MUL: "*", Ops.IDIV: "//", Ops.MOD: "%", Ops.CMPLT: "<", Ops.CMPNE: "!=",
          Ops.CMPEQ: "==", Ops.AND: "&", Ops.OR: "|"}


def show(u: UOp) -> str:
    """The expression in infix (failure messages)."""
    if u.op is Ops.CONST:
        return repr(u.arg) if u.dtype is I32 or u.dtype is dtypes.bool else f"{u.arg}:{u.dtype.name}"
    if u.op is Ops.RANGE:
        return f"r{u.arg[0]}"
    if u.op is Ops.DEFINE_VAR:
        return u.arg[0]
    if u.op in _INFIX:
        return f"({show(u.src[0])} {_INFIX[u.op]} {show(u.src[1])})"
    if u.op is Ops.LOAD:
        ix = u.src[0]
        return f"buf[{', '.join(show(s) for s in ix.src[1:])}]"
    if u.op is Ops.CAST:
        return f"{u.dtype.name}({show(u.src[0])})"
    return f"{u.op.name.lower()}({', '.join(show(s) for s in u.src)})"


def same_bounds(py: tuple[int, int], js: tuple[int, int]) -> bool:
    """Equal, where JavaScript's doubles can tell (an unknown bound is about 2**62 in both)."""
    exact = 2**53
    return all(a == b if abs(a) < exact else abs(b) >= exact // 2 and (a < 0) == (b < 0) for a, b in zip(py, js))


def cost(root: UOp) -> int:
    """Nodes in the expression (each shared sub-expression once)."""
    return len(root.toposort())


def assignments(root: UOp, rng: random.Random) -> list[dict]:
    """Random values of the expression's Variables and ranges (the extremes among them)."""
    nodes = root.toposort()
    variables = sorted({n.arg for n in nodes if n.op is Ops.DEFINE_VAR} | {("n", 1, 40)})
    ranges = sorted({n.arg[0]: n for n in nodes if n.op is Ops.RANGE}.items())
    out = []
    for i in range(SAMPLES):
        env: dict = {}
        for name, lo, hi in variables:
            env[("var", name)] = lo if i == 0 else hi if i == 1 else rng.randint(lo, hi)
        for axis, r in ranges:
            end = r.src[0]
            top = env[("var", end.arg[0])] if end.op is Ops.DEFINE_VAR else int(end.arg)
            env[("range", axis)] = 0 if i == 0 else top - 1 if i == 1 else rng.randint(0, top - 1)
        out.append(env)
    return out


# ---------------------------------------------------------------------------------------------------

def js_simplify(roots: list[UOp], tmp: Path, decompose: bool = False) -> tuple[list[UOp], dict]:
    """polygrad-js's simplified roots (transcendentals decomposed first if asked), and what it found of the
    original roots: {"bounds": [(min, max)], "coeffs": [{axis id: range coefficient}]}."""
    plan, out = tmp / "plan.json", tmp / "out.json"
    plan.write_text(json.dumps({"kernels": encode(roots)}))
    proc = subprocess.run([NODE, str(ROOT / "polygrad-js" / "tools" / "simplify_cases.js"), str(plan), str(out)]
                          + (["--decompose"] if decompose else []), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(out.read_text())
    coeffs = [{int(axis): c for axis, c in found.items()} for found in got["coeffs"]]
    return decode(got["kernels"]), {"bounds": [tuple(b) for b in got["bounds"]], "coeffs": coeffs}


def corpus(seed: int, count: int) -> list[UOp]:
    rng = random.Random(seed)
    return [ExprGen(rng).root() for _ in range(count)]


def test_both_simplifiers_keep_values_and_js_costs_no_more(tmp_path):
    roots = corpus(29, COUNT)
    js_roots, found = js_simplify(roots, tmp_path)
    rng = random.Random(2929)
    failures = []
    checked = 0
    for i, (root, js) in enumerate(zip(roots, js_roots)):
        py = graph_rewrite(root, symbolic_rules)
        if cost(js) > cost(py) or js is not py:  # one table, one engine: the same expression
            failures.append(f"#{i}: polygrad-js leaves {cost(js)} nodes, Python {cost(py)}:\n"
                            f"  original {show(root)}\n  python   {show(py)}\n  js       {show(js)}")
        if not same_bounds(bounds(root), found["bounds"][i]):
            failures.append(f"#{i}: bounds differ: Python {bounds(root)}, polygrad-js {found['bounds'][i]}: "
                            f"{show(root)}")
        coeffs = {r.arg[0]: range_coeff(root, r) for r in root.toposort() if r.op is Ops.RANGE}
        if coeffs != found["coeffs"][i]:
            failures.append(f"#{i}: range coefficients differ: Python {coeffs}, polygrad-js {found['coeffs'][i]}")
        for env in assignments(root, rng):
            want, over = evaluate(root, env)
            if over:
                continue  # C leaves signed overflow undefined: only well-defined points are compared
            checked += 1
            for lang, got in (("Python", py), ("polygrad-js", js)):
                have = evaluate(got, env)[0]
                if have != want:
                    failures.append(f"#{i}: {lang}'s result gives {have}, the original {want} at {env}:\n"
                                    f"  original {show(root)}\n  result   {show(got)}")
        if len(failures) > 8:
            break
    assert not failures, "\n".join(failures)
    assert checked > COUNT * SAMPLES // 2  # most points are well defined: the comparison is not vacuous


def test_corpus_exercises_every_rule():
    """Every row of the rule table fires on the corpus (a row the corpus never reaches is not tested)."""
    from polygrad.definitions.symbolic_rules import RULES
    from polygrad.uop.rewrite import PatternMatcher
    fired: set[int] = set()

    def spy(k: int, fn):
        def rule(*a, **kw):
            out = fn(*a, **kw)
            if out is not None:
                fired.add(k)
            return out
        return rule

    spied = PatternMatcher([(pat, spy(k, fn)) for k, (pat, fn) in enumerate(symbolic_rules.rules)], name="spied")
    for root in corpus(29, COUNT):
        graph_rewrite(root, spied)
    missing = [RULES[k]["doc"] for k in range(len(RULES)) if k not in fired]
    assert not missing, missing
