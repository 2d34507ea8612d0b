"""The op table (polygrad/definitions/ops.py) describes the graphs polygrad really builds, at every level.

Every node of a corpus of real graphs is checked against its op's row: the level it is found at is one of
the row's levels, its src count is in the row's range, and an elementwise op's dtypes follow the row's
class and relation. The corpus: tensor graphs (forward and backward of an MLP, every elementwise op, the
movement ops, gather/scatter, assign, copy, custom kernels, symbolic sizes), the kernels the scheduler
builds from them and the stored kernels of the bundles polygrad-js's tests load (kernel IR), those
kernels lowered for the default device, and a custom kernel's body before it is devectorized. Every row's
levels are met by some node of the corpus, so a level the table claims is one polygrad uses.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from polygrad import Tensor, Variable, bundle, dtypes, nn
from polygrad.codegen.lower import lower
from polygrad.codegen.passes import simplify_indices
from polygrad.codegen.search import choose_opts
from polygrad.definitions import ops as table
from polygrad.device import Device, open_device
from polygrad.schedule.normalize import normalize
from polygrad.schedule.template import build_template
from polygrad.uop import serialize
from polygrad.uop.ops import KernelInfo, Ops, UOp

from conftest import DEVICES

FIXTURES = Path(__file__).resolve().parents[1] / "polygrad-js" / "test" / "fixtures"
CLASSES = {
    table.ANY: lambda dt: True,
    table.FLOAT: lambda dt: dt.is_float,
    table.INT: lambda dt: dt.is_int,
    table.INT_OR_BOOL: lambda dt: dt.is_int or dt is dtypes.bool,
}


def row_problem(n: UOp, level: str) -> str | None:
    """What in node n disagrees with its op's row at this level (None: nothing)."""
    row = table.BY_NAME[n.op.name]
    if level not in row.levels:
        return f"{n.op.name} met at level {level!r}, the table says {row.levels}"
    lo, hi = table.arity_range(row)
    if len(n.src) < lo or (hi is not None and len(n.src) > hi):
        return f"{n.op.name} has {len(n.src)} srcs, the table says {row.src}"
    src = [s.dtype for s in n.src]
    rel, ok = row.relation, CLASSES.get(row.dtypes, lambda dt: True)
    if rel == table.SAME and not (all(d == n.dtype for d in src) and ok(n.dtype)):
        return f"{n.op.name} {n.dtype} of {src} is not one {row.dtypes} dtype"
    if rel == table.COMPARE and not (n.dtype is dtypes.bool and all(d == src[0] for d in src) and ok(src[0])):
        return f"{n.op.name} {n.dtype} of {src} is not a bool of one {row.dtypes} dtype"
    if rel == table.SELECT and not (src[0] is dtypes.bool and src[1] == src[2] == n.dtype and ok(n.dtype)):
        return f"{n.op.name} {n.dtype} of {src} is not (bool, x, x) -> x"
    if rel == table.REINTERPRET and (src[0].itemsize != n.dtype.itemsize or dtypes.bool in (src[0], n.dtype)):
        return f"{n.op.name} {src[0]} -> {n.dtype} changes the width"
    return None


def custom_body(out, a, b):
    i = UOp.range(out.ctx, 2, 0)
    pair = UOp.vectorize(a[i * 2 + 1], a[i * 2]) * 3.0
    return out[i * 2].store(pair).end(i).sink(arg=KernelInfo(name="pairs"))


