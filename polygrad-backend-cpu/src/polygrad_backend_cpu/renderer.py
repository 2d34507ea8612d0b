"""The CPU dialect of the C-family renderer (plain C99 with GNU statement expressions)."""
from __future__ import annotations

from polygrad.backend_api import KERNEL_SYMBOL, CStyleRenderer, DType, Ops, dtypes

# outputs of at least this many bytes get non-temporal stores when the cache size is unknown
DEFAULT_STREAM_BYTES = 16 << 20


# x86 vector FMA builtins of GCC and clang by (element dtype, vector bytes): (feature macro, builtin, extra
# arguments). Each is one vfmadd instruction, rounded once like fma/fmaf, so results do not change.
X86_FMA = {
    (dtypes.float32, 16): ("__FMA__", "__builtin_ia32_vfmaddps", ""),
    (dtypes.float32, 32): ("__FMA__", "__builtin_ia32_vfmaddps256", ""),
    (dtypes.float32, 64): ("__AVX512F__", "__builtin_ia32_vfmaddps512_mask", ", (unsigned short)-1, 4"),
    (dtypes.float64, 16): ("__FMA__", "__builtin_ia32_vfmaddpd", ""),
    (dtypes.float64, 32): ("__FMA__", "__builtin_ia32_vfmaddpd256", ""),
    (dtypes.float64, 64): ("__AVX512F__", "__builtin_ia32_vfmaddpd512_mask", ", (unsigned char)-1, 4"),
}
# x86 masked loads by (element dtype, lanes): the lanes whose mask's sign bit is set are read, the others
# read nothing (a padded row's edge cannot fault) and give 0. The portable helper (count the lanes on, one
# vector load where all are, else lane by lane) made gcc keep the mask's lanes in general registers and
# spill a register tile's accumulators around it: conv2d's weight gradient ran 3x slower than with this.
X86_MASKLOAD = {(dtypes.float32, 4): ("__AVX__", "__builtin_ia32_maskloadps"),
                (dtypes.float32, 8): ("__AVX__", "__builtin_ia32_maskloadps256")}
# AVX-512's 16 lanes: the mask is a k register made from the int lanes (lane != 0), the load gives 0 where
# it is off (GCC's and clang's builtins behind _mm512_maskz_loadu_ps and _mm512_cmpneq_epi32_mask)
AVX512_MASK16 = "(unsigned short)__builtin_ia32_cmpd512_mask(m, (pg_i32x16){0}, 4, (unsigned short)-1)"
AVX512_MASKLOAD = {dtypes.float32: "__builtin_ia32_loadups512_mask"}
# masked stores by (element dtype, lanes): (feature macro, statement over p, v (the value) and m (int lanes));
# the lanes whose mask is off are not written
X86_MASKSTORE = {
    (dtypes.float32, 8): ("__AVX__", "__builtin_ia32_maskstoreps256((pg_f32x8*)(p), m, v);"),
    (dtypes.float32, 16): ("__AVX512F__", f"__builtin_ia32_storeups512_mask(p, v, {AVX512_MASK16});"),
}


# byte dot products on 256-bit vectors (vpdpbusd): AVX-512 VNNI with VL, or AVX-VNNI
VNNI_256 = "((defined(__AVX512VNNI__) && defined(__AVX512VL__)) || defined(__AVXVNNI__))"
# bytes ahead a tile's weight-row stream is prefetched (stream_prefetch: 4 rows of a decode matvec read together).
# Zen 4, a 151936 x 896 Q4_0 matvec from memory, one thread, best of 6 under load 6-7: 8.2-9.5 ms without,
# 5.3-5.4 with 256 bytes ahead (one row a turn: 6.1), 9.6-11.9 with 1024
STREAM_AHEAD = 256


