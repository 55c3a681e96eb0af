#!/usr/bin/env bash
# On a machine with an NVIDIA GPU, CUDA (nvcc) and the pip torch wheel (LibTorch with c10d, Gloo
# and NCCL): builds loradb with LibTorch + CUDA against that torch, then runs the distributed
# checks:
#   1. NCCL collectives on the GPU: `loradb dist-check --backend nccl --device cuda`, world 1,
#      then world 2 (two ranks on one device: NCCL refuses that on some versions ("duplicate
#      GPU"); reported, not fatal, when the machine has a single GPU), and world = GPU count;
#   2. Gloo carrying CUDA tensors, world 2 (the fallback when NCCL cannot share a device);
#   3. the DP and TP tests (gtest filter ProcessGroup*:Launcher*:DistCli*:DpTrain*:*Tp*; CPU/Gloo
#      paths on this machine's cores, plus TpGpu.*: TP decode with NCCL whose adapters come through
#      a CUDA device tier placed for the rank, against the CPU run's logits; TP 2 decode and the
#      cross-process export over NCCL when there are >= 2 GPUs);
#   4. the TP-placed device tier on the CUDA backend (storage tests TiersShard*/StoreOwnedTp* with
#      LORADB_TEST_TIERS_DEVICE=cuda: slot bytes = the exact slice, read back from device memory),
#      and `loradb-bench dist` (1 vs 2 ranks; TP cases when built).
# Needs `apt-get install libgloo-dev` (Gloo headers; the wheel has the symbols, not the headers).
# Usage: compute/distributed/check-on-gpu.sh [BUILD_DIR]   (default build-gpu-dist)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
DIR="${1:-build-gpu-dist}"

command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
NGPU=1
ARCH_ARGS=()
if command -v nvidia-smi >/dev/null; then
  NGPU="$(nvidia-smi --query-gpu=name --format=csv,noheader | wc -l)"
  cc="$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d ' .')"
  [ -n "$cc" ] && ARCH_ARGS=(-DCMAKE_CUDA_ARCHITECTURES="$cc")
fi
if [ ! -f /usr/include/gloo/rendezvous/store.h ]; then
  apt-get install -y -qq libgloo-dev >/dev/null 2>&1 || echo "warning: could not install libgloo-dev" >&2
fi
cmake -S . -B "$DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DLORADB_CUDA=ON -DLORADB_TORCH=ON \
  -DLORADB_C10D=ON -DLORADB_WERROR=ON "${ARCH_ARGS[@]}" >"$DIR.configure.log" 2>&1 \
  || { cat "$DIR.configure.log"; exit 1; }
grep -E "^-- loradb" "$DIR.configure.log" || true
cmake --build "$DIR" -j "$(nproc)" --target loradb_cli loradb_compute_tests loradb_storage_tests \
  loradb_bench
LORADB="$DIR/tools/loradb"

fail=0
echo "== NCCL, world 1, CUDA tensors"
"$LORADB" dist-check --world 1 --backend nccl --device cuda || fail=1
echo "== NCCL, world 2 on $NGPU GPU(s)"
if ! "$LORADB" dist-check --world 2 --backend nccl --device cuda --timeout-ms 60000; then
  if [ "$NGPU" -lt 2 ]; then
    echo "note: NCCL world 2 on one GPU failed (NCCL does not allow two ranks per device here)"
  else
    fail=1
  fi
fi
if [ "$NGPU" -gt 2 ]; then
  echo "== NCCL, world $NGPU"
  "$LORADB" dist-check --world "$NGPU" --backend nccl --device cuda || fail=1
fi
echo "== Gloo, world 2, CUDA tensors"
"$LORADB" dist-check --world 2 --backend gloo --device cuda || fail=1
echo "== DP / TP tests"
"$DIR/tests/loradb_compute_tests" --gtest_filter='ProcessGroup*:Launcher*:DistCli*:DpTrain*:*Tp*' --gtest_brief=1 || fail=1
echo "== TP-placed device tier on the CUDA backend"
LORADB_TEST_TIERS_DEVICE=cuda "$DIR/tests/loradb_storage_tests" \
  --gtest_filter='TiersShard*:StoreOwnedTp*:DeviceSlots*' --gtest_brief=1 || fail=1
echo "== TP export over NCCL, world 2 on $NGPU GPU(s)"
if [ "$NGPU" -lt 2 ]; then
  echo "note: skipped (TpGpu.NcclExportTp2MatchesTheTp1Export needs 2 GPUs; the Gloo export ran above)"
fi
echo "== loradb-bench dist"
"$DIR/bench/loradb-bench" dist || fail=1
exit $fail
