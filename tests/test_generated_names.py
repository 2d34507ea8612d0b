"""No name from a user or a file reaches generated source (issue 28 item 1), and one name rule.

A Variable named `HUGE_VALF` used to render as `const int HUGE_VALF`, which math.h turned into a
function-pointer parameter that every use of the Variable called: a bundle chose the jump address
through the Variable's max, and the issue's public-API repro segfaulted. Other header names gave a
CompileError at the first call. Now the renderers emit their own identifiers only (`pg_kernel`,
`v<k>`, `data<slot>`), so every name of tests/reserved_names.py (C/C++/CUDA keywords, the standard
headers' macros, functions and types, CUDA built-ins, compiler extensions, polygrad's own helper
names), as a Variable name or a kernel name:
- renders to the very same source as a plain name (C dialect of the CPU and TOY backends, CUDA, X86's
  code), and that source compiles (clang; NVRTC compile-only);
- computes NumPy's result on every usable backend through the public Tensor API (the issue's shrink
  repro; a custom kernel of that name) and through a bundle whose Variable and kernels carry it.
Names follow one rule in Python and in polygrad-js (uop/names.py, src/validate.js): a plain identifier
of at most 256 characters, no reserved words.
"""
from __future__ import annotations

import json
import shutil
import subprocess

import numpy as np
import pytest

from conftest import DEVICES, run_python
from polygrad import BundleError, Model, Tensor, Variable, bundle
from polygrad.backend_api import KERNEL_SYMBOL, CStyleRenderer
from polygrad.codegen.lower import lower
from polygrad.device import Device
from polygrad.errors import VariableError
from polygrad.schedule.template import schedule
from polygrad.uop.names import MAX_NAME, is_plain_name
from polygrad.uop.ops import KernelInfo, Ops, UOp
from polygrad.uop.serialize import KernelFormatError
from polygrad.uop.validate import check_kernel, declared_count
from reserved_names import RESERVED_NAMES

A = np.arange(32, dtype=np.float32).reshape(8, 4)
PLAIN = "batch"  # the reference name: every reserved name must render exactly as this one does
GOOD = ["batch", "for", "HUGE_VALF", "__asm__", "data0", "_", "x" * MAX_NAME, "int32_t", "threadIdx"]
BAD = ["", "1x", "a b", "a\n", "E_1(){}; int main", "caf\u00e9", "x" * (MAX_NAME + 1), "a-b", "a.b", "$x"]


def test_reserved_names_are_plain_names():
    assert len(RESERVED_NAMES) > 400
    assert all(is_plain_name(n) for n in RESERVED_NAMES)


def test_the_huge_valf_repro_runs_in_a_fresh_process():
    """The issue's repro, one process per backend, so a regression fails here instead of killing pytest."""
    for device in DEVICES:
        proc = run_python(f"""
            import numpy as np
            from polygrad import Tensor, Variable
            t = Tensor(np.ones((8, 4), np.float32), device={device!r})
            print(t.shrink(((0, Variable("HUGE_VALF", 1, 8).bind(3)), (0, 4))).sum().item())
        """)
        assert proc.returncode == 0, f"{device}: exit {proc.returncode}\n{proc.stderr[-2000:]}"
        assert proc.stdout.split()[-1] == "12.0", proc.stdout


# ---- rendering: the same text whatever the names -------------------------------------------------

def _graph(var_name: str) -> list:
    """The issue's shrink repro and an elementwise kernel over the same symbolic rows."""
    t = Tensor(A, device="INTERP").shrink(((0, Variable(var_name, 1, 8).bind(3)), (0, 4)))
    return [t.sum().uop, (t * 2 + 1).uop]


def _kernels(var_name: str, kernel_name: str | None = None) -> list[UOp]:
    tpl, _ = schedule(_graph(var_name))
    asts = [s.ast for s in tpl.steps if s.kind == "kernel"]
    if kernel_name is not None:
        asts = [ast.replace(arg=KernelInfo(name=kernel_name, opts=ast.arg.opts)) for ast in asts]
    return asts


def _sizes(ast: UOp) -> list[int]:
    """The element counts of a kernel's buffer parameters (slot order), at the Variables' maxima."""
    slots = {n.arg[0]: declared_count(n) for n in ast.toposort() if n.op is Ops.DEFINE_GLOBAL}
    return [slots[k] for k in range(len(slots))]


def _renderers() -> dict:
    """name -> (capabilities, render(spec) -> text): every source-emitting renderer available here (the
    base C dialect is what the TOY backend renders; X86's text is its code's disassembly)."""
    cpu = Device["CPU"]
    out = {"C": (cpu.capabilities, CStyleRenderer().render), "CPU": (cpu.capabilities, cpu.render)}
    if "X86" in DEVICES:
        x86 = Device["X86"]
        out["X86"] = (x86.capabilities, lambda spec: str(x86.render(spec)))
    try:
        from polygrad_backend_cuda import capabilities
        from polygrad_backend_cuda.renderer import CUDARenderer
        out["CUDA"] = (capabilities("sm_90"), CUDARenderer("sm_90").render)
    except ImportError:
        pass
    return out


