// cpu::DecodeAttention (one new token over a KV cache) against a double-precision softmax
// attention, on every runnable instruction set: head sizes around the vector width and the
// micro-kernel's 8-vector output block, grouped-query heads, one and many cached tokens, padded
// cache capacity; a sequence's result does not depend on the capacity around it; large scores
// stay finite.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/cpu/fast_isa.h"
#include "kernels/lora_kernels.h"
#include "tests/kernels/runnable_isas.h"
#include "tests/kernels/sum_check.h"

namespace loradb::kernels {
namespace {

using testing::RunnableIsas;

struct Shape {
  int64_t heads, kv_heads, head_dim, len, capacity;
};

// K and V laid out as a cache, [kv_heads, capacity, head_dim], random where tokens are cached
// and NaN in the unused capacity (a read past `len` would show).
std::vector<float> CacheLayer(const Shape& s, uint32_t seed, float spread) {
  std::vector<float> random =
      testing::RandomNormal(static_cast<size_t>(s.kv_heads * s.capacity * s.head_dim), seed);
  for (size_t i = 0; i < random.size(); ++i) {
    const int64_t t = static_cast<int64_t>(i) / s.head_dim % s.capacity;
    random[i] = t < s.len ? random[i] * spread : std::nanf("");
  }
  return random;
}

std::vector<double> Reference(const Shape& s, const std::vector<float>& q,
                              const std::vector<float>& k, const std::vector<float>& v,
                              double scale) {
  std::vector<double> out(static_cast<size_t>(s.heads * s.head_dim));
  const int64_t group = s.heads / s.kv_heads, stride = s.capacity * s.head_dim;
  for (int64_t h = 0; h < s.heads; ++h) {
    const int64_t g = h / group;
    std::vector<double> p(static_cast<size_t>(s.len));
    double top = -INFINITY, sum = 0;
    for (int64_t t = 0; t < s.len; ++t) {
      double d = 0;
      for (int64_t j = 0; j < s.head_dim; ++j)
        d += static_cast<double>(q[h * s.head_dim + j]) * k[g * stride + t * s.head_dim + j];
      p[t] = scale * d;
      top = std::max(top, p[t]);
    }
    for (double& x : p) sum += (x = std::exp(x - top));
    for (int64_t j = 0; j < s.head_dim; ++j) {
      double o = 0;
      for (int64_t t = 0; t < s.len; ++t) o += p[t] / sum * v[g * stride + t * s.head_dim + j];
      out[h * s.head_dim + j] = o;
    }
  }
  return out;
}

std::vector<float> Attend(const Shape& s, const std::vector<float>& q, const std::vector<float>& k,
                          const std::vector<float>& v, float scale) {
  std::vector<float> out(static_cast<size_t>(s.heads * s.head_dim), testing::kSentinel);
  cpu::DecodeAttention(q.data(), s.heads, s.kv_heads, s.head_dim, k.data(), v.data(),
                       s.capacity * s.head_dim, s.len, scale, out.data());
  return out;
}

void Check(const Shape& s, uint32_t seed, float spread = 1.0f) {
  SCOPED_TRACE(::testing::Message()
               << "heads " << s.heads << "/" << s.kv_heads << " head_dim " << s.head_dim << " len "
               << s.len << " capacity " << s.capacity << " spread " << spread);
  const std::vector<float> q =
      testing::RandomNormal(static_cast<size_t>(s.heads * s.head_dim), seed);
  const std::vector<float> k = CacheLayer(s, seed + 1, spread);
  const std::vector<float> v = CacheLayer(s, seed + 2, 1.0f);
  const float scale = 1.0f / std::sqrt(static_cast<float>(s.head_dim));
  const std::vector<float> got = Attend(s, q, k, v, scale);
  const std::vector<double> want = Reference(s, q, k, v, scale);
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_TRUE(std::isfinite(got[i])) << "output " << i;
    // Outputs are convex combinations of values ~N(0, 1); fp32 sums over <= a few hundred terms.
    ASSERT_NEAR(got[i], want[i], 2e-5 * (1 + std::fabs(want[i]))) << "output " << i;
  }
}

TEST(CpuDecodeAttention, MatchesDoubleSoftmaxAttentionOnEveryIsa) {
  for (const cpu_internal::IsaKernels* isa : RunnableIsas()) {
    cpu_internal::ForceKernelsForTesting(isa);
    SCOPED_TRACE(isa->name);
    uint32_t seed = 1;
    for (int64_t head_dim : {1, 3, 4, 8, 15, 16, 17, 64, 100, 128, 136, 264}) {
      for (int64_t len : {1, 2, 5, 37}) {
        Check({1, 1, head_dim, len, len}, seed++);
        Check({8, 4, head_dim, len, len + 3}, seed++);
        Check({6, 2, head_dim, len, 2 * len + 1}, seed++);
      }
    }
    // Scores far apart: the softmax subtracts the largest before exponentiating.
    Check({4, 2, 64, 50, 64}, seed++, 300.0f);
  }
  cpu_internal::ForceKernelsForTesting(nullptr);
}

// The same cached tokens in a cache of another capacity give the same bits: a sequence's result
// depends on its q, K and V only.
TEST(CpuDecodeAttention, ResultDoesNotDependOnCacheCapacity) {
  const Shape a{8, 2, 64, 21, 21}, b{8, 2, 64, 21, 64};
  const std::vector<float> q = testing::RandomNormal(8 * 64, 7);
  const std::vector<float> ka = CacheLayer(a, 8, 1.0f), va = CacheLayer(a, 9, 1.0f);
  std::vector<float> kb(static_cast<size_t>(2 * 64 * 64)), vb(kb.size());
  for (int64_t g = 0; g < 2; ++g) {
    std::copy_n(ka.begin() + g * 21 * 64, 21 * 64, kb.begin() + g * 64 * 64);
    std::copy_n(va.begin() + g * 21 * 64, 21 * 64, vb.begin() + g * 64 * 64);
  }
  EXPECT_EQ(Attend(a, q, ka, va, 0.125f), Attend(b, q, kb, vb, 0.125f));
}

}  // namespace
}  // namespace loradb::kernels
