"""Kept only for renderer/cstyle.py, which imports ProgramSpec from here: the types live in
polygrad/contract.py. Delete this module when the renderer imports polygrad.contract (after the
emitters branch, which rewrites renderer/, is merged)."""
from polygrad.contract import GlobalArg, ProgramSpec  # noqa: F401
