"""polygrad-onnx: ONNX graphs as polygrad Models, and Models back to ONNX.

Imported as `polygrad.onnx` or `polygrad_onnx`:

    import polygrad.onnx
    model = polygrad.onnx.load("model.onnx", max_batch=8)   # a polygrad Model: forward, fit, save(.pgb)
    polygrad.onnx.export(model, "copy.onnx")                # a Model built by polygrad.models

Modules, in pipeline order: reader (parse and refuse), node (attributes, the op table), ops_math /
ops_shape / ops_nn / ops_rnn (operators over Tensors, NumPy versions for load-time folding), control (If,
Loop, Scan, unrolled), graph (running a graph), loader (load: the Model), export (Model -> ONNX).
"""
from polygrad_onnx.errors import OnnxError, UnsupportedOpError
from polygrad_onnx.export import export
from polygrad_onnx.loader import load

__version__ = "0.1.0"

__all__ = ["OnnxError", "UnsupportedOpError", "export", "load", "__version__"]
