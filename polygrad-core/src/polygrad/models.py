"""polygrad.models: Models built from a JSON-compatible description instead of Python code.

Stage: user API over `polygrad.Model`. Input: a config dict (layer types, sizes, activations, and for
`Graph` the edges between named nodes) that `json.loads` could have produced. Output: a `Model`, the
same type that capture makes, so `fit`, `save` and the `.pgb` bundle work as for any Model. The config
is checked before anything is built: an unknown layer type, a missing or ill-typed field, an edge that
names no node, or a cycle raises `ModelConfigError` naming the place.

Sequential: one input, layers applied in order.

>>> from polygrad import models
>>> m = models.Sequential({"input": {"name": "x", "shape": [4]}, "batch": 2,
...                        "layers": [{"type": "linear", "out_features": 3, "activation": "relu"},
...                                   {"type": "linear", "out_features": 2}],
...                        "output": "logits", "loss": "cross_entropy"})
>>> m.forward(x=[[1, 2, 3, 4], [0, 0, 0, 0]])["logits"].shape
(2, 2)
>>> [(s["name"], s["dtype"]) for s in m.summary().targets]
[('y', 'int32')]
>>> m.dispose()

Graph: named nodes; a node's inputs are earlier names (declared inputs or nodes), given by its
`inputs` list or by top-level `edges` ([source, node] pairs). Merge nodes (`add`, `mul`, `sub`,
`concat`) take several inputs; layers take one.

Config keys (Sequential / Graph):
  input / inputs   {"name", "shape" (per sample, without the batch), "dtype"="float32"} / a list of them
  batch            an int (fixed), or {"name", "min", "max"}: a bounded Variable leading dimension
                   (default {"name": "batch", "min": 1, "max": 64})
  layers / nodes   layer specs: {"type", ...its arguments, "activation"?} (+ "name", "inputs" in a Graph)
  output / outputs the output name (Sequential, default "output") / list of node names (Graph)
  loss             optional: "mse", "l1", "cross_entropy", "binary_cross_entropy" (with logits), or
                   {"type", "output", "target"} in a Graph with several outputs
  target(s)        optional target specs; by default one target "y" of the loss's natural dtype/shape
  seed             optional int: parameters are initialised from this seed (the global seed is restored)
"""
from __future__ import annotations

import copy
from typing import Any, Callable, Mapping

from polygrad import nn, random
from polygrad.model import Model, ModelError
from polygrad.tensor import Tensor
from polygrad.uop.serialize import DTYPES_BY_NAME
from polygrad.uop.sint import Variable

__all__ = ["Graph", "LAYERS", "ModelConfigError", "Sequential"]


class ModelConfigError(ModelError):
    """A models.Sequential / models.Graph description that cannot be built (the message says where)."""


# ---------------------------------------------------------------------------------------------------
# field checks


def _field(spec: Mapping, key: str, kind: type | tuple, where: str, default: Any = ...) -> Any:
    if key not in spec:
        if default is ...:
            raise ModelConfigError(f"{where} lacks {key!r}")
        return default
    v = spec[key]
    bad_bool = isinstance(v, bool) and bool not in (kind if isinstance(kind, tuple) else (kind,))
    if not isinstance(v, kind) or bad_bool:
        names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise ModelConfigError(f"{where}.{key} must be {names}, got {v!r:.60}")
    return v


def _pos_int(spec: Mapping, key: str, where: str, default: Any = ...) -> Any:
    v = _field(spec, key, int, where, default)
    if v is not None and v is not default and v < 1:
        raise ModelConfigError(f"{where}.{key} must be >= 1, got {v}")
    return v


def _int_or_pair(spec: Mapping, key: str, where: str, default: Any) -> Any:
    v = _field(spec, key, (int, list), where, default)
    if isinstance(v, list):
        if not all(isinstance(d, int) and not isinstance(d, bool) for d in v):
            raise ModelConfigError(f"{where}.{key} must be an int or a list of ints, got {v!r:.60}")
        return tuple(v)
    return v


