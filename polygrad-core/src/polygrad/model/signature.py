"""What a Model's author declares, checked and turned into Specs: inputs, targets, Variables, params, caches.

Stage: capture, before anything runs. Input: the arguments of `Model(...)` (`inputs=`/`targets=` as
Tensor.empty(...) or Variables, `params=`, `caches=`, `entrypoints=`) and the shapes of the captured
outputs. Output: `Spec`s (program.py), Variable names with their bounds (one name, one pair of bounds),
and the named tensors and extra entrypoints capture.py records; a `ModelError` naming the argument
for anything a Model cannot declare.
"""
from __future__ import annotations

import functools
import types
from typing import Any, Mapping

from polygrad.definitions import bundle as bundle_format
from polygrad.model.errors import ModelCaptureError, ModelError
from polygrad.model.program import Spec
from polygrad.nn.state import get_state_dict
from polygrad.tensor import Tensor
from polygrad.uop.ops import Ops, UOp

BUILTIN_ENTRYPOINTS = tuple(bundle_format.ENTRYPOINTS)


def declare(var: UOp, variables: dict[str, tuple[int, int]]) -> str:
    """Record a Variable's bounds under its name (one name, one pair of bounds) and return the name."""
    vname, lo, hi = var.arg
    if variables.setdefault(vname, (lo, hi)) != (lo, hi):
        raise ModelError(f"Variable {vname!r} is declared with bounds {variables[vname]} and {(lo, hi)}")
    return vname


def is_variable(v: Any) -> bool:
    return isinstance(v, UOp) and v.op in (Ops.DEFINE_VAR, Ops.BIND) and \
        (v.op is Ops.DEFINE_VAR or v.src[0].op is Ops.DEFINE_VAR)


def spec_of(name: Any, t: Any, what: str, variables: dict[str, tuple[int, int]]) -> Spec:
    if not isinstance(name, str) or not name.isidentifier():
        raise ModelError(f"{what} names must be identifiers (they become keyword arguments), got {name!r}")
    if not isinstance(t, Tensor):
        raise ModelError(f"{what}[{name!r}] must be a Tensor declaring shape and dtype, e.g. Tensor.empty(32, 784), "
                         f"or a Variable passed as an int; got {type(t).__name__}")
    shape: list[int | str] = []
    for d in t.shape:
        if isinstance(d, UOp):
            if not is_variable(d):
                raise ModelError(f"{what}[{name!r}] shape {t.shape}: a variable dimension must be a Variable itself, "
                                 "not an expression (e.g. Tensor.empty(Variable('batch', 1, 64), 784))")
            shape.append(declare(d if d.op is Ops.DEFINE_VAR else d.src[0], variables))
        else:
            shape.append(int(d))
    return Spec(name, t.dtype, tuple(shape))


def split_inputs(decl: Any, what: str, variables: dict[str, tuple[int, int]]) -> tuple[list[Spec], list[str]]:
    """(tensor input specs, Variable argument names) of one entrypoint's declared inputs."""
    if not isinstance(decl, Mapping) or not decl:
        raise ModelError(f"{what} must be a dict {{name: Tensor.empty(shape)}} declaring at least one input")
    specs, args = [], []
    for k, v in decl.items():
        if is_variable(v):
            var = v if v.op is Ops.DEFINE_VAR else v.src[0]
            if k != var.arg[0]:
                raise ModelError(f"{what}[{k!r}] is Variable {var.arg[0]!r}; a Variable argument is passed under "
                                 f"its own name: {{{var.arg[0]!r}: Variable({var.arg[0]!r}, ...)}}")
            args.append(declare(var, variables))
        else:
            specs.append(spec_of(k, v, what, variables))
    return specs, args


def extra_entrypoints(entrypoints: Any, variables: dict[str, tuple[int, int]]) -> dict[str, tuple]:
    """{name: (callable, declared inputs, tensor input specs, Variable argument names)} of the extra
    evaluation entrypoints, checked."""
    if entrypoints is None:
        return {}
    if not isinstance(entrypoints, Mapping):
        raise ModelError("entrypoints must be a dict {name: (callable, {input name: Tensor.empty(...) or Variable})}")
    out = {}
    for name, pair in entrypoints.items():
        if not isinstance(name, str) or not name.isidentifier() or name in BUILTIN_ENTRYPOINTS:
            raise ModelError(f"entrypoint name {name!r} must be an identifier other than {list(BUILTIN_ENTRYPOINTS)}")
        if not isinstance(pair, (tuple, list)) or len(pair) != 2 or not callable(pair[0]):
            raise ModelError(f"entrypoints[{name!r}] must be (callable, {{input name: Tensor.empty(...)}})")
        specs, args = split_inputs(pair[1], f"entrypoints[{name!r}] inputs", variables)
        out[name] = (pair[0], pair[1], specs, args)
    return out


def params_of(obj: Any, params: Any) -> dict[str, Any]:
    """{name: Tensor} of the callable's parameters: `params=` (a dict, a list or an object), else the
    callable's own (its object's, a bound method's object's; a plain function has none)."""
    if params is None:
        if isinstance(obj, types.MethodType):
            return get_state_dict(obj.__self__)
        if isinstance(obj, (types.FunctionType, types.BuiltinFunctionType, functools.partial)):
            return {}  # a plain function: its closure state must come as params=
        return get_state_dict(obj)
    if isinstance(params, Mapping):
        named = dict(params)
    elif isinstance(params, (list, tuple)):
        named = {f"p{i}": t for i, t in enumerate(params)}
    else:
        named = get_state_dict(params)
    for k, t in named.items():
        if not isinstance(t, Tensor):
            raise ModelError(f"params[{k!r}] must be a Tensor, got {type(t).__name__}")
    return named


def caches_of(caches: Any) -> dict[str, Any]:
    """{name: Tensor} of `caches=`, each at a fixed size."""
    if caches is None:
        return {}
    if not isinstance(caches, Mapping):
        raise ModelError("caches must be a dict {name: Tensor} of buffers the entrypoints keep between calls")
    for k, t in caches.items():
        if not isinstance(k, str) or not k:
            raise ModelError(f"cache names must be non-empty strings, got {k!r}")
        if not isinstance(t, Tensor):
            raise ModelError(f"caches[{k!r}] must be a Tensor, got {type(t).__name__}")
        if any(isinstance(d, UOp) for d in t.shape):
            raise ModelError(f"caches[{k!r}] has a symbolic shape {t.shape}; a cache is allocated at a fixed size")
    return dict(caches)


def out_shape(name: str, shape: tuple, variables: dict[str, tuple[int, int]]) -> tuple[int | str, ...]:
    """A captured output's shape as a Spec holds it: fixed sizes, or the names of the inputs' Variables."""
    out: list[int | str] = []
    for d in shape:
        if isinstance(d, UOp):
            var = d.src[0] if d.op is Ops.BIND else d
            if var.op is not Ops.DEFINE_VAR or var.arg[0] not in variables:
                raise ModelCaptureError(f"output {name!r} has shape {shape}; an output dimension must be fixed or be "
                                        "one of the inputs' Variables itself (not an expression of them)")
            out.append(var.arg[0])
        else:
            out.append(int(d))
    return tuple(out)
