#!/usr/bin/env bash
# The GPU check of polygrad-backend-cuda, in one go (under 8 minutes on one GPU):
#   1. environment: the GPU, Python, the probe (python -m polygrad doctor)
#   2. the op and nn suites on CUDA (tests/test_tensor_core_*.py, nn, optim, jit, transcendental, linalg:
#      their CUDA cases; needs torch for references),
#      or, without torch, tests/test_cuda_compile.py's kernels only compiled
#   3. tests/test_cuda_gpu.py: values vs NumPy (the tiled fp32 matmul on 1, 17, 1000, 4097), a training
#      step, the bundle round trip (host -> CUDA); the tile kernels compiled by this NVRTC and run on
#      the CPU check (tests/test_cuda_tiled_matmul.py, tests/test_cuda_cpu_check.py: needs clang++)
#   4. issue 35's speed table (benchmarks/bench_cuda.py): matmul 4096 fp32 / fp16 / bf16, the MLP Adam step,
#      a GPT-2-small training step (batch 8 x 512), GPT-2-small decode and the launch overhead of a
#      40-kernel JIT replay with and without CUDA graphs, beside torch CUDA when it is
#      installed, every row checked against NumPy (and torch); a failed check fails the run
# Usage: bash scripts/cuda_check.sh [LOG]   (LOG defaults to $OUT/cuda_check.log or ./cuda_check.log)
# STEPS="suite gpu table" (the default) picks steps 2, 3 and 4: STEPS=table runs the speed table alone
# (about 2-3 minutes), STEPS="suite gpu" the checks alone, when one call must stay under a time limit.
# No network needed: Python packages missing from the interpreter are unpacked from the wheels in
# $WHEELS (default .whl/: numpy, pluggy, cffi, pycparser, pytest, iniconfig, packaging, pygments,
# nvidia-cuda-nvrtc-cu11 for libnvrtc), and the polygrad packages are used from the source tree.
# Fetch the wheels on a machine with PyPI access first (40 MB; .whl/ is git-ignored, carry it along):
#   pip download -d .whl --only-binary=:all: --python-version 3.12 --platform manylinux2014_x86_64 \
#     --platform manylinux_2_17_x86_64 nvidia-cuda-nvrtc-cu11 "numpy<2.3" pluggy cffi pycparser pytest pytest-timeout
# (the cu11 NVRTC wheel: 23 MB, compiles for sm_90; the cu12 one, 90 MB, does not fit a 64 MiB carry)
# DRY_RUN=1 runs every step where no GPU is found (the GPU tests then skip; the speed table runs at its
# --tiny sizes on the CPU device) and says so.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
LOG=${1:-${OUT:-.}/cuda_check.log}
mkdir -p "$(dirname "$LOG")"
exec > >(tee "$LOG") 2>&1
PY=${PYTHON:-python3}
WHEELS=${WHEELS:-$ROOT/.whl}
SITE=${SITE:-/tmp/polygrad-cuda-site}
START=$(date +%s)
status=0
step() { echo; echo "=== $* ($(($(date +%s) - START)) s)"; }

step "environment"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
$PY --version

step "python packages (unpacked from $WHEELS where missing)"
mkdir -p "$SITE"
need() {  # need MODULE WHEEL-PREFIX: unpack the wheel when the module does not import
  if ! PYTHONPATH="$SITE" $PY -c "import $1" 2>/dev/null; then
    whl=$(ls "$WHEELS"/"$2"-*.whl 2>/dev/null | head -1)
    if [ -n "$whl" ]; then
      $PY -m zipfile -e "$whl" "$SITE" && echo "unpacked $(basename "$whl")"
    else
      echo "MISSING: $1 (no $2 wheel in $WHEELS)"
    fi
  fi
}
need numpy numpy; need pluggy pluggy; need pycparser pycparser; need cffi cffi
need iniconfig iniconfig; need packaging packaging; need pygments pygments; need pytest pytest
need pytest_timeout pytest_timeout
if ! ls "$SITE"/nvidia/cuda_nvrtc/lib/libnvrtc.so* >/dev/null 2>&1 && ! ldconfig -p 2>/dev/null | grep -q libnvrtc; then
  whl=$(ls "$WHEELS"/nvidia_cuda_nvrtc*.whl 2>/dev/null | head -1)
  [ -n "$whl" ] && $PY -m zipfile -e "$whl" "$SITE" && echo "unpacked $(basename "$whl")"
