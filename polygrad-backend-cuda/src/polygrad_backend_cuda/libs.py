"""Find and open libcuda (driver API) and libnvrtc (runtime compiler) through cffi in ABI mode.

Stage: runtime support. Input: the environment (POLY_CUDA_LIB, POLY_NVRTC_LIB, installed NVIDIA wheels,
CUDA_HOME). Output: cffi library objects, or a `LibraryMissing` error whose message says what was
looked for and how to get it. Nothing here compiles C: the declarations below are the subset of
cuda.h / nvrtc.h the backend calls, with the ABI's real symbol names (the `_v2` entry points).
"""
from __future__ import annotations

import ctypes.util
import glob
import os
import sys

import cffi

from polygrad.backend_api import setting

CUDA_CDEF = """
typedef int CUresult;
typedef int CUdevice;
typedef struct CUctx_st *CUcontext;
typedef struct CUmod_st *CUmodule;
typedef struct CUfunc_st *CUfunction;
typedef struct CUstream_st *CUstream;
typedef unsigned long long CUdeviceptr;
CUresult cuInit(unsigned int flags);
CUresult cuDriverGetVersion(int *version);
CUresult cuGetErrorString(CUresult error, const char **text);
CUresult cuDeviceGetCount(int *count);
CUresult cuDeviceGet(CUdevice *device, int ordinal);
CUresult cuDeviceGetName(char *name, int len, CUdevice device);
CUresult cuDeviceGetAttribute(int *value, int attribute, CUdevice device);
CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice device);
CUresult cuCtxCreate_v2(CUcontext *ctx, unsigned int flags, CUdevice device);
CUresult cuCtxSetCurrent(CUcontext ctx);
CUresult cuCtxSynchronize(void);
CUresult cuModuleLoadData(CUmodule *module, const void *image);
CUresult cuModuleGetFunction(CUfunction *function, CUmodule module, const char *name);
CUresult cuModuleUnload(CUmodule module);
CUresult cuFuncSetAttribute(CUfunction function, int attribute, int value);
CUresult cuLaunchKernel(CUfunction f, unsigned int gridX, unsigned int gridY, unsigned int gridZ,
                        unsigned int blockX, unsigned int blockY, unsigned int blockZ,
                        unsigned int sharedMemBytes, CUstream stream, void **params, void **extra);
CUresult cuMemAlloc_v2(CUdeviceptr *ptr, size_t bytes);
CUresult cuMemFree_v2(CUdeviceptr ptr);
CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t bytes);
CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t bytes);
CUresult cuMemGetInfo_v2(size_t *free, size_t *total);
"""

# CUDA graphs (graph.py): the entry points of driver API 11.4 and newer with the first kernel-node layout,
# which later drivers keep exporting beside their _v2 forms. A driver without them runs plain launches.
GRAPH_CDEF = """
typedef struct CUgraph_st *CUgraph;
typedef struct CUgraphNode_st *CUgraphNode;
typedef struct CUgraphExec_st *CUgraphExec;
typedef struct {
    CUfunction func;
    unsigned int gridDimX, gridDimY, gridDimZ;
    unsigned int blockDimX, blockDimY, blockDimZ;
    unsigned int sharedMemBytes;
    void **kernelParams;
    void **extra;
} CUDA_KERNEL_NODE_PARAMS;
CUresult cuGraphCreate(CUgraph *graph, unsigned int flags);
CUresult cuGraphAddKernelNode(CUgraphNode *node, CUgraph graph, const CUgraphNode *dependencies,
                              size_t count, const CUDA_KERNEL_NODE_PARAMS *params);
CUresult cuGraphInstantiateWithFlags(CUgraphExec *exec, CUgraph graph, unsigned long long flags);
CUresult cuGraphExecKernelNodeSetParams(CUgraphExec exec, CUgraphNode node, const CUDA_KERNEL_NODE_PARAMS *params);
CUresult cuGraphLaunch(CUgraphExec exec, CUstream stream);
CUresult cuGraphExecDestroy(CUgraphExec exec);
CUresult cuGraphDestroy(CUgraph graph);
"""
GRAPH_CALLS = ("cuGraphCreate", "cuGraphAddKernelNode", "cuGraphInstantiateWithFlags", "cuGraphExecKernelNodeSetParams",
               "cuGraphLaunch", "cuGraphExecDestroy", "cuGraphDestroy")

