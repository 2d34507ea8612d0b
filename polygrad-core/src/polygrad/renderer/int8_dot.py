"""Integer dot products of 8-bit lanes: `contract_int8_dots(prog) -> prog`, a rewrite of the linear program.

Stage: linearizing, after `linearize` and before a C dialect renders the program, for a dialect that asks
for it (`CStyleRenderer.int8_dot`: the CPU backend on a CPU with VNNI). Input: a LinearProgram. Output: the
same program with each loop of the shapes below replaced by one UPDATE with arg DOT4 or DOT4_NIBBLES.

Bytes (Q8_0): 4 turns (0 to 4, step 1) whose body is scalar int index arithmetic, two contiguous n-lane
loads of int8 (an unsigned byte load read through a BITCAST to int8 counts), their CASTs to int32, the
product, and an UPDATE (ADD) of an int32 accumulator of n lanes defined outside the loop; each load's
index grows by n a turn. That is lane l of the accumulator gaining a[l + n k] * b[l + n k] for k < 4 over
the 4n bytes at each load's index at turn 0, which the loop becomes: its index arithmetic at turn 0, two
4n-lane loads and `UPDATE(acc, a, b)` with arg DOT4, which the dialect renders as one call of its helper
(the CPU's: a byte shuffle and vpdpbusd).

Nibbles (Q4_0): two nested 2-turn loops h (outer) and t whose body is as above except that the second
factor is ((q >> 4h) & 15) - 8 in int32, q a contiguous n-lane load of uint8 whose index grows by n a
turn of t and not with h, while the int8 load grows by n a turn of t and 2n a turn of h. That is lane l
gaining a[l + n k] * (nibble(k) - 8) for k = 2h + t < 4, nibble(k) = q[l + n t] >> 4h & 15, over the 4n
int8 values and the 2n bytes of q at turn 0: `UPDATE(acc, a, q)` with arg DOT4_NIBBLES (the CPU's helper:
the nibbles unpacked to bytes in value order, a byte shuffle, vpdpbusd of nibbles x a, less 8 x a's sum).

Broadcast rows (a prompt tile): a 4-turn loop of one or more UPDATEs of int32 accumulators (one per row of
x the tile unrolls), each adding the product of one 8-bit value of x broadcast to the lanes (a scalar load,
1 further a turn) and n 8-bit lanes 4 apart (a "quads" load of a staged weight panel, 1 further a turn),
one factor int8 and the other uint8: lane l gaining x[k] * b[4l + k], each update one DOT4_BCAST of a
4-byte load and a 4n-byte load (shared by the updates), which the CPU renders as one vpdpbusd.

Several weight rows a turn (a decode matvec's tile, host_opts.int8_dot_rows): the Bytes and Nibbles loops
may hold one such UPDATE per weight row, each into its own accumulator; the loads they share (the
activation's) are widened once, and each row gets its own DOT4 or DOT4_NIBBLES update, in order. The C
compiler then shuffles the activation's block and computes its offset (8 x or 128 x its sum) once for the
rows. Each row's own load is a STREAM (the dialect prefetches ahead along it).

Integer sums are exact, so the values are the loops' bit for bit. nn/quant.py writes a decode matvec's
32-weight block in these forms (`_int8_matmul_t`) and a prompt's (`_int8_matmul_rows`).

Two float chains (`split_chains`, run on every program that contracted a loop): the block loop around a
contraction scales each block's int32 lanes to float and FMAs them into one accumulator, so a weight row
waits on one FMA per block in turn, longer than the block's integer work. The loop's update goes instead
to accumulator b & 1 for block b (an IF each, which the C compiler folds away when it unrolls the loop by
two), and after the loop acc_0 += acc_1. The same terms summed in another fixed order: within float
reassociation of the single chain, the same bits from run to run (INTERP and the X86 emitter, which never
contract, keep the one chain). The loop is not unrolled here: two copies of the body, each with its own
32-bit index sums, made clang sign-extend and spill (Qwen2's 4864 x 896 Q4_0 matvec on Zen 4, data in
cache, in a variant that reads per-block offsets: 1.67 ns a block, against 1.24 for the IFs and 1.36 for
one chain).
"""
from __future__ import annotations

