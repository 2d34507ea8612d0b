"""The op table: every op of polygrad's IR, how many srcs it takes, the dtypes it is defined on and
the levels of the pipeline where it may appear.

Stage: shared (definition). Input: nothing. Output: `OPS` (one `Op` row per op, in the order that
numbers `uop/ops.Ops`) and the op sets Python and polygrad-js derive from it (`uop/ops.py`,
`uop/validate.py`; `src/generated/ops.js` for ir.js and validate.js). docs/kernel-ir.md describes
the semantics; tests/test_op_table.py checks the rows against real graphs at every level.
"""
from __future__ import annotations

from typing import NamedTuple, Optional, Tuple, Union

# ---- levels: where an op may appear
TENSOR = "tensor"    # tensor graphs: what Tensor methods and autograd build, the scheduler's input
KERNEL = "kernel"    # stored kernel IR: a scheduled kernel as bundles and golden files hold it (docs/kernel-ir.md);
#                      uop/validate.py and validate.js accept only these ops in a file's kernels
LOWERED = "lowered"  # a kernel lowered for a device (codegen/lower.py, polygrad-js compile.js): what renderers read
CUSTOM = "custom"    # kernel IR written by hand for a custom kernel, before it is devectorized and scheduled
LEVELS = (TENSOR, KERNEL, LOWERED, CUSTOM)
_IR = (KERNEL, LOWERED, CUSTOM)  # every level of kernel IR
_ALL = (TENSOR, KERNEL, LOWERED, CUSTOM)

# ---- dtype classes: the dtypes an elementwise op is defined on
ANY = "any"                  # every dtype, bool included
FLOAT = "float"              # float16, bfloat16, float32, float64
INT = "int"                  # signed and unsigned integers
INT_OR_BOOL = "int_or_bool"  # integers and bool (bitwise ops)

# ---- relations: how an elementwise op's dtypes relate (structural ops have their own rules, in validate)
SAME = "same"                # every src and the result have one dtype, of the op's class
COMPARE = "compare"          # the srcs have one dtype, the result is bool
SELECT = "select"            # src 0 is bool; srcs 1 and 2 and the result have one dtype (WHERE)
CONVERT = "convert"          # any dtype to any dtype (CAST)
REINTERPRET = "reinterpret"  # the bits of one dtype as another of the same width, bool never (BITCAST)

# ---- groups
SOURCE = "source"            # tensor-graph leaves and their device
MOVEMENT = "movement"        # views of a tensor: no arithmetic, no copy
EFFECT = "effect"            # realize boundaries, writes and custom kernels
REDUCE = "reduce"            # folds over axes
INDEXED = "indexed"          # tensor-graph gather / scatter
STRUCTURE = "structure"      # the skeleton of a kernel: buffers, loops, addresses, loads and stores
ELEMENTWISE = "elementwise"  # arithmetic on values, at every level

Arity = Union[int, Tuple[int, Optional[int]]]  # an exact src count, or (min, max) with None: no maximum


class Op(NamedTuple):
    name: str
    src: Arity
    levels: Tuple[str, ...]
    group: str
    dtypes: Optional[str] = None    # elementwise ops: the class of dtypes they are defined on
    relation: Optional[str] = None  # elementwise ops: how the srcs' and the result's dtypes relate
    commutative: bool = False       # op(a, b) == op(b, a)


def _unary(name: str, cls: str = FLOAT, levels: Tuple[str, ...] = _ALL) -> Op:
    return Op(name, 1, levels, ELEMENTWISE, cls, SAME)


# lowering expands EXP2/LOG2/SIN into arithmetic (uop/transcendental.py): no renderer meets them
_BEFORE_LOWERING = (TENSOR, KERNEL, CUSTOM)


def _binary(name: str, cls: str = ANY, relation: str = SAME, commutative: bool = False) -> Op:
    return Op(name, 2, _ALL, ELEMENTWISE, cls, relation, commutative)


