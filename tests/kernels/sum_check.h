// Checks of a kernel's fp32 sums of products against double-precision sums, shared by the dense
// and GEMM kernel tests.
#ifndef LORADB_TESTS_KERNELS_SUM_CHECK_H_
#define LORADB_TESTS_KERNELS_SUM_CHECK_H_

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

namespace loradb::kernels::testing {

inline std::vector<float> RandomNormal(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d;
  std::vector<float> v(n);
  for (float& f : v) f = d(rng);
  return v;
}

// What an output buffer holds before the kernel runs; positions outside its range keep it.
constexpr float kSentinel = -12345.0f;

// y [rows, ldy]: y[r * ldy + j] for j in [j_begin, j_end) equals sum_{i < k} term(r, j, i) to
// 1e-5 of the sum of the terms' magnitudes; every other position still holds kSentinel.
template <typename Term>
void ExpectSums(const std::vector<float>& y, int64_t rows, int64_t ldy, int64_t j_begin,
                int64_t j_end, int64_t k, Term term) {
  int bad = 0;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < ldy; ++j) {
      const float got = y[static_cast<size_t>(r * ldy + j)];
      if (j < j_begin || j >= j_end) {
        if (got != kSentinel && ++bad <= 5)
          ADD_FAILURE() << "wrote outside: row " << r << " j " << j;
        continue;
      }
      double want = 0, magnitude = 0;
      for (int64_t i = 0; i < k; ++i) {
        const double t = term(r, j, i);
        want += t;
        magnitude += std::fabs(t);
      }
      if (!(std::fabs(got - want) <= 1e-5 * magnitude + 1e-30) && ++bad <= 5) {
        ADD_FAILURE() << "row " << r << " j " << j << ": got " << got << " want " << want;
      }
    }
  }
}

}  // namespace loradb::kernels::testing

#endif  // LORADB_TESTS_KERNELS_SUM_CHECK_H_
