"""polygrad.onnx: ONNX import and export from the separate polygrad-onnx distribution, under the polygrad name.

Stage: user API shim. Input: nothing. Output: polygrad_onnx's public names (load, export, OnnxError,
UnsupportedOpError), or an ImportError that names `pip install polygrad-onnx` when that distribution is
not installed.
"""
try:
    from polygrad_onnx import *  # noqa: F401,F403
    from polygrad_onnx import __all__  # noqa: F401
except ModuleNotFoundError as e:
    if e.name != "polygrad_onnx":
        raise
    raise ModuleNotFoundError("polygrad.onnx needs the polygrad-onnx distribution: pip install polygrad-onnx "
                              "(or pip install 'polygrad[onnx]')", name="polygrad.onnx") from None
