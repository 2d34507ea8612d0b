"""BEAM search over kernel optimisations, timed on the device; winners cached on disk.

Stage: lowering (device optimisation). Input: a scheduled kernel AST and a device. Output: the list
of Opts to apply. With BEAM=0 the heuristics in `lower` decide.
"""
from __future__ import annotations

from polygrad import config
from polygrad.uop.ops import UOp


def choose_opts(ast: UOp, device: str):
    """None means "use the heuristics"; BEAM search is added by the optimisation work."""
    if config.get("BEAM") <= 0:
        return None
    return None
