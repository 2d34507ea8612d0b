"""An imported model saved as .pgb loads back: Model.load proves every kernel's indices, so the importer must
not leave index arithmetic that can overflow (issue 34: BERT's int64 token ids made a bundle that Model.save
wrote and Model.load, in Python and in polygrad-js, refused).
"""
from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx", reason="the tests build ONNX graphs")

import polygrad.onnx as pgo  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from polygrad import Model  # noqa: E402


def test_gather_with_int64_ids_saves_a_loadable_bundle(tmp_path):
    table = np.random.default_rng(0).standard_normal((10, 4)).astype(np.float32)
    graph = helper.make_graph([helper.make_node("Gather", ["table", "ids"], ["y"])], "embedding",
                              [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 5])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 5, 4])],
                              [numpy_helper.from_array(table, "table")])
    data = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
    ids = np.array([[3, -1, 0, 9, -10]], np.int64)  # negative ids count from the end (ONNX)
    model = pgo.load(data)
    try:
        np.testing.assert_array_equal(model.forward(ids=ids)["y"].numpy(), table[ids])
        model.save(tmp_path / "embedding.pgb")
    finally:
        model.dispose()
    loaded = Model.load(tmp_path / "embedding.pgb")
    try:
        np.testing.assert_array_equal(loaded.forward(ids=ids)["y"].numpy(), table[ids])
    finally:
        loaded.dispose()
