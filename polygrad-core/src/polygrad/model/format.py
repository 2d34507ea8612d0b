"""A Model's program to and from the bundle manifest (docs/bundle-format.md), with every field checked.

Stage: export / import (polygrad-js: manifest.js), between the Program a Model runs (program.py) and
polygrad/bundle.py (the file layout). Input: a Program and its stored buffers' contents, or a manifest
and the bundle's data section. Output: (manifest, blobs), or (Program, {slot: stored array}).
`to_manifest` writes; `from_manifest` reads an untrusted manifest and raises
`BundleError` for anything out of place: unknown roles or dtypes, slot numbers out of range, sizes
that disagree with shapes or with the stored bytes, offsets outside the data section, a kernel whose
buffers do not match its call, a call that passes one buffer twice, a temporary or output read before
a call writes it (`_check_dataflow`, docs/bundle-format.md 4.1), Variables without declared bounds,
more memory than `max_bytes`, or an entrypoint whose calls evaluate more than `max_work` kernel
nodes (polygrad/limits.py has the caps and their defaults). Nothing is allocated before the whole
manifest passed.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from polygrad import bundle
from polygrad.bundle import BundleError, check_int, get, get_int, need
from polygrad.codegen.passes import affine_kernel
from polygrad.definitions import bundle as bundle_format
from polygrad.definitions import optimizer as optimizer_table
from polygrad.dtype import DType, dtypes
from polygrad.errors import PolygradError
from polygrad.limits import MAX_CALLS, MAX_DIMS, MAX_ELEMENTS, MAX_NAME, MAX_SLOTS, MAX_SPECS
from polygrad.model.optim import optimizer_config
from polygrad.model.program import ROLES, STORED, Call, Entry, Program, Slot, Spec, dtype_name, program_flow
from polygrad.uop import serialize, sint
from polygrad.uop.ops import Ops, UOp
from polygrad.uop.transcendental import decompose_transcendentals
from polygrad.uop.validate import check_kernel, declared_count, kernel_work

# the hyperparameters a bundle's optimizer may carry and their JSON kinds (docs/bundle-format.md 2.6)
OPTIMIZER_HYPER: dict[str, dict[str, str]] = optimizer_table.HYPER_KINDS


def _le(arr: np.ndarray) -> memoryview:
    """The array's bytes, little-endian, as a view where it already is (no copy of a weight)."""
    little = np.ascontiguousarray(arr).astype(arr.dtype.newbyteorder("<"), copy=False)
    return memoryview(little.reshape(-1).view(np.uint8))  # 1-d bytes: a view of an empty or 0-d array too


def stored_kernel(ast: UOp) -> UOp:
    """A kernel in the form a bundle stores it (docs/bundle-format.md 2.4): the scheduler's output with
    EXP2/LOG2/SIN decomposed into IR arithmetic, then index-simplified (a fixed point: every reader's
    simplification leaves it as it is) and its merged ranges split (codegen/merged_ranges.py, so every
    reader's heuristics see affine addresses): codegen/passes.py's affine_kernel; no device
    optimisation (share_reduce_ranges neither: a reader's lowering applies its own). These passes are
    device-independent, so they run once here and no reader needs a copy of them."""
    return affine_kernel(decompose_transcendentals(ast))