import dataclasses

from polygrad.dtype import dtypes
from polygrad.renderer.linearize import Inst, L, LinearProgram
from polygrad.uop.ops import Ops

DOT4 = "dot4"  # UPDATE arg: acc lane l += sum over k < 4 of a[l + n k] * b[l + n k] (a, b: 4n int8 lanes)
# UPDATE arg: acc lane l += sum over k < 4 of a[l + n k] * (((q[l + n (k % 2)] >> 4 (k // 2)) & 15) - 8)
# (a: 4n int8 lanes; q: 2n uint8 lanes, each byte two 4-bit weights, Q4_0's low and high halves)
DOT4_NIBBLES = "dot4_nibbles"
BYTES = (dtypes.int8, dtypes.uint8)
# UPDATE arg: acc lane l += sum over k < 4 of x[k] * b[4 l + k] (x: 4 bytes shared by every lane, b: 4n bytes,
# each lane's 4 together, as vpdpbusd reads them; one int8, the other uint8): a prompt row's 4 activations
# against 4 values of n weight rows (nn/quant.py's multi-row route, its weights staged: linearize.stage_layout)
DOT4_BCAST = "dot4_bcast"
TURNS = 4
NIBBLE_OFFSET = 8  # Q4_0's weights are nibble - 8
# LOAD arg of a weight row's bytes in a contracted loop of several rows (a decode matvec's tile): contiguous, as
# "contiguous", and one of several streams the loop reads together, which a dialect may prefetch ahead along
# (CStyleRenderer.stream_prefetch): 4 rows interleaved kept the CPU's own prefetcher behind (a Qwen2 head's
# 151936 x 896 Q4_0 matvec from memory 1.5x slower than one row a turn, which reads one stream)
STREAM = "stream"


def contract_int8_dots(prog: LinearProgram) -> LinearProgram:
    """The program with every 4-turn loop of 8-bit products into an int32 accumulator as one DOT4 UPDATE."""
    insts = list(prog.insts)
    end_of = {id(x.src[0]): j for j, x in enumerate(insts) if x.op is L.ENDLOOP}
    out: list[Inst] = []
    i = 0
    while i < len(insts):
        x = insts[i]
        if x.op is L.LOOP:
            j = end_of[id(x)]
            body = insts[i + 1:j]
            nested = bool(body) and body[0].op is L.LOOP
            contracted = _contracted_nibbles(x, body) if nested else _contracted(x, body)
            if contracted is not None:
                out.extend(contracted)
                i = j + 1
                continue
        out.append(x)
        i += 1
    if len(out) == len(insts):
        return prog
    return split_chains(dataclasses.replace(prog, insts=tuple(out)))


def _is_int_const(x: Inst, value: int) -> bool:
    return x.op is L.CONST and x.lanes == 1 and x.arg == value


def _byte_operand(x: Inst, lanes: int) -> tuple[Inst, Inst | None] | None:
    """(the load, its BITCAST or None) when x is int32 lanes CAST from a contiguous int8 load."""
    if not (x.op is L.ALU and x.arg is Ops.CAST and x.dtype is dtypes.int32 and x.lanes == lanes):
        return None
    v = x.src[0]
    cast = None
    if v.op is L.ALU and v.arg is Ops.BITCAST and v.dtype is dtypes.int8 and v.src[0].dtype is dtypes.uint8:
        cast, v = v, v.src[0]
    ok = v.op is L.LOAD and v.arg == "contiguous" and len(v.src) == 2 and v.lanes == lanes
    if not ok or v.dtype is not (dtypes.int8 if cast is None else dtypes.uint8):
        return None
    return v, cast


def _turn_step(x: Inst, loop: Inst, body: set[int]) -> int | None:
    """How much x grows a turn of `loop` when it is affine in the loop variable; None when it is not."""
    if x is loop:
        return 1
    if id(x) not in body:
        return 0
    if not (x.op is L.ALU and x.lanes == 1):
        return None
    found = [_turn_step(s, loop, body) for s in x.src]
    steps = [s for s in found if s is not None]
    if len(steps) < len(found):
        return None
    if not any(steps):
        return 0  # the loop's value does not reach x (a clamped row index's comparison and select)
    if x.dtype is not dtypes.int32:
        return None
    if x.arg is Ops.ADD:
        return sum(steps)
    if x.arg is Ops.MUL:
        a, b = x.src
        if b.op is L.CONST and steps[1] == 0:
            return steps[0] * b.arg
        if a.op is L.CONST and steps[0] == 0:
            return steps[1] * a.arg
    return None


