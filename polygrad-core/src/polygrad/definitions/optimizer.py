"""The optimizers a bundle may carry: defaults, hyperparameter kinds and value rules, state layout.

Stage: shared (definition). Input: nothing. Output: `DEFAULTS` (each optimizer's hyperparameters and
their defaults, by their Python names), `HYPER_KINDS` (the JSON kind of each, docs/bundle-format.md
2.6), `RULES` and `REQUIRES` (the values an optimizer refuses), and the constants of the flat
state layout. nn/optim.py and the model package (model/optim.py, model/format.py) read them; polygrad-js's optim.js and
manifest.js read src/generated/optimizer.js, so a JavaScript fine-tune lays out and checks its
state as Python does.
"""
from __future__ import annotations

from typing import Dict, NamedTuple, Optional, Tuple

# the configurations Model.fit accepts and a bundle's training.optimizer holds (lower-case names)
DEFAULTS: Dict[str, Dict[str, object]] = {
    "sgd": {"lr": 0.001, "momentum": 0.0, "weight_decay": 0.0, "nesterov": False},
    "adam": {"lr": 0.001, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.0},
    "adamw": {"lr": 0.001, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.01},
    "lamb": {"lr": 0.001, "b1": 0.9, "b2": 0.999, "eps": 1e-6, "weight_decay": 0.0},
}
NAMES: Tuple[str, ...] = tuple(DEFAULTS)
# what nn.optim.LAMB takes beyond the bundle's lamb configuration (Adam and AdamW are LAMB with these)
LAMB_EXTRA: Dict[str, object] = {"adam": False, "l2_decay": 0.0}

# JSON kinds: a number (never a boolean), true/false, or a list of two numbers
NUMBER, BOOL, PAIR = "number", "bool", "pair"


def _kind(default: object) -> str:
    return BOOL if isinstance(default, bool) else PAIR if isinstance(default, tuple) else NUMBER


# the hyperparameters each optimizer may carry in a bundle besides name and lr, with their JSON kinds
HYPER_KINDS: Dict[str, Dict[str, str]] = {
    name: {k: _kind(v) for k, v in hyper.items() if k != "lr"} for name, hyper in DEFAULTS.items()
}

FLOAT32_MAX = (2 - 2**-23) * 2**127  # the update kernels compute in float32: larger values overflow


class Rule(NamedTuple):
    """The values a hyperparameter takes. real: a number finite as float32 (never a boolean) within the
    bounds; pair: a list or tuple of two such numbers; bool: true or false."""

    kind: str
    want: str  # the error's words: "hyperparameter lr must be <want>"
    low: Optional[float] = None
    low_open: bool = False  # low itself excluded
    high: Optional[float] = None
    high_open: bool = True  # high itself excluded


REAL, PAIR_OF_REALS, FLAG = "real", "pair", "bool"
_RATE = Rule(REAL, "a number >= 0, finite as float32", low=0)
_BETA = Rule(REAL, "a number in [0, 1)", low=0, high=1)
RULES: Dict[str, Rule] = {
    "lr": _RATE, "momentum": _RATE, "weight_decay": _RATE, "l2_decay": _RATE,
    # eps 0 divides 0 by 0 wherever a gradient is 0 from the start (torch allows it, and NaNs)
    "eps": Rule(REAL, "a number > 0, finite as float32", low=0, low_open=True),
    "b1": _BETA, "b2": _BETA,
    "betas": Rule(PAIR_OF_REALS, "a pair of numbers in [0, 1)", low=0, high=1),
    "nesterov": Rule(FLAG, "true or false"), "adam": Rule(FLAG, "true or false"),
}
# (flag, number, error): a true flag needs the number > 0
REQUIRES: Tuple[Tuple[str, str, str], ...] = (("nesterov", "momentum", "nesterov momentum needs momentum > 0"),)

# ---- the flat state layout (nn/optim._flat_groups; optim.js lays out the same buffers)
GROUP_SIZE = 16  # parameters sharing one flat state buffer: each element of a joined gradient tests this many pieces
# A parameter with more elements than this keeps a state buffer of its own: its state update is then a
# plain elementwise kernel in vector lanes, where a joined one tests every piece's bounds per element in
# scalar code (the 784-512-512-10 MLP's two joined Adam moment updates took 1.3 ms each on CPU, about a
# third of its step). Small parameters (biases, norms) still share one buffer and one kernel per group.
SOLO_NUMEL = 1 << 14