def to_manifest(p: Program, stored: Callable[[int], np.ndarray], include_optimizer: bool, version: str,
                external: tuple[str, ...] = (), as_captured: bool = False) -> tuple[dict, list[memoryview]]:
    """(manifest, blobs) of a program; blob k holds the k-th buffer whose "data" is true, `stored(slot)`.

    include_optimizer=False marks the optimizer state "initial" (`stored` then gives the values before
    any step); `version` is the producing polygrad's. Two options serve a program cache entry
    (model/programcache.py), never a bundle file: buffers of the `external` roles store no data (the
    weights come from their own file; only `from_manifest` with the same `external` reads it), and
    `as_captured` keeps the kernels as the scheduler made them instead of their stored form, so the
    reader lowers and compiles the very kernels the capturing process ran (the stored form can steer
    the heuristics elsewhere: GPT-2's decode attention got a THREAD opt)."""
    recorded = "optimizer_step" in p.entries
    buffers, blobs = [], []
    for s, slot in enumerate(p.slots):
        d: dict[str, Any] = {"name": slot.name, "role": slot.role, "dtype": dtype_name(slot.dtype),
                             "shape": list(slot.shape), "size": slot.size}
        if slot.role in STORED and slot.role not in external:
            blobs.append(_le(stored(s)))
            d["data"] = True
        buffers.append(d)

    def spec(s: Any) -> dict:
        return {"name": s.name, "dtype": dtype_name(s.dtype), "shape": list(s.shape)}

    def calls(e: Any) -> list:
        return [{"copy": list(c.args)} if c.kernel < 0 else {"kernel": c.kernel, "args": list(c.args)} for c in e.calls]

    def entry(e: Any) -> dict:
        d = {"inputs": dict(e.inputs), "outputs": dict(e.outputs), "calls": calls(e), "rng": list(e.rng)}
        if e.args:
            d["arguments"] = list(e.args)
        return d

    manifest = {
        "format": bundle.FORMAT, "version": format_version(p), "producer": f"polygrad {version}",
        "signature": {"inputs": [spec(s) for s in p.inputs], "targets": [spec(s) for s in p.targets],
                      "outputs": [spec(s) for s in p.outputs]},
        "variables": [{"name": k, "min": lo, "max": hi} for k, (lo, hi) in p.variables.items()],
        "buffers": buffers,
        "kernels": serialize.encode(p.kernels if as_captured else [stored_kernel(k) for k in p.kernels]),
        "entrypoints": {name: entry(e) for name, e in p.entries.items()},
        "training": {"gradients": [[a, b] for a, b in p.gradients.items()],
                     "optimizer": dict(p.optimizer) if recorded and p.optimizer else None,
                     "optimizer_state": ("kept" if include_optimizer else "initial") if recorded else None,
                     "lr_buffer": p.lr_slot if recorded else None,
                     **({"grad_scale_buffer": p.grad_scale_slot}
                        if recorded and p.grad_scale_slot is not None else {})},
        "rng": {"seed": int(p.rng[0]), "counter": int(p.rng[1])},
    }
    return manifest, blobs


def format_version(p: Any) -> int:
    """The oldest bundle version that holds this program: 2 when it has a cache buffer, a Variable outside
    a leading dimension or a Variable argument (what version 2 added), else 1 (every version-1 reader)."""
    inner = any(isinstance(d, str) for slot in p.slots for d in slot.shape[1:])
    if inner or any(slot.role == "cache" for slot in p.slots) or any(e.args for e in p.entries.values()):
        return 2
    return 1


# ---------------------------------------------------------------------------------------------------
# reading


def _name(v: Any, where: str) -> str:
    need(isinstance(v, str) and 0 < len(v) <= MAX_NAME, f"{where} must be a non-empty string of at most "
         f"{MAX_NAME} characters")
    return v


def _dtype(v: Any, where: str) -> DType:
    need(isinstance(v, str) and v in serialize.DTYPES_BY_NAME, f"{where} = {v!r} is not a known dtype "
         f"({sorted(serialize.DTYPES_BY_NAME)})")
    return serialize.DTYPES_BY_NAME[v]


def _shape(v: Any, where: str, variables: dict[str, tuple[int, int]], version: int) -> tuple[int | str, ...]:
    need(isinstance(v, list) and len(v) <= MAX_DIMS, f"{where} must be a list of at most {MAX_DIMS} dimensions")
    out: list[int | str] = []
    for k, d in enumerate(v):
        if isinstance(d, str):
            need(d in variables, f"{where}[{k}] = {d!r} is not a declared Variable")
            need(k == 0 or version >= 2, f"{where}[{k}] = {d!r}: in a version-1 bundle only the leading dimension "
                 "may name a Variable")
            out.append(d)
        else:
            out.append(check_int(d, f"{where}[{k}]", 0, MAX_ELEMENTS))
    return tuple(out)


