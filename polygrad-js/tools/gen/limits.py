"""src/generated/limits.js: the loader's caps of polygrad/definitions/limits.py for limits.js.

Stage: build (generator). Input: polygrad.definitions.limits. Output: every cap by its Python name and
value; MAX_RANGE as a BigInt, since validate.js compares it with BigInt intervals.
"""
from __future__ import annotations

from polygrad.definitions import limits as d

from gen._js import GENERATED, BigInt, module

OUT = GENERATED / "limits.js"
BIGINT = {"MAX_RANGE"}  # compared with exact (BigInt) intervals in validate.js


SOURCE = "polygrad-core/src/polygrad/definitions/limits.py"
ABOUT = "What a bundle may ask of the loader; src/limits.js adds the defaults that grow with the file."


def exports() -> dict:
    """The table: the values module.exports holds."""
    return {k: BigInt(v) if k in BIGINT else v for k, v in vars(d).items() if k.isupper()}


def render() -> str:
    return module(__file__, SOURCE, ABOUT, exports())
