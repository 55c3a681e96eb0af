// Fast-path micro-kernels for any CPU (the compiler's baseline vector width); see fast_isa.inc.
#define LORADB_ISA_NS portable
#define LORADB_ISA_NAME "portable"
#define LORADB_LANES 4
#define LORADB_SHRINK_K 4
#define LORADB_SHRINK_ROWS 2
#define LORADB_EXPAND_TILE 16
#define LORADB_EXPAND_ROWS 2
#define LORADB_GEMM_MR 4
#define LORADB_GEMM_NV 2
#include "kernels/cpu/fast_isa.inc"

namespace loradb::kernels::cpu_internal {

const IsaKernels& PortableKernels() { return portable::Get(); }

const IsaKernels& BestKernels() {
#if defined(LORADB_KERNELS_X86) && (defined(__GNUC__) || defined(__clang__))
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq")) {
    return Avx512Kernels();
  }
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return Avx2Kernels();
#endif
  return PortableKernels();
}

namespace {
const IsaKernels* forced_kernels = nullptr;
}  // namespace

const IsaKernels& ActiveKernels() {
  return forced_kernels != nullptr ? *forced_kernels : BestKernels();
}

void ForceKernelsForTesting(const IsaKernels* kernels) { forced_kernels = kernels; }

}  // namespace loradb::kernels::cpu_internal
