"""Shared test fixtures: the backends every op test runs on.

`DEVICES` is every backend the registry lists whose probe passes (CPU and INTERP at least, plus any
other backend installed later). Tests take the `device` fixture (one run per backend) or read
`DEVICES` directly.
"""
from __future__ import annotations

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
