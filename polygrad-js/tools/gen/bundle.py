"""src/generated/bundle.js: the container, manifest and kernel-table names of polygrad/definitions/bundle.py.

Stage: build (generator). Input: polygrad.definitions.bundle. Output: the magic bytes, versions, header
offsets, roles, entrypoints, manifest fields and kernel codec names for bundle.js, manifest.js and ir.js.
"""
from __future__ import annotations

from polygrad.definitions import bundle as d

from gen._js import GENERATED, module

OUT = GENERATED / "bundle.js"


SOURCE = "polygrad-core/src/polygrad/definitions/bundle.py"
ABOUT = "The .pgb container, its manifest's roles, entrypoints and fields, and the kernel table's format."


def exports() -> dict:
    """The table: the values module.exports holds."""
    fields = {obj: {k: f._asdict() for k, f in keys.items()} for obj, keys in d.MANIFEST_FIELDS.items()}
    return {
        "MAGIC": list(d.MAGIC),
        "FORMAT": d.FORMAT,
        "VERSION": d.VERSION,
        "SUPPORTED_VERSIONS": d.SUPPORTED_VERSIONS,
        "ALIGN": d.ALIGN,
        "HEADER_SIZE": d.HEADER_SIZE,
        "HEADER_OFFSETS": d.HEADER_OFFSETS,
        "ROLES": list(d.ROLES),
        "STORED": d.STORED,
        "TRACKED": d.TRACKED,
        "ROLES_SINCE": d.ROLES_SINCE,
        "ENTRYPOINTS": d.ENTRYPOINTS,
        "REQUIRED_ENTRYPOINTS": d.REQUIRED_ENTRYPOINTS,
        "SIGNATURE_ENTRYPOINTS": d.SIGNATURE_ENTRYPOINTS,
        "OPTIMIZER_ENTRYPOINTS": d.OPTIMIZER_ENTRYPOINTS,
        "OPTIMIZER_STATES": d.OPTIMIZER_STATES,
        "LOSS_OUTPUT": d.LOSS_OUTPUT,
        "MANIFEST_FIELDS": fields,
        "KERNEL_FORMAT": d.KERNEL_FORMAT,
        "KERNEL_VERSION": d.KERNEL_VERSION,
        "KERNEL_SUPPORTED_VERSIONS": d.KERNEL_SUPPORTED_VERSIONS,
        "KERNEL_FIELDS": d.KERNEL_FIELDS,
        "ARG_TAGS": d.ARG_TAGS,
    }


def render() -> str:
    return module(__file__, SOURCE, ABOUT, exports())