def _elements(shape: tuple[int | str, ...], variables: dict[str, tuple[int, int]]) -> int:
    n = 1
    for d in shape:
        n *= variables[d][1] if isinstance(d, str) else d
        if n > MAX_ELEMENTS:
            return n
    return n


def _specs(obj: Any, key: str, variables: dict, version: int) -> list:
    rows = get(obj, key, list, "signature")
    need(len(rows) <= MAX_SPECS, f"signature.{key} has too many entries")
    out, seen = [], set()
    for i, r in enumerate(rows):
        where = f"signature.{key}[{i}]"
        name = _name(get(r, "name", str, where), f"{where}.name")
        need(name.isidentifier() and name not in seen, f"{where}.name {name!r} must be a distinct identifier")
        seen.add(name)
        out.append(Spec(name, _dtype(get(r, "dtype", str, where), f"{where}.dtype"),
                        _shape(get(r, "shape", list, where), f"{where}.shape", variables, version)))
    return out


def from_manifest(manifest: dict, body: memoryview, max_bytes: int, max_work: int,
                  external: tuple[str, ...] = ()) -> tuple[Program, dict[int, np.ndarray]]:
    """(Program, {slot: stored array}) of a manifest read by bundle.read(); BundleError if inconsistent.

    max_bytes caps the memory of all buffers together, max_work the node evaluations of one entrypoint call
    (`uop/validate.kernel_work` summed over its calls; a copy counts its elements). Model.load passes the
    defaults for the file's length (polygrad/limits.py) unless its caller gave others. Buffers of the
    `external` roles must store no data (to_manifest's `external`); the caller supplies their contents."""
    try:
        return _from_manifest(manifest, body, max_bytes, max_work, external)
    except BundleError:
        raise
    except PolygradError as e:  # a kernel or an optimizer configuration that does not read
        raise BundleError(f"bundle manifest: {e}") from None


