"""The Tensor's house (issue 10 item 8): one concern per module, mixins written against type(self), no import
of polygrad.tensor from any mixin (so no import cycle between tensor.py and its mixins)."""
from __future__ import annotations

import ast
import pathlib

import pytest

import polygrad
from polygrad import Tensor

SRC = pathlib.Path(polygrad.__file__).parent
MIXINS = sorted(p for p in SRC.glob("tensor_*.py"))


def _runtime_imports(path: pathlib.Path) -> list[str]:
    """Modules a file imports at run time (anywhere, functions included), skipping `if TYPE_CHECKING:` blocks."""
    tree = ast.parse(path.read_text())
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            skip.update(id(n) for n in ast.walk(node))
    found = []
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.ImportFrom) and node.module:
            found.append(node.module)
        elif isinstance(node, ast.Import):
            found += [a.name for a in node.names]
    return found


@pytest.mark.parametrize("path", MIXINS, ids=lambda p: p.name)
def test_mixins_never_import_tensor(path: pathlib.Path) -> None:
    assert "polygrad.tensor" not in _runtime_imports(path), f"{path.name} imports polygrad.tensor"
    names = [n.lineno for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Name) and n.id == "Tensor"]
    assert not names, f"{path.name} uses the name Tensor in code (lines {names}); use type(self), cls or type(x)"


CONCERNS = {
    "tensor_create": ["empty", "full", "zeros", "ones", "arange", "linspace", "eye", "rand", "randn", "full_like",
                      "zeros_like", "rand_like", "manual_seed", "multinomial"],
    "tensor_dtype": ["cast", "bitcast", "float", "half", "int", "long", "bool", "double"],
    "tensor_elementwise": ["add", "sub", "mul", "div", "where", "maximum", "__lt__", "eq", "__iadd__", "__lshift__"],
    "tensor_math": ["exp", "log", "abs", "clamp", "pow", "erf", "isinf"],
    "tensor_activation": ["relu", "sigmoid", "gelu", "softplus"],
    "tensor_reduce": ["sum", "prod", "max", "mean", "var", "argmax", "cumsum", "cummax", "sort", "softmax"],
    "tensor_contract": ["matmul", "dot", "__matmul__", "einsum"],
    "tensor_movement": ["reshape", "permute", "expand", "pad", "shrink", "flip", "transpose", "flatten", "squeeze",
                        "cat", "stack", "split", "roll", "rearrange"],
    "tensor_indexing": ["__getitem__", "__setitem__", "gather", "scatter", "masked_select", "nonzero"],
    "tensor_nn": ["conv2d", "max_pool2d", "interpolate", "scaled_dot_product_attention", "one_hot", "normalize"],
    "tensor_losses": ["cross_entropy", "nll_loss", "binary_crossentropy"],
    "tensor": ["__init__", "realize", "numpy", "item", "assign", "backward", "gradient", "to", "_alu"],
}


@pytest.mark.parametrize("module", list(CONCERNS))
def test_each_concern_lives_in_its_module(module: str) -> None:
    for name in CONCERNS[module]:
        fn = getattr(Tensor, name)
        fn = getattr(fn, "__func__", fn)
        assert fn.__module__ == f"polygrad.{module}", f"Tensor.{name} is defined in {fn.__module__}"


def test_mixins_build_the_calling_class() -> None:
    """Constructors reached through a mixin build type(self)/cls, not a hard-wired Tensor."""
    class Sub(Tensor):
        __slots__ = ()
    x = Sub([1.0, 2.0])
    assert type(Sub.zeros(2)) is Sub and type(Sub.arange(3)) is Sub and type(x.full_like(0.0)) is Sub
