"""What a bundle may ask of the loader: the caps Python and polygrad-js share, as data.

Stage: shared (definition). Input: nothing. Output: the constants below, re-exported with their
size-relative defaults by polygrad/limits.py and generated into polygrad-js's src/generated/limits.js
(src/limits.js). docs/bundle-format.md ("Trust model") is the contract; the formulas for the two caps
that grow with the file are in polygrad/limits.py.
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
MAX_DIMS = 16  # dimensions of one buffer or signature shape
MAX_SPECS = 4096  # entries of one signature list (inputs, targets, outputs)

BYTES_FLOOR = 256 << 20  # what any bundle may allocate, however small the file
BYTES_PER_FILE_BYTE = 32
WORK_FLOOR = 1 << 36  # node evaluations one entrypoint call may run, however small the file
WORK_PER_FILE_BYTE = 1 << 18