def _from_manifest(manifest: dict, body: memoryview, max_bytes: int, max_work: int,
                   external: tuple[str, ...]) -> tuple[Program, dict[int, np.ndarray]]:

    variables: dict[str, tuple[int, int]] = {}
    for i, v in enumerate(get(manifest, "variables", list, "manifest")):
        where = f"variables[{i}]"
        name = _name(get(v, "name", str, where), f"{where}.name")
        lo, hi = get_int(v, "min", where), get_int(v, "max", where)
        sint.Variable(name, lo, hi)  # the one name rule and the bounds (VariableError -> BundleError)
        need(name not in variables, f"{where}: Variable {name!r} declared twice")
        variables[name] = (lo, hi)
    version = manifest.get("version", 1)
    sig = get(manifest, "signature", dict, "manifest")
    inputs, targets, outputs = (_specs(sig, k, variables, version) for k in ("inputs", "targets", "outputs"))

    rows = get(manifest, "buffers", list, "manifest")
    need(len(rows) <= MAX_SLOTS, f"{len(rows)} buffers exceed the limit of {MAX_SLOTS}")
    slots: list[Slot] = []
    where_data: dict[int, tuple[int, int]] = {}
    total = 0
    for s, r in enumerate(rows):
        where = f"buffers[{s}]"
        role = get(r, "role", str, where)
        need(role in ROLES, f"{where}.role {role!r} is not one of {list(ROLES)}")
        since = bundle_format.ROLES_SINCE.get(role, 1)
        need(version >= since, f"{where}.role {role!r} needs bundle version {since}")
        dt = _dtype(get(r, "dtype", str, where), f"{where}.dtype")
        shape = _shape(get(r, "shape", list, where), f"{where}.shape", variables, version)
        size = get_int(r, "size", where)
        need(_elements(shape, variables) == size, f"{where}: size {size} does not match shape {list(shape)}")
        total += size * dt.itemsize
        if total > max_bytes:
            raise BundleError(f"bundle manifest: the buffers need more than {max_bytes} bytes, the limit for this "
                              "file; if you trust it, load it with Model.load(..., max_bytes=N)")
        data = r.get("data")
        if role in STORED and role not in external:
            need(isinstance(data, dict), f"{where} ({role}) must have stored data")
            off = get_int(data, "offset", f"{where}.data", 0, len(body))
            nbytes = get_int(data, "nbytes", f"{where}.data", 0, len(body))
            need(nbytes == size * dt.itemsize, f"{where}.data.nbytes {nbytes} != size {size} x {dt.itemsize} bytes")
            need(off % bundle.ALIGN == 0 and off + nbytes <= len(body),
                 f"{where}.data [{off}, {off + nbytes}) is misaligned or outside the {len(body)}-byte data section")
            where_data[s] = (off, nbytes)
        else:
            need(data is None, f"{where} ({role}) must not store data")
        slots.append(Slot(_name(get(r, "name", str, where), f"{where}.name"), role, dt, shape, size))

    try:
        kernels = serialize.decode(get(manifest, "kernels", dict, "manifest"))
    except RecursionError:
        raise BundleError("bundle manifest: kernels are nested too deeply") from None
    for k, ast in enumerate(kernels):
        need(ast.op is Ops.SINK, f"kernels root {k} is a {ast.op.name}, expected SINK")
    globals_of = [_kernel_globals(k, ast, variables) for k, ast in enumerate(kernels)]

    def slot_no(v: Any, where: str, roles: tuple[str, ...] | None = None) -> int:
        s = check_int(v, where, 0, len(slots) - 1) if slots else need(False, f"{where}: there are no buffers")
        if roles is not None:
            need(slots[s].role in roles, f"{where}: buffer {s} is a {slots[s].role}, expected {'/'.join(roles)}")
        return s  # type: ignore[return-value]

    entries: dict[str, Entry] = {}
    work_of: dict[int, int] = {}
    eps = get(manifest, "entrypoints", dict, "manifest")
    for required in bundle_format.REQUIRED_ENTRYPOINTS:
        need(required in eps, f"entrypoints lack {required!r}")
    n_calls = 0
    checked: set[tuple] = set()  # (kernel, its buffers' sizes and dtypes) whose calls passed _check_call
    for name, e in eps.items():
        where = f"entrypoints.{_name(name, 'entrypoint name')}"
        ins = {_name(k, f"{where}.inputs key"): slot_no(v, f"{where}.inputs.{k}", ("input",))
               for k, v in get(e, "inputs", dict, where).items()}
        outs = {_name(k, f"{where}.outputs key"): slot_no(v, f"{where}.outputs.{k}", ("output",))
                for k, v in get(e, "outputs", dict, where).items()}
        rng = [slot_no(v, f"{where}.rng[{i}]", ("rng",)) for i, v in enumerate(get(e, "rng", list, where))]
        for i in rng:
            need(slots[i].size == 2 and slots[i].dtype.np == np.uint32, f"{where}: rng buffer {i} must be 2 x uint32")
        calls = []
        raw = get(e, "calls", list, where)
        n_calls += len(raw)
        need(n_calls <= MAX_CALLS, f"more than {MAX_CALLS} calls")
        for i, c in enumerate(raw):
            cw = f"{where}.calls[{i}]"
            need(isinstance(c, dict), f"{cw} must be an object")
            if "copy" in c:
                pair = get(c, "copy", list, cw)
                need(len(pair) == 2, f"{cw}.copy must be [destination, source]")
                dst, src = (slot_no(v, f"{cw}.copy") for v in pair)
                need(slots[dst].dtype == slots[src].dtype, f"{cw}: copy between {slots[src].dtype.name} and "
                     f"{slots[dst].dtype.name}")
                _check_distinct(cw, (dst, src))
                calls.append(Call(-1, (dst, src)))
                continue
            k = get_int(c, "kernel", cw, 0, max(len(kernels) - 1, 0))
            need(k < len(kernels), f"{cw}.kernel {k}: there are {len(kernels)} kernels")
            args = tuple(slot_no(v, f"{cw}.args[{j}]") for j, v in enumerate(get(c, "args", list, cw)))
            _check_distinct(cw, args)
            seen = (k, tuple((slots[s].size, slots[s].dtype) for s in args))
            if seen not in checked:  # check_kernel reads only the kernel and the buffers' sizes and dtypes
                _check_call(cw, k, kernels[k], globals_of[k], args, slots, variables)
                checked.add(seen)
            calls.append(Call(k, args))
        _check_work(where, calls, kernels, slots, work_of, max_work)
        args = []
        if "arguments" in e:
            need(version >= 2, f"{where}.arguments needs bundle version 2")
            for i, v in enumerate(get(e, "arguments", list, where)):
                need(isinstance(v, str) and v in variables and v not in args and v not in ins,
                     f"{where}.arguments[{i}] must name a declared Variable once, distinct from the inputs")
                args.append(v)
        entries[name] = Entry(ins, outs, calls, rng, args)
    called = {c.kernel for e in entries.values() for c in e.calls}
    for k, ast in enumerate(kernels):
        if k not in called:
            _check_uncalled(k, ast)
    fwd = entries["forward"]
    need(set(fwd.inputs) == {s.name for s in inputs}, "entrypoints.forward.inputs do not match signature.inputs")
    need(set(fwd.outputs) == {s.name for s in outputs}, "entrypoints.forward.outputs do not match signature.outputs")
    for spec in inputs + targets:
        for name, e in entries.items():
            if spec.name in e.inputs and name in bundle_format.SIGNATURE_ENTRYPOINTS:  # others: their buffers
                slot = slots[e.inputs[spec.name]]
                need(slot.dtype == spec.dtype and slot.shape == spec.shape,
                     f"entrypoints.{name}.inputs.{spec.name}: buffer does not match the signature")
    for spec in outputs:
        slot = slots[fwd.outputs[spec.name]]
        need(slot.dtype == spec.dtype and slot.shape == spec.shape, f"output {spec.name!r}: buffer does not match")

    tr = get(manifest, "training", dict, "manifest")
    grads = {}
    for i, pair in enumerate(get(tr, "gradients", list, "training")):
        need(isinstance(pair, list) and len(pair) == 2, f"training.gradients[{i}] must be [parameter, gradient]")
        a, b = slot_no(pair[0], f"training.gradients[{i}]", ("parameter",)), \
            slot_no(pair[1], f"training.gradients[{i}]", ("gradient",))
        need(slots[a].shape == slots[b].shape, f"training.gradients[{i}]: shapes differ")
        grads[a] = b
    opt = tr.get("optimizer")
    lr_slot = scale_slot = None
    if opt is not None:
        named = isinstance(opt, dict) and isinstance(opt.get("name"), str)
        need(named, "training.optimizer must be an object with a name")
        hyper = {k: (tuple(v) if isinstance(v, list) else v) for k, v in opt.items() if k not in ("name", "lr")}
        lr = opt.get("lr")
        need(_is_number(lr), "training.optimizer.lr must be a number")
        _check_hyper(opt)
        try:  # the values Model.fit would refuse (nn/optim.check_hyperparameters; optim.js the same)
            opt = optimizer_config(opt["name"], float(lr), hyper)
        except PolygradError as e:
            raise BundleError(f"bundle manifest: training.optimizer: {e}") from None
        need(all(k in entries for k in bundle_format.OPTIMIZER_ENTRYPOINTS),
             "an optimizer without train_step/optimizer_step")
        lr_slot = slot_no(tr.get("lr_buffer"), "training.lr_buffer", ("optimizer",))
        need(slots[lr_slot].size == 1, "training.lr_buffer must be a one-element buffer")
        if tr.get("grad_scale_buffer") is not None:
            scale_slot = slot_no(tr["grad_scale_buffer"], "training.grad_scale_buffer", ("optimizer",))
            need(slots[scale_slot].size == 1 and slots[scale_slot].dtype == dtypes.float32
                 and scale_slot != lr_slot, "training.grad_scale_buffer must be a one-element float32 optimizer "
                 "buffer other than lr_buffer")
        need(tr.get("optimizer_state") in bundle_format.OPTIMIZER_STATES,
             "training.optimizer_state must be 'kept' or 'initial'")
    else:
        need(not any(k in entries for k in bundle_format.OPTIMIZER_ENTRYPOINTS), "train_step without an optimizer")
        need(tr.get("grad_scale_buffer") is None, "training.grad_scale_buffer without an optimizer")
    rng = get(manifest, "rng", dict, "manifest")
    seed_counter = [get_int(rng, "seed", "rng", 0, 0xFFFFFFFF), get_int(rng, "counter", "rng", 0, 0xFFFFFFFF)]

    _check_dataflow(slots, kernels, entries, variables)

    stored = {}
    for s, (off, nbytes) in where_data.items():
        dt = np.dtype(slots[s].dtype.np).newbyteorder("<")
        # a view of the data section on a little-endian host (the caller copies it into device buffers: a
        # second copy here made a 498 MB bundle's load peak at 2.9x the file)
        stored[s] = np.frombuffer(body[off:off + nbytes], dtype=dt).astype(slots[s].dtype.np, copy=False)
    prog = Program(slots, kernels, entries, inputs, targets, outputs, variables, seed_counter, grads, opt, lr_slot,
                   scale_slot)
    return prog, stored


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _check_hyper(opt: dict) -> None:
    """Each hyperparameter of a named optimizer is one it takes, of the JSON kind docs/bundle-format.md gives."""
    known = OPTIMIZER_HYPER.get(opt["name"])
    need(known is not None, f"training.optimizer.name {opt['name']!r:.40} is not one of {list(OPTIMIZER_HYPER)}")
    kinds = {"number": _is_number, "bool": lambda v: isinstance(v, bool),
             "pair": lambda v: isinstance(v, list) and len(v) == 2 and all(_is_number(x) for x in v)}
    names = {"number": "a number", "bool": "true or false", "pair": "a list of two numbers"}
    for k, v in opt.items():
        if k in ("name", "lr"):
            continue
        need(k in known, f"training.optimizer: {opt['name']} has no hyperparameter {k!r:.40} (it takes {list(known)})")
        need(kinds[known[k]](v), f"training.optimizer.{k} must be {names[known[k]]}, got {v!r:.40}")


