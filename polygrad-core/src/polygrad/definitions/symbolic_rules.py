"""The index-simplification rules as data: one table that polygrad-core (`uop/symbolic.py`) and
polygrad-js (`src/simplify.js`, through the generated `src/generated/symbolic_rules.js`) interpret.

Stage: definitions. Input: nothing. Output: `RULES`, the ordered rows (a node tries them in this
order), and the vocabulary both languages implement, no more and no less: `CONDITIONS`, `BUILDERS`,
`VALUES` and `CODE` (tests/test_symbolic_rules.py checks both sides against these names).

A row is a dict:

    doc      why the rewrite keeps the value (copied into the generated JavaScript)
    pattern  what it matches (below)
    when     conditions that must all hold: [[condition, capture, ...], ...]
    build    the replacement, an expression (below); absent in a code row
    code     a code row's function (CODE), called with the captures named by "args", in order; it
             returns the replacement or nothing. Code rows are the rewrites that walk a sum's terms
             or split cases on bounds: a loop does not read well as data.

Patterns: {"op": [op names], "name": capture, "src": [pattern, ...], "arg": number or bool}, every key
optional. A pattern matches a node whose op is listed (any op without "op"), whose arg equals "arg"
as a number (True == 1, 0 == 0.0), and whose sources match "src" one for one (any sources without
"src"). "name" captures the node; a name used twice must capture the same node.

Expressions: a string is the node captured under that name; a list is [builder, operand, ...].
Values (numbers computed from constants, inside "const") are int literals or [value, operand, ...].
Integers are exact (unbounded) until "const" wraps them to the dtype, as C arithmetic does.
"""
from __future__ import annotations

from typing import Any

# what a condition, builder, value or code function means: both languages implement exactly these
CONDITIONS = {
    "is_int": "the node's dtype is an integer type",
    "is_bool": "the node's dtype is bool",
    "has_dtype": "the node has a dtype (it is a value, not a structural node)",
    "not_bool": "the node has a dtype other than bool",
    "not_const": "the node is not a CONST",
    "nonneg": "the node's smallest value (bounds) is >= 0",
    "positive": "the CONST's value is > 0",
    "nonzero": "the CONST's value is not 0",
    "divides": "[divides, b, a]: CONST a's value is a multiple of CONST b's value",
    "same": "[same, a, b]: a and b are one node",
    "equal": "[equal, c1, c2, ...]: the CONSTs hold equal values",
}
BUILDERS = {
    "const": "[const, like, value]: a CONST of like's dtype holding value, wrapped to the dtype",
    "alu": "[alu, OP, a, b]: the node OP(a, b) with a's dtype (bool for a comparison)",
    "with_src": "[with_src, x, a, b, ...]: x's op, dtype and arg over the sources a, b, ...",
    "select": "[select, c, a, b]: a when CONST c's value is true (not zero), else b",
}
VALUES = {
    "arg": "[arg, c]: CONST c's value",
    "add": "[add, v, w]: v + w",
    "mul": "[mul, v, w]: v * w",
    "neg": "[neg, v]: -v (exact for floats too)",
}
CODE = {
    "fold_binary": "x(CONST, CONST) of an int or bool op: the folded CONST (C's truncating // and %)",
    "divmod_fold": "a sum holding (a//c)*c and a%c: a in their place",
    "div_simplify": "x // c by x's bounds and its terms' constant factors",
    "mod_simplify": "x % c by x's bounds and its terms' constant factors",
    "cmp_fold": "a < b decided by the bounds of a and b",
    "gated_load_select": "WHERE(g, LOAD gated by g, +0): the load",
}


def pat(op: str | list[str] | None = None, *src: dict, name: str | None = None,
        arg: int | bool | None = None) -> dict[str, Any]:
    """A pattern: pat("ADD", pat(name="y"), const(arg=0)); src=() means "any sources"."""
    out: dict[str, Any] = {}
    if op is not None:
        out["op"] = [op] if isinstance(op, str) else list(op)
    if name is not None:
        out["name"] = name
    if src:
        out["src"] = list(src)
    if arg is not None:
        out["arg"] = arg
    return out


def const(name: str | None = None, arg: int | bool | None = None) -> dict[str, Any]:
    """A CONST pattern."""
    return pat("CONST", name=name, arg=arg)


def row(doc: str, pattern: dict, build: Any = None, when: tuple = (), code: str | None = None,
        args: tuple[str, ...] = ()) -> dict[str, Any]:
    """One rule row: data (pattern, when, build) or a code row (pattern, code, args)."""
    out: dict[str, Any] = {"doc": doc, "pattern": pattern}
    if when:
        out["when"] = [list(w) for w in when]
    if code is not None:
        out["code"] = code
        out["args"] = list(args)
    else:
        out["build"] = build
    return out


def _sum_args(op: str, a: str, b: str) -> list:
    return [op, ["arg", a], ["arg", b]]


