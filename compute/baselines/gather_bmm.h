// LibTorch baselines the kernels benchmark compares against. Plain C++ interface (no torch types),
// so bench/ can call it without LibTorch headers; the implementation is the only torch user.
#ifndef LORADB_COMPUTE_BASELINES_GATHER_BMM_H_
#define LORADB_COMPUTE_BASELINES_GATHER_BMM_H_

#include <cstdint>

#include "absl/status/status.h"

namespace loradb::compute::baselines {

// Multi-LoRA the way a framework does it without custom kernels: gather each row's A and B out of
// stacked fp32 tensors a [num_adapters, rank, in] and b [num_adapters, out, rank] (index_select,
// i.e. one copy of the weights per row), then two batched matmuls:
//   y[i, :] += scales[idx[i]] * B[idx[i]] (A[idx[i]] x[i])      (rows with idx[i] < 0 unchanged)
// x is [rows, in], y is [rows, out], all contiguous fp32 on the CPU; every adapter has `rank`.
[[nodiscard]] absl::Status GatherBmmLora(const float* x, const float* a, const float* b,
                                         const int32_t* idx, const float* scales, int64_t rows,
                                         int64_t in, int64_t out, int64_t rank,
                                         int64_t num_adapters, float* y);

// The base projection with LibTorch's CPU matmul: y[rows, out] = x[rows, in] @ w^T, w [out, in],
// contiguous fp32.
[[nodiscard]] absl::Status TorchLinear(const float* x, const float* w, int64_t rows, int64_t in,
                                       int64_t out, float* y);

// Threads LibTorch's CPU ops use.
int TorchNumThreads();

}  // namespace loradb::compute::baselines

#endif  // LORADB_COMPUTE_BASELINES_GATHER_BMM_H_
