"""Helpers every renderer shares: range dependencies and the reduces a store needs first."""
from __future__ import annotations

from polygrad.uop.ops import Ops, UOp


class RangeDeps:
    """deps(u): the RANGE nodes a value depends on (a REDUCE binds its own ranges)."""

    def __init__(self) -> None:
        self.memo: dict[UOp, frozenset[UOp]] = {}

    def __call__(self, u: UOp) -> frozenset[UOp]:
        hit = self.memo.get(u)
        if hit is not None:
            return hit
        for node in u.toposort():
            if node in self.memo:
                continue
            if node.op is Ops.RANGE:
                self.memo[node] = frozenset((node,))
                continue
            acc: frozenset[UOp] = frozenset()
            for s in node.src:
                acc = acc | self.memo[s]
            if node.op is Ops.REDUCE:
                acc = acc - frozenset(node.src[1:])
            self.memo[node] = acc
        return self.memo[u]


def top_level_reduces(u: UOp) -> list[UOp]:
    """REDUCE nodes reachable from u without passing through another REDUCE, sources first."""
    out: list[UOp] = []
    seen: set[UOp] = set()

    def walk(n: UOp) -> None:
        stack = [n]
        while stack:
            x = stack.pop()
            if x in seen:
                continue
            seen.add(x)
            if x.op is Ops.REDUCE:
                out.append(x)
                continue
            stack.extend(x.src)

    walk(u)
    order = {n: i for i, n in enumerate(u.toposort())}
    return sorted(out, key=lambda n: order[n])