# The order numbers Ops (1, 2, ...): append new ops at the end. Files name ops, never numbers.
OPS: Tuple[Op, ...] = (
    # tensor-graph ops
    Op("BUFFER", 0, (TENSOR,), SOURCE),               # arg: a device Buffer (SlotRef once scheduled)
    Op("CONST", (0, 1), _ALL, SOURCE),                # arg: the value; in a tensor graph src (DEVICE,), in kernels none
    Op("DEVICE", 0, (TENSOR,), SOURCE),               # arg: the device name
    Op("COPY", 1, (TENSOR,), EFFECT),                 # arg: the destination device
    Op("CONTIGUOUS", 1, (TENSOR,), EFFECT),
    Op("DETACH", 1, (TENSOR,), EFFECT),
    Op("ASSIGN", 2, (TENSOR,), EFFECT),               # (target, value)
    Op("CUSTOM", (1, None), (TENSOR,), EFFECT),       # the tensors a custom kernel reads and writes; arg: its body
    Op("AFTER", 2, (TENSOR,), EFFECT),                # (tensor, CUSTOM): the tensor once the kernel ran
    Op("BIND", 2, (TENSOR,), SOURCE),                 # (DEFINE_VAR, CONST): a Variable with this call's value
    Op("RESHAPE", 1, (TENSOR,), MOVEMENT),
    Op("PERMUTE", 1, (TENSOR,), MOVEMENT),
    Op("EXPAND", 1, (TENSOR,), MOVEMENT),
    Op("PAD", 1, (TENSOR,), MOVEMENT),
    Op("SHRINK", 1, (TENSOR,), MOVEMENT),
    Op("FLIP", 1, (TENSOR,), MOVEMENT),
    Op("REDUCE_AXIS", 1, (TENSOR,), REDUCE),          # arg: (ADD|MUL|MAX, axes)
    Op("IOTA", 1, (TENSOR,), SOURCE),                 # (DEVICE,), arg n: 0..n-1
    # kernel-IR ops
    Op("SINK", (0, None), _ALL, STRUCTURE),           # a kernel's root (its blocks), or a tensor graph's targets
    Op("DEFINE_GLOBAL", 0, _IR, STRUCTURE),           # arg: (slot, shape)
    Op("DEFINE_VAR", 0, _ALL, STRUCTURE),             # arg: (name, min, max)
    Op("RANGE", 1, _IR, STRUCTURE),                   # (end,), arg: (axis id, AxisKind)
    Op("INDEX", (2, 3), _IR, STRUCTURE),              # (DEFINE_GLOBAL, index[, gate])
    Op("LOAD", 1, _IR, STRUCTURE),                    # (INDEX,)
    Op("STORE", 2, _IR, STRUCTURE),                   # (INDEX, value), arg: None or ADD|MUL|MAX
    Op("END", (1, None), _IR, STRUCTURE),             # (STORE or END, RANGE...)
    Op("REDUCE", (2, None), _IR, REDUCE),             # (body, RANGE...), arg: ADD|MUL|MAX
    # elementwise (shared by every level)
    Op("CAST", 1, _ALL, ELEMENTWISE, ANY, CONVERT),
    Op("BITCAST", 1, _ALL, ELEMENTWISE, ANY, REINTERPRET),
    _unary("EXP2", levels=_BEFORE_LOWERING), _unary("LOG2", levels=_BEFORE_LOWERING),
    _unary("SIN", levels=_BEFORE_LOWERING), _unary("SQRT"), _unary("RECIPROCAL"),
    _unary("NEG", ANY), _unary("TRUNC"),
    _binary("ADD", commutative=True), _binary("MUL", commutative=True), _binary("MAX", commutative=True),
    _binary("MOD"), _binary("IDIV", INT), _binary("FDIV", FLOAT),
    _binary("CMPLT", relation=COMPARE), _binary("CMPNE", relation=COMPARE, commutative=True),
    _binary("CMPEQ", relation=COMPARE, commutative=True),
    _binary("AND", INT_OR_BOOL, commutative=True), _binary("OR", INT_OR_BOOL, commutative=True),
    _binary("XOR", INT_OR_BOOL, commutative=True), _binary("SHL", INT), _binary("SHR", INT),
    _binary("POW", FLOAT),
    Op("WHERE", 3, _ALL, ELEMENTWISE, ANY, SELECT),
    Op("FMA", 3, _IR, ELEMENTWISE, ANY, SAME),        # a*b+c with one rounding; never introduced implicitly
    Op("VECTORIZE", (1, None), (CUSTOM,), STRUCTURE),  # several scalars as one vector value; arg: the lane count
    # tensor-graph indexed access
    Op("GATHER", 2, (TENSOR,), INDEXED),              # (x, index), arg axis: x read where index says (0 outside)
    Op("SCATTER", 3, (TENSOR,), INDEXED),             # (base, index, value), arg (axis, ADD|MUL|MAX)
)