def _is_turns(loop: Inst, turns: int) -> bool:
    return len(loop.src) == 2 and _is_int_const(loop.src[0], 0) and _is_int_const(loop.src[1], turns)


def _product_updates(body: list[Inst], distinct: bool = True) -> list[tuple[Inst, Inst, Inst]] | None:
    """[(update, acc, mul)] when each UPDATE of the body adds an n-lane int32 product (n > 1) to an int32
    accumulator defined outside the body: with `distinct`, each its own (one per weight row a decode matvec's
    tile unrolls); _contracted_broadcast checks its prompt tile's operands instead."""
    updates = [x for x in body if x.op is L.UPDATE]
    inside = {id(x) for x in body}
    found = []
    for update in updates:
        if update.arg is not Ops.ADD or len(update.src) != 2:
            return None
        acc, mul = update.src
        if acc.op is not L.ACC or acc.dtype is not dtypes.int32 or acc.arg != (Ops.ADD, 1) or id(acc) in inside:
            return None
        if not (mul.op is L.ALU and mul.arg is Ops.MUL and mul.dtype is dtypes.int32 and mul.lanes == acc.lanes > 1):
            return None
        found.append((update, acc, mul))
    if not found or (distinct and len({id(acc) for _, acc, _ in found}) < len(found)):
        return None
    return found


def _index_at_start(index: list[Inst], starts: dict[int, Inst]) -> tuple[list[Inst], dict[int, Inst]]:
    """The scalar index arithmetic `index` again with each loop in `starts` (by id) replaced by its start,
    and the map from the old instructions (by id) to the new ones."""
    new = dict(starts)
    out = []
    for x in index:
        y = Inst(x.op, x.dtype, tuple(new.get(id(s), s) for s in x.src), x.arg, x.lanes)
        new[id(x)] = y
        out.append(y)
    return out, new


def _is_scalar_int(x: Inst) -> bool:
    return x.op is L.ALU and x.lanes == 1 and x.dtype is dtypes.int32


def _contracted(loop: Inst, body: list[Inst]) -> list[Inst] | None:
    """The instructions replacing `loop` (whose body is `body`), or None when it is not a 4-turn byte dot
    (one UPDATE per weight row of the tile; a load the rows share, the activation's, is widened once)."""
    if not _is_turns(loop, TURNS):
        return None
    found = _product_updates(body)
    if found is None:
        return _contracted_broadcast(loop, body)
    inside = {id(x) for x in body}
    vector: set[int] = set()
    parts = []
    for update, acc, mul in found:
        operands = [_byte_operand(s, acc.lanes) for s in mul.src]
        if any(o is None for o in operands):
            return _contracted_broadcast(loop, body)
        for load, cast in operands:
            vector |= {id(load)} | ({id(cast)} if cast is not None else set())
            if _turn_step(load.src[1], loop, inside) != acc.lanes:
                return None
        vector |= {id(update), id(mul)} | {id(s) for s in mul.src}
        parts.append((update, acc, operands))
    # everything else in the body is the loads' scalar index arithmetic
    index = [x for x in body if id(x) not in vector]
    if not all(_is_scalar_int(x) for x in index):
        return None
    # the index arithmetic at turn 0 (the loop's start stands for the variable), then the wide loads
    out, new = _index_at_start(index, {id(loop): loop.src[0]})
    wide: dict[int, Inst] = {}
    kind = _load_kinds([ld for _, _, operands in parts for ld, _ in operands])
    for update, acc, operands in parts:
        for load, cast in operands:
            if id(load) not in wide:
                w = Inst(L.LOAD, load.dtype, (load.src[0], new.get(id(load.src[1]), load.src[1])), kind[id(load)],
                         TURNS * acc.lanes)
                out.append(w)
                if cast is not None:
                    w = Inst(L.ALU, dtypes.int8, (w,), Ops.BITCAST, TURNS * acc.lanes)
                    out.append(w)
                wide[id(load)] = w
        out.append(Inst(L.UPDATE, update.dtype, (acc, *(wide[id(ld)] for ld, _ in operands)), DOT4, update.lanes))
    return out


