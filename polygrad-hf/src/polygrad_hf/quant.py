"""GGUF tensors kept in their block formats: the checks of a file's blocks; the formats live in core.

Stage: checkpoint reading (used by gguf_file.py and decoder.py). Input: a GGUF tensor's uint8 blocks,
its format (Q8_0 or Q4_0) and its logical (rows, cols). Output: the blocks as a (rows, cols // 32,
block_bytes) array, or a CheckpointError naming the file and tensor. The formats are
polygrad/definitions/quant_formats.py; `QuantWeight` (the blocks on the device, dequantized by the
kernels that read them) and `dequantize_blocks` are polygrad.nn.quant's, re-exported here.
"""
from __future__ import annotations

import numpy as np

from polygrad.definitions.quant_formats import BY_NAME
from polygrad.nn.quant import QuantWeight, dequantize_blocks

from polygrad_hf.errors import CheckpointError

__all__ = ["BLOCK", "BLOCK_BYTES", "QuantWeight", "check_blocks", "dequantize_blocks"]

BLOCK = 32  # weights per block, every format kept
BLOCK_BYTES = {f.name: f.block_bytes for f in BY_NAME.values()}


def check_blocks(arr: np.ndarray, fmt: str, shape: tuple[int, int], where: str) -> np.ndarray:
    """The uint8 blocks of a (rows, cols) tensor of `fmt` as a (rows, cols // 32, block_bytes) array;
    CheckpointError naming `where` (the file and tensor) when they do not fit."""
    if fmt not in BLOCK_BYTES:
        raise CheckpointError(f"{where}: block format {fmt!r} is not kept quantized; formats: {list(BLOCK_BYTES)}")
    rows, cols = shape
    if cols % BLOCK:
        raise CheckpointError(f"{where}: {fmt} tensor of shape {[rows, cols]} has rows of {cols} values, not a "
                              f"multiple of the {BLOCK}-value block; llama.cpp writes whole blocks, so the file is "
                              "corrupt")
    want = (rows, cols // BLOCK, BLOCK_BYTES[fmt])
    if arr.dtype != np.uint8 or arr.size != int(np.prod(want)):
        raise CheckpointError(f"{where}: {fmt} tensor of shape {[rows, cols]} needs {int(np.prod(want))} bytes of "
                              f"blocks, got {arr.size} {arr.dtype} values")
    return arr.reshape(want)
