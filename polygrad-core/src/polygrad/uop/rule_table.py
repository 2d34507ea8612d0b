"""Rule rows written as data (polygrad/definitions/*_rules.py) turned into a `PatternMatcher`.

Stage: shared (rule tables). Input: rows of the pattern language documented in
polygrad/definitions/symbolic_rules.py, and the implementations of the table's named conditions and
code functions. Output: a PatternMatcher whose rows are the data's, in the data's order.
polygrad-js interprets the same rows (src/ruletable.js); the builders and values, which need nothing
but the IR, are implemented here, and the conditions and code functions by the rule set's module.

>>> from polygrad.uop.ops import Ops, UOp
>>> from polygrad.dtype import dtypes
>>> rows = [{"pattern": {"op": ["ADD"], "src": [{"name": "y"}, {"op": ["CONST"], "arg": 0}]}, "build": "y"}]
>>> m = compile_rules(rows, {}, {})
>>> x = UOp(Ops.DEFINE_VAR, dtypes.int32, (), ("n", 0, 9))
>>> m.rewrite(x + 0) is x
True
"""
from __future__ import annotations

from typing import Any, Callable

from polygrad.errors import PolygradError
from polygrad.uop.ops import Ops, UOp
from polygrad.uop.rewrite import PatternMatcher, UPat

Captures = dict[str, UOp]
Build = Callable[[Captures], Any]


def _arg(name: str) -> Build:
    return lambda cap: cap[name].arg


def _arith(fn: Callable[..., Any]) -> Callable[..., Build]:
    def make(*operands: Any) -> Build:
        parts = [_value(o) for o in operands]
        return lambda cap: fn(*(p(cap) for p in parts))
    return make


# each entry makes, from an expression's operands, the function that computes it from the captures
VALUES: dict[str, Callable[..., Build]] = {
    "arg": _arg,
    "add": _arith(lambda v, w: v + w),
    "mul": _arith(lambda v, w: v * w),
    "neg": _arith(lambda v: -v),
}


def _const(like: str, value: Any) -> Build:
    compute = _value(value)
    return lambda cap: UOp.const(cap[like].dtype, compute(cap))


def _alu(op: str, a: Any, b: Any) -> Build:
    kind, left, right = Ops[op], _builder(a), _builder(b)
    return lambda cap: left(cap).alu(kind, right(cap))


def _with_src(x: str, *src: Any) -> Build:
    parts = [_builder(s) for s in src]
    return lambda cap: cap[x].replace(src=tuple(p(cap) for p in parts))


def _select(c: str, a: str, b: str) -> Build:
    return lambda cap: cap[a] if cap[c].arg else cap[b]


BUILDERS: dict[str, Callable[..., Build]] = {"const": _const, "alu": _alu, "with_src": _with_src, "select": _select}


def pattern(p: dict[str, Any]) -> UPat:
    """The UPat of a data pattern."""
    src = p.get("src")
    return UPat(tuple(Ops[o] for o in p["op"]) if "op" in p else None, name=p.get("name"),
                src=tuple(pattern(s) for s in src) if src is not None else None, arg=p.get("arg"))


def _value(v: Any) -> Build:
    if isinstance(v, int):
        return lambda cap: v
    return VALUES[v[0]](*v[1:])


def _builder(e: Any) -> Build:
    """The function that builds expression e from the captures."""
    if isinstance(e, str):
        return lambda cap: cap[e]
    if e[0] not in BUILDERS:
        raise PolygradError(f"internal: unknown builder {e[0]!r} in a rule table")
    return BUILDERS[e[0]](*e[1:])


def _check(condition: Callable[..., bool], names: tuple[str, ...]) -> Callable[[Captures], bool]:
    if len(names) == 1:
        name = names[0]
        return lambda cap: condition(cap[name])
    return lambda cap: condition(*(cap[n] for n in names))


def _data_rule(row: dict[str, Any], conditions: dict[str, Callable[..., bool]]) -> Callable[..., UOp | None]:
    checks = [_check(conditions[w[0]], tuple(w[1:])) for w in row.get("when", ())]
    build = _builder(row["build"])

    def rule(**cap: UOp) -> UOp | None:
        for check in checks:
            if not check(cap):
                return None
        return build(cap)

    return rule


def _captures(p: dict[str, Any], out: set[str]) -> set[str]:
    if "name" in p:
        out.add(p["name"])
    for s in p.get("src", ()):
        _captures(s, out)
    return out


def _code_rule(row: dict[str, Any], code: dict[str, Callable[..., UOp | None]]) -> Callable[..., UOp | None]:
    fn, names = code[row["code"]], tuple(row["args"])
    if set(names) == _captures(row["pattern"], set()):
        return fn  # the function's parameters are the captures' names: called with them directly
    return lambda **cap: fn(*(cap[n] for n in names))


def compile_rules(rows: list[dict[str, Any]], conditions: dict[str, Callable[..., bool]],
                  code: dict[str, Callable[..., UOp | None]], name: str = "rules") -> PatternMatcher:
    """A PatternMatcher over the rows, in order: data rows through the builders here and `conditions`,
    code rows through `code` (both keyed by the names the rows use)."""
    out = []
    for row in rows:
        fn = _code_rule(row, code) if "code" in row else _data_rule(row, conditions)
        out.append((pattern(row["pattern"]), fn))
    return PatternMatcher(out, name=name)