def _load_kinds(loads: list[Inst]) -> dict[int, str]:
    """The wide LOAD arg of each load (by id) of a contracted loop's updates, in order: STREAM for a load of
    one update alone where the loop has several (a weight row of a tile), else "contiguous"."""
    uses: dict[int, int] = {}
    for ld in loads:
        uses[id(ld)] = uses.get(id(ld), 0) + 1
    several = len(loads) > 2
    return {i: STREAM if several and n == 1 else "contiguous" for i, n in uses.items()}


def _splat(x: Inst, value: int) -> bool:
    """Whether x is `value` in every lane (a BCAST of a scalar CONST, or a CONST)."""
    if x.op is L.BCAST:
        return _is_int_const(x.src[0], value)
    return x.op is L.CONST and (x.arg == value or (isinstance(x.arg, tuple) and set(x.arg) == {value}))


def _value_at(x: Inst, env: dict[int, int]) -> int | None:
    """The scalar integer x when each loop in env (by id) holds its value; None when x depends on anything
    else (a load, another loop) or is not plain integer arithmetic."""
    if id(x) in env:
        return env[id(x)]
    if x.op is L.CONST and x.lanes == 1 and isinstance(x.arg, int):
        return x.arg
    if not (x.op is L.ALU and x.lanes == 1 and x.dtype is not None and x.dtype.is_int):
        return None
    vals = [_value_at(s, env) for s in x.src]
    if any(v is None for v in vals):
        return None
    ops = {Ops.CAST: lambda a: a, Ops.ADD: lambda a, b: a + b, Ops.MUL: lambda a, b: a * b,
           Ops.SHL: lambda a, b: a << b}
    f = ops.get(x.arg)
    return None if f is None or len(vals) != (1 if x.arg is Ops.CAST else 2) else f(*vals)


def _nibble_operand(x: Inst, lanes: int, h: Inst) -> tuple[Inst, list[Inst]] | None:
    """(the uint8 load, the instructions of the operand) when x is int32 lanes of ((q >> 4h) & 15) - 8 for
    a contiguous n-lane uint8 load q (the shift a scalar of loop h broadcast, 4h at each turn)."""
    if not (x.op is L.ALU and x.arg is Ops.ADD and x.dtype is dtypes.int32 and x.lanes == lanes):
        return None
    widened = next((s for s in x.src if not _splat(s, -NIBBLE_OFFSET)), None)
    if widened is None or not any(_splat(s, -NIBBLE_OFFSET) for s in x.src):
        return None
    if not (widened.op is L.ALU and widened.arg is Ops.CAST and widened.src[0].dtype is dtypes.uint8):
        return None
    masked = widened.src[0]
    if not (masked.op is L.ALU and masked.arg is Ops.AND and masked.lanes == lanes and _splat(masked.src[1], 15)):
        return None
    shifted = masked.src[0]
    if not (shifted.op is L.ALU and shifted.arg is Ops.SHR and shifted.src[1].op is L.BCAST):
        return None
    load, amount = shifted.src[0], shifted.src[1].src[0]
    if not (load.op is L.LOAD and load.arg == "contiguous" and len(load.src) == 2 and load.lanes == lanes
            and load.dtype is dtypes.uint8):
        return None
    if [_value_at(amount, {id(h): turn}) for turn in (0, 1)] != [0, 4]:
        return None
    return load, [x, widened, masked, shifted, shifted.src[1]]


def _ancestors_in(x: Inst, inside: set[int]) -> set[int]:
    """The ids of x's sources, theirs and so on, that are in `inside` (x itself not counted)."""
    found: set[int] = set()
    todo = list(x.src)
    while todo:
        y = todo.pop()
        if id(y) in inside and id(y) not in found:
            found.add(id(y))
            todo.extend(y.src)
    return found