def _check_uncalled(k: int, ast: UOp) -> None:
    """A kernel no call names is checked against its own declared shapes: every kernel of a file is valid
    (polygrad-js decodes and checks them all, so both readers refuse the same files)."""
    where = f"kernel {k}"
    params = {n.arg[0]: n for n in ast.toposort() if n.op is Ops.DEFINE_GLOBAL}
    try:
        check_kernel(ast, [declared_count(params[i], where) if i in params else -1 for i in range(len(params))],
                     where=where)
    except serialize.KernelFormatError as e:
        raise BundleError(f"bundle manifest: {e}") from None


def _check_work(where: str, calls: list, kernels: list[UOp], slots: list, work_of: dict[int, int],
                max_work: int) -> None:
    """One call of the entrypoint evaluates at most max_work nodes, its Variables at their maxima."""
    work = 0
    for c in calls:
        if c.kernel < 0:
            work += slots[c.args[1]].size
            continue
        if c.kernel not in work_of:
            try:
                work_of[c.kernel] = kernel_work(kernels[c.kernel])
            except serialize.KernelFormatError as e:
                raise BundleError(f"bundle manifest: {where}: kernel {c.kernel}: {e}") from None
        work += work_of[c.kernel]
    if work > max_work:
        raise BundleError(f"bundle manifest: {where} evaluates up to {work} kernel nodes per call (its Variables at "
                          f"their maxima); the limit for this file is {max_work}. If you trust it, load it with "
                          "Model.load(..., max_work=N)")


