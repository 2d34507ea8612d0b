"""UOp.toposort splices cached orders (uop/ops.py): the order it gives is exactly the post-order of a plain
depth-first walk taking sources in order, whichever nodes were ordered before and in whatever sequence."""
from __future__ import annotations

import random

import pytest

from polygrad.dtype import dtypes
from polygrad.uop.ops import Ops, UOp


def _plain_dfs(root: UOp) -> list[UOp]:
    """The reference: recursive post-order, sources left to right, each node once."""
    out: list[UOp] = []
    seen: set[int] = set()

    def visit(u: UOp) -> None:
        if id(u) in seen:
            return
        seen.add(id(u))
        for s in u.src:
            visit(s)
        out.append(u)

    visit(root)
    return out


def _random_dag(rng: random.Random, n: int, tag: int) -> list[UOp]:
    """n nodes, each with 0-3 sources drawn (with repeats) from the nodes made before it."""
    nodes: list[UOp] = []
    for i in range(n):
        k = 0 if not nodes else rng.choice((0, 1, 1, 2, 2, 3))
        src = tuple(rng.choice(nodes[max(0, len(nodes) - rng.choice((3, 10, 1000))):]) for _ in range(k))
        nodes.append(UOp(Ops.ADD if src else Ops.CONST, dtypes.int32, src, (tag, i) if src else tag * 10_000 + i))
    return nodes


@pytest.mark.parametrize("seed", range(60))
def test_spliced_order_is_the_plain_dfs_post_order(seed: int) -> None:
    rng = random.Random(seed)
    nodes = _random_dag(rng, rng.randint(1, 60), seed)
    roots = [nodes[-1], *rng.sample(nodes, min(len(nodes), rng.randint(0, 8)))]
    rng.shuffle(roots)  # order some inner nodes first (in random sequence), so later walks splice them
    expected = {id(r): _plain_dfs(r) for r in roots}
    for r in roots:
        assert r.toposort() == expected[id(r)]
    for r in roots:  # and again, from the cache
        assert r.toposort() == expected[id(r)]
    assert nodes[-1].toposort() == _plain_dfs(nodes[-1])


def test_shared_sources_appear_once_and_before_their_users() -> None:
    a = UOp(Ops.CONST, dtypes.int32, (), 1)
    b = UOp(Ops.ADD, dtypes.int32, (a, a), "b")
    c = UOp(Ops.ADD, dtypes.int32, (b, a), "c")
    b.toposort()
    d = UOp(Ops.ADD, dtypes.int32, (a, c, b), "d")
    assert d.toposort() == [a, b, c, d] == _plain_dfs(d)


def test_cached_order_holds_no_reference_to_its_own_node() -> None:
    a = UOp(Ops.CONST, dtypes.int32, (), 7)
    b = UOp(Ops.ADD, dtypes.int32, (a,), "x")
    b.toposort()
    assert b not in b._toposort
