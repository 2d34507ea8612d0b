"""The core's layout, read from the source (function-level imports included).

The Tensor's house (issue 10 item 8): one concern per module, mixins written against type(self), no import
of polygrad.tensor from any mixin (so no import cycle between tensor.py and its mixins).
The model package (issue 29 section 2): one module per concern, each stating its stage, and no import cycle
through any of them: program.py imports none of the others, format.py never reaches the Model class."""
from __future__ import annotations

import ast
import pathlib

import pytest

import polygrad
from polygrad import Tensor

SRC = pathlib.Path(polygrad.__file__).parent
MIXINS = sorted(p for p in SRC.glob("tensor_*.py"))


def _import_nodes(path: pathlib.Path) -> list[ast.Import | ast.ImportFrom]:
    """A file's import statements that run (anywhere, functions included), skipping `if TYPE_CHECKING:` blocks."""
    tree = ast.parse(path.read_text())
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            skip.update(id(n) for n in ast.walk(node))
    return [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom)) and id(n) not in skip]


def _runtime_imports(path: pathlib.Path) -> list[str]:
    """Modules a file imports at run time (anywhere, functions included), skipping `if TYPE_CHECKING:` blocks."""
    found = []
    for node in _import_nodes(path):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.append(node.module)
        elif isinstance(node, ast.Import):
            found += [a.name for a in node.names]
    return found


def _module_files() -> dict[str, pathlib.Path]:
    """{dotted name: file} of every module of polygrad-core (a package by its __init__.py)."""
    out = {}
    for path in SRC.rglob("*.py"):
        parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def import_graph() -> dict[str, set[str]]:
    """{module: the polygrad-core modules it imports}, function-level imports included. `from pkg import x`
    is an edge to pkg.x when x is a submodule, else to pkg; relative imports are resolved."""
    files = _module_files()
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        edges = set()
        for node in _import_nodes(path):
            if isinstance(node, ast.Import):
                edges |= {a.name for a in node.names if a.name in files}
                continue
            base = node.module or ""
            if node.level:
                up = package.split(".")[:len(package.split(".")) - (node.level - 1)]
                base = ".".join(up + ([node.module] if node.module else []))
            for a in node.names:
                if f"{base}.{a.name}" in files:
                    edges.add(f"{base}.{a.name}")
                elif base in files:
                    edges.add(base)
        graph[name] = edges - {name}
    return graph


def _reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    seen: set[str] = set()
    todo = list(graph.get(start, ()))
    while todo:
        m = todo.pop()
        if m not in seen:
            seen.add(m)
            todo += graph.get(m, ())
    return seen


@pytest.mark.parametrize("path", MIXINS, ids=lambda p: p.name)
def test_mixins_never_import_tensor(path: pathlib.Path) -> None:
    assert "polygrad.tensor" not in _runtime_imports(path), f"{path.name} imports polygrad.tensor"
    names = [n.lineno for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Name) and n.id == "Tensor"]
    assert not names, f"{path.name} uses the name Tensor in code (lines {names}); use type(self), cls or type(x)"


CONCERNS = {
    "tensor_create": ["empty", "full", "zeros", "ones", "arange", "linspace", "eye", "full_like", "zeros_like",
                      "rand_like", "normal", "multinomial"],
    "tensor_random": ["rand", "randn", "randint", "manual_seed"],
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


MODEL = SRC / "model"


def _model_modules(graph: dict[str, set[str]]) -> list[str]:
    return sorted(m for m in graph if m == "polygrad.model" or m.startswith("polygrad.model."))


def test_no_import_cycle_passes_through_the_model_package() -> None:
    """Counting imports inside functions, no module of polygrad.model reaches itself (model.py and
    modelformat.py imported each other inside functions before the split, and saving imported polygrad)."""
    graph = import_graph()
    cyclic = [m for m in _model_modules(graph) if m in _reachable(graph, m)]
    assert not cyclic, f"import cycles through {cyclic}"


# polygrad/model/ bottom-up, as docs/architecture.md lists it: each module imports only modules before it
MODEL_ORDER = ["program", "errors", "signature", "table", "executor", "data", "optim", "format", "capture",
               "training", "core"]


def test_model_modules_depend_downward() -> None:
    """program.py is the data model under everything, format.py (the bundle) never reaches the Model, and
    no module imports one listed after it in MODEL_ORDER (nor the package's __init__)."""
    graph = import_graph()
    found = sorted(p.stem for p in MODEL.glob("*.py") if p.stem != "__init__")
    assert found == sorted(MODEL_ORDER), f"polygrad/model/ holds {found}; list each module in MODEL_ORDER"
    for k, name in enumerate(MODEL_ORDER):
        deps = {"__init__" if m == "polygrad.model" else m.rpartition(".")[2]
                for m in set(_model_modules(graph)) & graph[f"polygrad.model.{name}"]}
        above = sorted(deps - set(MODEL_ORDER[:k]))
        assert not above, f"model/{name}.py imports {above}, which are not below it in MODEL_ORDER"
    assert not _reachable(graph, "polygrad.model.format") & {"polygrad.model", "polygrad.model.core"}


def test_model_modules_state_their_stage_and_stay_small() -> None:
    files = sorted(MODEL.glob("*.py"))
    assert len(files) > 5, "polygrad/model/ is not split by concern"
    for path in files:
        doc = ast.get_docstring(ast.parse(path.read_text())) or ""
        assert "Stage:" in doc, f"{path.name} does not open with a docstring naming its stage, input and output"
        lines = len(path.read_text().splitlines())
        assert lines <= 500, f"{path.name} has {lines} lines; split it by concern"
