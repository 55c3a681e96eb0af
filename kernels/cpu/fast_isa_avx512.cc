// Fast-path micro-kernels compiled for AVX-512 (16 fp32 lanes); see fast_isa.inc.
#if defined(LORADB_KERNELS_X86)
#define LORADB_ISA_NS avx512
#define LORADB_ISA_NAME "avx512"
#define LORADB_LANES 16
#define LORADB_SHRINK_K 4
#define LORADB_SHRINK_ROWS 4
#define LORADB_EXPAND_TILE 64
#define LORADB_EXPAND_ROWS 4
#define LORADB_GEMM_MR 12
#define LORADB_GEMM_NV 2
#include "kernels/cpu/fast_isa.inc"

namespace loradb::kernels::cpu_internal {
const IsaKernels& Avx512Kernels() { return avx512::Get(); }
}  // namespace loradb::kernels::cpu_internal
#endif
