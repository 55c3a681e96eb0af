// The instruction sets this CPU can run (the fast path picks the best; the others are tested too,
// so a machine without AVX-512 still runs checked code).
#ifndef LORADB_TESTS_KERNELS_RUNNABLE_ISAS_H_
#define LORADB_TESTS_KERNELS_RUNNABLE_ISAS_H_

#include <vector>

#include "kernels/cpu/fast_isa.h"

namespace loradb::kernels::testing {

inline std::vector<const cpu_internal::IsaKernels*> RunnableIsas() {
  std::vector<const cpu_internal::IsaKernels*> v = {&cpu_internal::PortableKernels()};
#if defined(LORADB_KERNELS_X86)
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    v.push_back(&cpu_internal::Avx2Kernels());
  }
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq")) {
    v.push_back(&cpu_internal::Avx512Kernels());
  }
#endif
  return v;
}

}  // namespace loradb::kernels::testing

#endif  // LORADB_TESTS_KERNELS_RUNNABLE_ISAS_H_
