"""GGUF tensors kept in their block formats: the checks of a file's blocks; the formats live in core.

Stage: checkpoint reading (used by gguf_file.py and decoder.py). Input: a GGUF tensor's uint8 blocks,
its format (Q8_0, Q4_K, ...) and its logical (rows, cols). Output: the blocks as a (rows, cols // block,
block_bytes) array, or a CheckpointError naming the file and tensor. The formats are
polygrad/definitions/quant_formats.py; `QuantWeight` (the blocks on the device, dequantized by the
kernels that read them) and `dequantize_blocks` are polygrad.nn.quant's, re-exported here.
"""
from __future__ import annotations

import numpy as np

from polygrad.definitions.quant_formats import BY_NAME
from polygrad.nn.quant import QuantWeight, dequantize_blocks

from polygrad_hf.errors import CheckpointError

__all__ = ["KEPT", "QuantWeight", "check_blocks", "dequantize_blocks", "q8_k_floats"]

KEPT = tuple(BY_NAME)  # the GGUF types kept in their blocks


def check_blocks(arr: np.ndarray, fmt: str, shape: tuple[int, int], where: str) -> np.ndarray:
    """The uint8 blocks of a (rows, cols) tensor of `fmt` as a (rows, cols // block, block_bytes) array;
    CheckpointError naming `where` (the file and tensor) when they do not fit."""
    if fmt not in BY_NAME:
        raise CheckpointError(f"{where}: block format {fmt!r} is not kept quantized; formats: {list(KEPT)}")
    f = BY_NAME[fmt]
    rows, cols = shape
    if cols % f.block:
        raise CheckpointError(f"{where}: {fmt} tensor of shape {[rows, cols]} has rows of {cols} values, not a "
                              f"multiple of the {f.block}-value block; llama.cpp writes whole blocks, so the file "
                              "is corrupt")
    want = (rows, cols // f.block, f.block_bytes)
    if arr.dtype != np.uint8 or arr.size != int(np.prod(want)):
        raise CheckpointError(f"{where}: {fmt} tensor of shape {[rows, cols]} needs {int(np.prod(want))} bytes of "
                              f"blocks, got {arr.size} {arr.dtype} values")
    return arr.reshape(want)


def q8_k_floats(data: np.ndarray) -> np.ndarray:
    """float32 values of Q8_K blocks (any shape whose last axis is whole blocks' bytes): d * q, with d the
    float32 at a block's start and q its 256 int8 quants (the gguf package has no Q8_K dequantizer)."""
    f = BY_NAME["Q8_K"]
    blocks = np.ascontiguousarray(data, dtype=np.uint8).reshape(-1, f.block_bytes)
    d = blocks[:, :4].copy().view(np.float32)
    quants = blocks[:, 4:4 + f.block].view(np.int8).astype(np.float32)
    return (d * quants).reshape(*data.shape[:-1], -1)