def _contracted_nibbles(outer: Inst, body: list[Inst]) -> list[Inst] | None:
    """The instructions replacing the loop `outer` (h, whose body is `body`: the loop t and its end), or None
    when they are not Q4_0's nibble dot (module docstring)."""
    inner = body[0]
    if not (_is_turns(outer, 2) and _is_turns(inner, 2) and body[-1].op is L.ENDLOOP and body[-1].src[0] is inner):
        return None
    turn_body = body[1:-1]
    found = _product_updates(turn_body)
    if found is None:
        return None
    inside = {id(x) for x in turn_body}
    vector: set[int] = set()
    parts, x_loads = [], set()
    for update, acc, mul in found:
        lanes = acc.lanes
        a, b = mul.src
        for first, second in ((a, b), (b, a)):
            byte = _byte_operand(first, lanes)
            nibble = _nibble_operand(second, lanes, outer)
            if byte is not None and byte[1] is None and nibble is not None:
                break
        else:
            return None
        (x_load, _), (q_load, operand) = byte, nibble
        steps = {"x": (_turn_step(x_load.src[1], outer, inside), _turn_step(x_load.src[1], inner, inside)),
                 "q": (_turn_step(q_load.src[1], outer, inside), _turn_step(q_load.src[1], inner, inside))}
        if steps != {"x": (2 * lanes, lanes), "q": (0, lanes)}:
            return None
        vector |= {id(update), id(mul), id(first), id(x_load), id(q_load)} | {id(y) for y in operand}
        parts.append((update, acc, x_load, q_load, operand))
        x_loads.add(id(x_load))
    rest = [x for x in turn_body if id(x) not in vector]
    # the shift amount's arithmetic of h goes with the shift; the rest is the loads' index arithmetic
    shift_math: set[int] = set()
    for *_, operand in parts:
        shift_math |= _ancestors_in(operand[-1], inside)
    index = [x for x in rest if id(x) not in shift_math]
    if not all(_is_scalar_int(x) for x in index):
        return None
    loads = [ld for _, _, x_load, q_load, _ in parts for ld in (x_load, q_load)]
    if any(id(s) in shift_math for x in (*index, *loads) for s in x.src):
        return None  # the index reads the shift's arithmetic, which the contraction drops
    out, new = _index_at_start(index, {id(outer): outer.src[0], id(inner): inner.src[0]})
    wide: dict[int, Inst] = {}
    kind = _load_kinds(loads)

    def widened(load: Inst, lanes: int) -> Inst:  # each load once (the rows share the activation's)
        if id(load) not in wide:
            at = new.get(id(load.src[1]), load.src[1])
            wide[id(load)] = Inst(L.LOAD, load.dtype, (load.src[0], at), kind[id(load)], lanes)
            out.append(wide[id(load)])
        return wide[id(load)]
    for update, acc, x_load, q_load, _ in parts:
        wide_x, wide_q = widened(x_load, TURNS * acc.lanes), widened(q_load, 2 * acc.lanes)
        out.append(Inst(L.UPDATE, update.dtype, (acc, wide_x, wide_q), DOT4_NIBBLES, update.lanes))
    return out


CHAINS = 2  # float accumulators a contracted block loop alternates between (split_chains)


def split_chains(prog: LinearProgram, chains: int = CHAINS) -> LinearProgram:
    """The program with each block loop of a contracted dot (a LOOP whose body holds a DOT4-family UPDATE)
    that feeds a float accumulator defined outside it (UPDATE FMA or ADD, the loop's only use of it; one
    per weight row of a tile of rows) updating `chains` accumulators instead (a power of two): block b's
    update goes to accumulator b & (chains - 1), under an IF each, and after the loop they are added in
    order (acc_0 += acc_1, ..).
    One chain of FMAs through every block made the decode matvec wait on the FMA's latency (nn/quant.py
    _int8_matmul_t); the C compiler unrolls the constant loop and keeps the chains apart in registers,
    without the IFs. The same block terms summed in another fixed order: a float reassociation, the same
    bits from run to run. A loop with bounds that are not constants, or fewer than 2 turns per chain,
    keeps its one chain."""
    if chains < 2 or chains & (chains - 1):
        raise ValueError(f"split_chains: chains must be a power of two of at least 2, not {chains}")
    insts, done = list(prog.insts), set()
    while (found := _chain_loop(insts, chains, done)) is not None:
        done.add(id(insts[found[0]]))
        insts = _split(insts, *found, chains)
    return prog if len(insts) == len(prog.insts) else dataclasses.replace(prog, insts=tuple(insts))


