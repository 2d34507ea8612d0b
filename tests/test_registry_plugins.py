"""Backend plugins found through the `polygrad.backends` entry point (issue 2, item 8).

* Broken plugins: a distribution whose module fails to import and one built for another plugin API
  are written to a temporary site folder as real dist-info entry points; they are recorded in
  `registry.failures`, reported by doctor, and the built-in backends keep working.
* A third-party backend: tests/fixtures/polygrad-backend-toy is pip-installed with --target into a
  temporary folder and put on PYTHONPATH; device "TOY" then runs kernels with no change to core.
"""
from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import run_python

TOY_ROOT = Path(__file__).parent / "fixtures" / "polygrad-backend-toy"
CLEAN_ENV = {"DEV": None, "POLY_DEV": None}


def write_dist(site: Path, dist: str, version: str, module: str, code: str) -> None:
    """A minimal installed distribution: a module plus dist-info with a polygrad.backends entry point."""
    (site / f"{module}.py").write_text(code)
    info = site / f"{dist.replace('-', '_')}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    (info / "entry_points.txt").write_text(f"[polygrad.backends]\n{module} = {module}\n")


@pytest.fixture(scope="module")
def broken_site(tmp_path_factory) -> Path:
    site = tmp_path_factory.mktemp("broken_site")
    write_dist(site, "polygrad-backend-broken", "0.3.1", "polygrad_backend_broken",
               "import polygrad_dependency_that_is_not_installed\n")
    write_dist(site, "polygrad-backend-future", "9.0.0", "polygrad_backend_future", '''
from polygrad.backend_api import BackendSpec, ProbeResult, hookimpl

@hookimpl
def polygrad_register_backends():
    return [BackendSpec(name="FUTURE", probe=lambda: ProbeResult(True), open=None, api_version=99)]
''')
    return site


def test_broken_plugins_are_recorded_and_others_work(broken_site):
    proc = run_python("""
        import json
        from polygrad import Device, Tensor
        from polygrad.device import registry
        out = {"installed": Device.installed(),
               "failures": [[f.plugin, f.version, f.error] for f in registry.failures],
               "cpu": (Tensor([1.0, 2.0], device="CPU") * 2).tolist(),
               "interp": (Tensor([1.0, 2.0], device="INTERP") + 1).tolist(), "default": Device.DEFAULT}
        print(json.dumps(out))
    """, {**CLEAN_ENV, "PYTHONPATH": str(broken_site)})
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert "CPU" in got["installed"] and "INTERP" in got["installed"] and "FUTURE" not in got["installed"]
    assert got["cpu"] == [2.0, 4.0] and got["interp"] == [2.0, 3.0] and got["default"] == "CPU"
    by_plugin = {f[0]: f for f in got["failures"]}
    broken = by_plugin["polygrad-backend-broken"]
    assert broken[1] == "0.3.1" and "polygrad_dependency_that_is_not_installed" in broken[2]
    future = by_plugin["polygrad-backend-future"]
    assert future[1] == "9.0.0"
    assert "polygrad-backend-future" in future[2] and "9.0.0" in future[2] and "99" in future[2], future


def test_doctor_reports_broken_plugins(broken_site):
    proc = subprocess.run([sys.executable, "-m", "polygrad", "doctor"], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(broken_site)}, timeout=120)
    out = proc.stdout
    assert "polygrad-backend-broken 0.3.1 failed to load" in out, out
    assert "ModuleNotFoundError" in out and "plugin API" in out, out
    assert any(ln.split()[:1] == ["CPU"] and "smoke=pass" in ln for ln in out.splitlines()), out
    assert proc.returncode == 1, "doctor must exit non-zero when a plugin failed to load"


def test_wrong_api_version_rejected_in_process():
    """register_plugin applies the same checks as entry points and never raises."""
    from polygrad.backend_api import BackendSpec, ProbeResult, hookimpl
    from polygrad.device import Registry

    class OldPlugin:
        @hookimpl
        def polygrad_register_backends(self):
            return [BackendSpec(name="OLDDEV", probe=lambda: ProbeResult(True), open=None, api_version=0)]

    reg = Registry()
    reg.register_plugin(OldPlugin(), name="polygrad-backend-old", version="0.0.9")
    assert "OLDDEV" not in reg.specs() and "CPU" in reg.specs()
    failure = reg.failures[-1]
    assert failure.plugin == "polygrad-backend-old" and failure.version == "0.0.9"
    assert "plugin API 0" in failure.error and "polygrad-backend-old" in failure.error


