"""`python -m polygrad doctor`: list backend plugins, versions, probe results and the settings (core's
and the backends'), run a smoke test, and show the host CPU's description and the tile choices made from
it. `python -m polygrad calibrate [CPU|X86]`: time the tile choices on this processor and keep the
winners (polygrad/calibrate.py)."""
from __future__ import annotations

import sys

import numpy as np

import polygrad
from polygrad import config
from polygrad.calibrate import calibrate
from polygrad.codegen.host_opts import host_opts
from polygrad.codegen.passes import kernel_for_opts
from polygrad.device import registry
from polygrad.errors import SettingError
from polygrad.hostcpu import describe_cpu
from polygrad.schedule.template import schedule
from polygrad.tensor import Tensor


def doctor() -> int:
    print(f"polygrad {polygrad.__version__}")
    specs = registry.specs()
    failed = 0
    for name, spec in sorted(specs.items(), key=lambda kv: -kv[1].priority):
        probe = registry.probe(name)
        status = "ok" if probe.ok else f"unavailable: {probe.reason}"
        line = f"  {name:8s} {spec.package or '?'} {spec.version or ''} priority={spec.priority} probe={status}"
        if probe.ok:
            try:
                got = (Tensor([1.0, 2.0, 3.0], device=name) * 2 + 1).sum().numpy()
                ok = np.allclose(got, 15.0)
                line += f" smoke={'pass' if ok else 'FAIL'}"
                failed += not ok
            except Exception as e:  # report, keep going
                line += f" smoke=ERROR {type(e).__name__}: {e}"
                failed += 1
        print(line)
    for f in registry.failures:
        print(f"  plugin {f.plugin} {f.version} failed to load: {f.error}")
    failed += len(registry.failures)  # a broken plugin is a problem to fix, even if the others work
    print("settings (name = value, default, declared by):")
    for setting in config.settings():
        print(f"  {setting.name} = {config.get(setting.name)!r}, default {setting.default!r}, {setting.owner}")
    failed += host_report(specs)
    try:
        print(f"default device: {polygrad.Device.DEFAULT}")
    except Exception as e:
        print(f"default device: none ({e})")
        failed += 1
    return 1 if failed else 0


def host_report(specs: dict) -> int:
    """The detected (or declared) CPU and, per host device, the tile parameters chosen from it; the
    number of problems found (a POLY_CPU that cannot be used)."""
    try:
        cpu = describe_cpu()
    except SettingError as e:
        print(f"host CPU: {e}")
        return 1
    wide = [f for f in cpu.flags if f.startswith(("avx", "fma", "amx", "sse4", "f16c", "asimd", "sve"))]
    print("host CPU (each field's source in brackets; POLY_CPU declares fields):")
    print(f"  {cpu.model_name or '?'} ({cpu.vendor or '?'} family {cpu.family:#x} model {cpu.model:#x}, "
          f"{cpu.microarchitecture or 'microarchitecture not in the table'}) [{cpu.source('model_name')}]")
    print(f"  vector flags: {' '.join(wide) or 'none'} ({len(cpu.flags)} flags) [{cpu.source('flags')}]")
    print(f"  vectors: {cpu.vector_bits} bits ({cpu.lanes} float32 lanes), {cpu.vector_registers} registers "
          f"[{cpu.source('vector_bits')}]")
    print(f"  FMA: {cpu.fma_units} per cycle at {cpu.vector_bits} bits, {cpu.fma_units_256} at 256, latency "
          f"{cpu.fma_latency} cycles [{cpu.source('fma_units')}]")
    print(f"  caches: L1d {cpu.l1d_bytes >> 10} KiB, L2 {cpu.l2_bytes >> 10} KiB per core [{cpu.source('l2_bytes')}], "
          f"L3 {cpu.l3_bytes >> 20} MiB; cores {cpu.cores} [{cpu.source('cores')}]")
    print(f"  threads: one core reads {cpu.read_gbs:g} GB/s, a split launch costs {cpu.thread_handoff_ns} ns "
          f"[{cpu.source('thread_handoff_ns')}]")
    for name in ("CPU", "X86"):
        if name not in specs or not registry.probe(name).ok:
            continue
        try:
            caps = polygrad.Device[name].capabilities
            tpl, _ = schedule([(Tensor.empty(1024, 1024, device=name) @ Tensor.empty(1024, 1024, device=name)).uop])
            ast = [s.ast for s in tpl.steps if s.kind == "kernel"][-1]
            opts = ", ".join(f"{o.kind.value}({o.axis},{o.amount})" for o in host_opts(kernel_for_opts(ast), caps))
        except Exception as e:  # report, keep going
            print(f"  {name}: tile choice unavailable ({type(e).__name__}: {e})")
            continue
        print(f"  {name}: {caps.tuning} tiles: {caps.tile_vectors} vectors per row of {caps.vector_width} lanes, "
              f"{caps.registers} registers, {caps.fma_units * caps.fma_latency} accumulators hide the FMA "
              f"latency, staging {caps.stage_bytes >> 10} KiB, {caps.threads} threads; matmul 1024: {opts}")
    return 0


def main(argv: list[str]) -> int:
    if len(argv) >= 1 and argv[0] == "doctor":
        return doctor()
    if len(argv) >= 1 and argv[0] == "calibrate" and len(argv) <= 2:
        device = argv[1].upper() if len(argv) == 2 else "CPU"
        print(f"calibrating {device} tiles for this processor (a minute or less)...")
        calibrate(device)
        return 0
    print("usage: python -m polygrad doctor | python -m polygrad calibrate [CPU|X86]")
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