class CPURenderer(CStyleRenderer):
    prelude = "#include <math.h>\n#include <stdint.h>\n"
    strided_loads = True  # lanes 2 apart: two masked vector loads and a shuffle (strided_vload_body)
    no_unroll_pragma = "#pragma clang loop unroll(disable)"  # gcc ignores it

    def __init__(self, stream_bytes: int = DEFAULT_STREAM_BYTES, int8_dot: bool = False):
        self.stream_bytes = stream_bytes  # 0: never stream
        self.int8_dot = int8_dot  # the CPU has VNNI: byte dot products as vpdpbusd (dot4_body)

    def stream_slots(self, spec) -> frozenset[int]:  # type: ignore[no-untyped-def]
        """Outputs larger than the last-level cache that the kernel does not read: their contiguous vector
        stores go straight to memory (no read-for-ownership of each line, the cache left to the inputs)."""
        if not self.stream_bytes:
            return frozenset()
        big = {g.slot for g in spec.globals if g.written and isinstance(g.size, int)
               and g.size * g.dtype.itemsize >= self.stream_bytes}
        if not big:
            return frozenset()
        read = {n.src[0].src[0].arg[0] for n in spec.ast.toposort() if n.op is Ops.LOAD}
        return frozenset(big - read)

    def stream_prefetch(self, ptr: str, dt: DType) -> str | None:
        """__builtin_prefetch STREAM_AHEAD bytes further along a tile's weight row (see STREAM_AHEAD)."""
        return f"__builtin_prefetch((const char*)({ptr}) + {STREAM_AHEAD});"

    def dot4_body(self, n: int) -> str:
        """8 lanes with clang where the target has VNNI (AVX-512 VNNI with VL, or AVX-VNNI): both byte vectors
        shuffled so lane l's 4 bytes (l, l + 8, l + 16, l + 24) sit together, as vpdpbusd sums them; it
        multiplies unsigned by signed bytes, so it takes b ^ 0x80 (b + 128, unsigned) and a second one takes
        128 * a off again, first, from the accumulator: exact for every int8 value (integer sums). a is the
        activation (nn/quant.py's order), which a tile of weight rows shares: clang computes its shuffle and
        128 * a once for the tile's calls. Else the base's lane loop."""
        generic = super().dot4_body(n)
        if n != 8:
            return generic
        order = ", ".join(str(8 * k + lane) for lane in range(8) for k in range(4))
        vt, bt = self.vtype(dtypes.int32, 8), self.vtype(dtypes.int8, 32)
        return (f"#if defined(__clang__) && {VNNI_256}\n"
                f"  {bt} bias = ({bt}){{0}} + (signed char)-128;\n"
                f"  a = __builtin_shufflevector(a, a, {order});\n"
                f"  b = __builtin_shufflevector(b, b, {order});\n"
                f"  {vt} offset = ({vt})__builtin_ia32_vpdpbusd256(({vt}){{0}}, ({vt})bias, ({vt})a);\n"
                f"  return ({vt})__builtin_ia32_vpdpbusd256(acc - offset, ({vt})(b ^ bias), ({vt})a);\n"
                f"#else\n{generic}\n#endif")

    def dot4_bcast_body(self, n: int, xd: DType, bd: DType) -> str:
        """8 lanes with clang where the target has VNNI: x's 4 bytes broadcast to every lane as one int32, then
        one vpdpbusd of them and b (each lane's 4 bytes together already), which multiplies unsigned by
        signed bytes: the unsigned factor goes first. Else the base's lane loop."""
        generic = super().dot4_bcast_body(n, xd, bd)
        if n != 8:
            return generic
        vt = self.vtype(dtypes.int32, 8)
        head = (f"#if defined(__clang__) && {VNNI_256}\n"
                f"  int word; __builtin_memcpy(&word, &x, 4);\n"
                f"  {vt} a = ({vt}){{0}} + word;\n")
        if {xd, bd} != {dtypes.int8, dtypes.uint8}:
            return generic
        pair = f"a, ({vt})b" if xd is dtypes.uint8 else f"({vt})b, a"  # the unsigned factor first
        return f"{head}  return ({vt})__builtin_ia32_vpdpbusd256(acc, {pair});\n#else\n{generic}\n#endif"

    def dot4_nibbles_body(self, n: int) -> str:
        """8 lanes with clang where the target has VNNI: the weights in vpdpbusd's order (lane l's 4 bytes the
        nibbles of values l, l + 8, l + 16, l + 24, unsigned 0..15), the activations shuffled as in
        dot4_body, one vpdpbusd of nibbles x activations (unsigned x signed: exact, no sign trick) into the
        accumulator less 8 x the activations' sum (Q4_0's weight is nibble - 8; a second vpdpbusd, which clang
        computes once for a tile of weight rows, as the activations' shuffle). Else the base's lane loop.

        The weights: with AVX-512 BW, one byte shuffle puts bytes q[l], q[l + 8], q[l], q[l + 8] in lane l,
        one vpsrlvw shifts each lane's second 16-bit pair right by 4, and a mask keeps the low nibbles (4
        instructions a block; the empty asm hides the constant shift amounts, which clang otherwise turns
        back into the low/high split below and two cross-lane shuffles: 8). Without it, the low and high
        nibbles are split and shuffled into place."""
        generic = super().dot4_nibbles_body(n)
        if n != 8:
            return generic
        order = ", ".join(str(8 * k + lane) for lane in range(8) for k in range(4))
        pairs = ", ".join(str(8 * (k % 2) + lane) for lane in range(8) for k in range(4))
        vt, bt, qt = self.vtype(dtypes.int32, 8), self.vtype(dtypes.int8, 32), self.vtype(dtypes.uint8, 16)
        ut, wt = self.vtype(dtypes.uint8, 32), self.vtype(dtypes.uint16, 16)
        return (f"#if defined(__clang__) && {VNNI_256}\n"
                f"  {bt} eight = ({bt}){{0}} + (signed char)8;\n"
                f"#if defined(__AVX512BW__) && defined(__AVX512VL__)\n"
                f"  {wt} shifts = {{{', '.join(['0, 4'] * 8)}}};\n"
                f"  __asm__(\"\" : \"+v\"(shifts));\n"
                f"  {ut} pairs = __builtin_shufflevector(q, q, {pairs});\n"
                f"  {bt} w = ({bt})(({ut})__builtin_ia32_psrlv16hi(({wt})pairs, shifts) & (unsigned char)15);\n"
                f"#else\n"
                f"  {qt} low = q & (unsigned char)15, high = q >> (unsigned char)4;\n"
                f"  {bt} w = ({bt})__builtin_shufflevector(low, high, {order});\n"
                f"#endif\n"
                f"  a = __builtin_shufflevector(a, a, {order});\n"
                f"  {vt} offset = ({vt})__builtin_ia32_vpdpbusd256(({vt}){{0}}, ({vt})eight, ({vt})a);\n"
                f"  return ({vt})__builtin_ia32_vpdpbusd256(acc - offset, ({vt})w, ({vt})a);\n"
                f"#else\n{generic}\n#endif")

    def vfma_body(self, dt: DType, n: int) -> str:
        """The compiler's vector FMA builtin where the target has one (`__builtin_elementwise_fma` on newer
        clang, else the x86 builtin for the vector's size), else the base's per-lane loop. Left to itself,
        clang 14 scalarizes the loop inside a tile of dot products and re-vectorizes it across the wrong
        axis (measured: a 128x256x784 x @ W.T at 2 GFLOP/s a core, 75 with the builtin)."""
        portable = super().vfma_body(dt, n)
        x86 = X86_FMA.get((dt, n * dt.itemsize))
        if x86 is None:
            return portable
        macro, builtin, extra = x86
        vt = self.vtype(dt, n)
        return (f"#if defined(__has_builtin)\n#if __has_builtin(__builtin_elementwise_fma)\n"
                f"  return __builtin_elementwise_fma(a, b, c);\n"
                f"#elif defined({macro}) && __has_builtin({builtin})\n  return ({vt}){builtin}(a, b, c{extra});\n"
                f"#else\n{portable}\n#endif\n#else\n{portable}\n#endif")

    def gated_vload_body(self, dt: DType, lanes: int) -> str:
        """The x86 masked load where the target has AVX, else the base's portable body."""
        portable = super().gated_vload_body(dt, lanes)
        if lanes == 16 and dt in AVX512_MASKLOAD:
            vt = self.vtype(dt, lanes)
            fast = f"return ({vt}){AVX512_MASKLOAD[dt]}(p, ({vt}){{0}}, {AVX512_MASK16});"
            return f"#if defined(__AVX512F__)\n  {fast}\n#else\n{portable}\n#endif"
        if (dt, lanes) not in X86_MASKLOAD:
            return portable
        macro, builtin = X86_MASKLOAD[dt, lanes]
        fast = f"return {builtin}((const {self.vtype(dt, lanes)}*)p, m);"
        return f"#if defined({macro})\n  {fast}\n#else\n{portable}\n#endif"

    def strided_vload_body(self, dt: DType, lanes: int) -> str:
        """AVX-512 for 4, 8 or 16 float32 lanes 2 apart: the elements from the first lane on to the last one
        on (masked 16-float loads: nothing outside them is read, and every element between two lanes'
        elements lies in the same buffer), the even ones kept by one shuffle (vpermt2ps from two vectors)
        and the lanes that are off zeroed; the base's lane loop elsewhere. A stride-2 depthwise conv's 16
        lanes ran 2.7x slower than its plain loop as a gather, 1.8x faster than it this way (Zen 4)."""
        portable = super().strided_vload_body(dt, lanes)
        if dt is not dtypes.float32 or lanes not in (4, 8, 16):
            return portable
        vt, it, wide = self.vtype(dt, lanes), self.vtype(dtypes.int32, lanes), self.vtype(dt, 16)
        evens = ", ".join(str(2 * k) for k in range(lanes))
        on = AVX512_MASK16 if lanes == 16 else "0"
        if lanes < 16:  # the lanes' sign bits (m is 0 or -1 per lane)
            on = f"__builtin_ia32_movmskps{'256' if lanes == 8 else ''}(({self.vtype(dt, lanes)})m)"
        load = f"({wide})__builtin_ia32_loadups512_mask(%s, ({wide}){{0}}, (unsigned short)%s)"
        pair = (f"  {wide} lo = {load % ('p', 'e')}, hi = {load % ('p + 16', '(e >> 16)')};" if lanes == 16 else
                f"  {wide} lo = {load % ('p', 'e')}, hi = lo;")
        return "\n".join([
            "#if defined(__AVX512F__) && defined(__has_builtin)",
            "#if __has_builtin(__builtin_shufflevector)",
            f"  unsigned int k = (unsigned int){on};",
            f"  if (!k) return ({vt}){{0}};",
            "  int first = __builtin_ctz(k), last = 31 - __builtin_clz(k);",
            "  unsigned int e = (unsigned int)((2ull << (2 * last)) - (1ull << (2 * first)));",
            pair,
            f"  {vt} r = __builtin_shufflevector(lo, hi, {evens});",
            f"  return ({vt})(({it})r & m);",
            "#else", portable, "#endif",
            "#else", portable, "#endif"])

    def masked_vstore(self, dt: DType, lanes: int, ptr: str, value: str, gate: str) -> str | None:
        """A call of the x86 masked store helper (`pg_gstore_<type>`) where the target has one; the
        portable lane loop otherwise (the helper's #else)."""
        if (dt, lanes) not in X86_MASKSTORE:
            return None
        macro, fast = X86_MASKSTORE[dt, lanes]
        vt, mt = self.vtype(dt, lanes), self.vtype(dtypes.bool, lanes)
        name = f"pg_gstore_{vt[3:]}"
        portable = f"  for (int pl = 0; pl < {lanes}; pl++) if (m[pl]) p[pl] = v[pl];"
        self._helpers[name] = (f"static inline void {name}({self.storage_ctype(dt)}* p, {vt} v, {mt} m) {{\n"
                               f"#if defined({macro})\n  {fast}\n#else\n{portable}\n#endif\n}}")
        return f"{name}({ptr}, {value}, {gate});"

    def masked_gather(self, dt: DType, lanes: int, buf: str, idx: str, gate: str | None) -> str | None:
        """AVX-512's gather of 16 float32 lanes (`pg_gather_f32x16`), lanes whose gate is off reading nothing;
        the portable lane loop otherwise. A strided convolution's input row (every other pixel) ran 4x
        faster than lane by lane."""
        if (dt, lanes) != (dtypes.float32, 16):
            return None
        vt, mt = self.vtype(dt, lanes), self.vtype(dtypes.int32, lanes)
        lanes_loop = "for (int pl = 0; pl < 16; pl++) r[pl] = (m[pl]!=0) ? p[ix[pl]] : 0;"
        portable = f"  {vt} r = {{0}};\n  {lanes_loop}\n  return r;"
        fast = f"return ({vt})__builtin_ia32_gathersiv16sf(({vt}){{0}}, p, ix, {AVX512_MASK16}, 4);"
        head = f"static inline {vt} pg_gather_f32x16(const float* p, {mt} ix, {mt} m) {{"
        self._helpers["pg_gather_f32x16"] = f"{head}\n#if defined(__AVX512F__)\n  {fast}\n#else\n{portable}\n#endif\n}}"
        mask = gate if gate is not None else self.splat(dtypes.int32, lanes, "-1")
        return f"pg_gather_f32x16({buf}, {idx}, {mask})"

    def render_program(self, prog, stream: frozenset[int] = frozenset()) -> str:  # type: ignore[no-untyped-def]
        """The kernel, and its pool trampoline `pg_kernel_task(void** args, int tid)` (args: the buffer
        pointers, then pointers to the variables' values; tid: the THREAD index, unused without one), through
        which the pool runs a THREAD kernel's parts and a LaunchPlan any kernel (see runtime.py)."""
        src = super().render_program(prog, stream)
        args = [f"({'' if p.arg[1] else 'const '}{self.storage_ctype(p.dtype)}*)a[{i}]"
                for i, p in enumerate(prog.params)]
        args += [f"*(const {self.ctype(v.dtype)}*)a[{len(prog.params) + i}]" for i, v in enumerate(prog.vars)]
        call = f"{KERNEL_SYMBOL}({', '.join(args + (['tid'] if prog.threads > 1 else []))});"
        if prog.threads <= 1:
            call += " (void)tid;"
        return src + f"void {KERNEL_SYMBOL}_task(void** a, int tid) {{ {call} }}\n"
