"""The core's layout, read from the source (function-level imports included, `if TYPE_CHECKING:` blocks not).

The whole package (issue 29 section 3): no import cycle in polygrad-core, in each backend package or in
polygrad-hf, counting the imports inside functions (they run too) and the package `__init__` an import
from outside a package runs first; every import of polygrad-core goes downward (or within its layer)
in the declared order of LAYERS, and no core module imports polygrad.backend_api (backends do).
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
# the other distributions' packages (each its own import graph)
PACKAGES = ["polygrad_backend_cpu", "polygrad_backend_interp", "polygrad_backend_x86", "polygrad_backend_cuda",
            "polygrad_hf", "polygrad_onnx"]


def _is_type_checking(test: ast.expr) -> bool:
    return getattr(test, "id", None) == "TYPE_CHECKING" or getattr(test, "attr", None) == "TYPE_CHECKING"


def _import_nodes(path: pathlib.Path, only_nested: bool = False) -> list[ast.Import | ast.ImportFrom]:
    """A file's import statements that run (anywhere, functions included), skipping `if TYPE_CHECKING:` blocks;
    with only_nested, those not at module level."""
    tree = ast.parse(path.read_text())
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            skip.update(id(n) for n in ast.walk(node))
    if only_nested:
        skip.update(id(n) for n in tree.body)
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


def _module_files(src: pathlib.Path = SRC) -> dict[str, pathlib.Path]:
    """{dotted name: file} of every module of the package in `src` (a package by its __init__.py)."""
    out = {}
    for path in src.rglob("*.py"):
        parts = list(path.relative_to(src.parent).with_suffix("").parts)
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _imported(name: str, package: str, node: ast.Import | ast.ImportFrom, files: dict) -> set[str]:
    """The package's modules one import statement of module `name` (in `package`) loads. `from pkg import x`
    is pkg.x when x is a submodule, else pkg; relative imports are resolved; `import a.b.c` is its longest
    module prefix."""
    out = set()
    if isinstance(node, ast.Import):
        for a in node.names:
            mod = a.name
            while mod and mod not in files:
                mod = mod.rpartition(".")[0]
            if mod:
                out.add(mod)
        return out
    base = node.module or ""
    if node.level:
        up = package.split(".")[:len(package.split(".")) - (node.level - 1)]
        base = ".".join(up + ([node.module] if node.module else []))
    for a in node.names:
        mod = f"{base}.{a.name}" if f"{base}.{a.name}" in files else base
        while mod and mod not in files:
            mod = mod.rpartition(".")[0]
        if mod:
            out.add(mod)
    return out


def import_graph(src: pathlib.Path = SRC) -> dict[str, set[str]]:
    """{module: the modules of its package it imports}, function-level imports included, `if TYPE_CHECKING:`
    blocks not. An import of pkg.sub.mod from outside pkg.sub also runs pkg.sub's __init__: an edge to it too
    when that __init__ imports modules of the package (the top package's own __init__ is left out: every
    import runs it first, and it sits above everything)."""
    files = _module_files(src)
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        graph[name] = {mod for node in _import_nodes(path) for mod in _imported(name, package, node, files)} - {name}
    for name, edges in graph.items():
        for mod in list(edges):
            parent = mod.rpartition(".")[0]
            while parent and parent != src.name:
                if graph[parent] and name != parent and not name.startswith(parent + "."):
                    edges.add(parent)  # an __init__ that imports nothing of the package adds nothing
                parent = parent.rpartition(".")[0]
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in graph:
                    continue
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    m = stack.pop()
                    on_stack.discard(m)
                    comp.append(m)
                    if m == node:
                        break
                if len(comp) > 1:
                    cycles.append(sorted(comp))
    return cycles


# polygrad-core bottom-up (docs/architecture.md "Layout by stage"): a module imports modules of its own layer
# or of layers listed before it. A pattern names a module and the modules under it; the longest match wins.
LAYERS: list[tuple[str, list[str]]] = [
    ("definitions and errors", ["polygrad.definitions", "polygrad.errors", "polygrad.version",
                                "polygrad.runtime_context"]),
    ("dtypes, settings, limits, the random state", ["polygrad.dtype", "polygrad.config", "polygrad.limits",
                                                    "polygrad.random"]),
    ("IR", ["polygrad.uop"]),
    ("host services", ["polygrad.diskcache", "polygrad.atomicfile", "polygrad.filemap", "polygrad.hostlaunch",
                        "polygrad.hostmemory", "polygrad.hostcpu"]),
    ("contract", ["polygrad.contract"]),
    ("devices and memory", ["polygrad.device"]),
    ("schedule", ["polygrad.schedule"]),
    ("codegen", ["polygrad.codegen"]),
    ("renderer", ["polygrad.renderer"]),
    ("plugin API", ["polygrad.backend_api"]),
    ("engine", ["polygrad.engine"]),
    ("tensor", ["polygrad.tensor", "polygrad.tensor_*", "polygrad.gradient"]),
    ("above tensor", ["polygrad.engine.jit", "polygrad.engine.custom", "polygrad.nn", "polygrad.linalg",
                      "polygrad.linalg_svd"]),
    ("distributed", ["polygrad.distributed"]),
    ("model", ["polygrad.model", "polygrad.bundle"]),
    ("front", ["polygrad.models", "polygrad.quantization", "polygrad.runtime", "polygrad.inspect", "polygrad.hf",
               "polygrad.onnx", "polygrad.calibrate"]),
    ("package", ["polygrad", "polygrad.__main__"]),
]


def layer_of(module: str) -> int | None:
    """The index in LAYERS of the longest pattern matching `module` (None: no layer names it)."""
    best, found = -1, None
    for k, (_, patterns) in enumerate(LAYERS):
        for pattern in patterns:
            if pattern.endswith("*"):
                hit = module.startswith(pattern[:-1]) and "." not in module[len(pattern) - 1:]
            else:
                hit = module == pattern or module.startswith(pattern + ".")
            if hit and len(pattern) > best:
                best, found = len(pattern), k
    return found


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """Each import that goes to a later layer than its importer's, as a readable line."""
    out = []
    for module in sorted(graph):
        here = layer_of(module)
        for target in sorted(graph[module]):
            there = layer_of(target)
            if here is not None and there is not None and there > here:
                out.append(f"{module} ({LAYERS[here][0]}) imports {target} ({LAYERS[there][0]})")
    return out


