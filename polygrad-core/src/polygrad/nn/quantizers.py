"""Round-to-nearest quantizers for llama.cpp's block formats, on the host.

Stage: graph construction (before any device work). Input: float32 blocks (nblocks, block) of one
format of polygrad/definitions/quant_formats.py. Output: their uint8 blocks (nblocks, block_bytes) in
llama.cpp's layout, through `QUANTIZERS[name]`. The 32-weight formats give the bytes the `gguf` package's
quantizer writes (the same float32 arithmetic). The K-quants, which the gguf package cannot write, round
each sub-block's scale (and min) to the nearest step of the super-block's, then each weight to the nearest
level, where llama.cpp searches for the scales that minimise a weighted error (the rules are in the
definitions' docstring). polygrad/nn/quant.py's `quantize_rows` is the entry point.
"""
from __future__ import annotations

from typing import Callable

import numpy as np


def _reciprocal(d: np.ndarray) -> np.ndarray:
    """1 / d, and 0 where d is 0 (an all-zero block: every quant becomes the zero point)."""
    with np.errstate(divide="ignore"):
        return np.where(d == 0, np.float32(0), np.float32(1) / d).astype(np.float32)


def _half_bytes(values: np.ndarray) -> np.ndarray:
    """(n, 1) float32 as (n, 2) bytes of their float16."""
    return values.astype(np.float16).view(np.uint8).reshape(-1, 2)


def _pack_halves(quants: np.ndarray) -> np.ndarray:
    """(n, 2k) quants as k bytes: byte i = low 4 bits of quant i | quant i + k << 4."""
    half = quants.shape[1] // 2
    return (quants[:, :half] & np.uint8(15)) | (quants[:, half:] << np.uint8(4))


def _fifth_bits(quants: np.ndarray) -> np.ndarray:
    """(n, 32) 5-bit quants' top bits as a little-endian uint32: bit j is quant j's."""
    return np.packbits(quants >> np.uint8(4), axis=1, bitorder="little")


def _largest(blocks: np.ndarray) -> np.ndarray:
    """(n, 1): each block's weight of largest magnitude (the first one on a tie)."""
    return np.take_along_axis(blocks, np.abs(blocks).argmax(axis=1)[:, None], axis=1)


def q8_0(blocks: np.ndarray) -> np.ndarray:
    """Q8_0: d = max|w| / 127; q = w / d rounded half away from zero (in float32, as ggml does)."""
    d = (np.abs(blocks).max(axis=1, keepdims=True) / np.float32(127)).astype(np.float32)
    scaled = blocks * _reciprocal(d)
    magnitude = np.abs(scaled)
    whole = np.floor(magnitude)
    rounded = whole + (magnitude - whole >= np.float32(0.5))  # the fraction is exact: no double rounding
    quants = (np.sign(scaled) * rounded).astype(np.int8).view(np.uint8)
    return np.concatenate([_half_bytes(d), quants], axis=1)


