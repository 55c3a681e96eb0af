// cpu::DenseLinear (the base model's x @ w^T) against a double-precision sum, on every runnable
// instruction set: odd sizes around the micro-kernel's blocks and vector width, output ranges,
// strides; and each row's result bit for bit the same whatever batch or range it is computed in.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "kernels/cpu/fast_isa.h"
#include "kernels/lora_kernels.h"
#include "tests/kernels/runnable_isas.h"
#include "tests/kernels/sum_check.h"

namespace loradb::kernels {
namespace {

using testing::ExpectSums;
using testing::kSentinel;
using testing::RunnableIsas;

std::vector<float> Random(size_t n, uint32_t seed) { return testing::RandomNormal(n, seed); }

// x [rows, ldx] (first k used), w [n, k], y [rows, ldy]; outputs [j_begin, j_end) written.
void CheckAgainstDouble(int64_t rows, int64_t k, int64_t n, int64_t j_begin, int64_t j_end,
                        int64_t ldx_extra, int64_t ldy_extra, uint32_t seed) {
  SCOPED_TRACE(::testing::Message()
               << "rows " << rows << " k " << k << " n " << n << " j [" << j_begin << ", " << j_end
               << ") ldx+" << ldx_extra << " ldy+" << ldy_extra);
  const int64_t ldx = k + ldx_extra, ldy = n + ldy_extra;
  const std::vector<float> x = Random(static_cast<size_t>(rows * ldx), seed);
  const std::vector<float> w = Random(static_cast<size_t>(n * k), seed + 1);
  std::vector<float> y(static_cast<size_t>(rows * ldy), kSentinel);
  cpu::DenseLinear(x.data(), rows, ldx, k, w.data(), j_begin, j_end, y.data(), ldy);
  ExpectSums(y, rows, ldy, j_begin, j_end, k, [&](int64_t r, int64_t j, int64_t i) {
    return static_cast<double>(x[static_cast<size_t>(r * ldx + i)]) *
           w[static_cast<size_t>(j * k + i)];
  });
}

TEST(CpuDenseLinear, MatchesDoubleSumsOnEveryIsa) {
  for (const cpu_internal::IsaKernels* isa : RunnableIsas()) {
    cpu_internal::ForceKernelsForTesting(isa);
    SCOPED_TRACE(isa->name);
    uint32_t seed = 1;
    for (int64_t k : {1, 3, 4, 15, 16, 17, 33, 64, 513}) {
      for (int64_t rows : {1, 2, 3, 4, 5, 7, 9}) {
        for (int64_t n : {1, 3, 4, 5, 19}) CheckAgainstDouble(rows, k, n, 0, n, 0, 0, seed++);
      }
    }
    // Row chunks past 64, output ranges that start and end inside a block, padded strides.
    CheckAgainstDouble(130, 40, 37, 0, 37, 3, 5, seed++);
    CheckAgainstDouble(6, 100, 45, 5, 42, 1, 2, seed++);
    CheckAgainstDouble(66, 24, 9, 3, 4, 0, 0, seed++);
    CheckAgainstDouble(3, 20, 9, 4, 4, 0, 0, seed++);  // an empty range writes nothing
    CheckAgainstDouble(0, 20, 9, 0, 9, 0, 0, seed++);  // no rows
  }
  cpu_internal::ForceKernelsForTesting(nullptr);
}

// A row's outputs are bit for bit the same computed alone, in any batch, or in any split of the
// output range (what makes a decode step's result independent of its batch).
TEST(CpuDenseLinear, RowResultsDoNotDependOnBatchOrRange) {
  for (const cpu_internal::IsaKernels* isa : RunnableIsas()) {
    cpu_internal::ForceKernelsForTesting(isa);
    SCOPED_TRACE(isa->name);
    const int64_t rows = 70, k = 77, n = 45;
    const std::vector<float> x = Random(static_cast<size_t>(rows * k), 7);
    const std::vector<float> w = Random(static_cast<size_t>(n * k), 8);
    std::vector<float> batch(static_cast<size_t>(rows * n));
    cpu::DenseLinear(x.data(), rows, k, k, w.data(), 0, n, batch.data(), n);
    for (int64_t r = 0; r < rows; ++r) {
      std::vector<float> alone(static_cast<size_t>(n));
      // Alone, with the range split at an odd point.
      cpu::DenseLinear(x.data() + r * k, 1, k, k, w.data(), 0, 13, alone.data(), n);
      cpu::DenseLinear(x.data() + r * k, 1, k, k, w.data(), 13, n, alone.data(), n);
      for (int64_t j = 0; j < n; ++j) {
        ASSERT_EQ(alone[static_cast<size_t>(j)], batch[static_cast<size_t>(r * n + j)])
            << "row " << r << " output " << j;
      }
    }
  }
  cpu_internal::ForceKernelsForTesting(nullptr);
}

}  // namespace
}  // namespace loradb::kernels
