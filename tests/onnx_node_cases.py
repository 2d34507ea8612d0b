"""The ONNX backend operator tests (onnx.backend.test, "node" kind) run through polygrad.onnx: the adapter.

Each case is a one-node (or function-expanded) model with input and expected output arrays, the same the
onnx wheel ships as test dirs (model.onnx, test_data_set_*/input_*.pb, output_*.pb) when it ships them;
this onnx build generates them in process from onnx.backend.test.case (the generators the data is made
from), or reads ONNX_NODE_TEST_DIR when set to such a folder. An input that a node reads at load time
(a Reshape's shape, a Slice's starts) is given as a constant, as in an exported model; every other input
is a Tensor on the device under test, so the operator runs as polygrad kernels.
"""
from __future__ import annotations

import os
import pathlib
from dataclasses import dataclass
from typing import Any

import numpy as np

EXCLUSIONS = pathlib.Path(__file__).with_name("onnx_node_exclusions.txt")


@dataclass
class Case:
    name: str
    model: Any
    data_sets: list  # [(inputs, outputs)]
    rtol: float
    atol: float


def _read_dir(root: pathlib.Path) -> list[Case]:
    import onnx
    from onnx import numpy_helper
    out = []
    for d in sorted(p for p in root.iterdir() if (p / "model.onnx").exists()):
        model = onnx.load(str(d / "model.onnx"))
        sets = []
        for s in sorted(d.glob("test_data_set_*")):
            def arrays(prefix: str) -> list:
                files = sorted(s.glob(f"{prefix}_*.pb"), key=lambda p: int(p.stem.split("_")[1]))
                res = []
                for f in files:
                    t = onnx.TensorProto()
                    t.ParseFromString(f.read_bytes())
                    res.append(numpy_helper.to_array(t))
                return res
            sets.append((arrays("input"), arrays("output")))
        out.append(Case(d.name, model, sets, 1e-3, 1e-7))
    return out


def collect() -> dict[str, Case]:
    """{test name: Case} of every operator test."""
    root = os.environ.get("ONNX_NODE_TEST_DIR")
    if root:
        return {c.name: c for c in _read_dir(pathlib.Path(root))}
    import warnings

    from onnx.backend.test.case import node
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        cases = node.collect_testcases(None)
    return {c.name: Case(c.name, c.model, c.data_sets or [], c.rtol, c.atol) for c in cases}


def exclusions() -> dict[str, str]:
    """{test name: reason} from the committed exclusion list ("name  # reason" lines)."""
    out = {}
    for line in EXCLUSIONS.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, _, reason = line.partition("#")
        out[name.strip()] = reason.strip()
    return out


def static_inputs(model: Any) -> set[str]:
    """Graph inputs that some node reads at load time (its op's static input slots)."""
    from polygrad_onnx.node import OPS
    names = set()
    for proto in model.graph.node:
        opdef = OPS.get(proto.op_type)
        if opdef is not None:
            names.update(proto.input[i] for i in opdef.static if i < len(proto.input) and proto.input[i])
    return names


def _array(value: Any) -> np.ndarray:
    """A case's input or expected output as an array (some cases give TensorProtos)."""
    from onnx import TensorProto, numpy_helper
    return numpy_helper.to_array(value) if isinstance(value, TensorProto) else np.asarray(value)


def run_case(case: Case, device: str) -> None:
    """Run every data set of `case` on `device`; AssertionError (or the import's error) when one differs."""
    from polygrad import Context, Tensor
    from polygrad_onnx.graph import OnnxGraph, check_operators
    from polygrad_onnx.reader import check_opsets, read_model, tensor_array
    data = case.model.SerializeToString()
    f = read_model(data)
    check_operators(f.model.graph, case.name)
    check_opsets(f.model, case.name)
    graph = f.model.graph
    initial = {t.name: tensor_array(t) for t in graph.initializer}
    inputs = [i.name for i in graph.input if i.name not in initial]
    static = static_inputs(f.model)
    with Context(DEV=device):
        params = {k: Tensor(v) for k, v in initial.items() if v.dtype.kind == "f"}
        net = OnnxGraph(graph, f.opset, params, initial, {}, {o.name: o.name for o in graph.output})
        for feeds_in, expected in case.data_sets:
            feeds: dict[str, Any] = {}
            for name, arr in zip(inputs, feeds_in):
                arr = _array(arr)
                feeds[name] = arr if name in static else Tensor(arr)
            result = net.run(feeds)
            for o, want in zip(graph.output, expected):
                got = result[o.name]
                got = got.numpy() if isinstance(got, Tensor) else np.asarray(got)
                want = _array(want)
                assert got.shape == want.shape, f"{o.name}: shape {got.shape}, expected {want.shape}"
                assert got.dtype == want.dtype, f"{o.name}: dtype {got.dtype}, expected {want.dtype}"
                if want.dtype.kind in "biu":
                    np.testing.assert_array_equal(got, want, err_msg=o.name)
                else:
                    np.testing.assert_allclose(got, want, rtol=case.rtol, atol=case.atol, err_msg=o.name)