def _symmetric(blocks: np.ndarray, levels: int) -> tuple[np.ndarray, np.ndarray]:
    """Q4_0 / Q5_0's d = (the weight of largest magnitude) / -(levels / 2) and q = min(levels - 1,
    trunc(w / d + levels / 2 + 0.5))."""
    d = (_largest(blocks) / np.float32(-(levels // 2))).astype(np.float32)
    shifted = blocks * _reciprocal(d) + np.float32(levels // 2 + 0.5)
    return d, np.minimum(np.trunc(shifted), levels - 1).astype(np.uint8)


def _with_min(blocks: np.ndarray, levels: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Q4_1 / Q5_1's m = min w, d = (max w - m) / (levels - 1), q = min(levels - 1, trunc((w - m) / d + 0.5))."""
    low = blocks.min(axis=1, keepdims=True)
    d = ((blocks.max(axis=1, keepdims=True) - low) / np.float32(levels - 1)).astype(np.float32)
    shifted = (blocks - low) * _reciprocal(d) + np.float32(0.5)
    return d, low, np.minimum(np.trunc(shifted), levels - 1).astype(np.uint8)


def q4_0(blocks: np.ndarray) -> np.ndarray:
    d, quants = _symmetric(blocks, 16)
    return np.concatenate([_half_bytes(d), _pack_halves(quants)], axis=1)


def q4_1(blocks: np.ndarray) -> np.ndarray:
    d, low, quants = _with_min(blocks, 16)
    return np.concatenate([_half_bytes(d), _half_bytes(low), _pack_halves(quants)], axis=1)


def q5_0(blocks: np.ndarray) -> np.ndarray:
    d, quants = _symmetric(blocks, 32)
    return np.concatenate([_half_bytes(d), _fifth_bits(quants), _pack_halves(quants)], axis=1)


def q5_1(blocks: np.ndarray) -> np.ndarray:
    d, low, quants = _with_min(blocks, 32)
    return np.concatenate([_half_bytes(d), _half_bytes(low), _fifth_bits(quants), _pack_halves(quants)], axis=1)


def _six_bits(values: np.ndarray, unit: np.ndarray) -> np.ndarray:
    """values / unit rounded to the nearest integer in 0..63 (0 where unit is 0)."""
    return np.clip(np.rint(values * _reciprocal(unit)), 0, 63).astype(np.uint8)


def _pack_k_scales(sc: np.ndarray, m: np.ndarray) -> np.ndarray:
    """(n, 8) 6-bit scales and mins as Q4_K's 12 bytes: s[t] and s[t + 4] hold sub-block t's (t < 4) scale
    and min in their low 6 bits and sub-block t + 4's top two bits above them; s[8 + t] holds sub-block
    t + 4's low scale nibble, then its low min nibble."""
    first = (sc[:, :4] & 63) | ((sc[:, 4:] >> 4) << 6)
    second = (m[:, :4] & 63) | ((m[:, 4:] >> 4) << 6)
    third = (sc[:, 4:] & 15) | ((m[:, 4:] & 15) << 4)
    return np.concatenate([first, second, third], axis=1).astype(np.uint8)


def _k_levels(sub: np.ndarray, levels: int) -> tuple[np.ndarray, ...]:
    """Q4_K / Q5_K by rounding to nearest: sub-block t wants step (max - min(0, min)) / (levels - 1) and offset
    -min(0, min); d and dmin (float16) are the largest step and offset / 63, the 6-bit sc and m the nearest
    multiples of them, and each weight the nearest level (d * sc) * q - dmin * m, q in 0..levels - 1.
    Returns d, dmin (n, 1), sc, m (n, 8) and the quants (n, 8, 32)."""
    low = np.minimum(sub.min(axis=2), 0)
    step = ((sub.max(axis=2) - low) / np.float32(levels - 1)).astype(np.float32)
    offset = -low
    d = (step.max(axis=1, keepdims=True) / np.float32(63)).astype(np.float16).astype(np.float32)
    dmin = (offset.max(axis=1, keepdims=True) / np.float32(63)).astype(np.float16).astype(np.float32)
    sc, m = _six_bits(step, d), _six_bits(offset, dmin)
    scale = (d * sc.astype(np.float32))[:, :, None]  # the dequantizer's float32 products
    shift = (dmin * m.astype(np.float32))[:, :, None]
    quants = np.clip(np.rint((sub + shift) * _reciprocal(scale)), 0, levels - 1).astype(np.uint8)
    return d, dmin, sc, m, quants


def _k_nibbles(quants: np.ndarray) -> np.ndarray:
    """(n, 8, 32) quants' low nibbles as 128 bytes: byte 32c + i holds weight 64c + i (low nibble) and
    64c + 32 + i (high)."""
    n = quants.shape[0]
    return _pack_halves(quants.reshape(n * 4, 64)).reshape(n, 128)


def q4_k(blocks: np.ndarray) -> np.ndarray:
    """Q4_K: 16 levels per 32-weight sub-block (_k_levels)."""
    n = blocks.shape[0]
    d, dmin, sc, m, quants = _k_levels(blocks.reshape(n, 8, 32), 16)
    return np.concatenate([_half_bytes(d), _half_bytes(dmin), _pack_k_scales(sc, m), _k_nibbles(quants)], axis=1)


def q5_k(blocks: np.ndarray) -> np.ndarray:
    """Q5_K: 32 levels per 32-weight sub-block (_k_levels); bit t of qh[i] is weight 32t + i's 5th bit."""
    n = blocks.shape[0]
    d, dmin, sc, m, quants = _k_levels(blocks.reshape(n, 8, 32), 32)
    fifth = (quants >> np.uint8(4)) << np.arange(8, dtype=np.uint8)[None, :, None]
    qh = np.bitwise_or.reduce(fifth, axis=1)
    return np.concatenate([_half_bytes(d), _half_bytes(dmin), _pack_k_scales(sc, m), qh, _k_nibbles(quants)],
                          axis=1)


def q6_k(blocks: np.ndarray) -> np.ndarray:
    """Q6_K by rounding to nearest: sub-block t of 16 weights wants scale max|w| / 31; d (float16) is the
    largest scale / 127, the int8 sc the nearest multiple of it, and each weight q - 32 = w / (d * sc)
    rounded to nearest in -32..31."""
    n = blocks.shape[0]
    sub = blocks.reshape(n, 16, 16)
    want = (np.abs(sub).max(axis=2) / np.float32(31)).astype(np.float32)
    d = (want.max(axis=1, keepdims=True) / np.float32(127)).astype(np.float16).astype(np.float32)
    sc = np.clip(np.rint(want * _reciprocal(d)), -128, 127).astype(np.int8)
    scale = (d * sc.astype(np.float32))[:, :, None]
    quants = (np.clip(np.rint(sub * _reciprocal(scale)), -32, 31) + 32).astype(np.uint8).reshape(n, 2, 4, 32)
    # weight 128c + 32t + i: low nibble in ql[64c + 32(t % 2) + i] >> 4(t // 2), high 2 bits qh[32c + i] >> 2t
    low = quants & np.uint8(15)
    ql = (low[:, :, :2] | (low[:, :, 2:] << np.uint8(4))).reshape(n, 128)
    high = (quants >> np.uint8(4)) << (2 * np.arange(4, dtype=np.uint8))[None, None, :, None]
    qh = np.bitwise_or.reduce(high, axis=2).reshape(n, 64)
    return np.concatenate([ql, qh, sc.view(np.uint8), _half_bytes(d)], axis=1)


def q8_k(blocks: np.ndarray) -> np.ndarray:
    """Q8_K by rounding to nearest: d = max|w| / 127 (float32), q = w / d rounded to nearest; then the sums
    of each 16 quants (int16) that llama.cpp's dot products read."""
    n = blocks.shape[0]
    d = (np.abs(blocks).max(axis=1, keepdims=True) / np.float32(127)).astype(np.float32)
    quants = np.clip(np.rint(blocks * _reciprocal(d)), -127, 127).astype(np.int8)
    sums = quants.reshape(n, 16, 16).astype(np.int16).sum(axis=2, dtype=np.int16).astype("<i2")
    return np.concatenate([d.astype("<f4").view(np.uint8), quants.view(np.uint8), sums.view(np.uint8)], axis=1)


QUANTIZERS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "Q8_0": q8_0, "Q4_0": q4_0, "Q4_1": q4_1, "Q5_0": q5_0, "Q5_1": q5_1, "Q4_K": q4_k, "Q5_K": q5_k,
    "Q6_K": q6_k, "Q8_K": q8_k}
