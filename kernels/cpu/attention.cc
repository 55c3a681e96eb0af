// cpu::DecodeAttention: one new token per sequence attending over its cached keys and values,
// from the per-ISA dot and weighted-sum micro-kernels (fast_isa.inc) and a scalar softmax.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "kernels/cpu/fast_isa.h"
#include "kernels/lora_kernels.h"

namespace loradb::kernels::cpu {

void DecodeAttention(const float* q, int64_t heads, int64_t kv_heads, int64_t head_dim,
                     const float* k, const float* v, int64_t head_stride, int64_t len, float scale,
                     float* out) {
  const cpu_internal::IsaKernels& isa = cpu_internal::ActiveKernels();
  const int64_t group = heads / kv_heads;  // query heads per key/value head
  thread_local std::vector<float> p;
  p.resize(static_cast<size_t>(len));
  for (int64_t h = 0; h < heads; ++h) {
    const int64_t kvh = h / group;
    isa.dot_rows(q + h * head_dim, k + kvh * head_stride, head_dim, len, head_dim, scale, p.data());
    // softmax over the scores, as at::softmax computes it: exp(s - max) / sum.
    float top = -std::numeric_limits<float>::infinity();
    for (int64_t t = 0; t < len; ++t) top = std::max(top, p[t]);
    float sum = 0.0f;
    for (int64_t t = 0; t < len; ++t) sum += (p[t] = std::exp(p[t] - top));
    const float inv = 1.0f / sum;
    for (int64_t t = 0; t < len; ++t) p[t] *= inv;
    isa.weighted_rows(p.data(), v + kvh * head_stride, head_dim, len, head_dim, out + h * head_dim);
  }
}

}  // namespace loradb::kernels::cpu