_y, _z = pat(name="y"), pat(name="z")
_FOLD_OPS = ["ADD", "MUL", "MAX", "IDIV", "MOD", "CMPLT", "CMPNE", "CMPEQ", "AND", "OR", "XOR"]

RULES: list[dict[str, Any]] = [
    row("constant folding (integers and bools: float folding is the compiler's, which knows the rounding)",
        pat(_FOLD_OPS, const(), const(), name="x"), code="fold_binary", args=("x",)),
    row("-c folds, exact for floats too",
        pat("NEG", const("c"), name="x"), ["const", "x", ["neg", ["arg", "c"]]], when=(("not_bool", "x"),)),
    row("constants go on the right of commutative ops",
        pat(["ADD", "MUL"], const("c"), _y, name="x"), ["with_src", "x", "y", "c"], when=(("not_const", "y"),)),
    row("y + 0 is y", pat("ADD", _y, const(arg=0)), "y", when=(("is_int", "y"),)),
    row("y * 1 is y in every dtype (exact for floats too: -0.0, infinities and NaN keep their value)",
        pat("MUL", _y, const(arg=1)), "y", when=(("has_dtype", "y"),)),
    row("y * 0 is 0", pat("MUL", _y, const(arg=0), name="x"), ["const", "x", 0], when=(("is_int", "y"),)),
    row("y // 1 is y", pat("IDIV", _y, const(arg=1)), "y", when=(("is_int", "y"),)),
    row("reassociate constants: (y + c1) + c2",
        pat("ADD", pat("ADD", _y, const("c1")), const("c2")),
        ["alu", "ADD", "y", ["const", "y", _sum_args("add", "c1", "c2")]], when=(("is_int", "y"),)),
    row("reassociate constants: (y * c1) * c2",
        pat("MUL", pat("MUL", _y, const("c1")), const("c2")),
        ["alu", "MUL", "y", ["const", "y", _sum_args("mul", "c1", "c2")]], when=(("is_int", "y"),)),
    row("distribute: (y + z) * c -> y*c + z*c",
        pat("MUL", pat("ADD", _y, _z), const("c")),
        ["alu", "ADD", ["alu", "MUL", "y", "c"], ["alu", "MUL", "z", "c"]], when=(("is_int", "y"),)),
    row("move constants outward in sums: (y + c) + z -> (y + z) + c",
        pat("ADD", pat("ADD", _y, const("c")), _z), ["alu", "ADD", ["alu", "ADD", "y", "z"], "c"],
        when=(("is_int", "y"), ("not_const", "z"))),
    # (x//c)*c + x%c and x%c + (x//c)*c had rows of their own after this one, which could never fire
    row("(a//c)*c + a%c + rest -> a + rest (C's truncating / and % recombine for any a)",
        pat("ADD", name="x"), code="divmod_fold", args=("x",)),
    row("division by bounds", pat("IDIV", pat(name="x"), const("c")), code="div_simplify", args=("x", "c")),
    row("modulo by bounds", pat("MOD", pat(name="x"), const("c")), code="mod_simplify", args=("x", "c")),
    row("(x // a) // b -> x // (a*b) for non-negative x",
        pat("IDIV", pat("IDIV", pat(name="x"), const("a")), const("b")),
        ["alu", "IDIV", "x", ["const", "x", _sum_args("mul", "a", "b")]],
        when=(("is_int", "x"), ("nonneg", "x"), ("positive", "a"), ("positive", "b"))),
    row("(x % a) % b -> x % b when b divides a, for non-negative x",
        pat("MOD", pat("MOD", pat(name="x"), const("a")), const("b")),
        ["alu", "MOD", "x", ["const", "x", ["arg", "b"]]],
        when=(("is_int", "x"), ("nonneg", "x"), ("positive", "b"), ("divides", "b", "a"))),
    row("comparisons decided by bounds",
        pat("CMPLT", pat(name="a"), pat(name="b"), name="x"), code="cmp_fold", args=("x", "a", "b")),
    row("y & True is y", pat("AND", _y, const(arg=True)), "y", when=(("is_bool", "y"),)),
    row("True & y is y", pat("AND", const(arg=True), _y), "y", when=(("is_bool", "y"),)),
    row("a select by a constant", pat("WHERE", const("c"), pat(name="a"), pat(name="b")), ["select", "c", "a", "b"]),
    row("a select between one value", pat("WHERE", pat(), pat(name="a"), pat(name="b")), "a",
        when=(("same", "a", "b"),)),
    row("a load gated by g gives +0 where g is false (kernel IR): selecting it by g against +0 changes nothing",
        pat("WHERE", pat(name="g"), pat("LOAD", name="ld"), const("c")),
        code="gated_load_select", args=("g", "ld", "c")),
    row("integer casts of integer constants fold (wrapped to the new dtype)",
        pat("CAST", const("c"), name="x"), ["const", "x", ["arg", "c"]], when=(("is_int", "x"), ("is_int", "c"))),
]
