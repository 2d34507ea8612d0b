"""What a bundle may ask of the loader: the caps that Python and polygrad-js (src/limits.js) share.

Stage: import (bundle loading). Input: nothing (constants), or a file's length. Output: the limits (defined
in polygrad/definitions/limits.py, generated into polygrad-js's src/generated/limits.js) that
`bundle.read`, `model/format.from_manifest`, `uop/serialize.decode` and `uop/validate` check before they
allocate or run anything. A file from a stranger can only compute, and only this much; the JavaScript
reader has the same names and values (src/limits.js), so both accept and reject the same files (the
differential corpus of tests/test_bundle_differential.py checks it). docs/bundle-format.md ("Trust
model") is the contract.

Two caps grow with the file, because a real model's memory and work grow with its weights:

    max_bytes = max(BYTES_FLOOR, BYTES_PER_FILE_BYTE * file length)   all buffers together
    max_work  = max(WORK_FLOOR, WORK_PER_FILE_BYTE * file length)     node evaluations of one call

Work is counted by `uop/validate.kernel_work`: each block of a kernel evaluates each of its nodes at most
once per point of all its loops. A GPT-2 small saved by polygrad.hf with max_seq_len 1024 (502 MB) needs
2.5 GB of buffers (5x its size: the attention temporaries) and 9.9e12 node evaluations per forward
(19,624 per byte, its kernels stored with their transcendentals decomposed; 1.5e11 loop points). The
caller raises either cap explicitly: `Model.load(path, max_bytes=..., max_work=...)` (JS: `{ maxBytes,
maxWork }`).
"""
from __future__ import annotations

# the caps themselves live in polygrad/definitions/limits.py, from which polygrad-js's limits are generated
from polygrad.definitions.limits import (  # noqa: E402,F401 (re-exported: polygrad.limits.MAX_NODES)
    BYTES_FLOOR, BYTES_PER_FILE_BYTE, MAX_ARG_DEPTH, MAX_CALLS, MAX_DIMS, MAX_ELEMENTS, MAX_JSON_DEPTH, MAX_MANIFEST,
    MAX_NAME, MAX_NARROW_DEPTH, MAX_NODES, MAX_RANGE, MAX_SLOTS, MAX_SPECS, MAX_STEPS, MAX_UPCAST, WORK_FLOOR,
    WORK_PER_FILE_BYTE)


def default_max_bytes(file_bytes: int) -> int:
    """The memory a bundle of `file_bytes` bytes may ask for when the caller does not say.

    >>> default_max_bytes(704) == BYTES_FLOOR, default_max_bytes(1 << 30) == 16 << 30
    (True, True)
    """
    return max(BYTES_FLOOR, BYTES_PER_FILE_BYTE * file_bytes)


def default_max_work(file_bytes: int) -> int:
    """The node evaluations one entrypoint call of such a bundle may run when the caller does not say."""
    return max(WORK_FLOOR, WORK_PER_FILE_BYTE * file_bytes)