def _chain_loop(insts: list[Inst], chains: int, done: set[int]) -> tuple[int, int, list[Inst]] | None:
    """(index of the LOOP, index of its ENDLOOP, its float UPDATEs to split: one per weight row of the
    tile) of the first loop split_chains splits that is not in `done` (ids of the loops already split)."""
    where: dict[int, tuple[int, ...]] = {}  # id -> the indices of the LOOPs around it
    stack: list[int] = []
    end_of: dict[int, int] = {}
    for i, x in enumerate(insts):
        if x.op is L.ENDLOOP:
            end_of[stack.pop()] = i
        where[id(x)] = tuple(stack)
        if x.op is L.LOOP:
            stack.append(i)
    found: dict[int, list[Inst]] = {}  # the loop's index -> its chains' updates
    for u in insts:
        if not (u.op is L.UPDATE and u.arg in (Ops.FMA, Ops.ADD) and len(u.src) == (3 if u.arg is Ops.FMA else 2)):
            continue
        acc = u.src[0]
        if not (acc.op is L.ACC and acc.dtype is not None and acc.dtype.is_float and acc.arg[1] == 1):
            continue
        outside = where[id(acc)]
        loops = where[id(u)]
        if len(loops) <= len(outside) or loops[:len(outside)] != outside:
            continue
        start = loops[len(outside)]  # the outermost loop the chain runs through
        loop, end = insts[start], end_of[start]
        body = insts[start + 1:end]
        if id(loop) in done:
            continue
        if len(loop.src) != 2 or not all(s.op is L.CONST and s.lanes == 1 for s in loop.src) \
                or loop.src[1].arg - loop.src[0].arg < 2 * chains:
            continue  # (a constant trip count, which the C compiler unrolls by `chains`)
        if not any(x.op is L.UPDATE and x.arg in (DOT4, DOT4_NIBBLES) for x in body):
            continue
        if [x for x in body if any(s is acc for s in x.src)] != [u]:
            continue  # the accumulator is read or updated elsewhere in the loop
        found.setdefault(start, []).append(u)
    if not found:
        return None
    start = min(found)
    return start, end_of[start], found[start]


def _split(insts: list[Inst], start: int, end: int, updates: list[Inst], chains: int) -> list[Inst]:
    """insts with each float UPDATE of `updates` in the loop at `start` (ENDLOOP at `end`) going to
    accumulator (loop variable & (chains - 1)) of its own set, one IF per accumulator, and each set's
    accumulators added after the loop."""
    loop = insts[start]
    accs = {id(u): [u.src[0]] + [Inst(L.ACC, u.src[0].dtype, u.src[0].src, u.src[0].arg, u.src[0].lanes)
                                 for _ in range(chains - 1)] for u in updates}
    first = {id(u.src[0]): accs[id(u)] for u in updates}
    out = []
    for x in insts[:start]:
        out.append(x)
        if id(x) in first:
            out.extend(first[id(x)][1:])
    consts = [Inst(L.CONST, loop.dtype, (), k) for k in range(chains)]
    mask = Inst(L.CONST, loop.dtype, (), chains - 1)
    out.extend([*consts, mask])
    for x in insts[start:end + 1]:
        if id(x) not in accs:
            out.append(x)
            continue
        turn = Inst(L.ALU, loop.dtype, (loop, mask), Ops.AND)
        out.append(turn)
        for k in range(chains):
            cond = Inst(L.ALU, dtypes.bool, (turn, consts[k]), Ops.CMPEQ)
            gate = Inst(L.IF, None, (cond,))
            out.extend([cond, gate, Inst(L.UPDATE, None, (accs[id(x)][k], *x.src[1:]), x.arg, x.lanes),
                        Inst(L.ENDIF, None, (gate,))])
    for u in updates:  # acc_0 + acc_1 + .., in order
        acc, *others = accs[id(u)]
        for other in others:
            read = Inst(L.ACC_READ, other.dtype, (other,), None, other.lanes)
            out.extend([read, Inst(L.UPDATE, None, (acc, read), Ops.ADD, acc.lanes)])
    out.extend(insts[end + 1:])
    return out