# ---------------------------------------------------------------------------------------------------
# the third-party TOY backend


def test_toy_backend_imports_only_the_plugin_contract():
    tree = ast.parse((TOY_ROOT / "src" / "polygrad_backend_toy" / "__init__.py").read_text())
    polygrad_imports = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("polygrad"):
            polygrad_imports.add(node.module)
        if isinstance(node, ast.Import):
            polygrad_imports |= {a.name for a in node.names if a.name.startswith("polygrad")}
    assert polygrad_imports == {"polygrad.backend_api"}


@pytest.fixture(scope="module")
def toy_site(tmp_path_factory) -> Path:
    site = tmp_path_factory.mktemp("toy_site")
    build = tmp_path_factory.mktemp("toy_build")
    source = build / TOY_ROOT.name  # a copy, so the build leaves nothing in the repository
    shutil.copytree(TOY_ROOT, source, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    cmd = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
           "--disable-pip-version-check", "--no-index", "--target", str(site), str(source)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180, cwd=build,
                          env={**os.environ, "PIP_NO_CACHE_DIR": "1"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert list(site.glob("polygrad_backend_toy-0.0.1.dist-info"))
    return site


TOY_RUN = """
import json
import numpy as np
import polygrad_backend_toy
from polygrad import Device, Tensor
from polygrad.device import registry
rng = np.random.default_rng(0)
a = rng.standard_normal((5, 7)).astype(np.float32)
b = rng.standard_normal((7, 3)).astype(np.float32)
x, w = Tensor(a, device="toy"), Tensor(b, device="TOYDEV")
checks = {
    "chain": (((x * 2 + 1).relu() * x).sum().numpy(), (np.maximum(a * 2 + 1, 0) * a).sum()),
    "softmax": (x.softmax(-1).numpy(), np.exp(a) / np.exp(a).sum(-1, keepdims=True)),
    "matmul": ((x @ w).numpy(), a @ b),
    "int": ((Tensor([1, 2, 3], device="TOY") * 5 - 1).numpy(), np.array([4, 9, 14])),
    "to_cpu": ((x.to("CPU") + 1).numpy(), a + 1),
    "from_interp": ((Tensor(a, device="INTERP").to("TOY") * 3).numpy(), a * 3),
}
print(json.dumps({
    "installed": Device.installed(), "default": Device.DEFAULT, "device": (x * 1).device,
    "errors": {k: float(np.abs(np.asarray(got, np.float64) - ref).max()) for k, (got, ref) in checks.items()},
    "compiled": polygrad_backend_toy.stats["compiled"], "launched": polygrad_backend_toy.stats["launched"],
    "failures": [f.error for f in registry.failures], "spec": registry.specs()["TOY"].package}))
"""


def test_toy_backend_runs_kernels(toy_site):
    proc = run_python(TOY_RUN, {**CLEAN_ENV, "PYTHONPATH": str(toy_site)})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["failures"] == []
    assert "TOY" in got["installed"] and got["spec"] == "polygrad-backend-toy"
    assert got["default"] == "CPU"  # TOY has a lower priority than CPU
    assert got["device"] == "TOY"
    for name, err in got["errors"].items():
        assert err < 1e-4, f"{name}: max error {err}"
    assert got["compiled"] >= 5 and got["launched"] >= 6  # the toy's own compiler and launcher ran


def test_toy_backend_selected_by_dev_and_doctor(toy_site):
    proc = run_python("""
        from polygrad import Device, Tensor
        y = (Tensor([1.0, 2.0, 3.0]) * 2 + 1).realize()
        print(Device.DEFAULT, y.device, y.tolist())
    """, {**CLEAN_ENV, "DEV": "toy", "PYTHONPATH": str(toy_site)})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split()[:2] == ["TOY", "TOY"] and "[3.0, 5.0, 7.0]" in proc.stdout
    doc = subprocess.run([sys.executable, "-m", "polygrad", "doctor"], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(toy_site)})
    assert doc.returncode == 0, doc.stdout + doc.stderr
    line = next(ln for ln in doc.stdout.splitlines() if ln.split()[:1] == ["TOY"])
    assert "polygrad-backend-toy 0.0.1" in line and "probe=ok" in line and "smoke=pass" in line, line
