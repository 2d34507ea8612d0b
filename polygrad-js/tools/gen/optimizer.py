"""src/generated/optimizer.js: the optimizer table of polygrad/definitions/optimizer.py for optim.js and manifest.js.

Stage: build (generator). Input: polygrad.definitions.optimizer. Output: each optimizer's defaults and
hyperparameter kinds, the value rules, and the flat state layout's constants.
"""
from __future__ import annotations

from polygrad.definitions import optimizer as d

from gen._js import GENERATED, module

OUT = GENERATED / "optimizer.js"


SOURCE = "polygrad-core/src/polygrad/definitions/optimizer.py"
ABOUT = "Optimizer defaults, hyperparameter kinds and value rules, and the flat state layout."


def exports() -> dict:
    """The table: the values module.exports holds."""
    return {
        "NAMES": d.NAMES,
        "DEFAULTS": d.DEFAULTS,
        "LAMB_EXTRA": d.LAMB_EXTRA,
        "HYPER_KINDS": d.HYPER_KINDS,
        "RULES": {k: r._asdict() for k, r in d.RULES.items()},
        "REQUIRES": d.REQUIRES,
        "FLOAT32_MAX": d.FLOAT32_MAX,
        "GROUP_SIZE": d.GROUP_SIZE,
        "SOLO_NUMEL": d.SOLO_NUMEL,
    }


def render() -> str:
    return module(__file__, SOURCE, ABOUT, exports())
