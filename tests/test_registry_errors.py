"""The backend registry: typed errors, name handling, device selection order, can_run (issue 2, item 8).

Selection reads DEV/POLY_DEV, so those cases run in fresh interpreters with the variables set.
"""
from __future__ import annotations

import json

import numpy as np
import pytest

import polygrad
from polygrad import Device, Tensor
from polygrad.backend_api import BackendSpec, DeviceImpl
from polygrad.device import parse_device, registry
from polygrad.errors import CapabilityError, DeviceError, PolygradError, UnknownDeviceError

from conftest import run_python

CLEAN_ENV = {"DEV": None, "POLY_DEV": None}


def test_installed_backends_are_listed():
    installed = Device.installed()
    assert "CPU" in installed and "INTERP" in installed
    assert all(isinstance(registry.specs()[n], BackendSpec) for n in installed)
    assert isinstance(Device["cpu"], DeviceImpl) and Device["CPU"] is Device["cpu"]


# "cuda" and "x86" were here until their backends were installed with the dev tools; CUDA's errors
# (installed but unusable without a GPU) are tested in tests/test_cuda_backend.py
@pytest.mark.parametrize("name", ["nosuchdevice", "metal", "webgpu", "tpu:0"])
def test_unknown_device_lists_installed_and_pip_line(name):
    with pytest.raises(UnknownDeviceError) as info:
        Tensor([1.0], device=name)
    msg = str(info.value)
    assert "CPU" in msg and "INTERP" in msg, msg
    base = name.split(":")[0]
    assert f"pip install polygrad-backend-{base}" in msg, msg
    assert isinstance(info.value, DeviceError) and isinstance(info.value, ValueError)
    assert isinstance(info.value, PolygradError)


def test_unknown_device_rejected_by_to():
    with pytest.raises(UnknownDeviceError):
        Tensor([1.0], device="CPU").to("nosuchdevice")


@pytest.mark.parametrize("bad,words", [("cpu:7", ["7", "0..0"]), ("interp:1", ["1"]), ("cpu:-1", ["-1"]),
                                       ("cpu:x", ["integer"]), ("cpu:0,cpu:1", ["multi-device"]),
                                       ("cpu+interp", ["multi-device"]), ("", ["non-empty"]),
                                       ("  ", ["non-empty"])])
def test_bad_ordinals_and_multi_device_are_rejected(bad, words):
    with pytest.raises(DeviceError) as info:
        Tensor([1.0], device="CPU").to(bad).realize()
    for w in words:
        assert w in str(info.value), str(info.value)


def test_non_string_device_is_rejected():
    with pytest.raises(DeviceError):
        parse_device(3)  # type: ignore[arg-type]


@pytest.mark.parametrize("spelling,canonical", [("cpu", "CPU"), ("Cpu", "CPU"), ("CPU:0", "CPU"),
                                                ("interp", "INTERP"), ("InTeRp:0", "INTERP"),
                                                ("clang", "CPU"), ("numpy", "INTERP")])
def test_names_are_case_insensitive_and_aliases_resolve(spelling, canonical):
    t = Tensor([1.0, 2.0], device=spelling)
    assert t.device == canonical
    assert (t * 2).realize().device == canonical
    assert (t * 2).tolist() == [2.0, 4.0]


def test_default_and_cuda_available():
    assert Device.DEFAULT in Device.installed()
    assert Device.cuda_available() is False
    assert Device.available("cpu") and Device.available("INTERP")
    assert Device.available("nosuchdevice") is False


def test_can_run_is_conservative():
    assert polygrad.can_run("add", shape=[1024]) is True
    assert polygrad.can_run("add", shape=[1024], device="cpu") is True
    assert polygrad.can_run("add", dtype="int32", shape=[4, 4], device="INTERP") is True
    assert polygrad.can_run("matmul", shapes=[[3, 4], [4, 5]], device="cpu") is True
    assert polygrad.can_run("matmul", shapes=[[3, 4], [5, 4]], device="cpu") is False
    assert polygrad.can_run("add", shape=[1 << 40], device="cpu") is False  # larger than max_buffer_bytes
    assert polygrad.can_run("add", shape=[1] * 40, device="cpu") is False  # more dims than declared
    assert polygrad.can_run("add", shape=[4], device="nosuchdevice") is False
    with pytest.raises(CapabilityError):
        polygrad.can_run("frobnicate", shape=[4], device="cpu")
    with pytest.raises(CapabilityError):
        polygrad.can_run("matmul", shape=[4], device="cpu")  # needs both operand shapes
    with pytest.raises(TypeError):
        polygrad.can_run("add", dtype="float99", shape=[4], device="cpu")


def test_stats_counters():
    before = polygrad.stats()
    (Tensor(np.arange(5, dtype=np.float32), device="CPU") * 7).realize()
    after = polygrad.stats()
    assert after["kernels_run"] >= before["kernels_run"] + 1
    for key in ("programs_compiled", "program_cache_hits", "mem_used", "kernel_count"):
        assert key in after


SELECT = """
import json
from polygrad import Device, Tensor
out = {"default": Device.DEFAULT, "implicit": Tensor([1.0]).device,
       "explicit": Tensor([1.0], device="cpu").device, "value": (Tensor([1.0, 2.0]) * 3).tolist()}
print(json.dumps(out))
"""


@pytest.mark.parametrize("env,default", [
    ({}, "CPU"),  # highest priority usable backend
    ({"DEV": "INTERP"}, "INTERP"),
    ({"DEV": "interp"}, "INTERP"),
    ({"DEV": "cpu"}, "CPU"),
    ({"POLY_DEV": "interp"}, "INTERP"),
    ({"DEV": "CPU", "POLY_DEV": "INTERP"}, "INTERP"),  # POLY_DEV beats DEV
    ({"DEV": "INTERP", "POLY_DEV": "cpu"}, "CPU"),
])
def test_selection_order(env, default):
    proc = run_python(SELECT, {**CLEAN_ENV, **env})
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["default"] == default and got["implicit"] == default
    assert got["explicit"] == "CPU"  # device= beats both variables
    assert got["value"] == [3.0, 6.0]


def test_bad_dev_variable_is_a_typed_error():
    proc = run_python("""
        from polygrad import Tensor
        from polygrad.errors import UnknownDeviceError
        try:
            Tensor([1.0])
        except UnknownDeviceError as e:
            print("typed:", e)
        print("explicit ok", Tensor([1.0], device="INTERP").tolist())
    """, {**CLEAN_ENV, "DEV": "nosuchdevice"})
    assert proc.returncode == 0, proc.stderr
    assert "typed:" in proc.stdout and "pip install" in proc.stdout
    assert "explicit ok [1.0]" in proc.stdout


def test_doctor_output_and_exit_code():
    proc = run_python("import sys, runpy; sys.argv = ['polygrad', 'doctor']; "
                      "runpy.run_module('polygrad', run_name='__main__')", CLEAN_ENV)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("polygrad ")
    for name, package in (("CPU", "polygrad-backend-cpu"), ("INTERP", "polygrad-backend-interp")):
        line = next(ln for ln in lines if ln.split()[:1] == [name])
        assert package in line and "probe=ok" in line and "smoke=pass" in line, line
    assert "default device: CPU" in proc.stdout
    usage = run_python("import sys, runpy; sys.argv = ['polygrad']; runpy.run_module('polygrad', "
                       "run_name='__main__')", CLEAN_ENV)
    assert usage.returncode == 2 and "doctor" in usage.stdout
