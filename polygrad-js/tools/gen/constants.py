"""src/generated/constants.js: the float64 constants of polygrad's transcendental decompositions, bit for bit.

Stage: build (generator). Input: polygrad-core's uop/transcendental.py (the reduction constants) and the
polynomial degrees it uses. Output: each constant's IEEE float64 bits (big-endian hex).

The JavaScript lowering (src/transcendental.js) rebuilds EXP2/LOG2/SIN from the same polynomials;
JavaScript's Math.log and ** may round differently from CPython's, so the coefficients are copied as IEEE
bits rather than recomputed.
"""
from __future__ import annotations

import math
import struct

from polygrad.uop import transcendental as tr

from gen._js import GENERATED, module

OUT = GENERATED / "constants.js"
SOURCE = "polygrad-core/src/polygrad/uop/transcendental.py"
ABOUT = "float64 bits (big-endian hex) of the polynomial coefficients and reduction constants."


def hx(x: float) -> str:
    return struct.pack(">d", x).hex()


def exports() -> dict[str, list[str]]:
    """The table: the values module.exports holds."""
    ln2 = math.log(2)
    return {
        "exp2_f32": [hx(ln2 ** k / math.factorial(k)) for k in range(7 + 1)],
        "exp2_f64": [hx(ln2 ** k / math.factorial(k)) for k in range(13 + 1)],
        "log2_f32": [hx(2.0 / (math.log(2) * (2 * k + 1))) for k in range(6)],
        "log2_f64": [hx(2.0 / (math.log(2) * (2 * k + 1))) for k in range(12)],
        "sin_poly": [hx((-1) ** i / math.factorial(2 * i + 1)) for i in range(9)],
        "cos_poly": [hx((-1) ** i / math.factorial(2 * i)) for i in range(10)],
        "two_over_pi_24": [hx(c) for c in tr.TWO_OVER_PI_CHUNKS],
        "two_over_pi_26": [hx(c) for c in tr.TWO_OVER_PI_CHUNKS_26],
        "pio2_parts": [hx(c) for c in tr.PIO2_PARTS],
        "misc": [hx(2 / math.pi), hx(math.pi / 2), hx(math.sqrt(2.0))],
    }


def render() -> str:
    return module(__file__, SOURCE, ABOUT, exports())