def _scalar_byte(x: Inst) -> tuple[Inst, Inst] | None:
    """(the scalar 8-bit load, its CAST) when x is n int32 lanes broadcast from one int8 or uint8 value."""
    if x.op is not L.BCAST:
        return None
    v = x.src[0]
    if not (v.op is L.ALU and v.arg is Ops.CAST and v.dtype is dtypes.int32 and v.lanes == 1):
        return None
    ld = v.src[0]
    if not (ld.op is L.LOAD and ld.dtype in BYTES and ld.lanes == 1 and len(ld.src) == 2):
        return None
    return ld, v


def _quads_operand(x: Inst, lanes: int) -> Inst | None:
    """The load when x is n int32 lanes CAST from an int8 or uint8 "quads" load (a staged array)."""
    if not (x.op is L.ALU and x.arg is Ops.CAST and x.dtype is dtypes.int32 and x.lanes == lanes):
        return None
    v = x.src[0]
    ok = v.op is L.LOAD and v.arg == "quads" and len(v.src) == 2 and v.lanes == lanes and v.dtype in BYTES
    return v if ok else None


def _is_scalar_index(x: Inst) -> bool:
    """Scalar int32 arithmetic, or the comparison and select of a clamped index (a padded row tile's)."""
    if not (x.op is L.ALU and x.lanes == 1):
        return False
    return x.dtype is dtypes.int32 or (x.dtype is dtypes.bool and x.arg is Ops.CMPLT)


def _contracted_broadcast(loop: Inst, body: list[Inst]) -> list[Inst] | None:
    """A 4-turn loop of one or more updates (the rows of a prompt tile, each its own accumulator) whose
    product is one 8-bit value broadcast (its index 1 further a turn) times n 8-bit lanes 4 apart (a "quads"
    load of a staged array, 1 further a turn), one of them int8 and the other uint8: x[k] * b[4 l + k], each
    as DOT4_BCAST of a 4-byte load and a 4n-byte load (a load the updates share is loaded once)."""
    found = _product_updates(body, distinct=False)
    if found is None:
        return None
    inside = {id(x) for x in body}
    vector_ids: set[int] = set()
    parts = []
    for update, acc, mul in found:
        for first, second in (mul.src, tuple(reversed(mul.src))):
            scalar, vector = _scalar_byte(first), _quads_operand(second, acc.lanes)
            if scalar is not None and vector is not None and {scalar[0].dtype, vector.dtype} == set(BYTES):
                break  # one factor unsigned, one signed: vpdpbusd's
        else:
            return None
        (x_load, x_cast), w_load = scalar, vector
        if _turn_step(x_load.src[1], loop, inside) != 1 or _turn_step(w_load.src[1], loop, inside) != 1:
            return None
        vector_ids |= {id(update), id(mul), id(first), id(second), id(x_load), id(x_cast), id(w_load)}
        parts.append((update, acc, x_load, w_load))
    index = [x for x in body if id(x) not in vector_ids]
    if not all(_is_scalar_index(x) for x in index):
        return None
    out, new = _index_at_start(index, {id(loop): loop.src[0]})
    wide: dict[int, Inst] = {}

    def widened(load: Inst, lanes: int) -> Inst:  # each load once (the rows share the weights')
        if id(load) not in wide:
            at = new.get(id(load.src[1]), load.src[1])
            wide[id(load)] = Inst(L.LOAD, load.dtype, (load.src[0], at), "contiguous", lanes)
            out.append(wide[id(load)])
        return wide[id(load)]
    for update, acc, x_load, w_load in parts:
        x4, w = widened(x_load, TURNS), widened(w_load, TURNS * acc.lanes)
        out.append(Inst(L.UPDATE, update.dtype, (acc, x4, w), DOT4_BCAST, update.lanes))
    return out
