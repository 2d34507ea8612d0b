"""PADTO: an elementwise kernel whose size the vector width does not divide still gets vector lanes on a
device that masks lanes cheaply (`Capabilities.masked_lanes`, the X86 backend): its range is padded to a
multiple of the width and the points past the end are gated off (codegen/lower.py). The padded kernel is
ordinary kernel IR (gated loads and stores), so every device that runs the lowering must give the
unpadded results: CPU's C, X86's machine code (AVX-512 write masks, AVX2 vmaskmovps) and INTERP, with
THREAD shares; the gated lanes never write past the end (a guard region after the output)."""
import numpy as np
import pytest

from polygrad import Device, dtypes
from polygrad.backend_api import Capabilities
from polygrad.codegen.lower import lower
from polygrad.codegen.opts import Opt, OptKind
from polygrad.device import Buffer, open_device
from polygrad.uop.ops import KernelInfo, Ops, UOp

SIZES = [1, 15, 16, 17, 31, 203530]
GUARD = 37  # elements after the output the kernel must leave alone
SENTINEL = -12345.0


def padded_kernel(n: int) -> UOp:
    """out[r] = a[r]*0.9 + b[r]*0.1 + r for r < n, an Adam-like update plus a value computed from the
    index itself (computed, then discarded, in the gated lanes); out is n + GUARD elements long."""
    out = UOp.placeholder((n + GUARD,), dtypes.float32, 0)
    a = UOp.placeholder((n,), dtypes.float32, 1)
    b = UOp.placeholder((n,), dtypes.float32, 2)
    r = UOp.range(None, n, 0)
    value = a[r].load() * 0.9 + b[r].load() * 0.1 + UOp(Ops.CAST, dtypes.float32, (r,))
    return UOp(Ops.STORE, None, (out[r], value)).end(r).sink(arg=KernelInfo(name=f"k_pad{n}"))


