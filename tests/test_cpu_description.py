"""The host CPU's description drives the host backends' tiles (polygrad/hostcpu.py, issue 32).

A declared (fake) description with other caches, FMA units or registers gives other opts for a matmul
and a convolution, and the results stay NumPy's; a stored calibration is used for its processor model,
flags and code generator only; POLY_CPU is checked field by field.
"""
from __future__ import annotations

import json

import pytest

from polygrad import Context, Tensor
from polygrad.backend_api import Capabilities
from polygrad.codegen.host_opts import host_opts
from polygrad.codegen.passes import simplify_indices
from polygrad.errors import SettingError
from polygrad.hostcpu import CpuDescription, declare, host_fields, load_calibration, parse_declared, store_calibration
from polygrad.schedule.template import schedule

from conftest import DEVICES

# two machines of one vector width: Zen 4-like (one 512-bit FMA per cycle, 1 MiB L2) and one with two FMA
# units of a long latency and a small L2 (panels of 32 columns fit its staging budget, not 64)
ZEN = {"model_name": "fake Zen", "vector_bits": 512, "vector_registers": 32, "fma_units": 1, "fma_latency": 4,
       "l1d_bytes": 32768, "l2_bytes": 1048576}
OTHER = {"model_name": "fake other", "vector_bits": 512, "vector_registers": 32, "fma_units": 2, "fma_units_256": 2,
         "fma_latency": 8, "l1d_bytes": 49152, "l2_bytes": 131072}


def _caps(declared: dict, device: str = "CPU") -> Capabilities:
    """Capabilities as the CPU backend (clang: 4 vectors per tile row, staging) or the X86 backend (2, no
    staging, masked lanes) makes them for a declared description (no calibration)."""
    desc = declare(CpuDescription(), declared)
    cpu = device == "CPU"
    fields = host_fields(desc, device, "test", desc.vector_bits, 4 if cpu else 2, stage=cpu)
    return Capabilities(threads=2, vector_width=desc.lanes, registers=desc.vector_registers, fma=True,
                        masked_lanes=not cpu, **fields)


def _matmul(a: Tensor, b: Tensor) -> Tensor:
    return a @ b


def _conv(x: Tensor, w: Tensor) -> Tensor:
    return x.conv2d(w, padding=1)


# (name, expression, input shapes): a staged matmul (its panel width follows the L2) and a convolution with
# two output channels (a 2-row tile hides one FMA's latency, not two units' of 8 cycles)
CASES = [("matmul", _matmul, [(512, 512), (512, 512)]), ("conv", _conv, [(4, 8, 32, 32), (2, 8, 3, 3)])]


def _opts(expr, shapes, caps: Capabilities) -> list:
    tpl, _ = schedule([expr(*[Tensor.empty(*s) for s in shapes]).uop])
    ast = [s.ast for s in tpl.steps if s.kind == "kernel"][-1]
    return [(o.kind.value, o.axis, o.amount) for o in host_opts(simplify_indices(ast), caps)]


@pytest.mark.parametrize("device,name,expr,shapes", [("CPU", *c) for c in CASES] + [("X86", *CASES[1])],
                         ids=["cpu-matmul", "cpu-conv", "x86-conv"])
def test_other_cpu_gives_other_opts(device, name, expr, shapes, tmp_path):
    with Context(POLY_CACHE_DIR=str(tmp_path)):
        zen, other = _opts(expr, shapes, _caps(ZEN, device)), _opts(expr, shapes, _caps(OTHER, device))
    assert zen != other