def _known(spec: Mapping, where: str, allowed: set[str]) -> None:
    extra = sorted(set(spec) - allowed)
    if extra:
        raise ModelConfigError(f"{where} has unknown fields {extra}; {spec.get('type', 'it')!r} takes "
                               f"{sorted(allowed - {'type'})}")


# ---------------------------------------------------------------------------------------------------
# layers: type name -> builder(spec, input shape, where) -> callable (which may hold Tensor attributes)

ACTIVATIONS: dict[str, Callable[[Any], Any]] = {
    "relu": lambda x: x.relu(), "gelu": lambda x: x.gelu(), "tanh": lambda x: x.tanh(),
    "sigmoid": lambda x: x.sigmoid(), "silu": lambda x: x.silu(), "elu": lambda x: x.elu(),
    "leaky_relu": lambda x: x.leaky_relu(), "softplus": lambda x: x.softplus(), "mish": lambda x: x.mish(),
    "softmax": lambda x: x.softmax(-1), "log_softmax": lambda x: x.log_softmax(-1), "linear": lambda x: x,
}


class _Apply:
    """A parameter-free layer: a function of its input."""

    def __init__(self, fn: Callable[[Any], Any]):
        self.fn = fn

    def __call__(self, x: Any) -> Any:
        return self.fn(x)


def _need_rank(shape: tuple, lo: int, where: str, what: str) -> None:
    if len(shape) < lo:
        raise ModelConfigError(f"{where}: {what} needs an input of at least {lo} dims (batch included), "
                               f"got shape {list(shape)}")


def _linear(spec: Mapping, shape: tuple, where: str) -> Any:
    _known(spec, where, {"type", "out_features", "bias", "activation", "name", "inputs"})
    _need_rank(shape, 2, where, "linear")
    return nn.Linear(shape[-1], _pos_int(spec, "out_features", where), bias=_field(spec, "bias", bool, where, True))


def _conv(dims: int) -> Callable:
    def build(spec: Mapping, shape: tuple, where: str) -> Any:
        _known(spec, where, {"type", "out_channels", "kernel_size", "stride", "padding", "dilation", "groups",
                             "bias", "activation", "name", "inputs"})
        _need_rank(shape, dims + 2, where, f"conv{dims}d")
        cls = nn.Conv1d if dims == 1 else nn.Conv2d
        padding = spec.get("padding", 0)
        if not isinstance(padding, str):
            padding = _int_or_pair(spec, "padding", where, 0)
        return cls(shape[1], _pos_int(spec, "out_channels", where), _int_or_pair(spec, "kernel_size", where, ...),
                   stride=_int_or_pair(spec, "stride", where, 1), padding=padding,
                   dilation=_int_or_pair(spec, "dilation", where, 1), groups=_pos_int(spec, "groups", where, 1),
                   bias=_field(spec, "bias", bool, where, True))
    return build


def _pool(kind: str) -> Callable:
    def build(spec: Mapping, shape: tuple, where: str) -> Any:
        _known(spec, where, {"type", "kernel_size", "stride", "padding", "activation", "name", "inputs"})
        _need_rank(shape, 4, where, f"{kind}_pool2d")
        k = _int_or_pair(spec, "kernel_size", where, 2)
        stride = _int_or_pair(spec, "stride", where, None)
        padding = _int_or_pair(spec, "padding", where, 0)
        if kind == "max":
            return _Apply(lambda x: x.max_pool2d(k, stride=stride, padding=padding))
        return _Apply(lambda x: x.avg_pool2d(k, stride=stride, padding=padding))
    return build


def _batchnorm(spec: Mapping, shape: tuple, where: str) -> Any:
    _known(spec, where, {"type", "eps", "momentum", "affine", "activation", "name", "inputs"})
    _need_rank(shape, 2, where, "batchnorm")
    return nn.BatchNorm(shape[1], eps=float(_field(spec, "eps", (int, float), where, 1e-5)),
                        momentum=float(_field(spec, "momentum", (int, float), where, 0.1)),
                        affine=_field(spec, "affine", bool, where, True))


