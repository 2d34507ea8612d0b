"""The shared corpus of crafted and mutated bundles that Python's and polygrad-js's loaders must agree on.

Stage: tests (loading). Input: the bundles Python saved into polygrad-js/test/fixtures (an MLP with Adam
and a Variable batch, an embedding bag, a linear fit with SGD, a KV-cache decoder of version 2) and a
seed. Output: {file name: bytes}, deterministic for a seed:

- `crafted()`: one file per known way to ask too much of a loader (the work, memory, node, nesting and
  unrolling caps of polygrad/limits.py, just below and just above each), deep graphs, optimizer
  hyperparameters of the wrong kind, names no renderer may see. Each loads with the default options.
- `mutations(seed, count)`: the fixtures with one to three edits each: a JSON value anywhere in the
  manifest replaced (huge, negative, wrong type, nested), deleted or duplicated, manifest bytes changed
  (checksums recomputed), or raw bytes changed. They load with MUTATION_OPTIONS (small caps: fast).

`python tests/bundle_corpus.py DIR [COUNT]` writes DIR/crafted/*.pgb and DIR/mutated/*.pgb, the input of
`node polygrad-js/tools/verdicts.js`; tests/test_bundle_differential.py compares both languages' verdicts.
`python tests/bundle_corpus.py --js-fixtures` writes the few small crafted files polygrad-js's own tests
load (test/fixtures/crafted/, JS_FIXTURES), so `npm test` checks the caps without Python.
"""
from __future__ import annotations

import json
import re
import random
import sys
import zlib
from pathlib import Path
from typing import Any, Callable, Iterator

from polygrad import bundle, limits
from polygrad.dtype import dtypes
from polygrad.uop import serialize
from polygrad.uop.ops import AxisKind, KernelInfo, Ops, UOp
from polygrad.uop.validate import kernel_work

FIXTURES = Path(__file__).resolve().parent.parent / "polygrad-js" / "test" / "fixtures"
BASES = ("mlp_adam.pgb", "embedding_sgd.pgb", "linear.pgb", "decoder.pgb")
MUTATION_OPTIONS = {"max_bytes": 64 << 20, "max_work": 1 << 30}  # Python's names; JS: maxBytes, maxWork
JS_FIXTURES = ("work_2_38_reduction", "upcast_65536", "cache_1gib", "chain_600")


# ---------------------------------------------------------------------------------------------------
# bytes <-> (manifest, data)


def split(blob: bytes) -> tuple[dict, bytes, int]:
    """(manifest, data section, header version) of a well-formed bundle."""
    manifest, body = bundle.read(blob)
    return manifest, bytes(body), manifest["version"]


def pack(text: bytes, data: bytes, version: int) -> bytes:
    """A bundle of these manifest bytes and data section with a consistent header (lengths, checksums)."""
    head = bundle.HEADER.pack(bundle.MAGIC, version, 0, len(text), len(data), zlib.crc32(text), zlib.crc32(data))
    return head + text + b"\0" * (bundle._pad(len(text)) - len(text)) + data


RAW = "__raw_json__"  # a string repack() replaces by raw JSON text (nesting json.dumps cannot write)


def repack(manifest: Any, data: bytes, version: int, raw: str = "") -> bytes:
    text = json.dumps(manifest, separators=(",", ":"))
    return pack(text.replace(json.dumps(RAW), raw).encode(), data, version)


def base(name: str) -> bytes:
    return (FIXTURES / name).read_bytes()


# ---------------------------------------------------------------------------------------------------
# crafted files


F32 = dtypes.float32


def _buffer(name: str, role: str, shape: list, size: int | None = None, dtype: str = "float32") -> dict:
    n = 1
    for d in shape:
        n *= d
    return {"name": name, "role": role, "dtype": dtype, "shape": shape, "size": n if size is None else size}