def _kernel_globals(k: int, ast: UOp, variables: dict[str, tuple[int, int]]) -> dict[int, tuple[DType, Any]]:
    """{slot: (dtype, declared shape)} of a kernel's DEFINE_GLOBALs; its Variables must be declared."""
    out: dict[int, tuple[DType, Any]] = {}
    for n in ast.toposort():
        # the messages show no arg: a malformed one may hold nodes that cannot even be printed
        if n.op is Ops.DEFINE_GLOBAL:
            need(n.dtype is not None and isinstance(n.arg, tuple) and len(n.arg) == 2 and isinstance(n.arg[0], int),
                 f"kernel {k}: a DEFINE_GLOBAL needs a dtype and the arg (slot, shape)")
            prev = out.setdefault(n.arg[0], (n.dtype, n.arg[1]))
            need(prev == (n.dtype, n.arg[1]), f"kernel {k}: parameter {n.arg[0]} declared twice differently")
        elif n.op is Ops.DEFINE_VAR:
            ok = isinstance(n.arg, tuple) and len(n.arg) == 3 and isinstance(n.arg[0], str)
            need(ok and variables.get(n.arg[0]) == tuple(n.arg[1:]),
                 f"kernel {k}: a DEFINE_VAR {n.arg[0] if ok else '(malformed)'!r:.60} is not declared with these "
                 "bounds in the manifest's variables")
        elif n.op is Ops.BIND:
            need(False, f"kernel {k}: a kernel cannot hold a bound value (BIND)")
    return out


