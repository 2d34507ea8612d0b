"""Write, or check, every generated table of polygrad-js (src/generated/*.js) from polygrad-core.

Stage: build (development tool). Input: the generator modules of tools/gen/ (each `OUT` and `render()`,
see tools/gen/__init__.py), which read polygrad-core's definitions (polygrad/definitions/). Output: the
files of src/generated/, or with --check the list of those that differ from what their definition gives.

    python polygrad-js/tools/gen_all.py           write every table that changed
    python polygrad-js/tools/gen_all.py --check   exit 1 naming each stale or orphaned file

tests/test_generated_tables.py runs the check, so a definition changed without regenerating, or a
generated file edited by hand, fails the suite. The modules are found by listing tools/gen/, so a new
table is one new module there.
"""
from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType
from typing import Iterable, Optional

TOOLS = Path(__file__).resolve().parent
CORE = TOOLS.parents[1] / "polygrad-core" / "src"
for path in (str(CORE), str(TOOLS)):  # this checkout's definitions, whatever polygrad is installed
    if path not in sys.path:
        sys.path.insert(0, path)

from gen._js import GENERATED  # noqa: E402 (after the path set-up above)


def modules() -> list[ModuleType]:
    """Every generator module of tools/gen/, by file name."""
    names = sorted(p.stem for p in (TOOLS / "gen").glob("*.py") if not p.stem.startswith("_"))
    return [importlib.import_module(f"gen.{name}") for name in names]


def stale(mods: Optional[Iterable[ModuleType]] = None) -> list[Path]:
    """The generated files that differ from their module's render() (or are missing)."""
    out = []
    for m in modules() if mods is None else mods:
        path = Path(m.OUT)
        if not path.is_file() or path.read_text(encoding="utf-8") != m.render():
            out.append(path)
    return out


def orphans(mods: Optional[Iterable[ModuleType]] = None, folder: Path = GENERATED) -> list[Path]:
    """Files in src/generated/ that no generator writes (left behind by a removed or renamed table)."""
    owned = {Path(m.OUT).resolve() for m in (modules() if mods is None else mods)}
    return sorted(p for p in folder.glob("*.js") if p.resolve() not in owned)


def write(mods: Optional[Iterable[ModuleType]] = None) -> list[Path]:
    """Write every stale table; returns the files written."""
    written = []
    for m in modules() if mods is None else mods:
        path, text = Path(m.OUT), m.render()
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
            written.append(path)
    return written


def main(argv: list[str]) -> int:
    mods = modules()
    if "--check" in argv:
        problems = [f"{p} is stale: run python polygrad-js/tools/gen_all.py" for p in stale(mods)]
        problems += [f"{p} is written by no tools/gen module: delete it" for p in orphans(mods)]
        for line in problems:
            print(line, file=sys.stderr)
        return 1 if problems else 0
    for path in write(mods):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
