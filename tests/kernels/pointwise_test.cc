// The decoder's per-row kernels against double-precision formulas, on every runnable instruction
// set: the vector exp over its whole range (ulp distance to the correctly rounded value, the
// overflow and underflow ends, NaN), RMS norm and SiLU products at lengths around the vector
// width, in place and not, and the rotary embedding.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/cpu/fast_isa.h"
#include "kernels/lora_kernels.h"
#include "tests/kernels/runnable_isas.h"
#include "tests/kernels/sum_check.h"

namespace loradb::kernels {
namespace {

using testing::RunnableIsas;

// Distance in units in the last place between two finite floats of one sign.
int64_t UlpDistance(float a, float b) {
  int32_t ia, ib;
  std::memcpy(&ia, &a, 4);
  std::memcpy(&ib, &b, 4);
  return std::llabs(static_cast<int64_t>(ia) - static_cast<int64_t>(ib));
}

// Runs the ISA's exp over xs, a vector register's worth at a time.
std::vector<float> ExpAll(const cpu_internal::IsaKernels& isa, const std::vector<float>& xs) {
  std::vector<float> out(xs.size());
  std::vector<float> in(static_cast<size_t>(isa.lanes)), got(in.size());
  for (size_t i = 0; i < xs.size(); i += in.size()) {
    for (size_t l = 0; l < in.size(); ++l) in[l] = i + l < xs.size() ? xs[i + l] : 0.0f;
    isa.exp_lanes(in.data(), got.data());
    for (size_t l = 0; l < in.size() && i + l < xs.size(); ++l) out[i + l] = got[l];
  }
  return out;
}

TEST(CpuPointwise, ExpWithinTwoUlpOverItsRange) {
  std::vector<float> xs;
  for (float x = -87.0f; x <= 88.0f; x += 0.0137f) xs.push_back(x);
  for (float x : {0.0f, -0.0f, 1e-30f, -1e-30f, 0.5f, -0.5f, 1.0f, 88.5f, -87.2f}) xs.push_back(x);
  for (const cpu_internal::IsaKernels* isa : RunnableIsas()) {
    SCOPED_TRACE(isa->name);
    const std::vector<float> got = ExpAll(*isa, xs);
    int64_t worst = 0;
    for (size_t i = 0; i < xs.size(); ++i) {
      const float want = static_cast<float>(std::exp(static_cast<double>(xs[i])));
      const int64_t d = UlpDistance(got[i], want);
      worst = std::max(worst, d);
      ASSERT_LE(d, 2) << "exp(" << xs[i] << ") = " << got[i] << ", want " << want;
    }
    RecordProperty(std::string("worst_ulp_") + isa->name, static_cast<int>(worst));
    const std::vector<float> ends =
        ExpAll(*isa, {-1000.0f, -100.0f, 100.0f, 1000.0f, std::numeric_limits<float>::infinity(),
                      -std::numeric_limits<float>::infinity(), std::nanf("")});
    EXPECT_EQ(ends[0], 0.0f);
    EXPECT_EQ(ends[1], 0.0f);
    EXPECT_EQ(ends[2], std::numeric_limits<float>::infinity());
    EXPECT_EQ(ends[3], std::numeric_limits<float>::infinity());
    EXPECT_EQ(ends[4], std::numeric_limits<float>::infinity());
    EXPECT_EQ(ends[5], 0.0f);
    EXPECT_TRUE(std::isnan(ends[6]));
  }
}

TEST(CpuPointwise, RmsNormRowsMatchesDoubleFormula) {
  for (const cpu_internal::IsaKernels* isa : RunnableIsas()) {
    cpu_internal::ForceKernelsForTesting(isa);
    SCOPED_TRACE(isa->name);
    uint32_t seed = 1;
    for (int64_t n : {1, 3, 4, 15, 16, 17, 64, 100, 512, 1000}) {
      SCOPED_TRACE(::testing::Message() << "n " << n);
      const int64_t rows = 5;
      std::vector<float> x = testing::RandomNormal(static_cast<size_t>(rows * n), seed++);
      for (int64_t i = 0; i < n; ++i) x[static_cast<size_t>(2 * n + i)] *= 1000.0f;  // a loud row
      const std::vector<float> w = testing::RandomNormal(static_cast<size_t>(n), seed++);
      const float eps = 1e-6f;
      std::vector<float> out(x.size(), testing::kSentinel);
      cpu::RmsNormRows(x.data(), rows, n, w.data(), eps, out.data());
      for (int64_t r = 0; r < rows; ++r) {
        double ss = 0;
        for (int64_t i = 0; i < n; ++i) ss += static_cast<double>(x[r * n + i]) * x[r * n + i];
        const double inv = 1.0 / std::sqrt(ss / static_cast<double>(n) + eps);
        for (int64_t i = 0; i < n; ++i) {
          const double want = w[i] * (x[r * n + i] * inv);
          ASSERT_NEAR(out[r * n + i], want, 2e-6 * (1 + std::fabs(want)))
              << "row " << r << " i " << i;
        }
      }
      // In place gives the same bits.
      std::vector<float> in_place = x;
      cpu::RmsNormRows(in_place.data(), rows, n, w.data(), eps, in_place.data());
      EXPECT_EQ(in_place, out);
    }
  }
  cpu_internal::ForceKernelsForTesting(nullptr);
}

TEST(CpuPointwise, SiluMulMatchesDoubleFormula) {
  for (const cpu_internal::IsaKernels* isa : RunnableIsas()) {
    cpu_internal::ForceKernelsForTesting(isa);
    SCOPED_TRACE(isa->name);
    uint32_t seed = 11;
    for (int64_t n : {1, 2, 7, 8, 16, 17, 33, 1536, 1541}) {
      SCOPED_TRACE(::testing::Message() << "n " << n);
      std::vector<float> g = testing::RandomNormal(static_cast<size_t>(n), seed++);
      for (size_t i = 0; i < g.size(); i += 5) g[i] *= 30.0f;  // far into both tails
      if (n > 2) {
        g[1] = -200.0f;  // exp(-g) overflows: silu is -0
        g[2] = 200.0f;   // exp(-g) underflows: silu is g
      }
      const std::vector<float> u = testing::RandomNormal(static_cast<size_t>(n), seed++);
      std::vector<float> out(g.size(), testing::kSentinel);
      cpu::SiluMul(g.data(), u.data(), n, out.data());
      for (int64_t i = 0; i < n; ++i) {
        const double gd = g[i];
        const double want = gd / (1.0 + std::exp(-gd)) * u[i];
        ASSERT_NEAR(out[i], want, 1e-6 * (1 + std::fabs(want))) << "g " << g[i] << " u " << u[i];
      }
      std::vector<float> in_place = g;
      cpu::SiluMul(in_place.data(), u.data(), n, in_place.data());
      EXPECT_EQ(in_place, out);
    }
  }
  cpu_internal::ForceKernelsForTesting(nullptr);
}

TEST(CpuPointwise, RopeRowsRotatesEachHeadByItsRowsAngles) {
  const int64_t rows = 3, heads = 4, hd = 8, half = hd / 2;
  std::vector<float> x = testing::RandomNormal(static_cast<size_t>(rows * heads * hd), 21);
  std::vector<float> cos(static_cast<size_t>(rows * hd)), sin(cos.size());
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t i = 0; i < hd; ++i) {
      const double angle = (r + 1) * std::pow(10000.0, -static_cast<double>(i % half) / half);
      cos[r * hd + i] = static_cast<float>(std::cos(angle));
      sin[r * hd + i] = static_cast<float>(std::sin(angle));
    }
  }
  std::vector<float> got = x;
  cpu::RopeRows(got.data(), rows, heads, hd, cos.data(), sin.data());
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t h = 0; h < heads; ++h) {
      const float* v = x.data() + (r * heads + h) * hd;
      for (int64_t i = 0; i < hd; ++i) {
        // x * cos + rotate_half(x) * sin, rotate_half(x) = (-x[half:], x[:half]).
        const double rotated = i < half ? -static_cast<double>(v[i + half]) : v[i - half];
        const double want = v[i] * static_cast<double>(cos[r * hd + i]) +
                            rotated * static_cast<double>(sin[r * hd + i]);
        EXPECT_NEAR(got[(r * heads + h) * hd + i], want, 1e-6 * (1 + std::fabs(want)))
            << "row " << r << " head " << h << " i " << i;
      }
    }
  }
}

}  // namespace
}  // namespace loradb::kernels