def one_kernel(kernel: UOp, n_in: int, n_out: int, *, calls: int = 1, extra_buffers: tuple = (), version: int = 1,
               variables: list | None = None, edit: Callable[[dict], None] | None = None, raw: str = "") -> bytes:
    """A forward-only bundle: input x[n_in] (kernel parameter 1), output y[n_out] (parameter 0), `calls`
    calls of `kernel`, and any extra (unstored) buffers."""
    manifest = {
        "format": bundle.FORMAT, "version": version, "producer": "bundle_corpus",
        "signature": {"inputs": [{"name": "x", "dtype": "float32", "shape": [n_in]}], "targets": [],
                      "outputs": [{"name": "y", "dtype": "float32", "shape": [n_out]}]},
        "variables": variables or [],
        "buffers": [_buffer("output.y", "output", [n_out]), _buffer("input.x", "input", [n_in]), *extra_buffers],
        "kernels": serialize.encode([kernel]),
        "entrypoints": {"forward": {"inputs": {"x": 1}, "outputs": {"y": 0},
                                    "calls": [{"kernel": 0, "args": [0, 1]}] * calls, "rng": []}},
        "training": {"gradients": [], "optimizer": None, "optimizer_state": None, "lr_buffer": None},
        "rng": {"seed": 0, "counter": 0},
    }
    if edit is not None:
        edit(manifest)
    return repack(manifest, b"", version, raw)


def _raw(op: Ops, dtype: Any, src: tuple, arg: Any = None) -> UOp:
    return UOp(op, dtype, src, arg)


def _const(v: int) -> UOp:
    return UOp.const(dtypes.int32, v)


def elementwise(n: int, value: Callable[[UOp], UOp], name: str = "E_crafted") -> UOp:
    """y[i] = value(x[i]) for i < n."""
    y, x = UOp.placeholder((n,), F32, 0), UOp.placeholder((n,), F32, 1)
    i = UOp.range(None, n, 0)
    load = _raw(Ops.LOAD, F32, (_raw(Ops.INDEX, F32, (x, i)),))
    return _raw(Ops.STORE, None, (_raw(Ops.INDEX, F32, (y, i)), value(load))).end(i).sink(arg=KernelInfo(name))


def chain(length: int) -> UOp:
    """y[i] = x[i] + 1 + 1 + ... (`length` dependent ADDs): a deep graph."""
    def value(v: UOp) -> UOp:
        one = UOp.const(F32, 1.0)
        for _ in range(length):
            v = _raw(Ops.ADD, F32, (v, one))
        return v
    return elementwise(4, value, "E_chain")


def reduction(trips: list[int], blocks: int = 1) -> UOp:
    """y[b] = sum of x[0] over nested reduce RANGEs with these trip counts, one block per b."""
    y, x = UOp.placeholder((blocks,), F32, 0), UOp.placeholder((1,), F32, 1)
    stores = []
    axis = 0
    for b in range(blocks):
        ranges = []
        for t in trips:
            dt = dtypes.int64 if t > 2**31 - 1 else dtypes.int32
            ranges.append(UOp(Ops.RANGE, dt, (UOp.const(dt, t),), (axis, AxisKind.REDUCE)))
            axis += 1
        body = _raw(Ops.LOAD, F32, (_raw(Ops.INDEX, F32, (x, _const(0))),))
        total = _raw(Ops.REDUCE, F32, (body, *ranges), Ops.ADD)
        stores.append(_raw(Ops.STORE, None, (_raw(Ops.INDEX, F32, (y, _const(b))), total)))
    return _raw(Ops.SINK, None, tuple(stores), KernelInfo("r_crafted"))


def shared_loop(nested: bool) -> UOp:
    """y[0] = two REDUCEs over one RANGE: nested (sum of sums) or side by side (sum + sum)."""
    y, x = UOp.placeholder((1,), F32, 0), UOp.placeholder((1,), F32, 1)
    r = UOp(Ops.RANGE, dtypes.int32, (_const(64),), (0, AxisKind.REDUCE))
    load = _raw(Ops.LOAD, F32, (_raw(Ops.INDEX, F32, (x, _const(0))),))
    inner = _raw(Ops.REDUCE, F32, (load, r), Ops.ADD)
    other = _raw(Ops.REDUCE, F32, (_raw(Ops.MUL, F32, (load, load)), r), Ops.ADD)
    value = _raw(Ops.REDUCE, F32, (inner, r), Ops.ADD) if nested else _raw(Ops.ADD, F32, (inner, other))
    return _raw(Ops.STORE, None, (_raw(Ops.INDEX, F32, (y, _const(0))), value)).sink(arg=KernelInfo("r_shared"))


