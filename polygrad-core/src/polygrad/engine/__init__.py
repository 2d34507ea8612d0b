"""Execution: run schedules (realize.py), compile and cache programs (programs.py, rendercache.py), record
and replay launches (capture.py, live.py); above Tensor, the JIT (jit.py) and custom kernels (custom.py)."""