def every_op_body(out, a, b):
    """A custom kernel body using every elementwise op, a REDUCE and a Variable (a: float32, b: int32)."""
    n = Variable("n", 1, 4)
    i, r = UOp.range(out.ctx, n, 0), UOp.range(out.ctx, 4, 1, "reduce")
    x, k = a[i], b[i]
    f = x.alu(Ops.EXP2) + x.alu(Ops.LOG2) + x.alu(Ops.SIN) + x.alu(Ops.SQRT) + x.alu(Ops.RECIPROCAL)
    f = f + x.alu(Ops.TRUNC) - x.maximum(x.alu(Ops.POW, x)) + x.alu(Ops.FDIV, x)
    k = (k // 3) + (k % 5) + k.alu(Ops.SHL, k) + k.alu(Ops.SHR, k) + (k & k) + (k | k) + (k ^ k)
    c = (x < 1.0) & x.ne(2.0) & x.eq(3.0)
    total = UOp(Ops.REDUCE, dtypes.float32, (a[r], r), Ops.ADD)
    value = c.where(f + k.cast(dtypes.float32), total) + k.bitcast(dtypes.float32)
    return out[i].store(value).end(i).sink(arg=KernelInfo(name="every_op"))


def fma_body(out, a, b):
    i = UOp.range(out.ctx, out.numel(), 0)
    return out[i].store(a[i].fma(a[i], a[i])).end(i).sink(arg=KernelInfo(name="fma_4"))


def tensor_graphs(device: str) -> list[Tensor]:
    """Lazy tensors whose graphs hold every tensor-level op."""
    rng = np.random.default_rng(0)
    x = Tensor(rng.standard_normal((4, 6)).astype(np.float32), device=device)
    i = Tensor(rng.integers(1, 50, (4, 6)).astype(np.int32), device=device)
    u = Tensor(rng.integers(1, 50, (4, 6)).astype(np.uint32), device=device)
    model = nn.Linear(6, 3)
    w = Tensor(rng.standard_normal((6, 3)).astype(np.float32), device=device, requires_grad=True)
    loss = (x @ w).relu().log_softmax(-1).mean() + model(x).square().sum()
    loss.backward()
    v = Variable("rows", 1, 8)
    sym = Tensor(rng.standard_normal((8, 6)).astype(np.float32), device=device)[:v.bind(4)] * 2
    index = Tensor([[0, 2], [1, 0], [3, 3], [2, 1]], device=device)
    base = Tensor.zeros(4, 6, device=device).contiguous()
    base.assign(base + 1)
    a4 = Tensor([1.0, 2.0, 3.0, 4.0], device=device)
    custom = Tensor.empty(4, device=device).custom_kernel(a4, a4, fxn=custom_body)[0]
    fused = Tensor.empty(4, device=device).custom_kernel(a4, a4, fxn=fma_body)[0]
    return [
        loss, w.grad, sym.sum(0), base, custom + 1, fused,
        x.exp2() + x.log2() + x.sin() + x.sqrt() + x.reciprocal() + x.trunc() - x + x.maximum(x * 2) + x.pow(x),
        (x / 3.0) + x.where(x < 0, -x) + (x != 1).where(1.0, 0.0) + (x == 0).cast("float32"),
        i // 3 + i % 5 + (i << 2) + (i >> 1) + (i & 7) + (i | 8) + (i ^ 3) + (i * i).max(),
        (u // 3) + (u % 5) + (u << 1), x.bitcast(dtypes.int32) + i, (x > 0) & (x < 1) | (x == 2) ^ (x == 3),
        x.permute(1, 0).pad(((1, 1), (0, 2))).flip(0).shrink(((1, 5), (0, 3))).reshape(1, 12).expand(2, 12),
        x.sum(1) + x.max(1) + x.prod(1), Tensor.arange(6, device=device) + 1, x.gather(1, index) * 2,
        x.scatter(1, index, 5.0, reduce="add"), x.detach() + x.contiguous(), x.to("INTERP") * 2,
    ]


def corpus(device: str) -> dict[str, list[UOp]]:
    """{level: nodes} of the corpus (each node once per level)."""
    graphs = [t.uop for t in tensor_graphs(device)]
    levels: dict[str, dict[UOp, None]] = {lv: {} for lv in table.LEVELS}
    for g in graphs:
        levels[table.TENSOR].update(dict.fromkeys(g.toposort()))
    asts = stored_kernels()
    for g in graphs:  # scheduled one by one, as each would be realized
        key, inputs = normalize([g], [], {})
        # the scheduler's SINK over the normalised targets is a tensor graph too
        levels[table.TENSOR].update(dict.fromkeys(UOp(Ops.SINK, None, key).toposort()))
        asts += [s.ast for s in build_template(key, len(inputs)).steps if s.kind == "kernel"]
    for ast in asts:
        for k in (ast, simplify_indices(ast)):
            levels[table.KERNEL].update(dict.fromkeys(k.toposort()))
        for dev in DEVICES:  # lowered for every device here (some keep EXP2/LOG2/SIN, some expand them)
            spec = lower(ast, open_device(dev).capabilities, choose_opts(ast, dev))
            levels[table.LOWERED].update(dict.fromkeys(spec.ast.toposort()))
    for body in (custom_body, fma_body, every_op_body):
        args = [UOp.placeholder((4,), dt, k) for k, dt in enumerate((dtypes.float32, dtypes.float32, dtypes.int32))]
        levels[table.CUSTOM].update(dict.fromkeys(body(*args).toposort()))
    return {lv: with_arg_nodes(nodes) for lv, nodes in levels.items()}


def with_arg_nodes(nodes: dict[UOp, None]) -> list[UOp]:
    """The nodes and those of the UOps in their args (symbolic sizes in shapes: BIND, DEFINE_VAR, ADD...)."""
    out = dict(nodes)
    stack = [n.arg for n in nodes if n.op is not Ops.CUSTOM]  # a CUSTOM's arg is its body: custom-level IR
    while stack:
        arg = stack.pop()
        if isinstance(arg, UOp):
            for u in arg.toposort():
                if u not in out:
                    out[u] = None
                    stack.append(u.arg)
        elif type(arg) is tuple:
            stack.extend(arg)
    return list(out)


def stored_kernels() -> list[UOp]:
    """The kernels of the bundles polygrad-js's tests load, today's and those saved at 20af852: kernel IR as
    files hold it."""
    out = []
    for f in sorted(FIXTURES.glob("*.pgb")) + sorted((FIXTURES / "saved_at_20af852").glob("*.pgb")):
        manifest, _ = bundle.read(f.read_bytes())
        out += serialize.decode(manifest["kernels"])
    return out


@pytest.fixture(scope="module")
def nodes() -> dict[str, list[UOp]]:
    return corpus("CPU" if "CPU" in DEVICES else Device.DEFAULT)


@pytest.mark.parametrize("level", table.LEVELS)
def test_every_node_follows_its_row(nodes, level):
    problems = {p for n in nodes[level] if (p := row_problem(n, level)) is not None}
    assert not problems, "\n".join(sorted(problems))


def test_every_level_a_row_claims_is_met(nodes):
    seen = {lv: {n.op.name for n in ns} for lv, ns in nodes.items()}
    unmet = [f"{op.name} at {lv}" for op in table.OPS for lv in op.levels if op.name not in seen[lv]]
    assert not unmet, f"the corpus never meets: {unmet}"


def test_the_check_sees_a_wrong_row(nodes, monkeypatch):
    """The checks can fail: a row that lies about its src count, its dtypes or its levels is caught."""
    add = next(n for n in nodes[table.TENSOR] if n.op is Ops.ADD and n.dtype is dtypes.float32)
    for lie in (table.BY_NAME["ADD"]._replace(src=3), table.BY_NAME["ADD"]._replace(dtypes=table.INT),
                table.BY_NAME["ADD"]._replace(levels=(table.KERNEL,))):
        monkeypatch.setitem(table.BY_NAME, "ADD", lie)
        assert row_problem(add, table.TENSOR) is not None


def test_python_reads_the_table():
    """Ops and the op sets are the table's, in its order (the numbering of Ops follows it)."""
    from polygrad.uop import ops, validate
    assert [op.name for op in Ops] == list(table.NAMES)
    assert [op.value for op in Ops] == list(range(1, len(table.NAMES) + 1))
    assert {op.name for op in ops.ALU} == set(table.ALU)
    assert {op.name for op in validate.ELEMENTWISE} == set(table.KERNEL_ELEMENTWISE)
    assert all(validate.ARITY[Ops[name]] == table.BY_NAME[name].src for name in table.KERNEL_ELEMENTWISE)