def _layernorm(spec: Mapping, shape: tuple, where: str) -> Any:
    _known(spec, where, {"type", "eps", "elementwise_affine", "activation", "name", "inputs"})
    _need_rank(shape, 2, where, "layernorm")
    return nn.LayerNorm(shape[-1], eps=float(_field(spec, "eps", (int, float), where, 1e-5)),
                        elementwise_affine=_field(spec, "elementwise_affine", bool, where, True))


def _rmsnorm(spec: Mapping, shape: tuple, where: str) -> Any:
    _known(spec, where, {"type", "eps", "activation", "name", "inputs"})
    _need_rank(shape, 2, where, "rmsnorm")
    eps = _field(spec, "eps", (int, float), where, None)
    return nn.RMSNorm(shape[-1], eps=None if eps is None else float(eps))


def _groupnorm(spec: Mapping, shape: tuple, where: str) -> Any:
    _known(spec, where, {"type", "num_groups", "eps", "affine", "activation", "name", "inputs"})
    _need_rank(shape, 2, where, "groupnorm")
    groups = _pos_int(spec, "num_groups", where)
    if shape[1] % groups:
        raise ModelConfigError(f"{where}: {shape[1]} channels do not split into {groups} groups")
    return nn.GroupNorm(groups, shape[1], eps=float(_field(spec, "eps", (int, float), where, 1e-5)),
                        affine=_field(spec, "affine", bool, where, True))


def _embedding(spec: Mapping, shape: tuple, where: str) -> Any:
    _known(spec, where, {"type", "num_embeddings", "embedding_dim", "activation", "name", "inputs"})
    return nn.Embedding(_pos_int(spec, "num_embeddings", where), _pos_int(spec, "embedding_dim", where))


def _dropout(spec: Mapping, shape: tuple, where: str) -> Any:
    _known(spec, where, {"type", "p", "activation", "name", "inputs"})
    p = float(_field(spec, "p", (int, float), where, 0.5))
    if not 0 <= p < 1:
        raise ModelConfigError(f"{where}.p must be in [0, 1), got {p}")
    return nn.Dropout(p)


def _flatten(spec: Mapping, shape: tuple, where: str) -> Any:
    _known(spec, where, {"type", "activation", "name", "inputs"})
    return _Apply(lambda x: x.flatten(1))


def _reshape(spec: Mapping, shape: tuple, where: str) -> Any:
    _known(spec, where, {"type", "shape", "activation", "name", "inputs"})
    per_sample = _field(spec, "shape", list, where)
    if not all(isinstance(d, int) and not isinstance(d, bool) and (d > 0 or d == -1) for d in per_sample) or \
            per_sample.count(-1) > 1:
        raise ModelConfigError(f"{where}.shape must list positive sizes (one -1 at most), got {per_sample!r:.60}")
    return _Apply(lambda x: x.reshape(x.shape[0], *per_sample))


def _activation_layer(name: str) -> Callable:
    def build(spec: Mapping, shape: tuple, where: str) -> Any:
        _known(spec, where, {"type", "name", "inputs"})
        return _Apply(ACTIVATIONS[name])
    return build


LAYERS: dict[str, Callable[[Mapping, tuple, str], Any]] = {
    "linear": _linear, "conv1d": _conv(1), "conv2d": _conv(2), "max_pool2d": _pool("max"),
    "avg_pool2d": _pool("avg"), "batchnorm": _batchnorm, "layernorm": _layernorm, "rmsnorm": _rmsnorm,
    "groupnorm": _groupnorm, "embedding": _embedding, "dropout": _dropout, "flatten": _flatten,
    "reshape": _reshape, **{name: _activation_layer(name) for name in ACTIVATIONS if name != "linear"},
}
MERGES: dict[str, Callable[[list], Any]] = {
    "add": lambda xs: _fold(xs, lambda a, b: a + b), "mul": lambda xs: _fold(xs, lambda a, b: a * b),
    "sub": lambda xs: _fold(xs, lambda a, b: a - b),
}


def _fold(xs: list, fn: Callable[[Any, Any], Any]) -> Any:
    out = xs[0]
    for x in xs[1:]:
        out = fn(out, x)
    return out


