// CUDA multi-LoRA kernels (BGMV, SGMV, MoE; shrink, expand, fused) for sm_80 / sm_90. Same
// arguments and contracts as the CPU functions in kernels/lora_kernels.h, with these differences:
//   - every pointer (x, y, t, the adapter tables, what they point to, ranks, scales and the
//     mapping's index arrays) is device memory (or managed memory);
//   - the work is queued on `stream` and the call returns at once; the result is the launch
//     status (cudaErrorInvalidValue for bad scalar arguments: call ValidateShrink/Expand/
//     ShrinkExpand(..., host_indices=false) for the message);
//   - indices cannot be checked on the host: on the device, a row whose adapter is out of range,
//     whose rank is outside 1..max_rank or whose expert is out of range is skipped (unchanged).
// No LibTorch here; bindings live in compute/.
#ifndef LORADB_KERNELS_CUDA_LORA_CUDA_H_
#define LORADB_KERNELS_CUDA_LORA_CUDA_H_

#include <cuda_runtime_api.h>

#include "kernels/lora_kernels.h"

namespace loradb::kernels::cuda {

// t[i, 0..rank_a) = x[i] A_a^T (fp32) for every row with an adapter. One warp per (row, k).
cudaError_t Shrink(const ConstRows& x, const AdapterTable& w, const RowMapping& m,
                   const RankBuffer& t, cudaStream_t stream);

// y[i, offset + o] += scale_a * t[i] B_a^T. One thread per (row, output).
cudaError_t Expand(const RankBuffer& t, const AdapterTable& w, const RowMapping& m,
                   const OutputRows& y, cudaStream_t stream);

// Both, with the rank intermediate in shared memory (each block recomputes its row's shrink).
cudaError_t ShrinkExpand(const ConstRows& x, const AdapterTable& w, const RowMapping& m,
                         const OutputRows& y, cudaStream_t stream);

}  // namespace loradb::kernels::cuda

#endif  // LORADB_KERNELS_CUDA_LORA_CUDA_H_
