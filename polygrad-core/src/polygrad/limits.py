"""What a bundle may ask of the loader: the caps that Python and polygrad-js (src/limits.js) share.

Stage: import (bundle loading). Input: nothing (constants), or a file's length. Output: the limits that
`bundle.read`, `modelformat.from_manifest`, `uop/serialize.decode` and `uop/validate` check before they
allocate or run anything. A file from a stranger can only compute, and only this much; the JavaScript
reader has the same names and values, so both accept and reject the same files (the differential corpus
of tests/test_bundle_differential.py checks it). docs/bundle-format.md ("Trust model") is the contract.

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

MAX_MANIFEST = 256 << 20  # bytes of manifest JSON
MAX_JSON_DEPTH = 256  # nesting of the manifest JSON (a kernel arg nests at most 2 * MAX_ARG_DEPTH + 6)
MAX_NAME = 256  # characters of a manifest name (buffer, spec, Variable, entrypoint)
MAX_SLOTS = 1 << 20  # buffers in the table
MAX_CALLS = 1 << 20  # calls of all entrypoints together
MAX_ELEMENTS = (1 << 31) - 1  # elements of one buffer (kernel indices are int32)
MAX_NODES = 1 << 18  # nodes in the kernel table, checked before any is decoded (so in any one kernel)
MAX_ARG_DEPTH = 64  # nested tuples in one kernel arg
MAX_RANGE = 2**48  # a loop's largest trip count
MAX_UPCAST = 256  # points of a block's upcast (unrolled) RANGEs together: their ends multiplied
MAX_STEPS = 1 << 22  # node evaluations of one kernel's interval analysis
MAX_NARROW_DEPTH = 6  # WHEREs nested inside an index that still narrow their arms

BYTES_FLOOR = 256 << 20  # what any bundle may allocate, however small the file
BYTES_PER_FILE_BYTE = 16
WORK_FLOOR = 1 << 36  # node evaluations one entrypoint call may run, however small the file
WORK_PER_FILE_BYTE = 1 << 16


def default_max_bytes(file_bytes: int) -> int:
    """The memory a bundle of `file_bytes` bytes may ask for when the caller does not say.

    >>> default_max_bytes(704) == BYTES_FLOOR, default_max_bytes(1 << 30) == 16 << 30
    (True, True)
    """
    return max(BYTES_FLOOR, BYTES_PER_FILE_BYTE * file_bytes)


def default_max_work(file_bytes: int) -> int:
    """The node evaluations one entrypoint call of such a bundle may run when the caller does not say."""
    return max(WORK_FLOOR, WORK_PER_FILE_BYTE * file_bytes)
