"""`python -m polygrad doctor`: list backend plugins, versions, probe results and the settings (core's
and the backends'), and run a smoke test."""
from __future__ import annotations

import sys

import numpy as np

import polygrad
from polygrad import config
from polygrad.device import registry
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
    try:
        print(f"default device: {polygrad.Device.DEFAULT}")
    except Exception as e:
        print(f"default device: none ({e})")
        failed += 1
    return 1 if failed else 0


def main(argv: list[str]) -> int:
    if len(argv) >= 1 and argv[0] == "doctor":
        return doctor()
    print("usage: python -m polygrad doctor")
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
