// cpu::RmsNormRows, cpu::SiluMul and cpu::RopeRows: the decoder's per-row operations between the
// linear layers, over raw fp32 rows (the norm and SiLU through the per-ISA micro-kernels).
#include <cstdint>

#include "kernels/cpu/fast_isa.h"
#include "kernels/lora_kernels.h"

namespace loradb::kernels::cpu {

void RmsNormRows(const float* x, int64_t rows, int64_t n, const float* w, float eps, float* out) {
  const cpu_internal::IsaKernels& isa = cpu_internal::ActiveKernels();
  for (int64_t r = 0; r < rows; ++r) isa.rms_norm(x + r * n, n, w, eps, out + r * n);
}

void SiluMul(const float* g, const float* u, int64_t n, float* out) {
  cpu_internal::ActiveKernels().silu_mul(g, u, n, out);
}

void RopeRows(float* x, int64_t rows, int64_t heads, int64_t head_dim, const float* cos,
              const float* sin) {
  const int64_t half = head_dim / 2;
  for (int64_t r = 0; r < rows; ++r) {
    const float* c = cos + r * head_dim;
    const float* s = sin + r * head_dim;
    for (int64_t h = 0; h < heads; ++h) {
      float* v = x + (r * heads + h) * head_dim;
      for (int64_t i = 0; i < half; ++i) {
        const float a = v[i], b = v[i + half];
        v[i] = a * c[i] - b * s[i];
        v[i + half] = b * c[i + half] + a * s[i + half];
      }
    }
  }
}

}  // namespace loradb::kernels::cpu
