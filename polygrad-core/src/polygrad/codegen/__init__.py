"""Lowering: one scheduled kernel -> a ProgramSpec for a device. lower.py (the pass list), passes.py,
opts.py (the Opt kinds and apply_opts), analysis.py, the heuristics per device class (host_opts.py,
gpu_opts.py) and BEAM (search.py)."""
