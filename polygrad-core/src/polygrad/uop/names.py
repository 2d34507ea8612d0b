"""The one rule for the names a kernel carries: its name (KernelInfo.name) and its Variables' names.

Stage: shared (checked where names come in: `sint.Variable`, the kernel validator, the bundle reader).
Input: a name from a user, a file or the scheduler. Output: whether it is a plain name.

These names are metadata only: the renderers emit their own identifiers (renderer/cstyle.py), so no
name ever reaches generated source, and the rule only keeps names printable and bounded. A plain
name is `[A-Za-z_][A-Za-z0-9_]*` (ASCII letters, digits and underscores, not starting with a
digit) of at most MAX_NAME characters, with no reserved words: `for`, `HUGE_VALF` and `data0` are
names like `batch`. polygrad-js applies the same rule (src/validate.js, `isPlainName`);
docs/kernel-ir.md and docs/bundle-format.md state it.

>>> is_plain_name("batch"), is_plain_name("HUGE_VALF"), is_plain_name("2x"), is_plain_name("a b")
(True, True, False, False)
"""
from __future__ import annotations

import re
from typing import Any

from polygrad.limits import MAX_NAME  # shared with polygrad-js (src/limits.js)

_PLAIN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
NAME_RULE = (f"a plain name: ASCII letters, digits and _, not starting with a digit, 1 to {MAX_NAME} "
             "characters")


def is_plain_name(name: Any) -> bool:
    """name is a str that follows the rule (fullmatch: a trailing newline is not allowed)."""
    return type(name) is str and len(name) <= MAX_NAME and _PLAIN.fullmatch(name) is not None


def plain_name(text: str, fallback: str = "kernel") -> str:
    """text made into a plain name (for names polygrad makes: generated and custom kernel names): other
    characters become _, a leading digit gets a `k_` prefix, and the result is cut to MAX_NAME."""
    name = re.sub(r"[^A-Za-z0-9_]", "_", text) or fallback
    if name[0].isdigit():
        name = "k_" + name
    return name[:MAX_NAME]