def inputs(n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(n)
    a = rng.standard_normal(n).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    want = a * np.float32(0.9) + b * np.float32(0.1) + np.arange(n, dtype=np.float32)
    return a, b, want


def run_spec(device: str, spec, program, n: int) -> np.ndarray:
    """Run a compiled program of padded_kernel(n) on fresh buffers; the whole output, guard included."""
    a, b, _ = inputs(n)
    out = Buffer(device, n + GUARD, dtypes.float32)
    out.copyin(np.full(n + GUARD, SENTINEL, dtype=np.float32))
    bufs = [out, Buffer(device, n, dtypes.float32), Buffer(device, n, dtypes.float32)]
    bufs[1].copyin(a)
    bufs[2].copyin(b)
    program([x.handle for x in bufs], (), False)
    return out.numpy().copy()


def check(got: np.ndarray, n: int, what: str) -> None:
    _, _, want = inputs(n)
    np.testing.assert_array_equal(got[:n], want, err_msg=what)
    np.testing.assert_array_equal(got[n:], np.full(GUARD, SENTINEL, dtype=np.float32),
                                  err_msg=f"{what}: wrote past the end")


def kinds(spec) -> list[str]:
    return [o.kind.value for o in spec.opts]


def expect_padded(spec, n: int, width: int) -> None:
    if n % width and n > 1:
        assert kinds(spec)[:2] == ["PADTO", "UPCAST"], spec.opts
        assert spec.threads == (2 if n > 100000 else 1), spec.opts


@pytest.mark.parametrize("width", [8, 16])
@pytest.mark.parametrize("n", SIZES)
def test_padded_lanes_on_cpu_and_interp(n, width):
    """The same padded spec (THREAD shares for the big size) runs as C vector code on CPU (gated vector
    loads, per-lane gated stores) and through INTERP's evaluator, equal to NumPy, guard untouched."""
    caps = Capabilities(threads=2, vector_width=width, registers=16, masked_lanes=True)
    spec = lower(padded_kernel(n), caps)
    expect_padded(spec, n, width)
    for device in ("CPU", "INTERP"):
        if not Device.available(device):
            continue
        dev = open_device(device)
        source = dev.render(spec)
        if device == "CPU" and n > 1:
            assert "vector_size(" in source, source
        check(run_spec(device, spec, dev.load(spec, dev.compile(source)), n), n, f"{device} n={n} width={width}")


def x86_tiers() -> list[str]:
    if not Device.available("X86"):
        return []
    from polygrad_backend_x86.cpu import choose_isa
    best = choose_isa().tier
    return [t for t in ("avx2", "avx512") if best == "avx512" or t == best]


@pytest.mark.parametrize("tier", x86_tiers() or [pytest.param("none", marks=pytest.mark.skip("X86 not usable"))])
@pytest.mark.parametrize("n", SIZES)
def test_padded_lanes_on_x86_are_masked_moves(n, tier):
    """X86 (the device that declares masked_lanes) pads on its own: the last vector's lanes past the
    end are masked (an AVX-512 write mask, AVX2 vmaskmovps), never a lane-at-a-time loop, and the rest
    of the kernel is packed vector code."""
    from polygrad_backend_x86.compiler import X86Source, compile_source
    from polygrad_backend_x86.cpu import Isa, choose_isa
    from polygrad_backend_x86.runtime import X86Program
    host = choose_isa()
    isa = Isa(tier, fma=host.fma, features=host.features)
    caps = open_device("X86").capabilities
    assert caps.masked_lanes
    caps = Capabilities(threads=2, vector_width=isa.lanes, registers=caps.registers, fma=caps.fma, masked_lanes=True)
    spec = lower(padded_kernel(n), caps)
    expect_padded(spec, n, isa.lanes)
    src = X86Source(spec, isa)
    text = str(src)
    if n % isa.lanes and n > 1:
        wide = "zmm" if tier == "avx512" else "ymm"
        masked = r"{k1}" if tier == "avx512" else "vmaskmovps"
        assert f"vmulps {wide}" in text and masked in text, text
        assert "vmaskmovps [" in text or "{k1}," in text, text  # the store itself is masked
    kernel = compile_source(src)
    check(run_spec("X86", spec, X86Program(spec, kernel.code, kernel.externs), n), n, f"X86 {tier} n={n}")


def test_only_devices_that_declare_masked_lanes_pad():
    """Without masked_lanes a size the width does not divide keeps its scalar loop (the CPU backend: the
    C compiler vectorises it with its own remainder loop); with it, the kernel is padded; the padded
    points are not counted as work."""
    ast = padded_kernel(1001)
    plain = lower(ast, Capabilities(threads=1, vector_width=8, registers=16))
    padded = lower(ast, Capabilities(threads=1, vector_width=8, registers=16, masked_lanes=True))
    assert kinds(plain) == [] and kinds(padded) == ["PADTO", "UPCAST"]
    assert padded.ops == plain.ops and padded.mem_bytes == plain.mem_bytes
    if Device.available("CPU"):
        assert not open_device("CPU").capabilities.masked_lanes


def test_padto_that_divides_or_is_too_small_is_skipped():
    """PADTO by an amount that already divides the range (or below 2) changes nothing; a size the amount
    does not divide gets the gate `r < n` on every access."""
    ast = padded_kernel(64)
    assert lower(ast, None, [Opt(OptKind.PADTO, 0, 16)]).ast is lower(ast, None, []).ast
    assert lower(ast, None, [Opt(OptKind.PADTO, 0, 1)]).ast is lower(ast, None, []).ast
    spec = lower(padded_kernel(60), None, [Opt(OptKind.PADTO, 0, 16)])
    gates = [x for x in spec.ast.toposort() if x.op is Ops.INDEX and len(x.src) == 3]
    assert len(gates) == 3  # two loads and the store
    (r,) = [x for x in spec.ast.toposort() if x.op is Ops.RANGE]
    assert r.src[0].arg == 64


def test_beam_search_tries_padded_lanes_where_the_device_masks_them():
    from polygrad.codegen.passes import simplify_indices
    from polygrad.codegen.search import candidate_opts
    ast = simplify_indices(padded_kernel(1001))
    masked = Capabilities(threads=1, vector_width=8, registers=16, masked_lanes=True)
    pad = [Opt(OptKind.PADTO, 0, 8), Opt(OptKind.UPCAST, 0, 8)]
    assert pad in candidate_opts(ast, [], masked)
    assert not any(o.kind is OptKind.PADTO for c in candidate_opts(ast, [], Capabilities(vector_width=8)) for o in c)


def test_padding_that_could_overflow_the_index_dtype_is_refused():
    """A range whose padded points would take an int32 index past 2**31 - 1 stays unpadded: the gated
    points compute their addresses too."""
    n = 2**31 - 5
    out = UOp.placeholder((n,), dtypes.float32, 0)
    r = UOp.range(None, n, 0)
    ast = UOp(Ops.STORE, None, (out[r], UOp.const(dtypes.float32, 1.0))).end(r).sink(arg=KernelInfo(name="k_big"))
    spec = lower(ast, None, [Opt(OptKind.PADTO, 0, 16)])
    (rng,) = [x for x in spec.ast.toposort() if x.op is Ops.RANGE]
    assert rng.src[0].arg == n
