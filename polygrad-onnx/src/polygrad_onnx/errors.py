"""The errors polygrad-onnx raises; every message names the node, op or file and says what to do.

Stage: shared by every module of the package. Input: none. Output: exception types.
"""
from __future__ import annotations

from polygrad.errors import PolygradError


class OnnxError(PolygradError, ValueError):
    """An .onnx file, graph, operator or attribute that polygrad-onnx cannot import or export."""


class UnsupportedOpError(OnnxError):
    """An operator (or one of its attribute values) that polygrad-onnx does not implement."""
