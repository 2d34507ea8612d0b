"""Benchmarks are run with `python -m pytest benchmarks --benchmark-only`; they are not part of the suite."""
