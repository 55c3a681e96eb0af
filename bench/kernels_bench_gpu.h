// The GPU part of scenario `kernels` (built when the CUDA kernels are): BGMV decode bandwidth.
#ifndef LORADB_BENCH_KERNELS_BENCH_GPU_H_
#define LORADB_BENCH_KERNELS_BENCH_GPU_H_

#include "absl/status/status.h"

namespace loradb::bench {

// Times the CUDA kernels on decode-shaped batches (every row its own adapter, bf16) and prints
// the achieved memory bandwidth as a fraction of the device's theoretical peak. Fails with
// FailedPrecondition when no GPU is present.
absl::Status RunGpuKernelsBench(double min_seconds);

}  // namespace loradb::bench

#endif  // LORADB_BENCH_KERNELS_BENCH_GPU_H_
