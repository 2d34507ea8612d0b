"""Lower one scheduled kernel for a device: `lower(ast, caps, opts) -> ProgramSpec`. The pass list.

Stage: lowering. Input: kernel IR from the scheduler (global and reduce ranges) and the device's
`Capabilities`. Output: a ProgramSpec whose index arithmetic is simplified and whose ranges are split
for that device. The passes, in order (`lower` below runs them):

  1. parameters_of              (analysis.py)  the pointer and integer parameters, before a pass may drop
                                               a load
  2. simplify_indices           (passes.py)    fold constants, simplify index arithmetic (symbolic_rules)
  3. split_merged_ranges        (merged_ranges.py)  a range read only as (r // c, r % c) and affine forms
                                               (heads x D merged by a transpose) becomes two ranges, so
                                               its addresses are affine and the opts can tile it
  3b. share_reduce_ranges       (passes.py)    sibling reductions with ranges of the same trip counts (a
                                               gated MLP's gate and up products) run over the first one's
                                               ranges, so the opts chosen for it split them all
  4. default_opts               (here)         the Opts (opts.py) to apply, unless given (BEAM: search.py)
                                               or NOOPT=1: host_opts.py or gpu_opts.py by device class;
                                               none for a kernel with an accumulating STORE (SCATTER's:
                                               its points run one at a time, no threads, no lanes)
  5. split_kernel               (passes.py)    apply_opts (opts.py), then simplify_indices again
  6. estimate                   (analysis.py)  operations and bytes, for GlobalCounters
  7. contract_fma               (passes.py)    devices with `caps.fma`: a float REDUCE(ADD) of a MUL becomes
                                               REDUCE(FMA), each step acc = fma(a, b, acc) rounded once
  8. decompose_transcendentals  (uop/transcendental.py)  EXP2/LOG2/SIN as IR arithmetic: the same bits
                                               on every backend
The ProgramSpec then goes to the linearizer (renderer/linearize.py) and the device's renderer.
"""
from __future__ import annotations

from polygrad import config
from polygrad.codegen.analysis import atomic_stores_only, estimate, has_accumulating_store, parameters_of
from polygrad.codegen.gpu_opts import gpu_opts
from polygrad.codegen.host_opts import host_opts
from polygrad.codegen.opts import Opt, OptKind, threads_of
from polygrad.codegen.passes import contract_fma, kernel_for_opts, split_kernel
from polygrad.contract import Capabilities, ProgramSpec
from polygrad.uop.ops import UOp
from polygrad.uop.transcendental import decompose_transcendentals


def lower(ast: UOp, caps: Capabilities | None = None, opts: list[Opt] | None = None) -> ProgramSpec:
    """Lower a scheduled kernel for a device with capabilities `caps` (None: no device optimisation
    beyond what `opts` asks). opts None means the heuristics choose (none with NOOPT=1)."""
    # the scheduler passes one buffer per DEFINE_GLOBAL; keep them all even if simplification drops a load
    params, variables = parameters_of(ast)  # before simplification, so the parameter list never shrinks
    ast = kernel_for_opts(ast)
    if opts is None:
        opts = [] if config.get("NOOPT") else default_opts(ast, caps)
    if opts and has_accumulating_store(ast) and not (getattr(caps, "atomic_add", False) and atomic_stores_only(ast)):
        opts = []  # points that fold into one element run in order (one thread)
    split = split_kernel(ast, opts)
    # counted before decomposition: a transcendental counts as one operation, as users expect; the points
    # a PADTO adds do nothing, so a padded kernel is counted unpadded
    ops, mem = estimate(ast if any(o.kind is OptKind.PADTO for o in opts) else split)
    ast = split
    if getattr(caps, "fma", False) and not config.get("NOOPT"):
        ast = contract_fma(ast)
    ast = decompose_transcendentals(ast)
    name = getattr(ast.arg, "name", "kernel")
    return ProgramSpec(name=name, ast=ast, globals=params, ops=ops, mem_bytes=mem, opts=tuple(opts),
                       vars=variables, threads=threads_of(ast, opts),
                       vector_width=max(1, int(getattr(caps, "vector_width", 1) or 1)))


def default_opts(ast: UOp, caps: Capabilities | None) -> list[Opt]:
    """The heuristic choice for a simplified kernel, by device class: GPU-style devices (local memory)
    get gpu_opts.py's, host devices host_opts.py's."""
    if caps is not None and caps.has_local_memory:
        return gpu_opts(ast, caps)
    return host_opts(ast, caps)

