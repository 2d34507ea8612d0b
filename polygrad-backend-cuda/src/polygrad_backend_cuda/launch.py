"""The launch of a CUDA kernel: grid and block sizes for a lowered ProgramSpec.

Stage: rendering and running (the renderer and the loader both ask). Input: a ProgramSpec. Output:
a LaunchDims (backend_api, from polygrad.renderer.launch): one warpgroup a block for wgmma kernels (wgmma.py),
the tensor-core layout for kernels lowered with Opt(TC),
the block tiles of kernels lowered with Opt(TILE),
else core's mapping of GLOBAL ranges to blocks and LOCAL/GROUP ranges to threads.
"""
from __future__ import annotations

from typing import Any

from polygrad.backend_api import LaunchDims, launch_dims

from polygrad_backend_cuda.tensor_core import tensor_core_launch, uses_tensor_cores
from polygrad_backend_cuda.tiled_matmul import tiled_launch, uses_tiles
from polygrad_backend_cuda.wgmma import uses_wgmma, wgmma_launch

WARP_SIZE = 32  # every CUDA architecture's (grouped row reductions combine through __shfl_xor_sync)


def launch_of(spec: Any) -> LaunchDims:
    if uses_wgmma(spec):
        return wgmma_launch(spec)
    if uses_tensor_cores(spec):
        return tensor_core_launch(spec)
    if uses_tiles(spec):
        return tiled_launch(spec)
    # scatter-adds: atomicAdd (CUDARenderer.atomic_store); grouped reductions: __shfl_xor_sync (CUDARenderer.shuffle)
    return launch_dims(spec, atomic_add=True, warp=WARP_SIZE)
