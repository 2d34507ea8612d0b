"""The pattern-rewrite engine: `UPat` patterns, `PatternMatcher` rule tables, `graph_rewrite` passes.

Stage: shared. Input: a UOp graph and a rule table. Output: the graph rewritten bottom-up to a
fixed point. Rules are data: rows of (pattern, function); a function returns a new UOp or None.
"""
from __future__ import annotations

from typing import Any, Callable, Iterable

from polygrad.uop.ops import Ops, UOp


class UPat:
    """Matches a UOp by op, dtype, arg and sources; `name` captures the node for the rule function."""

    __slots__ = ("ops", "name", "src", "arg", "dtype", "allow_any_len")

    def __init__(self, op: "Ops | Iterable[Ops] | None" = None, name: str | None = None,
                 src: "tuple[UPat, ...] | UPat | None" = None, arg: Any = None, dtype: Any = None):
        if isinstance(op, Ops):
            op = (op,)
        self.ops = frozenset(op) if op is not None else None
        self.name = name
        self.src = src
        self.arg = arg
        self.dtype = dtype

    @staticmethod
    def var(name: str | None = None, dtype: Any = None) -> "UPat":
        return UPat(name=name, dtype=dtype)

    @staticmethod
    def cvar(name: str | None = None, dtype: Any = None) -> "UPat":
        return UPat(Ops.CONST, name=name, dtype=dtype)

    def match(self, u: UOp, store: dict[str, UOp]) -> bool:
        if self.ops is not None and u.op not in self.ops:
            return False
        if self.arg is not None and u.arg != self.arg:
            return False
        if self.dtype is not None and u.dtype not in (self.dtype if isinstance(self.dtype, tuple) else (self.dtype,)):
            return False
        if self.name is not None:
            prev = store.get(self.name)
            if prev is not None and prev is not u:
                return False
            store[self.name] = u
        if self.src is None:
            return True
        if isinstance(self.src, UPat):  # every source matches the same pattern
            return all(self.src.match(s, store) for s in u.src)
        if len(self.src) != len(u.src):
            return False
        return all(p.match(s, store) for p, s in zip(self.src, u.src))


Rule = tuple[UPat, Callable[..., "UOp | None"]]


class PatternMatcher:
    """An ordered rule table, indexed by op so each node only tries the rules that can match it."""

    def __init__(self, rules: list[Rule], name: str = "rules"):
        self.name = name
        self.rules = rules
        self.by_op: dict[Ops, list[Rule]] = {}
        self.any_op: list[Rule] = []
        for pat, fn in rules:
            if pat.ops is None:
                self.any_op.append((pat, fn))
            else:
                for op in pat.ops:
                    self.by_op.setdefault(op, []).append((pat, fn))
        for op in self.by_op:
            self.by_op[op] = sorted(self.by_op[op] + self.any_op, key=lambda r: rules.index(r) if r in rules else 0)

    def __add__(self, other: "PatternMatcher") -> "PatternMatcher":
        return PatternMatcher(self.rules + other.rules, f"{self.name}+{other.name}")

    def rewrite(self, u: UOp, ctx: Any = None) -> "UOp | None":
        for pat, fn in self.by_op.get(u.op, self.any_op):
            store: dict[str, UOp] = {}
            if pat.match(u, store):
                out = fn(ctx, **store) if ctx is not None else fn(**store)
                if out is not None and out is not u:
                    return out
        return None


def graph_rewrite(sink: UOp, matcher: PatternMatcher, ctx: Any = None, name: str | None = None) -> UOp:
    """Rewrite every node bottom-up, re-applying rules to each result until nothing changes."""
    done: dict[UOp, UOp] = {}

    def visit(root: UOp) -> UOp:
        stack: list[tuple[UOp, int]] = [(root, 0)]
        while stack:
            node, stage = stack.pop()
            if node in done:
                continue
            if stage == 0:
                stack.append((node, 1))
                stack.extend((s, 0) for s in reversed(node.src) if s not in done)
                continue
            new_src = tuple(done[s] for s in node.src)
            cur = node if new_src == node.src else node.replace(src=new_src)
            for _ in range(1000):
                nxt = matcher.rewrite(cur, ctx)
                if nxt is None:
                    break
                if nxt not in done and any(s not in done for s in nxt.toposort()):
                    nxt = visit(nxt)
                cur = nxt
            done[node] = cur
        return done[root]

    return visit(sink)
