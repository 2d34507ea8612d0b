"""List the tinygrad Tensor attributes polygrad's Tensor lacks (issue 10), without tinygrad installed.

Reads tests/data/tinygrad_tensor_names.txt (tinygrad's public Tensor names, with the ones polygrad leaves out
on purpose marked `# not provided: reason`) and prints, one per line, every name polygrad's Tensor does not
have and that is not marked. Exit status 1 when there is any. Run: python tests/tinygrad_parity.py
(add --all to also print the deliberate omissions with their reasons).
"""
from __future__ import annotations

import pathlib
import sys

NAMES = pathlib.Path(__file__).with_name("data") / "tinygrad_tensor_names.txt"


def read_names(path: pathlib.Path = NAMES) -> tuple[list[str], dict[str, str]]:
    """(names polygrad should have, {name: reason} for the deliberate omissions)."""
    wanted, omitted = [], {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, _, note = line.partition("#")
        name, note = name.strip(), note.strip()
        if note.startswith("not provided:"):
            omitted[name] = note[len("not provided:"):].strip()
        else:
            wanted.append(name)
    return wanted, omitted


def missing(cls: type | None = None) -> list[str]:
    if cls is None:
        from polygrad import Tensor as cls
    wanted, _ = read_names()
    return [n for n in wanted if not hasattr(cls, n)]


def main(argv: list[str]) -> int:
    gaps = missing()
    for name in gaps:
        print(name)
    if "--all" in argv:
        for name, reason in sorted(read_names()[1].items()):
            print(f"{name}  (not provided: {reason})")
    return 1 if gaps else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
