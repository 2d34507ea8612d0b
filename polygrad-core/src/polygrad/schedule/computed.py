"""Values that realizes computed, kept while the graphs holding them live, so that a later realize
reads the buffer instead of computing the value again.

Stage: scheduling. Input: after a realize ran, its tensor-graph nodes with their normalised forms and
the template's buffers (`remember`). Output: `views()`, {weakref(node): buffer view}, which
`schedule.normalize` consults: a node found there is read from its buffer, and nothing below it is
walked, scheduled or run.

Why: lazy tensors share graphs. The gradients of a deep network share the backward chain, and
realizing them one parameter at a time recomputed that chain down to each parameter, O(depth) kernels
per gradient and O(depth**2) in all. With the computed values kept, each realize runs only the
kernels nothing computed before (tinygrad gets the same from its "becomes" map, which replaces
realized nodes in every live tensor).

Which values: every realize point (a node with its own kernel and buffer) and target of a realize,
when its value depends on a buffer (a graph of constants alone is held by the schedule cache's keys
forever, so it is not kept: it would pin its buffer).

Lifetime: an entry lives as long as its node (weak keys) and holds the buffer until then: while a lazy
tensor's graph holds the node, or a realized tensor's `_graph` (kept for backward) does, as autograd
keeps a graph's activations in PyTorch.

Validity: a kept value is exactly what computing the node now would give, because every entry is
dropped when a buffer that may already hold a value is written (`device.note_overwrite`: host
copies, effects that ran, replays of captured graphs). A host copy into a buffer made after every
kept value's realize (a new tensor's data) drops nothing: no kept value was computed from it. A
realize that runs an effect keeps nothing and reads nothing kept (the scheduler orders its reads
around the writes itself), and neither does one while a capture records (a captured function must
record every kernel its work needs, and a replay writes into the buffers it captured). normalize
never replaces a realize's target (or the node under its reshapes) by a kept buffer: the result
would alias a buffer another tensor owns.
"""
from __future__ import annotations

import weakref
from operator import attrgetter
from typing import Any

from polygrad.device import overwrite_listeners
from polygrad.uop.ops import Ops, UOp

# weakref(node) -> buffer view. A key's callback is the dict's own pop, so a node's death removes its
# entry without running Python code; clear() drops the refs, so their callbacks never run after it.
_views: dict[weakref.ref, UOp] = {}
_drop = _views.pop
# the newest Buffer (by creation serial) in the tables of the kept values' realizes: the values
# depend on no younger buffer
_newest = [-1]
# how many times forget() ran: a realize that saw another count when it started computed from buffers
# that were written meanwhile (another thread), so it keeps nothing
_generation = [0]
_serial = attrgetter("serial")


def _overwritten(buf: Any) -> None:
    """device.note_overwrite listener: drop every kept value unless `buf` is younger than them all."""
    if buf is None or buf.serial <= _newest[0]:
        forget()


overwrite_listeners.append(_overwritten)


def views() -> dict[weakref.ref, UOp] | None:
    """The kept values a realize may read, or None when there are none. Look a node up with
    `weakref.ref(node)`."""
    return _views or None


def generation() -> int:
    """Read before a realize's walk and given back to remember()."""
    return _generation[0]


def remember(walked: dict[UOp, UOp], kept: dict[UOp, tuple[int, tuple | None]], table: list[Any],
             since: int) -> None:
    """Keep the values a realize just computed: `walked` maps its graph's nodes to their normalised forms
    (normalize), `kept` the template's points to their table entries and view shapes
    (Template.kept), `table` holds the buffers the template ran with, `since` is generation() from
    before the realize's walk (nothing is kept if a buffer was written since)."""
    if since != _generation[0]:
        return
    _newest[0] = max(_newest[0], max(map(_serial, table)))
    for node, norm in walked.items():
        hit = kept.get(norm)
        if hit is None or norm is node:  # not computed here, or no buffer below (see the docstring)
            continue
        entry, shape = hit
        view = UOp(Ops.BUFFER, norm.dtype, (), table[entry])
        _views[weakref.ref(node, _drop)] = view if shape is None else UOp(Ops.RESHAPE, norm.dtype, (view,), shape)


def forget() -> None:
    """Drop every kept value (schedule.clear_schedule_cache, polygrad.collect, any overwrite)."""
    _generation[0] += 1
    _views.clear()
    _newest[0] = -1
