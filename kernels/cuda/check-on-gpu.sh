#!/usr/bin/env bash
# On a machine with an NVIDIA GPU (sm_80 or sm_90) and nvcc: builds the kernels tests and the
# benchmark (CUDA on, LibTorch off, so it needs no Python packages), runs the CUDA kernel tests
# against the CPU reference, then the GPU benchmark (BGMV decode bandwidth vs peak). Under five
# minutes on a 16-core machine. Usage: kernels/cuda/check-on-gpu.sh [--slow] [BUILD_DIR]
#   --slow  also runs the full sweep (LORADB_SLOW_TESTS=1)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
if [ "${1:-}" = "--slow" ]; then export LORADB_SLOW_TESTS=1; shift; fi
DIR="${1:-build-gpu}"

command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
ARCH_ARGS=()
if command -v nvidia-smi >/dev/null; then
  # Build for the GPU that is here (e.g. 90 for H100/H200) in addition to nothing else.
  cc="$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d ' .')"
  [ -n "$cc" ] && ARCH_ARGS=(-DCMAKE_CUDA_ARCHITECTURES="$cc")
fi
cmake -S . -B "$DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DLORADB_CUDA=ON \
  -DLORADB_TORCH=OFF -DLORADB_WERROR=ON "${ARCH_ARGS[@]}" >"$DIR.configure.log" 2>&1 \
  || { cat "$DIR.configure.log"; exit 1; }
cmake --build "$DIR" -j "$(nproc)" --target loradb_kernels_tests loradb_bench

echo "== CUDA kernel tests"
"$DIR/tests/loradb_kernels_tests" --gtest_filter='CudaKernels.*' --gtest_brief=0 | tee "$DIR/cuda-tests.log"
if grep -q "no CUDA device" "$DIR/cuda-tests.log"; then
  echo "error: CUDA tests were skipped (no usable GPU?)" >&2
  exit 1
fi
echo "== CPU kernel tests (same binary)"
"$DIR/tests/loradb_kernels_tests" --gtest_filter='-CudaKernels.*' --gtest_brief=1
echo "== GPU benchmark"
"$DIR/bench/loradb-bench" kernels gpu --min-seconds=0.2