@pytest.mark.skipif("CPU" not in DEVICES, reason="needs the CPU backend (a C compiler)")
@pytest.mark.parametrize("declared", [ZEN, OTHER], ids=["zen", "other"])
def test_declared_cpu_drives_the_device_and_results_match_numpy(declared, run_python):
    """POLY_CPU reaches the CPU device's Capabilities and its kernels' opts; the results are NumPy's."""
    code = f"""
        import json
        import numpy as np
        from polygrad import Device, Tensor
        from polygrad.engine import programs
        got_opts = []
        lower_and_render = programs.lower_and_render
        def record(ast, device, impl):
            spec, source = lower_and_render(ast, device, impl)
            got_opts.append([(o.kind.value, o.axis, o.amount) for o in spec.opts])
            return spec, source
        programs.lower_and_render = record
        rng = np.random.default_rng(0)
        errors = []
        for shapes in {[c[2] for c in CASES]!r}:
            a, b = (rng.standard_normal(s).astype(np.float32) for s in shapes)
            if len(shapes[0]) == 2:
                got, want = (Tensor(a) @ Tensor(b)).numpy(), a @ b
            else:
                import torch
                got = Tensor(a).conv2d(Tensor(b), padding=1).numpy()
                want = torch.nn.functional.conv2d(torch.from_numpy(a), torch.from_numpy(b), padding=1).numpy()
            errors.append(float(np.abs(got - want).max() / np.abs(want).max()))
        caps = Device["CPU"].capabilities
        print(json.dumps({{"opts": got_opts, "errors": errors, "l2": caps.l2_bytes, "fma": caps.fma_units,
                          "stage": caps.stage_bytes}}))
    """
    out = run_python(code, env={"POLY_CPU": json.dumps(declared), "DEV": "CPU"})
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["l2"] == declared["l2_bytes"] and result["fma"] == declared["fma_units"]
    assert result["stage"] == min(declared["l2_bytes"] // 2, 512 * 1024)
    want = _caps(declared)
    for name, expr, shapes in CASES:
        assert [list(o) for o in _opts(expr, shapes, want)] in result["opts"], name
    assert max(result["errors"]) < 1e-5


@pytest.mark.skipif("X86" not in DEVICES, reason="needs the X86 backend (x86-64)")
def test_declared_cpu_reaches_the_x86_device(run_python):
    """The X86 backend takes caches and FMA units from the same description (its vectors from cpuid)."""
    out = run_python("""
        import numpy as np, torch
        from polygrad import Device, Tensor
        rng = np.random.default_rng(0)
        x = rng.standard_normal((4, 8, 32, 32), dtype=np.float32)
        w = rng.standard_normal((2, 8, 3, 3), dtype=np.float32)
        got = Tensor(x).conv2d(Tensor(w), padding=1).numpy()
        want = torch.nn.functional.conv2d(torch.from_numpy(x), torch.from_numpy(w), padding=1).numpy()
        caps = Device["X86"].capabilities
        print(caps.l2_bytes, caps.fma_units, caps.fma_latency, caps.stage_bytes, float(np.abs(got - want).max()))
    """, env={"POLY_CPU": json.dumps(OTHER), "DEV": "X86"})
    assert out.returncode == 0, out.stderr
    l2, fma, latency, stage, error = out.stdout.split()
    assert (int(l2), int(fma), int(latency), int(stage)) == (131072, 2, 8, 0)
    assert float(error) < 1e-4


def test_calibration_is_keyed_by_the_processor(tmp_path):
    desc = declare(CpuDescription(), {**ZEN, "vendor": "AuthenticAMD", "flags": ["avx2", "avx512f", "fma"]})
    with Context(POLY_CACHE_DIR=str(tmp_path)):
        assert host_fields(desc, "CPU", "cc 1", 512, 4, stage=True)["tuning"] == "heuristic"
        store_calibration(desc, "CPU", "cc 1", {"tile_vectors": 2, "stage_bytes": 131072})
        tuned = host_fields(desc, "CPU", "cc 1", 512, 4, stage=True)
        assert (tuned["tuning"], tuned["tile_vectors"], tuned["stage_bytes"]) == ("calibrated", 2, 131072)
        # another model, other flags or another compiler: the heuristics again
        for other, code_generator in [(declare(desc, {"model_name": "fake Zen 5"}), "cc 1"),
                                      (declare(desc, {"flags": ["avx2", "fma"]}), "cc 1"), (desc, "cc 2")]:
            fields = host_fields(other, "CPU", code_generator, 512, 4, stage=True)
            assert (fields["tuning"], fields["tile_vectors"], fields["stage_bytes"]) == ("heuristic", 4, 524288)
        # a device without staging keeps none, whatever the calibration says
        assert host_fields(desc, "CPU", "cc 1", 512, 2, stage=False)["stage_bytes"] == 0
        assert load_calibration(declare(desc, {"model": 99}), "CPU", "cc 1") is None


@pytest.mark.skipif("CPU" not in DEVICES, reason="needs the CPU backend (a C compiler)")
def test_calibrate_stores_an_entry_the_device_reads(tmp_path, monkeypatch):
    """`calibrate` times its variants and stores a winner under this processor's key; a device opening
    afterwards takes it (host_fields), and the entry says what the heuristics would have chosen."""
    from polygrad import calibrate as calibration
    from polygrad.device import open_device
    from polygrad.hostcpu import code_generator_of, describe_cpu
    monkeypatch.setattr(calibration, "CANONICAL", (("x @ W.T", lambda d: Tensor.empty(64, 128, device=d)
                                                    @ Tensor.empty(256, 128, device=d).T),))
    monkeypatch.setattr(calibration, "ROUNDS", 2)
    caps = open_device("CPU").capabilities
    with Context(POLY_CACHE_DIR=str(tmp_path)):
        entry = calibration.calibrate("CPU", log=lambda line: None)
        stored = load_calibration(describe_cpu(), "CPU", code_generator_of("CPU"))
        fields = host_fields(describe_cpu(), "CPU", code_generator_of("CPU"), caps.vector_width * 32, 4, stage=True)
    assert entry["heuristic"] == {"tile_vectors": caps.tile_vectors, "stage_bytes": caps.stage_bytes}
    assert stored is not None and stored["tile_vectors"] == entry["tile_vectors"]
    assert len(entry["relative_time"]) == len(calibration.variants(caps))
    assert (fields["tuning"], fields["tile_vectors"], fields["stage_bytes"]) == \
        ("calibrated", entry["tile_vectors"], entry["stage_bytes"])


@pytest.mark.parametrize("text,field", [
    ('{"l2_bytez": 1048576}', "l2_bytez"),
    ('{"l2_bytes": "1M"}', "l2_bytes"),
    ('{"fma_units": 0}', "fma_units"),
    ('{"vector_bits": 384}', "vector_bits"),
    ('{"flags": "avx2"}', "flags"),
    ('{"cores": true}', "cores"),
])
def test_declared_fields_are_checked(text, field):
    with pytest.raises(SettingError, match=f"POLY_CPU field '{field}'"):
        parse_declared(text)


def test_declared_text_must_be_json_or_a_file(tmp_path):
    with pytest.raises(SettingError, match="neither inline JSON nor a readable file"):
        parse_declared(str(tmp_path / "missing.json"))
    with pytest.raises(SettingError, match="not valid JSON"):
        parse_declared("{l2_bytes: 1}")
    path = tmp_path / "cpu.json"
    path.write_text(json.dumps(OTHER))
    assert parse_declared(str(path)) == OTHER


def test_bad_declaration_fails_the_device_with_its_field(run_python):
    out = run_python("""
        from polygrad import Tensor
        Tensor([1.0, 2.0]).numpy()
    """, env={"POLY_CPU": '{"l2_bytez": 1}'})
    assert out.returncode != 0 and "POLY_CPU field 'l2_bytez'" in out.stderr


def test_doctor_shows_the_description_and_its_sources(run_python):
    out = run_python("""
        import sys
        from polygrad.__main__ import main
        sys.exit(main(["doctor"]))
    """, env={"POLY_CPU": json.dumps({"fma_units": 2, "l2_bytes": 2097152})})
    assert "host CPU" in out.stdout, out.stderr
    assert "L2 2048 KiB per core [declared (POLY_CPU)]" in out.stdout
    assert "[declared (POLY_CPU)]" in out.stdout.split("FMA:")[1].splitlines()[0]
    bad = run_python("""
        import sys
        from polygrad.__main__ import main
        sys.exit(main(["doctor"]))
    """, env={"POLY_CPU": '{"fma_units": -1}'})
    assert bad.returncode == 1 and "POLY_CPU field 'fma_units'" in bad.stdout
