// CUDA multi-LoRA kernels. Rows are independent: grid.x walks rows, and each block finds its
// row's (adapter, expert) from the per-row table (BGMV) or by binary search over the segment
// starts (SGMV), so both mappings share the same kernels. Weights are read in their dtype and
// widened to fp32; sums are fp32; y is rounded once.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/lora_cuda.h"

namespace loradb::kernels::cuda {
namespace {

constexpr int kWarps = 8;                    // warps per block
constexpr int kThreads = kWarps * 32;        // threads per block
constexpr int kFusedOutTile = 4 * kThreads;  // outputs per block in the fused kernel

__device__ __forceinline__ float LoadF(const float* p, int64_t i) { return p[i]; }
__device__ __forceinline__ float LoadF(const __nv_bfloat16* p, int64_t i) {
  return __bfloat162float(p[i]);
}
__device__ __forceinline__ float LoadF(const __half* p, int64_t i) { return __half2float(p[i]); }

// Activations have a runtime dtype (uniform across the grid, so the branch is free).
__device__ __forceinline__ float LoadAct(const void* p, DType d, int64_t i) {
  switch (d) {
    case DType::kBF16:
      return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
    case DType::kF16:
      return __half2float(static_cast<const __half*>(p)[i]);
    default:
      return static_cast<const float*>(p)[i];
  }
}

__device__ __forceinline__ void AddToAct(void* p, DType d, int64_t i, float v) {
  switch (d) {
    case DType::kBF16: {
      __nv_bfloat16* q = static_cast<__nv_bfloat16*>(p) + i;
      *q = __float2bfloat16_rn(__bfloat162float(*q) + v);
      return;
    }
    case DType::kF16: {
      __half* q = static_cast<__half*>(p) + i;
      *q = __float2half_rn(__half2float(*q) + v);
      return;
    }
    default:
      static_cast<float*>(p)[i] += v;
  }
}

__device__ __forceinline__ float WarpSum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Resolves `row` to its adapter, expert and rank; false when the row has no (valid) adapter.
__device__ bool ResolveRow(const AdapterTable& w, const RowMapping& m, int32_t row,
                           int32_t* adapter, int32_t* expert, int32_t* rank) {
  int32_t a, e = 0;
  if (m.segment_starts != nullptr) {
    // Largest s with starts[s] <= row.
    int64_t lo = 0, hi = m.num_segments;  // answer in [lo, hi)
    if (m.num_segments == 0 || row < m.segment_starts[0]) return false;
    while (hi - lo > 1) {
      int64_t mid = (lo + hi) / 2;
      if (m.segment_starts[mid] <= row) {
        lo = mid;
      } else {
        hi = mid;
      }
    }
    if (row >= m.segment_starts[lo + 1]) return false;
    a = m.segment_adapter[lo];
    if (m.segment_expert != nullptr) e = m.segment_expert[lo];
  } else {
    a = m.row_adapter[row];
    if (m.row_expert != nullptr) e = m.row_expert[row];
  }
  if (a < 0 || a >= w.num_adapters) return false;
  if (w.num_experts > 0 ? (e < 0 || e >= w.num_experts) : e != 0) return false;
  int32_t r = w.ranks[a];
  if (r <= 0 || r > w.max_rank) return false;
  *adapter = a;
  *expert = e;
  *rank = r;
  return true;
}

// Dot product of A_a[expert][k] with x[row], by one warp; the sum is valid on every lane.
template <typename WT>
__device__ __forceinline__ float WarpShrinkDot(const WT* a, const void* x_row, DType x_dtype,
                                               int64_t in, int lane) {
  float acc = 0.0f;
  for (int64_t j = lane; j < in; j += 32) acc += LoadF(a, j) * LoadAct(x_row, x_dtype, j);
  return WarpSum(acc);
}

template <typename WT>
__global__ void ShrinkKernel(ConstRows x, AdapterTable w, RowMapping m, RankBuffer t) {
  const int32_t row = static_cast<int32_t>(blockIdx.x);
  int32_t a, e, rank;
  if (!ResolveRow(w, m, row, &a, &e, &rank)) return;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int32_t k = static_cast<int32_t>(blockIdx.y) * kWarps + warp;
  if (k >= rank) return;
  const WT* A =
      static_cast<const WT*>(w.a[a]) + (static_cast<int64_t>(e) * rank + k) * w.in_features;
  const void* x_row = static_cast<const char*>(x.data) +
                      static_cast<int64_t>(row) * x.stride * (x.dtype == DType::kF32 ? 4 : 2);
  float s = WarpShrinkDot(A, x_row, x.dtype, w.in_features, lane);
  if (lane == 0) t.data[static_cast<int64_t>(row) * t.stride + k] = s;
}

// y[row, offset + o] += scale * sum_k B[o, k] * ts[k] for the outputs this thread owns.
template <typename WT>
__device__ __forceinline__ void ExpandOutputs(const WT* B, int32_t rank, const float* ts,
                                              float scale, int64_t o_begin, int64_t o_end,
                                              const OutputRows& y, int32_t row) {
  const int64_t ybase = static_cast<int64_t>(row) * y.stride + y.offset;
  for (int64_t o = o_begin + threadIdx.x; o < o_end; o += blockDim.x) {
    const WT* brow = B + o * rank;
    float acc = 0.0f;
    for (int32_t k = 0; k < rank; ++k) acc += LoadF(brow, k) * ts[k];
    AddToAct(y.data, y.dtype, ybase + o, scale * acc);
  }
}

template <typename WT>
__global__ void ExpandKernel(RankBuffer t, AdapterTable w, RowMapping m, OutputRows y) {
  __shared__ float ts[kMaxRank];
  const int32_t row = static_cast<int32_t>(blockIdx.x);
  int32_t a, e, rank;
  if (!ResolveRow(w, m, row, &a, &e, &rank)) return;
  for (int32_t k = threadIdx.x; k < rank; k += blockDim.x) {
    ts[k] = t.data[static_cast<int64_t>(row) * t.stride + k];
  }
  __syncthreads();
  const WT* B = static_cast<const WT*>(w.b[a]) + static_cast<int64_t>(e) * w.out_features * rank;
  const int64_t o0 = static_cast<int64_t>(blockIdx.y) * kThreads;
  const int64_t o1 = o0 + kThreads < w.out_features ? o0 + kThreads : w.out_features;
  ExpandOutputs(B, rank, ts, w.scales[a], o0, o1, y, row);
}

template <typename WT>
__global__ void FusedKernel(ConstRows x, AdapterTable w, RowMapping m, OutputRows y) {
  __shared__ float ts[kMaxRank];
  const int32_t row = static_cast<int32_t>(blockIdx.x);
  int32_t a, e, rank;
  if (!ResolveRow(w, m, row, &a, &e, &rank)) return;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const void* x_row = static_cast<const char*>(x.data) +
                      static_cast<int64_t>(row) * x.stride * (x.dtype == DType::kF32 ? 4 : 2);
  const WT* A = static_cast<const WT*>(w.a[a]) + static_cast<int64_t>(e) * rank * w.in_features;
  for (int32_t k = warp; k < rank; k += kWarps) {
    float s = WarpShrinkDot(A + static_cast<int64_t>(k) * w.in_features, x_row, x.dtype,
                            w.in_features, lane);
    if (lane == 0) ts[k] = s;
  }
  __syncthreads();
  const WT* B = static_cast<const WT*>(w.b[a]) + static_cast<int64_t>(e) * w.out_features * rank;
  const int64_t o0 = static_cast<int64_t>(blockIdx.y) * kFusedOutTile;
  const int64_t o1 = o0 + kFusedOutTile < w.out_features ? o0 + kFusedOutTile : w.out_features;
  ExpandOutputs(B, rank, ts, w.scales[a], o0, o1, y, row);
}

unsigned CeilDiv(int64_t a, int64_t b) { return static_cast<unsigned>((a + b - 1) / b); }

// Calls launch(WT{}) with the weight dtype's device type.
template <typename Launch>
cudaError_t ByWeightType(DType d, Launch&& launch) {
  switch (d) {
    case DType::kF32:
      launch(float{});
      break;
    case DType::kBF16:
      launch(__nv_bfloat16{});
      break;
    case DType::kF16:
      launch(__half{});
      break;
    default:
      return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t Shrink(const ConstRows& x, const AdapterTable& w, const RowMapping& m,
                   const RankBuffer& t, cudaStream_t stream) {
  if (!ValidateShrink(x, w, m, t, /*host_indices=*/false).ok()) return cudaErrorInvalidValue;
  if (m.num_rows == 0 || w.max_rank == 0 || w.num_adapters == 0) return cudaSuccess;
  dim3 grid(static_cast<unsigned>(m.num_rows), CeilDiv(w.max_rank, kWarps));
  return ByWeightType(w.dtype, [&](auto wt) {
    using WT = decltype(wt);
    ShrinkKernel<WT><<<grid, kThreads, 0, stream>>>(x, w, m, t);
  });
}

cudaError_t Expand(const RankBuffer& t, const AdapterTable& w, const RowMapping& m,
                   const OutputRows& y, cudaStream_t stream) {
  if (!ValidateExpand(t, w, m, y, /*host_indices=*/false).ok()) return cudaErrorInvalidValue;
  if (m.num_rows == 0 || w.max_rank == 0 || w.num_adapters == 0) return cudaSuccess;
  dim3 grid(static_cast<unsigned>(m.num_rows), CeilDiv(w.out_features, kThreads));
  if (grid.y > 65535) return cudaErrorInvalidValue;
  return ByWeightType(w.dtype, [&](auto wt) {
    using WT = decltype(wt);
    ExpandKernel<WT><<<grid, kThreads, 0, stream>>>(t, w, m, y);
  });
}

cudaError_t ShrinkExpand(const ConstRows& x, const AdapterTable& w, const RowMapping& m,
                         const OutputRows& y, cudaStream_t stream) {
  if (!ValidateShrinkExpand(x, w, m, y, /*host_indices=*/false).ok()) {
    return cudaErrorInvalidValue;
  }
  if (m.num_rows == 0 || w.max_rank == 0 || w.num_adapters == 0) return cudaSuccess;
  dim3 grid(static_cast<unsigned>(m.num_rows), CeilDiv(w.out_features, kFusedOutTile));
  if (grid.y > 65535) return cudaErrorInvalidValue;
  return ByWeightType(w.dtype, [&](auto wt) {
    using WT = decltype(wt);
    FusedKernel<WT><<<grid, kThreads, 0, stream>>>(x, w, m, y);
  });
}

}  // namespace loradb::kernels::cuda