def at_work(make: Callable[[int], UOp], work: int, calls: int = 1, extra: int = 0) -> UOp:
    """make(t) with the largest t whose `calls` runs evaluate at most `work` nodes (make's work is linear in t:
    its node count does not depend on t, measured at a t no other constant of the kernel equals), or `extra`
    more than that t."""
    per_point = kernel_work(make(7919)) // 7919
    return make(work // (calls * per_point) + extra)


def upcast(points: int) -> UOp:
    """y[u] = x[u] * 2 over one upcast RANGE of `points` (unrolled by every renderer)."""
    y, x = UOp.placeholder((points,), F32, 0), UOp.placeholder((points,), F32, 1)
    u = UOp.range(None, points, 0, AxisKind.UPCAST)
    load = _raw(Ops.LOAD, F32, (_raw(Ops.INDEX, F32, (x, u)),))
    value = _raw(Ops.MUL, F32, (load, UOp.const(F32, 2.0)))
    return _raw(Ops.STORE, None, (_raw(Ops.INDEX, F32, (y, u)), value)).end(u).sink(arg=KernelInfo("E_upcast"))


def _nested(depth: int) -> str:
    return "[" * depth + "0" + "]" * depth


def _with_manifest(name: str, edit: Callable[[dict], None], raw: str = "") -> bytes:
    manifest, data, version = split(base(name))
    edit(manifest)
    return repack(manifest, data, version, raw)


def _optimizer(**changes: Any) -> bytes:
    def edit(m: dict) -> None:
        m["training"]["optimizer"].update(changes)
    return _with_manifest("mlp_adam.pgb", edit)


def _grad_scale(name: str, slot: Any) -> bytes:
    return _with_manifest(name, lambda m: m["training"].update(grad_scale_buffer=slot))


def _rename_kernel(name: str) -> bytes:
    def edit(m: dict) -> None:
        for node in m["kernels"]["nodes"]:
            if node[0] == "SINK" and node[3] is not None:
                node[3][1]["name"] = name
    return _with_manifest("linear.pgb", edit)


def _rename_variable(name: str) -> bytes:
    def edit(m: dict) -> None:
        text = json.dumps(m).replace('"batch"', json.dumps(name))
        m.clear()
        m.update(json.loads(text))
    return _with_manifest("mlp_adam.pgb", edit)


def _cache(elements: int) -> bytes:
    """A version-2 forward over a cache of `elements` float32 that nothing reads (zero-filled at load)."""
    return one_kernel(elementwise(4, lambda v: v), 4, 4, version=2,
                      extra_buffers=(_buffer("cache.k", "cache", [elements]),))


def _unused_nodes(count: int) -> bytes:
    kernel = elementwise(4, lambda v: v)

    def edit(m: dict) -> None:
        table = m["kernels"]
        pad = [["CONST", "int32", [], ["int", k]] for k in range(count)]
        shift = len(pad)
        nodes = [[op, dt, [s + shift for s in src], arg] for op, dt, src, arg in table["nodes"]]
        table["nodes"] = pad + nodes
        table["roots"] = [r + shift for r in table["roots"]]
    return one_kernel(kernel, 4, 4, edit=edit)


def _nested_arg(depth: int) -> bytes:
    """The kernel's KernelInfo opts: a tuple arg nested `depth` levels."""
    def edit(m: dict) -> None:
        for node in m["kernels"]["nodes"]:
            if node[0] == "SINK":
                node[3] = ["kernel_info", {"name": "E_deep", "opts": RAW}]
    arg = '["tuple",[' * depth + '["int",0]' + "]]" * depth
    return one_kernel(elementwise(4, lambda v: v), 4, 4, edit=edit, raw=arg)


def _node_arg(raw: str) -> bytes:
    """The elementwise kernel with one node's arg replaced by raw JSON text."""
    def edit(m: dict) -> None:
        next(n for n in m["kernels"]["nodes"] if n[3] is None)[3] = RAW
    return one_kernel(elementwise(4, lambda v: v), 4, 4, edit=edit, raw=raw)


def _uncalled(kernel: UOp) -> bytes:
    """The elementwise forward, and `kernel` in the table that no call names."""
    def edit(m: dict) -> None:
        m["kernels"] = serialize.encode([elementwise(4, lambda v: v), kernel])
    return one_kernel(elementwise(4, lambda v: v), 4, 4, edit=edit)


def out_of_bounds() -> UOp:
    """y[i] = x[i] for i < 8 over buffers of 4 elements."""
    y, x = UOp.placeholder((4,), F32, 0), UOp.placeholder((4,), F32, 1)
    i = UOp.range(None, 8, 0)
    load = _raw(Ops.LOAD, F32, (_raw(Ops.INDEX, F32, (x, i)),))
    return _raw(Ops.STORE, None, (_raw(Ops.INDEX, F32, (y, i)), load)).end(i).sink(arg=KernelInfo("E_oob"))


def _shape_node_without_arg(m: dict) -> None:
    """The size expression of a buffer shape (batch*6) becomes a DEFINE_VAR without an arg: a node that
    cannot even be printed, reached only through a DEFINE_GLOBAL's arg."""
    node = next(n for n in m["kernels"]["nodes"] if n[0] == "MUL" and n[1] == "int32")
    node[0], node[3] = "DEFINE_VAR", None


def _respelled(*pairs: tuple[str, str]) -> bytes:
    """linear.pgb with each JSON text matching the regular expression `old` written as `new` ((old, new)
    pairs, `new` may refer to groups; each old must occur)."""
    manifest, data, version = split(base("linear.pgb"))
    text = json.dumps(manifest, separators=(",", ":"))
    for old, new in pairs:
        text, n = re.subn(old, new, text)
        assert n, old
    return pack(text.encode(), data, version)


def _buffer_as_value(m: dict) -> None:
    """A WHERE's arm (an int32 value) becomes the int32 DEFINE_GLOBAL of its kernel: a pointer as a value."""
    nodes = m["kernels"]["nodes"]
    where = next(n for n in nodes if n[0] == "WHERE" and n[1] == "int32")
    where[2][2] = next(i for i, n in enumerate(nodes) if n[0] == "DEFINE_GLOBAL" and n[1] == "int32")


def _extra_key(depth: int) -> bytes:
    return _with_manifest("linear.pgb", lambda m: m.update(note=RAW), _nested(depth))


W = limits.WORK_FLOOR  # the default work cap of a small file

# name: (the verdict every loader must give with the default options, how to make the file)
CRAFTED: dict[str, tuple[str, Callable[[], bytes]]] = {
    # JSON nesting (MAX_JSON_DEPTH): an ignored key may nest up to the limit, not beyond
    "json_depth_200_ignored_key": ("accept", lambda: _extra_key(200)),
    "json_depth_300_ignored_key": ("reject", lambda: _extra_key(300)),
    "json_depth_10000_producer": ("reject", lambda: _with_manifest("linear.pgb", lambda m: m.update(producer=RAW),
                                                                   _nested(10000))),
    "json_depth_10000_kernel_arg": ("reject", lambda: _nested_arg(10000)),
    "json_depth_10000_node_arg": ("reject", lambda: _node_arg(_nested(10000))),
    "kernel_arg_tuples_63": ("accept", lambda: _nested_arg(63)),
    "kernel_arg_tuples_64": ("reject", lambda: _nested_arg(64)),
    # graph depth: every walk is iterative, so a long chain loads (it is far below MAX_NODES)
    "chain_600": ("accept", lambda: one_kernel(chain(600), 4, 4)),
    "chain_60000": ("accept", lambda: one_kernel(chain(60000), 4, 4)),
    # JSON has one number type: an integral value is an integer however it is written, a fraction is not
    "integers_written_as_floats": ("accept", lambda: _respelled((r'"roots":\[(\d+),', r'"roots":[\1.0,'),
                                                                ('"kernel":0,', '"kernel":0e0,'))),
    "integer_with_a_fraction": ("reject", lambda: _respelled(('"kernel":0,', '"kernel":0.5,'))),
    # every kernel of the table is valid, called or not
    "kernel_uncalled_valid": ("accept", lambda: _uncalled(elementwise(4, lambda v: v, "E_spare"))),
    "kernel_uncalled_out_of_bounds": ("reject", lambda: _uncalled(out_of_bounds())),
    "kernel_const_out_of_range": ("reject", lambda: _node_arg('["int",4294967296]')),
    "kernel_buffer_as_value": ("reject", lambda: _with_manifest("embedding_sgd.pgb", _buffer_as_value)),
    "kernel_shape_node_without_arg": ("reject", lambda: _with_manifest("embedding_sgd.pgb", _shape_node_without_arg)),
    # each RANGE is one loop: a reduce nested in a reduce over the same RANGE broke the C renderer at the first
    # call, and two reduces side by side over one RANGE would run that loop twice per counted point
    "reduce_nested_same_range": ("reject", lambda: one_kernel(shared_loop(nested=True), 1, 1)),
    "reduce_siblings_same_range": ("reject", lambda: one_kernel(shared_loop(nested=False), 1, 1)),
    # the kernel table's node count is checked before any node is decoded
    "nodes_over_limit": ("reject", lambda: _unused_nodes(limits.MAX_NODES)),
    # unrolled upcast RANGEs (MAX_UPCAST points per block)
    "upcast_256": ("accept", lambda: one_kernel(upcast(256), 256, 256)),
    "upcast_257": ("reject", lambda: one_kernel(upcast(257), 257, 257)),
    "upcast_65536": ("reject", lambda: one_kernel(upcast(65536), 65536, 65536)),
    # work: node evaluations per entrypoint call (nodes x loop points, summed over blocks and calls), at the
    # default cap
    "work_2_38_reduction": ("reject", lambda: one_kernel(reduction([2**38]), 1, 1)),
    "work_at_floor": ("accept", lambda: one_kernel(at_work(lambda t: reduction([t]), W), 1, 1)),
    "work_over_floor": ("reject", lambda: one_kernel(at_work(lambda t: reduction([t]), W, extra=1), 1, 1)),
    "work_nested_at_floor": ("accept", lambda: one_kernel(at_work(lambda t: reduction([2**12, t]), W), 1, 1)),
    "work_nested_over_floor": ("reject", lambda: one_kernel(at_work(lambda t: reduction([2**12, t]), W, extra=1),
                                                            1, 1)),
    "work_two_blocks_at_floor": ("accept", lambda: one_kernel(at_work(lambda t: reduction([t], 2), W), 2, 2)),
    "work_two_blocks_over_floor": ("reject", lambda: one_kernel(at_work(lambda t: reduction([t], 2), W, extra=1),
                                                                2, 2)),
    "work_calls_at_floor": ("accept", lambda: one_kernel(at_work(lambda t: reduction([t]), W, 16), 1, 1, calls=16)),
    "work_calls_over_floor": ("reject", lambda: one_kernel(at_work(lambda t: reduction([t]), W, 16), 1, 1,
                                                           calls=17)),
    "work_empty_inner_range": ("reject", lambda: one_kernel(reduction([2**40, 0]), 1, 1)),
    # memory: a tiny file may allocate BYTES_FLOOR, not more
    "cache_at_floor": ("accept", lambda: _cache(limits.BYTES_FLOOR // 4 - 8)),
    "cache_1gib": ("reject", lambda: _cache(1 << 28)),
    # optimizer hyperparameters of the wrong kind (docs/bundle-format.md 2.6)
    "optimizer_betas_object": ("reject", lambda: _optimizer(betas={"a": 1})),
    "optimizer_betas_three": ("reject", lambda: _optimizer(betas=[0.9, 0.99, 0.999])),
    "optimizer_eps_string": ("reject", lambda: _optimizer(eps="x")),
    "optimizer_eps_bool": ("reject", lambda: _optimizer(eps=True)),
    "optimizer_weight_decay_null": ("reject", lambda: _optimizer(weight_decay=None)),
    "optimizer_unknown_hyper": ("reject", lambda: _optimizer(momentum=0.9)),
    "optimizer_name_capitalised": ("reject", lambda: _optimizer(name="Adam")),
    "optimizer_int_lr_and_eps": ("accept", lambda: _optimizer(lr=1, eps=1)),
    # the values Model.fit refuses (nn/optim.check_hyperparameters, optim.js checkHyperparameters)
    "optimizer_eps_zero": ("reject", lambda: _optimizer(eps=0)),
    "optimizer_lr_negative": ("reject", lambda: _optimizer(lr=-1)),
    "optimizer_beta_one": ("reject", lambda: _optimizer(betas=[0.9, 1.0])),
    # the update's gradient multiplier (training.grad_scale_buffer): a one-element float32 optimizer buffer
    # other than lr_buffer, and only with an optimizer; absent or null for an update without one
    "grad_scale_null": ("accept", lambda: _grad_scale("mlp_adam.pgb", None)),
    "grad_scale_on_lr_buffer": ("reject", lambda: _grad_scale("mlp_adam.pgb", 21)),
    "grad_scale_two_elements": ("reject", lambda: _grad_scale("mlp_adam.pgb", 22)),
    "grad_scale_on_an_input": ("reject", lambda: _grad_scale("mlp_adam.pgb", 0)),
    "grad_scale_out_of_range": ("reject", lambda: _grad_scale("mlp_adam.pgb", 10**6)),
    "grad_scale_string": ("reject", lambda: _grad_scale("mlp_adam.pgb", "optimizer.0")),
    "grad_scale_without_optimizer": ("reject", lambda: _grad_scale("embedding_sgd.pgb", 0)),
    # names are metadata that reach no generated source (uop/names.py): any plain name is one, others are not
    "kernel_name_asm": ("accept", lambda: _rename_kernel("__asm__")),
    "kernel_name_injection": ("reject", lambda: _rename_kernel("E_1(){}; int main")),
    "kernel_name_leading_digit": ("reject", lambda: _rename_kernel("6assign_1")),
    "kernel_name_too_long": ("reject", lambda: _rename_kernel("k" * 257)),
    "variable_name_for": ("accept", lambda: _rename_variable("for")),
    "variable_name_huge_valf": ("accept", lambda: _rename_variable("HUGE_VALF")),
    "variable_name_newline": ("reject", lambda: _rename_variable("batch\n")),
    # the data section, which a path load reads straight into the buffers (polygrad-js bundlefile.js): a changed
    # byte of a stored buffer or of the padding no buffer stores fails the checksum; two buffers may store one range
    "data_byte_changed": ("reject", lambda: _data_byte_changed("mlp_adam.pgb", padding=False)),
    "data_padding_changed": ("reject", lambda: _data_byte_changed("mlp_adam.pgb", padding=True)),
    "data_two_buffers_one_range": ("accept", lambda: _alias_parameter("mlp_adam.pgb")),
}


def _stored_ranges(manifest: dict) -> list[tuple[int, int]]:
    return [(b["data"]["offset"], b["data"]["offset"] + b["data"]["nbytes"]) for b in manifest["buffers"]
            if isinstance(b.get("data"), dict)]


def _data_byte_changed(name: str, padding: bool) -> bytes:
    """The bundle with its first data byte that a buffer stores (or, with `padding`, that none does) changed."""
    manifest, data, _ = split(base(name))
    ranges = _stored_ranges(manifest)
    at = next(i for i in range(len(data)) if any(a <= i < b for a, b in ranges) != padding)
    blob = bytearray(base(name))
    blob[len(blob) - len(data) + at] ^= 0x10
    return bytes(blob)


def _alias_parameter(name: str) -> bytes:
    """The bundle with a parameter added that no call reads, storing the same bytes as the first parameter."""
    manifest, data, version = split(base(name))
    first = next(b for b in manifest["buffers"] if b["role"] == "parameter")
    manifest["buffers"].append({**first, "name": "alias", "data": dict(first["data"])})
    return repack(manifest, data, version)


def crafted() -> dict[str, bytes]:
    return {name: make() for name, (_, make) in CRAFTED.items()}


# ---------------------------------------------------------------------------------------------------
# mutations


REPLACEMENTS: list[Any] = [
    None, True, False, 0, 1, -1, 2, 7, 63, 64, 255, 2**31 - 1, 2**31, 2**32, 2**53, 2**63, 2**64, -2**31, 10**30,
    0.5, -0.0, 1e300, "", "x", "float32", "int32", "bool", "float16", "int64", "parameter", "state", "rng",
    "optimizer", "gradient", "input", "output", "temporary", "cache", "batch", "tokens", "pos", "forward",
    "train_step", "decode", "uop", "ADD", "FDIV", "DEFINE_GLOBAL", "a" * 300, [], [0], [[0]], {}, {"a": 1},
    ["op", "ADD"], ["int", 5], ["tuple", []], ["batch"], [2**31 - 1], [1, "tokens"],
]


def _paths(obj: Any, prefix: tuple = ()) -> Iterator[tuple]:
    stack = [(obj, prefix)]
    while stack:
        v, p = stack.pop()
        yield p
        if isinstance(v, dict):
            stack.extend((x, p + (k,)) for k, x in v.items())
        elif isinstance(v, list):
            stack.extend((x, p + (i,)) for i, x in enumerate(v))


def _json_edit(manifest: dict, rnd: random.Random) -> None:
    paths = [p for p in _paths(manifest) if p]
    for _ in range(rnd.randint(1, 3)):
        path = rnd.choice(paths)
        parent: Any = manifest
        try:
            for key in path[:-1]:
                parent = parent[key]
            last = path[-1]
            action = rnd.choice(["replace", "replace", "replace", "delete", "duplicate", "bump"])
            if action == "replace":
                parent[last] = json.loads(json.dumps(rnd.choice(REPLACEMENTS)))
            elif action == "delete":
                del parent[last]
            elif action == "duplicate" and isinstance(parent, list):
                parent.append(json.loads(json.dumps(parent[last])))
            elif action == "duplicate":
                parent[last] = [parent[last], parent[last]]
            elif isinstance(parent[last], int) and not isinstance(parent[last], bool):
                parent[last] += rnd.choice([-1, 1, 64, -64])
        except (KeyError, IndexError, TypeError):
            continue  # an earlier edit removed this path


KERNEL_OPS = ["ADD", "MUL", "MAX", "MOD", "IDIV", "FDIV", "CMPLT", "CMPNE", "CMPEQ", "AND", "OR", "XOR", "SHL",
              "SHR", "NEG", "SQRT", "EXP2", "CAST", "BITCAST", "WHERE", "LOAD", "INDEX", "STORE", "RANGE", "REDUCE",
              "END", "CONST", "DEFINE_VAR", "DEFINE_GLOBAL", "VECTORIZE", "BIND"]
KERNEL_DTYPES = ["bool", "int8", "uint8", "int32", "uint32", "int64", "float16", "float32", "float64", None]


def _ints(arg: Any) -> list[list]:
    """The ["int", v] pairs inside an encoded arg (to edit in place)."""
    out, stack = [], [arg]
    while stack:
        a = stack.pop()
        if isinstance(a, list):
            if len(a) == 2 and a[0] == "int" and isinstance(a[1], int):
                out.append(a)
            else:
                stack.extend(a)
        elif isinstance(a, dict):
            stack.extend(a.values())
    return out


def _kernel_edit(manifest: dict, rnd: random.Random) -> None:
    """Plausible kernel-table edits that decode: another op, dtype or source, or an int arg moved."""
    nodes = manifest["kernels"]["nodes"]
    for _ in range(rnd.randint(1, 2)):
        i = rnd.randrange(len(nodes))
        node = nodes[i]
        kind = rnd.choice(["op", "dtype", "src", "int", "int"])
        ints = _ints(node[3])
        if kind == "op":
            node[0] = rnd.choice(KERNEL_OPS)
        elif kind == "dtype":
            node[1] = rnd.choice(KERNEL_DTYPES)
        elif kind == "src" and node[2] and i:
            node[2][rnd.randrange(len(node[2]))] = rnd.randrange(i)
        elif ints:
            pair = rnd.choice(ints)
            v = pair[1]
            pair[1] = rnd.choice([v + 1, v - 1, 2 * v, v // 2, 0, -1, 2**31 - 1, 2**31, v + 2**32, 2**48 + 1])


def apply_edits(buf: bytearray, edits: list[tuple[str, int, int]]) -> bytearray:
    """buf with (kind, position, byte) edits applied in order: flip a bit, set, insert or delete a byte (the
    position taken modulo the current length)."""
    for kind, pos, val in edits:
        if not buf:
            break
        i = pos % len(buf)
        if kind == "flip":
            buf[i] ^= 1 << (val % 8)
        elif kind == "set":
            buf[i] = val
        elif kind == "insert":
            buf.insert(i, val)
        else:
            del buf[i]
    return buf


def _byte_edit(buf: bytearray, rnd: random.Random, alphabet: bytes | None = None) -> bytearray:
    kinds = ["set", "set", "insert", "delete"]
    return apply_edits(buf, [(rnd.choice(kinds), rnd.randrange(1 << 30), rnd.choice(alphabet) if alphabet else
                              rnd.randrange(256)) for _ in range(rnd.randint(1, 4))])


def mutations(seed: int, count: int) -> Iterator[tuple[str, bytes]]:
    """`count` mutated fixtures, the same for the same seed: 45% JSON value edits anywhere, 30% kernel-table
    edits, 15% manifest byte edits (checksums recomputed), 10% raw byte edits."""
    rnd = random.Random(seed)
    bases = [(name, *split(base(name))) for name in BASES]
    for k in range(count):
        name, manifest, data, version = bases[k % len(bases)]
        roll = rnd.random()
        if roll < 0.75:
            m = json.loads(json.dumps(manifest))
            (_json_edit if roll < 0.45 else _kernel_edit)(m, rnd)
            blob = repack(m, data, version)
            kind = "json" if roll < 0.45 else "kernel"
        elif roll < 0.9:
            text = json.dumps(manifest, separators=(",", ":")).encode()
            blob = pack(bytes(_byte_edit(bytearray(text), rnd, b' {}[],:"0123456789-eE.tfnul')), data, version)
            kind = "text"
        else:
            blob = bytes(_byte_edit(bytearray(base(name)), rnd))
            kind = "bytes"
        yield f"{k:05d}_{kind}_{name[:-4]}", blob


def write(folder: str | Path, seed: int = 0, count: int = 300) -> Path:
    """DIR/crafted/*.pgb (default options) and DIR/mutated/*.pgb (MUTATION_OPTIONS)."""
    root = Path(folder)
    for sub, files in (("crafted", crafted().items()), ("mutated", mutations(seed, count))):
        (root / sub).mkdir(parents=True, exist_ok=True)
        for name, blob in files:
            (root / sub / f"{name}.pgb").write_bytes(blob)
    return root


if __name__ == "__main__":
    if sys.argv[1] == "--js-fixtures":
        (FIXTURES / "crafted").mkdir(exist_ok=True)
        for name in JS_FIXTURES:
            (FIXTURES / "crafted" / f"{name}.pgb").write_bytes(CRAFTED[name][1]())
    else:
        write(sys.argv[1], count=int(sys.argv[2]) if len(sys.argv) > 2 else 300)