def _layer_type(spec: Any, where: str) -> str:
    if not isinstance(spec, Mapping):
        raise ModelConfigError(f"{where} must be an object with a 'type', got {type(spec).__name__}")
    t = _field(spec, "type", str, where).lower()
    if t not in LAYERS and t not in MERGES and t != "concat":
        raise ModelConfigError(f"{where}: unknown layer type {spec['type']!r}; known types: "
                               f"{sorted([*LAYERS, *MERGES, 'concat'])}")
    return t


def _activation(spec: Mapping, where: str) -> str | None:
    """The spec's activation name (checked), or None."""
    act = spec.get("activation")
    if act is None:
        return None
    if not isinstance(act, str) or act.lower() not in ACTIVATIONS:
        raise ModelConfigError(f"{where}.activation {act!r} is not one of {sorted(ACTIVATIONS)}")
    return act.lower()


def _activate(x: Any, act: str | None) -> Any:
    return x if act is None else ACTIVATIONS[act](x)


# ---------------------------------------------------------------------------------------------------
# inputs, targets, loss


def _batch_dim(cfg: Mapping) -> Any:
    b = cfg.get("batch", {"name": "batch", "min": 1, "max": 64})
    if isinstance(b, int) and not isinstance(b, bool):
        if b < 1:
            raise ModelConfigError(f"config.batch must be >= 1, got {b}")
        return b
    if isinstance(b, Mapping):
        _known(b, "config.batch", {"name", "min", "max"})
        name = _field(b, "name", str, "config.batch", "batch")
        lo, hi = _pos_int(b, "min", "config.batch", 1), _pos_int(b, "max", "config.batch")
        try:
            return Variable(name, lo, hi)
        except Exception as e:  # noqa: BLE001 (VariableError and friends, reported as a config error)
            raise ModelConfigError(f"config.batch: {e}") from None
    raise ModelConfigError(f"config.batch must be an int or {{'name', 'min', 'max'}}, got {b!r:.60}")


def _tensor_spec(spec: Any, where: str, default_dtype: str = "float32") -> tuple[str, tuple[int, ...], str]:
    if not isinstance(spec, Mapping):
        raise ModelConfigError(f"{where} must be an object with 'name' and 'shape'")
    _known(spec, where, {"name", "shape", "dtype"})
    name = _field(spec, "name", str, where)
    if not name.isidentifier():
        raise ModelConfigError(f"{where}.name {name!r} must be an identifier")
    shape = _field(spec, "shape", list, where)
    if not all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in shape):
        raise ModelConfigError(f"{where}.shape must list positive sizes (per sample, without the batch), "
                               f"got {shape!r:.60}")
    dtype = _field(spec, "dtype", str, where, default_dtype)
    if dtype not in DTYPES_BY_NAME:
        raise ModelConfigError(f"{where}.dtype {dtype!r} is not one of {sorted(DTYPES_BY_NAME)}")
    return name, tuple(shape), dtype


def _empty(batch: Any, shape: tuple, dtype: str) -> Any:
    return Tensor.empty(batch, *shape, dtype=dtype)


LOSSES: dict[str, tuple[str, Callable[[Any, Any], Any]]] = {  # name -> (target dtype, fn(output, target))
    "mse": ("float32", lambda o, y: (o - y).square().mean()),
    "l1": ("float32", lambda o, y: (o - y).abs().mean()),
    "cross_entropy": ("int32", lambda o, y: o.sparse_categorical_crossentropy(y)),
    "binary_cross_entropy": ("float32", lambda o, y: o.binary_crossentropy_logits(y)),
}


def _loss_name(v: Any, where: str) -> str:
    if not isinstance(v, str) or v.lower() not in LOSSES:
        raise ModelConfigError(f"{where} {v!r} is not one of {sorted(LOSSES)}")
    return v.lower()


def _default_target(loss: str, out_shape: tuple) -> dict:
    dtype = LOSSES[loss][0]
    per_sample = list(out_shape[1:-1]) if dtype == "int32" else list(out_shape[1:])
    return {"name": "y", "shape": per_sample, "dtype": dtype}


