// Fast-path micro-kernels compiled for AVX2 + FMA (8 fp32 lanes); see fast_isa.inc.
#if defined(LORADB_KERNELS_X86)
#define LORADB_ISA_NS avx2
#define LORADB_ISA_NAME "avx2"
#define LORADB_LANES 8
#define LORADB_SHRINK_K 4
#define LORADB_SHRINK_ROWS 2
#define LORADB_EXPAND_TILE 32
#define LORADB_EXPAND_ROWS 2
#define LORADB_GEMM_MR 6
#define LORADB_GEMM_NV 2
#include "kernels/cpu/fast_isa.inc"

namespace loradb::kernels::cpu_internal {
const IsaKernels& Avx2Kernels() { return avx2::Get(); }
}  // namespace loradb::kernels::cpu_internal
#endif