def _reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    seen: set[str] = set()
    todo = list(graph.get(start, ()))
    while todo:
        m = todo.pop()
        if m not in seen:
            seen.add(m)
            todo += graph.get(m, ())
    return seen


def _package_src(package: str) -> pathlib.Path:
    return pathlib.Path(pytest.importorskip(package).__file__).parent


@pytest.mark.parametrize("package", ["polygrad", *PACKAGES])
def test_no_import_cycle(package: str) -> None:
    """Counting imports inside functions, no module of the package reaches itself."""
    cycles = import_cycles(import_graph(SRC if package == "polygrad" else _package_src(package)))
    assert not cycles, f"import cycles in {package}: {cycles}"


def test_every_core_module_has_a_layer() -> None:
    missing = sorted(m for m in import_graph() if layer_of(m) is None)
    assert not missing, f"name the layer of {missing} in LAYERS (and in docs/architecture.md)"


def test_core_imports_go_downward() -> None:
    """Every import of polygrad-core, function-level ones included, goes to its own layer or one below."""
    bad = upward_imports(import_graph())
    assert not bad, "imports that go up the layers:\n" + "\n".join(bad)


def test_core_never_imports_backend_api() -> None:
    """backend_api gathers what backends use; core modules import the modules that define it."""
    users = sorted(m for m, deps in import_graph().items() if "polygrad.backend_api" in deps)
    assert not users, f"{users} import polygrad.backend_api; import polygrad.contract (or the defining module)"


BACKENDS = [p for p in PACKAGES if p.startswith("polygrad_backend_")]


@pytest.mark.parametrize("package", BACKENDS)
def test_backends_reach_core_only_through_backend_api(package: str) -> None:
    """A backend plugin imports polygrad.backend_api and nothing else of polygrad-core (the plugin contract:
    core may move its modules without breaking a backend)."""
    src = _package_src(package)
    bad = sorted({f"{path.relative_to(src)}: {mod}" for path in src.rglob("*.py") for mod in _runtime_imports(path)
                  if (mod == "polygrad" or mod.startswith("polygrad.")) and mod != "polygrad.backend_api"})
    assert not bad, f"{package} imports core modules other than polygrad.backend_api: {bad}"


def test_core_imports_nothing_of_its_own_inside_functions() -> None:
    """Imports inside functions that only dodged a cycle are gone: what is left inside functions in core is an
    optional dependency of another distribution (tqdm, polygrad_hf, polygrad_onnx)."""
    found = []
    for name, path in sorted(_module_files().items()):
        for node in _import_nodes(path, only_nested=True):
            mods = [node.module or ""] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
            if node.level or any(m == "polygrad" or m.startswith("polygrad.") for m in mods):
                found.append(f"{name}:{node.lineno}")
    assert not found, f"function-level imports of core modules: {found}; import them at module level"


def _write(root: pathlib.Path, files: dict[str, str]) -> pathlib.Path:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root / "pkg"


def test_the_graph_counts_function_level_imports_and_skips_type_checking(tmp_path: pathlib.Path) -> None:
    """The checks read what runs: a planted upward import inside a function is a cycle and goes up the layers,
    the same import under `if TYPE_CHECKING:` is neither; relative imports and package __init__ count too."""
    base = {"pkg/__init__.py": "", "pkg/low.py": "import os\n", "pkg/sub/__init__.py": "from pkg.sub import c\n",
            "pkg/sub/c.py": "", "pkg/high.py": "from pkg import low\nfrom .sub import c\n"}
    clean = import_graph(_write(tmp_path / "a", base))
    assert clean["pkg.high"] == {"pkg.low", "pkg.sub.c", "pkg.sub"} and not import_cycles(clean)
    planted = {**base, "pkg/low.py": "def f():\n    from pkg.high import g\n    return g\n"}
    graph = import_graph(_write(tmp_path / "b", planted))
    assert import_cycles(graph) == [["pkg.high", "pkg.low"]]
    hidden = {**base, "pkg/low.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import high\n"}
    assert not import_cycles(import_graph(_write(tmp_path / "c", hidden)))


def test_a_planted_upward_import_is_caught() -> None:
    """upward_imports names an import from a lower layer (codegen) to a higher one (tensor), function-level or not."""
    graph = import_graph()
    assert not upward_imports(graph)
    graph["polygrad.codegen.lower"] = graph["polygrad.codegen.lower"] | {"polygrad.tensor"}
    assert upward_imports(graph) == ["polygrad.codegen.lower (codegen) imports polygrad.tensor (tensor)"]


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
MODEL_ORDER = ["program", "errors", "signature", "table", "executor", "data", "optim", "format", "programcache",
               "capture", "training", "core"]


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