def _build_model(net: Any, inputs: dict, outputs: dict[str, tuple], cfg: Mapping, batch: Any) -> Model:
    """The Model of `net` with the config's loss and targets (outputs: name -> shape, batch included)."""
    loss_cfg = cfg.get("loss")
    if loss_cfg is None:
        if "target" in cfg or "targets" in cfg:
            raise ModelConfigError("config gives targets but no loss; add e.g. \"loss\": \"mse\"")
        return Model(net, inputs=inputs)
    if isinstance(loss_cfg, Mapping):
        _known(loss_cfg, "config.loss", {"type", "output", "target"})
        name = _loss_name(loss_cfg.get("type"), "config.loss.type")
        out = _field(loss_cfg, "output", str, "config.loss", None)
        tgt = _field(loss_cfg, "target", str, "config.loss", None)
    else:
        name, out, tgt = _loss_name(loss_cfg, "config.loss"), None, None
    if out is None:
        if len(outputs) != 1:
            raise ModelConfigError(f"the model has outputs {list(outputs)}; say which one the loss reads with "
                                   "\"loss\": {\"type\": ..., \"output\": name}")
        out = next(iter(outputs))
    if out not in outputs:
        raise ModelConfigError(f"config.loss.output {out!r} is not an output ({list(outputs)})")
    raw = cfg.get("targets", [cfg["target"]] if "target" in cfg else [_default_target(name, outputs[out])])
    if not isinstance(raw, list) or not raw:
        raise ModelConfigError("config.targets must be a non-empty list of {'name', 'shape', 'dtype'}")
    targets = {}
    for i, t in enumerate(raw):
        tname, tshape, tdtype = _tensor_spec(t, f"config.targets[{i}]", LOSSES[name][0])
        if tname in inputs:
            raise ModelConfigError(f"target {tname!r} has the name of an input")
        targets[tname] = _empty(batch, tshape, tdtype)
    tgt = tgt if tgt is not None else next(iter(targets))
    if tgt not in targets:
        raise ModelConfigError(f"config.loss.target {tgt!r} is not a target ({list(targets)})")
    fn = LOSSES[name][1]
    return Model(net, inputs=inputs, targets=targets, loss=lambda outs, **ys: fn(outs[out], ys[tgt]))


def _described(model: Model, kind: str, config: Mapping) -> Model:
    """The model with its description kept (`models_config`: (kind, a copy of the config)), from which
    polygrad.onnx.export writes its layers; a saved bundle does not carry it."""
    model.models_config = (kind, copy.deepcopy(dict(config)))  # type: ignore[attr-defined]
    return model


def _seeded(cfg: Mapping, build: Callable[[], Model]) -> Model:
    """build() with the config's seed, if any, leaving the global RNG state as it was."""
    seed = cfg.get("seed")
    if seed is None:
        return build()
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        raise ModelConfigError(f"config.seed must be a non-negative int, got {seed!r:.40}")
    with random.scoped(seed):  # this thread's own generator: other threads' draws do not shift the weights
        return build()


# ---------------------------------------------------------------------------------------------------
# Sequential


class _SequentialNet:
    """`layers[i]` then activation `acts[i]`, in order (parameters are named layers.<i>.<name>)."""

    def __init__(self, input_name: str, output_name: str, layers: list, acts: list[str | None]):
        self.input_name, self.output_name, self.layers, self.acts = input_name, output_name, layers, acts

    def __call__(self, **inputs: Any) -> dict:
        x = inputs[self.input_name]
        for layer, act in zip(self.layers, self.acts):
            x = _activate(layer(x), act)
        return {self.output_name: x}


