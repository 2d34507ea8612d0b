"""How much the fuzz and soak tests run: a CI-sized budget by default, a long one with POLY_LONG_TESTS=1.

`examples(ci, long)` is a hypothesis max_examples; `scale(ci, long)` any other count (steps, graphs).
"""
from __future__ import annotations

import os

LONG = os.environ.get("POLY_LONG_TESTS", "") not in ("", "0")


def scale(ci: int, long: int) -> int:
    return long if LONG else ci


def examples(ci: int, long: int) -> int:
    return scale(ci, long)


def fuzz_settings(ci: int, long: int):
    """hypothesis settings for a fuzzer: no deadline (the machine is shared), no example database."""
    from hypothesis import HealthCheck, settings
    return settings(max_examples=examples(ci, long), deadline=None, database=None,
                    suppress_health_check=list(HealthCheck))
