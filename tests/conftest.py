"""Shared test fixtures: the backends every op test runs on.

`DEVICES` is every backend the registry lists whose probe passes (CPU and INTERP at least, plus any
other backend installed later). Tests take the `device` fixture (one run per backend) or read
`DEVICES` directly. `run_python` runs a snippet in a fresh interpreter with extra environment
variables (for settings read at import time: DEV, POLY_DEV, PATH, POLY_CACHE_DIR...).
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from polygrad import Device


def usable_devices() -> list[str]:
    """Installed backends whose probe succeeds, in a stable order."""
    return [name for name in Device.installed() if Device.available(name)]


DEVICES = usable_devices()


@pytest.fixture(params=DEVICES)
def device(request: pytest.FixtureRequest) -> str:
    """One test run per usable backend."""
    return request.param


@pytest.fixture
def devices() -> list[str]:
    """Every usable backend."""
    return list(DEVICES)


def run_python(code: str, env: dict[str, str] | None = None, cwd: str | None = None,
               timeout: float = 120) -> subprocess.CompletedProcess:
    """Run `code` (dedented) with this interpreter; env entries override os.environ, None removes."""
    full = dict(os.environ)
    for key, value in (env or {}).items():
        if value is None:
            full.pop(key, None)
        else:
            full[key] = value
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=full, cwd=cwd,
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture(name="run_python")
def run_python_fixture():
    """The `run_python` helper as a fixture."""
    return run_python


# CI runs the property tests on a fixed set of examples (reproducible); locally they explore new ones.
try:
    from hypothesis import settings as _hyp_settings

    _hyp_settings.register_profile("ci", derandomize=True, deadline=None, print_blob=True)
    if os.environ.get("CI"):
        _hyp_settings.load_profile("ci")
except ImportError:  # hypothesis is a dev dependency
    pass


def kernels_of(fn, run: bool = True) -> list:
    """The kernel ASTs `fn` schedules, in order (each program the runtime asks for; tests that lower them
    for another device's capabilities run `fn` on INTERP, which needs no compiler). With run=False the
    kernels are not run (their outputs keep whatever they held): for tests that only read the kernels, where
    INTERP would spend a minute on a ResNet-sized convolution whose values nobody reads."""
    import dataclasses

    from polygrad.engine import programs
    asts: list = []
    orig = programs.get_program

    def ask(ast, device):
        asts.append(ast)
        program = orig(ast, device)
        return program if run else dataclasses.replace(program, program=_not_run, direct=None)
    programs.get_program = ask
    try:
        fn()
    finally:
        programs.get_program = orig
    return asts


def _not_run(*args, **kwargs) -> None:
    """A program that does nothing (kernels_of(run=False))."""


def programs_of(fn) -> list:
    """The programs `fn` runs (compiled now or found in the cache), in order."""
    from polygrad.engine import programs
    asked: list = []
    orig = programs.get_program
    programs.get_program = lambda ast, device: asked.append(orig(ast, device)) or asked[-1]
    try:
        fn()
    finally:
        programs.get_program = orig
    return asked