def Sequential(config: Mapping[str, Any]) -> Model:  # noqa: N802 (a Model constructor, spelled as a class)
    """A Model applying `config["layers"]` in order to one input (see the module docstring)."""
    if not isinstance(config, Mapping):
        raise ModelConfigError(f"Sequential needs a config dict, got {type(config).__name__}")
    _known(config, "config", {"input", "batch", "layers", "output", "loss", "target", "targets", "seed"})
    name, shape, dtype = _tensor_spec(config.get("input"), "config.input")
    out_name = _field(config, "output", str, "config", "output")
    if not out_name.isidentifier():
        raise ModelConfigError(f"config.output {out_name!r} must be an identifier")
    specs = _field(config, "layers", list, "config")
    if not specs:
        raise ModelConfigError("config.layers is empty; give at least one layer")
    batch = _batch_dim(config)

    def build() -> Model:
        probe = Tensor.empty(1, *shape, dtype=dtype)  # shapes only: nothing is realized
        layers, acts = [], []
        for i, spec in enumerate(specs):
            where = f"config.layers[{i}]"
            t = _layer_type(spec, where)
            if t not in LAYERS:
                raise ModelConfigError(f"{where}: {t!r} merges several inputs; it belongs in a models.Graph")
            layer, act = LAYERS[t](spec, tuple(probe.shape), where), _activation(spec, where)
            probe = _activate(_probe(layer, probe, where), act)
            layers.append(layer)
            acts.append(act)
        net = _SequentialNet(name, out_name, layers, acts)
        return _build_model(net, {name: _empty(batch, shape, dtype)}, {out_name: tuple(probe.shape)}, config, batch)

    return _described(_seeded(config, build), "Sequential", config)


def _probe(layer: Any, x: Any, where: str) -> Any:
    """The layer applied to a batch-1 placeholder, for the next layer's input shape."""
    try:
        return layer(x)
    except ModelConfigError:
        raise
    except Exception as e:  # noqa: BLE001 (a shape mismatch inside a layer, reported at its config entry)
        shapes = [list(t.shape) for t in x] if isinstance(x, list) else list(x.shape)
        raise ModelConfigError(f"{where} cannot take input(s) of shape {shapes}: {e}") from None


# ---------------------------------------------------------------------------------------------------
# Graph


class _GraphNet:
    """Nodes run in `plan` order; layer nodes' objects live in `nodes` (parameters: nodes.<name>.<name>)."""

    def __init__(self, plan: list[tuple[str, tuple[str, ...], str, int, str | None]], nodes: dict, outputs: list[str]):
        self.plan, self.nodes, self.output_names = plan, nodes, outputs

    def __call__(self, **inputs: Any) -> dict:
        values = dict(inputs)
        for name, srcs, kind, axis, act in self.plan:
            values[name] = _activate(_node(self.nodes.get(name), kind, axis, [values[s] for s in srcs]), act)
        return {k: values[k] for k in self.output_names}


def _node(layer: Any, kind: str, axis: int, xs: list) -> Any:
    """One node's value: a layer of its one input, or a merge of several."""
    if layer is not None:
        return layer(xs[0])
    if kind == "concat":
        return xs[0].cat(*xs[1:], dim=axis)
    return MERGES[kind](xs)