fi
nvrtc=$(ls "$SITE"/nvidia/cuda_nvrtc/lib/libnvrtc.so.1? "$SITE"/nvidia/cuda_nvrtc/lib/libnvrtc.so.1?.? 2>/dev/null | head -1)
[ -n "$nvrtc" ] && export POLY_NVRTC_LIB="$nvrtc" && echo "libnvrtc: $nvrtc"
# the polygrad distributions from the tree: their entry points through minimal .dist-info folders
for d in polygrad-core:polygrad_core polygrad-backend-cpu:polygrad_backend_cpu \
         polygrad-backend-interp:polygrad_backend_interp polygrad-backend-cuda:polygrad_backend_cuda; do
  dir=${d%%:*}; mod=${d##*:}; info="$SITE/$mod-0.1.0.dist-info"
  mkdir -p "$info"
  printf 'Metadata-Version: 2.1\nName: %s\nVersion: 0.1.0\n' "$dir" > "$info/METADATA"
  if [ "$dir" != polygrad-core ]; then
    printf '[polygrad.backends]\n%s = %s\n' "$(echo "$dir" | sed 's/polygrad-backend-//')" "$mod" > "$info/entry_points.txt"
  fi
done
export PYTHONPATH="$ROOT:$SITE:$ROOT/polygrad-core/src:$ROOT/polygrad-backend-cpu/src:$ROOT/polygrad-backend-interp/src:$ROOT/polygrad-backend-cuda/src:$ROOT/polygrad-hf/src${PYTHONPATH:+:$PYTHONPATH}"
export POLY_CACHE_DIR=${POLY_CACHE_DIR:-/tmp/polygrad-cuda-cache}
$PY -m polygrad doctor || true
if ! $PY -c "from polygrad import Device; import sys; sys.exit(0 if Device.cuda_available() else 1)"; then
  $PY -c "from polygrad.device import registry; print('CUDA unavailable:', registry.probe('CUDA').reason)"
  if [ "${DRY_RUN:-0}" != 1 ]; then echo "RESULT: no GPU, nothing checked"; exit 2; fi
  echo "DRY RUN: continuing without a GPU (the GPU tests skip)"
fi
PYTEST=($PY -m pytest -q -p no:cacheprovider -o addopts= --timeout=300)
$PY -c "import pytest_timeout" 2>/dev/null || PYTEST=($PY -m pytest -q -p no:cacheprovider -o addopts=)

tests() {  # pytest with a time limit; exit 5 (nothing selected: no CUDA cases) fails unless DRY_RUN
  timeout "$1" "${PYTEST[@]}" "${@:2}"
  rc=$?
  if [ $rc = 5 ]; then echo "no tests selected"; [ "${DRY_RUN:-0}" = 1 ] && rc=0; fi
  return $rc
}

wanted() { [[ " ${STEPS:-suite gpu table} " == *" $1 "* ]]; }

if wanted suite; then
  step "op suite on CUDA"
  if $PY -c "import torch" 2>/dev/null; then
    tests 300 tests/test_tensor_core_unary.py tests/test_tensor_core_binary.py \
      tests/test_tensor_core_reduce.py tests/test_tensor_core_dtypes.py tests/test_tensor_core_create.py \
      tests/test_tensor_core_properties.py tests/test_nn_layers.py tests/test_optim_trajectories.py \
      tests/test_jit_training.py tests/test_jit_replay.py tests/test_transcendental.py tests/test_linalg_ops.py \
      tests/test_foundation_grad.py tests/test_index_width.py -k "CUDA" --maxfail=40 -rf || status=1
  else
    echo "torch is not installed: the op suite's references are missing; compiling its kernels instead"
    tests 240 tests/test_cuda_compile.py || status=1
  fi
fi

if wanted gpu; then
  step "GPU values, training steps, bundle round trip"
  tests 240 -rs tests/test_cuda_gpu.py tests/test_cuda_backend.py tests/test_cuda_tiled_matmul.py \
    tests/test_cuda_cpu_check.py tests/test_cuda_graph.py || status=1
fi

if wanted table; then
  step "speed table"
  if $PY -c "from polygrad import Device; import sys; sys.exit(0 if Device.cuda_available() else 1)"; then
    timeout 300 $PY benchmarks/bench_cuda.py || status=1
  else  # DRY_RUN without a GPU: the table's code at its tiny sizes on the CPU device
    timeout 300 $PY benchmarks/bench_cuda.py --device "${HOST_DEVICE:-CPU}" --tiny || status=1
  fi
fi

step "done"
echo "RESULT: $([ $status = 0 ] && echo PASS || echo FAIL) in $(($(date +%s) - START)) s; log $LOG"
exit $status