@pytest.fixture(scope="module")
def rendered() -> dict:
    """{(renderer, "variable" | "kernel", name): [source per kernel]} for every reserved name."""
    renderers = _renderers()
    out = {}
    for name in [PLAIN, *RESERVED_NAMES]:
        for kind, asts in (("variable", _kernels(name)), ("kernel", _kernels(PLAIN, name))):
            specs: dict = {}  # lowered once per set of capabilities
            for label, (caps, render) in renderers.items():
                lowered = specs.setdefault(id(caps), [lower(ast, caps) for ast in asts])
                out[label, kind, name] = [render(spec) for spec in lowered]
    return out


def test_names_never_change_the_rendered_source(rendered):
    labels = {k[0] for k in rendered}
    assert {"C", "CPU"} <= labels
    for (label, kind, name), sources in rendered.items():
        ref = rendered[label, "variable", PLAIN]
        assert sources == ref, f"{label}: the {kind} name {name!r} changed the rendered source"
    for label in labels - {"X86"}:
        src = rendered[label, "variable", PLAIN][0]
        assert f" {KERNEL_SYMBOL}(" in src and " v0" in src and PLAIN not in src, src


def test_rendered_sources_compile_with_clang(rendered):
    from polygrad_backend_cpu.compiler import ClangCompiler
    distinct = {src for (label, _, _), sources in rendered.items() if label in ("C", "CPU") for src in sources}
    assert len(distinct) <= 4  # two kernels, two dialects: no name made another source
    ClangCompiler().compile_many(sorted(distinct))


def test_rendered_cuda_sources_compile_with_nvrtc(rendered):
    cuda = pytest.importorskip("polygrad_backend_cuda")
    from polygrad_backend_cuda import libs
    from polygrad_backend_cuda.compile_check import compile_all
    from polygrad_backend_cuda.compiler import nvcc_compile, nvrtc_compile
    try:
        libs.nvrtc()
        compile_fn = nvrtc_compile
    except libs.LibraryMissing:
        if shutil.which("nvcc") is None:
            pytest.skip("neither libnvrtc (pip install nvidia-cuda-nvrtc-cu12) nor nvcc is installed")
        compile_fn = nvcc_compile
    assert cuda is not None
    distinct = sorted({src for (label, _, _), sources in rendered.items() if label == "CUDA" for src in sources})
    assert 1 <= len(distinct) <= 2
    compile_all(distinct, "sm_90", compile_fn)
    for src in distinct:  # each on its own as well: the runtime loads pg_kernel from a one-kernel module
        compile_fn(src, "sm_90")


def test_tensor_core_kernels_carry_no_name():
    pytest.importorskip("polygrad_backend_cuda")
    from polygrad_backend_cuda import capabilities
    from polygrad_backend_cuda.renderer import CUDARenderer
    from polygrad_backend_cuda.tensor_core import uses_tensor_cores
    a = Tensor.empty(64, 64, dtype="float16", device="INTERP")
    tpl, _ = schedule([(a @ a).uop])
    (ast,) = [s.ast for s in tpl.steps if s.kind == "kernel"]
    caps = capabilities("sm_90")
    ref = CUDARenderer("sm_90").render(lower(ast, caps))
    assert uses_tensor_cores(lower(ast, caps)) and "mma.sync" in ref and f" {KERNEL_SYMBOL}(" in ref
    for name in ("HUGE_VALF", "threadIdx", "__half", "mma", "asm"):
        spec = lower(ast.replace(arg=KernelInfo(name=name, opts=ast.arg.opts)), caps)
        assert CUDARenderer("sm_90").render(spec) == ref, name


# ---- results: the public Tensor API ---------------------------------------------------------------

def _named_kernel(name: str):
    def double_plus_one(out, a):
        i = UOp.range(out.ctx, out.numel(), 0)
        return out[i].store(a[i] * 2 + 1).end(i).sink(arg=KernelInfo(name=name))
    return double_plus_one


@pytest.mark.parametrize("device", DEVICES)
def test_reserved_names_compute_through_the_tensor_api(device):
    x = A.reshape(-1)
    for name in RESERVED_NAMES:
        v = Variable(name, 1, 8).bind(3)
        got = Tensor(A, device=device).shrink(((0, v), (0, 4))).sum().item()
        assert got == A[:3].sum(), f"{device}: Variable {name!r} gave {got}"
        out = Tensor.empty(32, device=device).custom_kernel(Tensor(x, device=device), fxn=_named_kernel(name))[0]
        np.testing.assert_array_equal(out.numpy(), x * 2 + 1, err_msg=f"{device}: kernel {name!r}")


# ---- results: bundles whose Variable and kernels carry the names ----------------------------------

class _Rows:
    def __call__(self, x):
        return {"y": x * 2 + 1, "s": x.sum(1)}


@pytest.fixture(scope="module")
def manifest() -> dict:
    m = Model(_Rows(), inputs={"x": Tensor.empty(Variable(PLAIN, 1, 8), 4)})
    man, body = bundle.read(m.save())
    m.dispose()
    assert len(body) == 0 and man["variables"][0]["name"] == PLAIN
    return man


