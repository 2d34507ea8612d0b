"""The .pgb bundle and its kernel table: names, versions and layout both readers and writers share.

Stage: shared (definition). Input: nothing. Output: the container's magic, versions and header layout,
the buffer roles, the entrypoints, the manifest's keys (`MANIFEST_FIELDS`: what every reader requires
and what it may meet) and the kernel codec's format and versions. polygrad/bundle.py, model/format.py,
the model package and uop/serialize.py read them; polygrad-js's bundle.js, manifest.js and ir.js read
src/generated/bundle.js. docs/bundle-format.md is the prose; tests/test_manifest_fields.py checks both
readers against `MANIFEST_FIELDS`.
"""
from __future__ import annotations

import struct
from typing import Dict, NamedTuple, Tuple

# ---- the container (docs/bundle-format.md section 1)
MAGIC = b"\x89PGB\r\n\x1a\n"  # PNG-style: catches text-mode and 7-bit transfers
FORMAT = "polygrad-bundle"
VERSION = 1  # what a bundle is written as unless it needs version 2 (model/format.format_version)
SUPPORTED_VERSIONS = (1, 2)  # 2 adds cache buffers, Variables in any dimension, Variable arguments
ALIGN = 64  # the manifest is padded to it; every stored buffer starts at a multiple of it

# the 64-byte header, little-endian: (field, struct code); offsets follow from the codes
HEADER_LAYOUT: Tuple[Tuple[str, str], ...] = (
    ("magic", "8s"),
    ("version", "I"),
    ("flags", "I"),            # 0; a reader refuses any other value
    ("manifest_len", "Q"),  # bytes of JSON, without padding
    ("data_len", "Q"),
    ("manifest_crc", "I"),     # CRC-32 (zlib) of the JSON bytes
    ("data_crc", "I"),         # CRC-32 of the data section
    ("reserved", "24x"),       # zero when written, ignored when read
)
HEADER_FORMAT = "<" + "".join(code for _, code in HEADER_LAYOUT)
HEADER_SIZE = struct.calcsize(HEADER_FORMAT)
HEADER_OFFSETS: Dict[str, int] = {
    name: struct.calcsize("<" + "".join(code for _, code in HEADER_LAYOUT[:i]))
    for i, (name, code) in enumerate(HEADER_LAYOUT) if not code.endswith("x")
}

# ---- buffers (docs/bundle-format.md 2.3)
ROLES: Dict[str, str] = {
    "parameter": "a trainable tensor (float)",
    "state": "a non-trainable tensor the model owns (running statistics, integer tables)",
    "constant": "host data the captured callable created (a mask, an index table)",
    "rng": "a 2 x uint32 random key, refilled before each call",
    "optimizer": "optimizer state (moments, beta powers, the learning rate)",
    "gradient": "a parameter's gradient, written by loss, read by optimizer_step",
    "input": "a declared input or target, filled from the caller's data",
    "output": "an entrypoint's result",
    "temporary": "anything else the kernels write before they read it",
    "cache": "state the entrypoints write and read, kept between calls (a KV cache); version 2",
}
STORED = ("parameter", "state", "constant", "optimizer")  # roles whose contents a bundle keeps
TRACKED = ("temporary", "output")  # roles that hold nothing until a call of the entrypoint writes them
ROLES_SINCE = {"cache": 2}  # roles a version-1 bundle may not hold

# ---- entrypoints (docs/bundle-format.md 2.5)
ENTRYPOINTS: Dict[str, str] = {
    "forward": "evaluation: the signature's inputs to its outputs (every bundle has it)",
    "loss": "the training forward and backward: inputs and targets to the loss, writing the gradients",
    "optimizer_step": "one update of the parameters and the optimizer state from the gradients",
    "train_step": "loss's calls followed by optimizer_step's",
}
REQUIRED_ENTRYPOINTS = ("forward",)
SIGNATURE_ENTRYPOINTS = ("forward", "loss", "train_step")  # their inputs are the signature's (and targets)
OPTIMIZER_ENTRYPOINTS = ("optimizer_step", "train_step")  # together, and only with training.optimizer
OPTIMIZER_STATES = ("kept", "initial")  # training.optimizer_state: trained state, or a fresh optimizer's
LOSS_OUTPUT = "loss"  # the one output of loss and train_step


# ---- the manifest's keys (docs/bundle-format.md section 2): {object: {key: Field}}. A reader refuses
# a file that lacks a required key; keys it does not know it ignores (the top level, buffers, entries)
class Field(NamedTuple):
    kind: str              # JSON kind: string, int, number, list, object, or a|b
    required: bool = True  # False: may be absent (the reader's default applies)
    since: int = 1         # the first bundle version that may carry it


MANIFEST_FIELDS: Dict[str, Dict[str, Field]] = {
    "manifest": {
        "format": Field("string"), "version": Field("int"), "producer": Field("string", False),
        "signature": Field("object"), "variables": Field("list"), "buffers": Field("list"),
        "kernels": Field("object"), "entrypoints": Field("object"), "training": Field("object"),
        "rng": Field("object"),
    },
    "signature": {"inputs": Field("list"), "targets": Field("list"), "outputs": Field("list")},
    "spec": {"name": Field("string"), "dtype": Field("string"), "shape": Field("list")},
    "variable": {"name": Field("string"), "min": Field("int"), "max": Field("int")},
    "buffer": {
        "name": Field("string"), "role": Field("string"), "dtype": Field("string"), "shape": Field("list"),
        "size": Field("int"), "data": Field("object", False),  # required for the STORED roles, absent otherwise
    },
    "buffer_data": {"offset": Field("int"), "nbytes": Field("int")},
    "entrypoint": {
        "inputs": Field("object"), "outputs": Field("object"), "calls": Field("list"), "rng": Field("list"),
        "arguments": Field("list", False, 2),
    },
    "kernel_call": {"kernel": Field("int"), "args": Field("list")},
    "copy_call": {"copy": Field("list")},
    "training": {
        "gradients": Field("list"), "optimizer": Field("object|null", False),
        "optimizer_state": Field("string|null", False),  # required with an optimizer
        "lr_buffer": Field("int|null", False),  # required with an optimizer
    },
    "rng": {"seed": Field("int"), "counter": Field("int")},
}

# ---- the kernel table (docs/kernel-ir.md "Serialised form"; uop/serialize.py, ir.js)
KERNEL_FORMAT = "polygrad-kernel"
KERNEL_VERSION = 2  # 2 adds ["uop", index] args (symbolic sizes in DEFINE_GLOBAL shapes); writers use 1 when they can
KERNEL_SUPPORTED_VERSIONS = (1, 2)
KERNEL_FIELDS = ("format", "version", "nodes", "roots")  # exactly these keys
ARG_TAGS = ("int", "float", "bool", "str", "tuple", "op", "dtype", "axis_kind", "kernel_info", "uop")