def Graph(config: Mapping[str, Any]) -> Model:  # noqa: N802 (a Model constructor, spelled as a class)
    """A Model over named nodes connected by edges (see the module docstring)."""
    if not isinstance(config, Mapping):
        raise ModelConfigError(f"Graph needs a config dict, got {type(config).__name__}")
    _known(config, "config", {"inputs", "batch", "nodes", "edges", "outputs", "loss", "target", "targets", "seed"})
    raw_inputs = _field(config, "inputs", list, "config")
    if not raw_inputs:
        raise ModelConfigError("config.inputs is empty; declare at least one input")
    in_specs = [_tensor_spec(s, f"config.inputs[{i}]") for i, s in enumerate(raw_inputs)]
    names = [n for n, _, _ in in_specs]
    nodes = _field(config, "nodes", list, "config")
    if not nodes:
        raise ModelConfigError("config.nodes is empty; give at least one node")
    srcs: dict[str, list[str]] = {}
    where_of: dict[str, str] = {}
    for i, spec in enumerate(nodes):
        where = f"config.nodes[{i}]"
        _layer_type(spec, where)
        name = _field(spec, "name", str, where)
        if not name.isidentifier() or name in names or name in srcs:
            raise ModelConfigError(f"{where}.name {name!r} must be an identifier distinct from every input and node")
        ins = _field(spec, "inputs", list, where, [])
        if not all(isinstance(s, str) for s in ins):
            raise ModelConfigError(f"{where}.inputs must list node or input names")
        srcs[name], where_of[name] = list(ins), where
    for i, edge in enumerate(_field(config, "edges", list, "config", [])):
        if not (isinstance(edge, list) and len(edge) == 2 and all(isinstance(e, str) for e in edge)):
            raise ModelConfigError(f"config.edges[{i}] must be [source, node], got {edge!r:.60}")
        if edge[1] not in srcs:
            raise ModelConfigError(f"config.edges[{i}] ends at {edge[1]!r}, which is not a node ({sorted(srcs)})")
        srcs[edge[1]].append(edge[0])
    known = set(names) | set(srcs)
    for name, ins in srcs.items():
        for s in ins:
            if s not in known:
                raise ModelConfigError(f"{where_of[name]} ({name!r}) takes {s!r}, which is neither an input nor a "
                                       f"node; known: {sorted(known)}")
        if not ins:
            raise ModelConfigError(f"{where_of[name]} ({name!r}) has no inputs; give \"inputs\": [...] or edges")
    order = _topological(srcs, set(names))
    outputs = _field(config, "outputs", list, "config")
    if not outputs or not all(isinstance(o, str) and o in srcs for o in outputs) or len(set(outputs)) < len(outputs):
        raise ModelConfigError(f"config.outputs must list distinct node names ({sorted(srcs)}), got {outputs!r:.80}")
    spec_of = {_field(s, "name", str, "node"): s for s in nodes}
    batch = _batch_dim(config)

    def build() -> Model:
        probes = {n: Tensor.empty(1, *shape, dtype=dt) for n, shape, dt in in_specs}
        plan, layers = [], {}
        for name in order:
            spec, where = spec_of[name], where_of[name]
            t = _layer_type(spec, where)
            xs = [probes[s] for s in srcs[name]]
            axis = -1
            if t in LAYERS:
                if len(xs) != 1:
                    raise ModelConfigError(f"{where} ({name!r}): a {t} layer takes one input, got {len(xs)}")
                layers[name] = LAYERS[t](spec, tuple(xs[0].shape), where)
            else:
                _known(spec, where, {"type", "name", "inputs", "axis", "activation"})
                axis = _field(spec, "axis", int, where, -1)
            act = _activation(spec, where)
            probes[name] = _activate(_probe(lambda v: _node(layers.get(name), t, axis, v), xs, where), act)
            plan.append((name, tuple(srcs[name]), t, axis, act))
        net = _GraphNet(plan, layers, outputs)
        inputs = {n: _empty(batch, shape, dt) for n, shape, dt in in_specs}
        return _build_model(net, inputs, {o: tuple(probes[o].shape) for o in outputs}, config, batch)

    return _described(_seeded(config, build), "Graph", config)


def _topological(srcs: dict[str, list[str]], inputs: set[str]) -> list[str]:
    """Node names with every node after its sources; ModelConfigError naming the nodes on a cycle."""
    order: list[str] = []
    state: dict[str, int] = {}  # 1: on the stack, 2: done
    for root in srcs:
        if state.get(root) == 2:
            continue
        stack = [(root, iter(srcs[root]))]
        state[root] = 1
        while stack:
            name, it = stack[-1]
            nxt = next((s for s in it if s not in inputs and state.get(s) != 2), None)
            if nxt is None:
                stack.pop()
                state[name] = 2
                order.append(name)
            elif state.get(nxt) == 1:
                cycle = [n for n, _ in stack][[n for n, _ in stack].index(nxt):] + [nxt]
                raise ModelConfigError(f"config.nodes form a cycle: {' -> '.join(reversed(cycle))}")
            else:
                state[nxt] = 1
                stack.append((nxt, iter(srcs[nxt])))
    return order