def _check_call(where: str, k: int, ast: UOp, globals_: dict[int, tuple[DType, Any]], args: tuple[int, ...],
                slots: list, variables: dict[str, tuple[int, int]]) -> None:
    need(sorted(globals_) == list(range(len(args))), f"{where}: kernel {k} takes {len(globals_)} buffers, the call "
         f"passes {len(args)}")
    for i, s in enumerate(args):
        dt, shape = globals_[i]
        slot = slots[s]
        need(dt == slot.dtype, f"{where}: kernel {k} parameter {i} is {dt.name}, buffer {s} is {slot.dtype.name}")
        try:
            dims = shape if isinstance(shape, tuple) else (shape,)
            n = 1
            for d in dims:
                n *= sint.vmax(d)
        except Exception:  # noqa: BLE001 (an unreadable size is a malformed file, reported below)
            n = -1
        need(0 <= n <= slot.size, f"{where}: kernel {k} parameter {i} spans {n} elements, buffer {s} holds {slot.size}")
    try:
        check_kernel(ast, [slots[s].size for s in args], [slots[s].dtype for s in args], where=f"kernel {k}")
    except serialize.KernelFormatError as e:
        raise BundleError(f"bundle manifest: {where}: {e}") from None


def _check_distinct(where: str, args: tuple[int, ...]) -> None:
    """One buffer is never two parameters of a call: through two pointers the order of reads and writes
    is not defined (the C backends declare them restrict), so backends would disagree."""
    for j, s in enumerate(args):
        need(s not in args[:j], f"{where}: buffer {s} is passed as parameters {args.index(s)} and {j}; the buffers "
             "of one call must be distinct (a kernel reads and writes one buffer through one parameter)")


def _check_dataflow(slots: list, kernels: list[UOp], entries: dict, variables: dict[str, tuple[int, int]]) -> None:
    """Every temporary or output an entrypoint reads, and every output it returns, is written by an
    earlier call of that entrypoint (docs/bundle-format.md section 4.1)."""
    for name, flow in program_flow(slots, kernels, entries, variables).items():
        e = entries[name]
        if flow.readonly_write is not None:
            i, p, s = flow.readonly_write
            need(False, f"{_call_text(name, e, i, p)} writes buffer {s} (input {slots[s].name!r}); a bundle never "
                 "writes its inputs (they may be the caller's own tensors)")
        if flow.unwritten_read is not None:
            i, p, s = flow.unwritten_read
            need(False, f"{_call_text(name, e, i, p)} reads buffer {s} ({slots[s].role} {slots[s].name!r}) before "
                 f"any earlier call of {name!r} writes it; a bundle reads only what it stores, is given or wrote "
                 "itself")
        for s in flow.unwritten_outputs:
            key = next(k for k, v in e.outputs.items() if v == s)
            need(False, f"entrypoints.{name}.outputs.{key}: buffer {s} ({slots[s].name!r}) is never written by "
                 f"the calls of {name!r}")


def _call_text(name: str, e: Any, i: int, p: int) -> str:
    k = e.calls[i].kernel
    return f"entrypoints.{name}.calls[{i}]: " + ("the copy" if k < 0 else f"kernel {k} (parameter {p})")