NVRTC_CDEF = """
typedef int nvrtcResult;
typedef struct _nvrtcProgram *nvrtcProgram;
const char *nvrtcGetErrorString(nvrtcResult result);
nvrtcResult nvrtcVersion(int *major, int *minor);
nvrtcResult nvrtcCreateProgram(nvrtcProgram *prog, const char *src, const char *name, int numHeaders,
                               const char * const *headers, const char * const *includeNames);
nvrtcResult nvrtcDestroyProgram(nvrtcProgram *prog);
nvrtcResult nvrtcCompileProgram(nvrtcProgram prog, int numOptions, const char * const *options);
nvrtcResult nvrtcGetProgramLogSize(nvrtcProgram prog, size_t *size);
nvrtcResult nvrtcGetProgramLog(nvrtcProgram prog, char *log);
nvrtcResult nvrtcGetPTXSize(nvrtcProgram prog, size_t *size);
nvrtcResult nvrtcGetPTX(nvrtcProgram prog, char *ptx);
nvrtcResult nvrtcGetCUBINSize(nvrtcProgram prog, size_t *size);
nvrtcResult nvrtcGetCUBIN(nvrtcProgram prog, char *cubin);
"""

ffi = cffi.FFI()
ffi.cdef(CUDA_CDEF)
ffi.cdef(GRAPH_CDEF)
ffi.cdef(NVRTC_CDEF)

# device attributes (cuda.h CUdevice_attribute)
ATTR_MAX_THREADS_PER_BLOCK = 1
ATTR_MAX_SHARED_MEMORY_PER_BLOCK = 8
ATTR_MULTIPROCESSOR_COUNT = 16
ATTR_COMPUTE_CAPABILITY_MAJOR = 75
ATTR_COMPUTE_CAPABILITY_MINOR = 76
CUDA_ERROR_NO_DEVICE = 100


class LibraryMissing(OSError):
    """A CUDA library could not be opened; the message names what was tried and what to install."""


def _open(candidates: list[str], what: str, hint: str):
    tried = []
    for name in candidates:
        try:
            return ffi.dlopen(name)
        except OSError:
            tried.append(name)
    raise LibraryMissing(f"{what} not found (tried {', '.join(tried) or 'nothing'}): {hint}")


def cuda_candidates() -> list[str]:
    forced = setting("POLY_CUDA_LIB")
    if forced:
        return [forced]
    found = ctypes.util.find_library("cuda")
    return ["libcuda.so.1", "libcuda.so"] + ([found] if found else [])


def nvrtc_candidates() -> list[str]:
    """libnvrtc from POLY_NVRTC_LIB, the nvidia-cuda-nvrtc wheels, CUDA_HOME, or the loader's path."""
    forced = setting("POLY_NVRTC_LIB")
    if forced:
        return [forced]
    out: list[str] = []
    roots = [os.path.join(p, "nvidia") for p in sys.path if p and os.path.isdir(os.path.join(p, "nvidia"))]
    for root in roots:
        for pattern in ("cuda_nvrtc/lib/libnvrtc.so.*", "cu*/lib/libnvrtc.so.*"):
            out += sorted(p for p in glob.glob(os.path.join(root, pattern)) if "builtins" not in p and ".alt." not in p)
    for env in ("CUDA_HOME", "CUDA_PATH"):  # the CUDA toolkit's variables, not polygrad settings
        home = os.environ.get(env)
        if home:
            out += sorted(glob.glob(os.path.join(home, "lib64", "libnvrtc.so*")))
    out += sorted(glob.glob("/usr/local/cuda/lib64/libnvrtc.so*"))
    found = ctypes.util.find_library("nvrtc")
    out += ([found] if found else []) + ["libnvrtc.so", "libnvrtc.so.13", "libnvrtc.so.12"]
    return list(dict.fromkeys(out))


_cache: dict[str, object] = {}


def cuda():
    """The driver library (libcuda, from the NVIDIA driver)."""
    if "cuda" not in _cache:
        _cache["cuda"] = _open(cuda_candidates(), "libcuda.so",
                               "no NVIDIA driver on this machine (a GPU and its driver are needed to run CUDA kernels)")
    return _cache["cuda"]


def nvrtc():
    """The runtime compiler (libnvrtc)."""
    if "nvrtc" not in _cache:
        _cache["nvrtc"] = _open(nvrtc_candidates(), "libnvrtc",
                                "pip install nvidia-cuda-nvrtc-cu12 (or polygrad-backend-cuda[nvrtc])")
    return _cache["nvrtc"]


def forget() -> None:
    """Drop the opened libraries (tests that point POLY_CUDA_LIB at a stub)."""
    _cache.clear()


def has_graphs(lib) -> bool:
    """Does this driver library export the CUDA graph calls graph.py makes?"""
    try:
        return all(getattr(lib, name) is not None for name in GRAPH_CALLS)
    except AttributeError:  # cffi (ABI mode): a declared function the library does not export
        return False


class CUDAError(RuntimeError):
    """A driver API call failed; the message names the call and the driver's error text."""


def check(lib, status: int, call: str) -> None:
    if status != 0:
        text = ffi.new("const char **")
        msg = "unknown error"
        try:
            if lib.cuGetErrorString(status, text) == 0 and text[0] != ffi.NULL:
                msg = ffi.string(text[0]).decode(errors="replace")
        except AttributeError:
            pass
        raise CUDAError(f"{call} failed with CUDA error {status}: {msg}")