BY_NAME = {op.name: op for op in OPS}
NAMES: Tuple[str, ...] = tuple(BY_NAME)


def names(where=lambda op: True) -> Tuple[str, ...]:
    """The names of the ops a row test selects, in table order."""
    return tuple(op.name for op in OPS if where(op))


# ---- the op sets both languages use
UNARY = names(lambda op: op.src == 1 and op.relation == SAME)
BINARY = names(lambda op: op.src == 2 and op.relation in (SAME, COMPARE))
ALU = names(lambda op: op.relation in (SAME, COMPARE, SELECT))
ELEMENTWISE_OPS = names(lambda op: op.group == ELEMENTWISE)
COMPARISONS = names(lambda op: op.relation == COMPARE)
MOVEMENT_OPS = names(lambda op: op.group == MOVEMENT)
COMMUTATIVE = names(lambda op: op.commutative)
FLOAT_ONLY = names(lambda op: op.dtypes == FLOAT)
INT_ONLY = names(lambda op: op.dtypes == INT)
INT_OR_BOOL_ONLY = names(lambda op: op.dtypes == INT_OR_BOOL)
KERNEL_OPS = names(lambda op: KERNEL in op.levels)          # what a stored kernel may hold
KERNEL_ELEMENTWISE = names(lambda op: KERNEL in op.levels and op.group == ELEMENTWISE)
# integer size expressions (a RANGE end, a symbolic buffer dimension): constants, Variables, this arithmetic
SIZE_OPS = ("CONST", "DEFINE_VAR", "ADD", "MUL", "IDIV", "MOD", "MAX", "NEG", "CAST")
REDUCE_OPS = ("ADD", "MUL", "MAX")  # the folds of REDUCE_AXIS, REDUCE and accumulating STOREs

# ---- RANGE kinds (a RANGE's arg is (axis id, kind)); a str enum in Python (uop/ops.AxisKind)
AXIS_KINDS = (
    ("GLOBAL", "global"),    # one point per output element
    ("REDUCE", "reduce"),    # folded by a REDUCE
    ("UPCAST", "upcast"),    # small inner lanes from UPCAST/SPLIT_REDUCE: register tiles and vector lanes
    ("UNROLL", "unroll"),    # a reduce range split off to be unrolled (one accumulator)
    ("THREAD", "thread"),    # a global range shared among host threads (ProgramSpec.threads)
    ("LOCAL", "local"),      # GPU workgroup-local axis
    ("GROUP", "group"),      # GPU grouped reduction axis
)
STORED_AXIS_KINDS = ("global", "reduce", "upcast")  # what a device-independent (stored) kernel has


def arity_range(op: Op) -> Tuple[int, Optional[int]]:
    """(min, max) srcs of an op; max None: any number."""
    return (op.src, op.src) if isinstance(op.src, int) else op.src