def named_bundle(manifest: dict, var_name: str, kernel_name: str) -> bytes:
    """The bundle with its Variable (everywhere: declaration, shapes, kernel DEFINE_VARs) and every
    kernel renamed."""
    def swap(obj):
        if isinstance(obj, dict):
            return {k: swap(v) for k, v in obj.items()}
        if isinstance(obj, list):
            return [swap(v) for v in obj]
        return var_name if obj == PLAIN else obj
    man = swap(manifest)
    for node in man["kernels"]["nodes"]:
        if node[0] == "SINK":
            node[3][1]["name"] = kernel_name
    return bundle.write(man, [])


@pytest.mark.parametrize("device", DEVICES)
def test_reserved_names_compute_through_a_bundle(manifest, device):
    x = A[:3]
    for name in RESERVED_NAMES:
        m = Model.load(named_bundle(manifest, name, name), device=device)
        out = m.forward(x=x)
        np.testing.assert_array_equal(out["y"].numpy(), x * 2 + 1, err_msg=f"{device}: name {name!r}")
        np.testing.assert_array_equal(out["s"].numpy(), x.sum(1), err_msg=f"{device}: name {name!r}")
        m.dispose()


# ---- the one name rule ----------------------------------------------------------------------------

@pytest.mark.parametrize("name", GOOD)
def test_plain_names_are_accepted_everywhere(manifest, name):
    assert is_plain_name(name)
    Variable(name, 1, 8)
    for ast in _kernels(PLAIN, name):
        check_kernel(ast, _sizes(ast))
    Model.load(named_bundle(manifest, name, name), device="INTERP").dispose()


@pytest.mark.parametrize("name", BAD)
def test_other_names_are_refused_everywhere(manifest, name):
    assert not is_plain_name(name)
    with pytest.raises(VariableError, match="plain name"):
        Variable(name, 1, 8)
    for ast in _kernels(PLAIN, name):
        with pytest.raises(KernelFormatError, match="kernel name .* plain name"):
            check_kernel(ast, _sizes(ast))
    for var_name, kernel_name in ((name, PLAIN), (PLAIN, name)):
        with pytest.raises(BundleError, match="plain name|non-empty string of at most"):
            Model.load(named_bundle(manifest, var_name, kernel_name), device="INTERP")


@pytest.mark.parametrize("name", [None, 5, ("a",)])
def test_names_that_are_not_strings_are_refused(name):
    with pytest.raises(VariableError):
        Variable(name, 1, 8)


def test_custom_kernel_names_are_made_plain():
    x = np.arange(4, dtype=np.float32)
    for name, made in (("my kernel!", "my_kernel_"), ("3d", "k_3d"), ("", "kernel"), ("x" * 300, "x" * MAX_NAME)):
        seen = []
        from polygrad.engine import programs
        orig = programs.get_program
        programs.get_program = lambda ast, device: seen.append(ast.arg.name) or orig(ast, device)
        try:
            out = Tensor.empty(4, device="INTERP").custom_kernel(Tensor(x, device="INTERP"),
                                                                 fxn=_named_kernel(name))[0].numpy()
        finally:
            programs.get_program = orig
        np.testing.assert_array_equal(out, x * 2 + 1)
        assert made in seen, (name, seen)


NODE = shutil.which("node")


@pytest.mark.skipif(NODE is None, reason="node is not installed")
def test_polygrad_js_applies_the_same_name_rule(manifest, tmp_path):
    """Python and polygrad-js accept and refuse the same Variable and kernel names (the JS validator used to
    accept kernel names such as `E_1(){}; int main` and refuse Variables named `for`)."""
    from test_js import JS, dec, enc
    x = A[:3]
    cases, expect = [], {}
    for name in GOOD + BAD:
        for kind, blob in (("variable", named_bundle(manifest, name, PLAIN)),
                           ("kernel", named_bundle(manifest, PLAIN, name))):
            case = f"{kind}-{len(cases)}"
            path = tmp_path / f"{case}.pgb"
            path.write_bytes(blob)
            cases.append({"name": case, "bundle": str(path), "forward": {"x": enc(x)}})
            try:
                Model.load(blob, device="INTERP").dispose()
                expect[case] = (name, None)
            except BundleError as e:
                expect[case] = (name, str(e))
    plan, out = tmp_path / "plan.json", tmp_path / "results.json"
    plan.write_text(json.dumps({"cases": cases}))
    proc = subprocess.run([NODE, str(JS / "tools" / "run_cases.js"), str(plan), str(out)], capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    results = json.loads(out.read_text())
    for case, (name, py_error) in expect.items():
        js_error = results[case].get("error")
        assert (py_error is None) == (js_error is None), f"{case} {name!r}: Python {py_error!r}, JS {js_error!r}"
        assert (py_error is None) == is_plain_name(name), (case, name, py_error)
        if js_error is None:
            np.testing.assert_array_equal(dec(results[case]["outputs"]["y"]), x * 2 + 1)
        else:
            assert "BundleError" in js_error or "plain name" in js_error, js_error
