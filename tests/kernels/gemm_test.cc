// cpu::Gemm (packed-panel matrix multiply) against a double-precision sum on every runnable
// instruction set: both layouts of B, sizes around the tile, the K block and the column block,
// column ranges, strides; each output bit for bit the same whatever rows or range surround it;
// and the transposing pack's panels element by element.
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

struct Case {
  int64_t m, k, n, j_begin, j_end;
  cpu::GemmB layout;
  int64_t lda_extra = 0, ldb_extra = 0, ldc_extra = 0;
  cpu::GemmA a_layout = cpu::GemmA::kMK;
};

// A(i, p) and B(p, j) of matrices stored as the case's layouts say.
float AAt(const std::vector<float>& a, const Case& c, int64_t lda, int64_t i, int64_t p) {
  return c.a_layout == cpu::GemmA::kMK ? a[static_cast<size_t>(i * lda + p)]
                                       : a[static_cast<size_t>(p * lda + i)];
}
float At(const std::vector<float>& b, const Case& c, int64_t ldb, int64_t p, int64_t j) {
  return c.layout == cpu::GemmB::kNK ? b[static_cast<size_t>(j * ldb + p)]
                                     : b[static_cast<size_t>(p * ldb + j)];
}

void Check(const Case& c, uint32_t seed) {
  SCOPED_TRACE(::testing::Message()
               << "m " << c.m << " k " << c.k << " n " << c.n << " j [" << c.j_begin << ", "
               << c.j_end << ") " << (c.a_layout == cpu::GemmA::kMK ? "MK " : "KM ")
               << (c.layout == cpu::GemmB::kNK ? "NK" : "KN") << " strides +" << c.lda_extra << " +"
               << c.ldb_extra << " +" << c.ldc_extra);
  const int64_t lda = (c.a_layout == cpu::GemmA::kMK ? c.k : c.m) + c.lda_extra;
  const int64_t ldc = c.n + c.ldc_extra;
  const int64_t a_rows = c.a_layout == cpu::GemmA::kMK ? c.m : c.k;
  const int64_t ldb = (c.layout == cpu::GemmB::kNK ? c.k : c.n) + c.ldb_extra;
  const int64_t b_rows = c.layout == cpu::GemmB::kNK ? c.n : c.k;
  const std::vector<float> a = Random(static_cast<size_t>(a_rows * lda), seed);
  const std::vector<float> b = Random(static_cast<size_t>(b_rows * ldb), seed + 1);
  std::vector<float> out(static_cast<size_t>(c.m * ldc), kSentinel);
  cpu::Gemm(a.data(), lda, c.a_layout, c.m, c.k, b.data(), ldb, c.layout, c.j_begin, c.j_end,
            out.data(), ldc);
  ExpectSums(out, c.m, ldc, c.j_begin, c.j_end, c.k, [&](int64_t i, int64_t j, int64_t p) {
    return static_cast<double>(AAt(a, c, lda, i, p)) * At(b, c, ldb, p, j);
  });
}

TEST(CpuGemm, MatchesDoubleSumsOnEveryIsa) {
  for (const cpu_internal::IsaKernels* isa : RunnableIsas()) {
    cpu_internal::ForceKernelsForTesting(isa);
    SCOPED_TRACE(isa->name);
    uint32_t seed = 1;
    for (cpu::GemmB layout : {cpu::GemmB::kNK, cpu::GemmB::kKN}) {
      for (int64_t k : {1, 5, 16, 33}) {
        for (int64_t m : {1, 4, 7, 12, 13, 25}) {
          for (int64_t n : {1, 8, 17, 32, 33, 70}) Check({m, k, n, 0, n, layout}, seed++);
        }
      }
      // Depth past one K block (256) and its remainder, rows past one row block (12 panels of
      // the widest tile), columns past one column block (1024), column ranges inside blocks,
      // padded strides, an empty range, no rows, no depth (zeros).
      Check({150, 300, 40, 0, 40, layout, 3, 5, 7}, seed++);
      Check({9, 520, 1100, 0, 1100, layout}, seed++);
      Check({30, 40, 100, 13, 77, layout, 1, 2, 3}, seed++);
      Check({5, 20, 9, 4, 4, layout}, seed++);
      Check({0, 20, 9, 0, 9, layout}, seed++);
      Check({6, 0, 9, 0, 9, layout}, seed++);
      // A stored transposed ([k, m]: a LoRA's weight gradients), rows inside and past a tile,
      // depth past a K block, a padded stride.
      for (int64_t m : {1, 8, 13, 150}) {
        Check({m, 300, 40, 0, 40, layout, 2, 0, 0, cpu::GemmA::kKM}, seed++);
        Check({m, 7, 33, 3, 30, layout, 0, 1, 1, cpu::GemmA::kKM}, seed++);
      }
    }
  }
  cpu_internal::ForceKernelsForTesting(nullptr);
}

// A row's outputs do not depend on the rows computed with it, the column range, or the ISA's
// split of the work into tiles and blocks: the same bits alone, in a batch and in a sub-range.
TEST(CpuGemm, OutputsDoNotDependOnBatchOrRange) {
  for (const cpu_internal::IsaKernels* isa : RunnableIsas()) {
    cpu_internal::ForceKernelsForTesting(isa);
    SCOPED_TRACE(isa->name);
    for (cpu::GemmB layout : {cpu::GemmB::kNK, cpu::GemmB::kKN}) {
      const int64_t m = 40, k = 300, n = 70;
      const std::vector<float> a = Random(static_cast<size_t>(m * k), 7);
      const std::vector<float> b = Random(static_cast<size_t>(k * n), 8);
      const int64_t ldb = layout == cpu::GemmB::kNK ? k : n;
      std::vector<float> all(static_cast<size_t>(m * n));
      cpu::Gemm(a.data(), k, cpu::GemmA::kMK, m, k, b.data(), ldb, layout, 0, n, all.data(), n);
      for (int64_t r : {0, 13, 39}) {
        std::vector<float> one(static_cast<size_t>(n));
        cpu::Gemm(a.data() + r * k, k, cpu::GemmA::kMK, 1, k, b.data(), ldb, layout, 0, n,
                  one.data(), n);
        std::vector<float> part(static_cast<size_t>(n), 0.0f);
        cpu::Gemm(a.data() + r * k, k, cpu::GemmA::kMK, 1, k, b.data(), ldb, layout, 21, 50,
                  part.data(), n);
        for (int64_t j = 0; j < n; ++j) {
          ASSERT_EQ(one[static_cast<size_t>(j)], all[static_cast<size_t>(r * n + j)])
              << "row " << r << " col " << j;
          if (j >= 21 && j < 50) {
            ASSERT_EQ(part[static_cast<size_t>(j)], one[static_cast<size_t>(j)]) << "col " << j;
          }
        }
      }
    }
  }
  cpu_internal::ForceKernelsForTesting(nullptr);
}

// The transposing pack of every ISA: each panel element from its source row and depth, zeros
// past the valid rows, and nothing written past the panel (whole-vector stores of a narrow panel
// overlap the following lines, never the memory after it).
TEST(CpuGemm, TransposingPackFillsExactlyThePanel) {
  for (const cpu_internal::IsaKernels* isa : RunnableIsas()) {
    SCOPED_TRACE(isa->name);
    for (int width : {1, 4, 6, 8, 12, 16, 20, 32}) {
      for (int64_t kc : {1, 7, 8, 15, 16, 17, 31, 48, 50}) {
        for (int valid : {0, 1, width / 2, width}) {
          const int64_t ld = kc + 3;
          const std::vector<float> src = Random(static_cast<size_t>(width * ld), 9);
          const int64_t size = kc * width;
          std::vector<float> out(static_cast<size_t>(size + 64), kSentinel);
          isa->pack_rows_t(src.data(), ld, kc, valid, width, out.data());
          for (int64_t p = 0; p < kc; ++p) {
            for (int l = 0; l < width; ++l) {
              const float want = l < valid ? src[static_cast<size_t>(l * ld + p)] : 0.0f;
              ASSERT_EQ(out[static_cast<size_t>(p * width + l)], want)
                  << "width " << width << " kc " << kc << " valid " << valid << " depth " << p
                  << " lane " << l;
            }
          }
          for (int64_t i = size; i < size + 64; ++i) {
            ASSERT_EQ(out[static_cast<size_t>(i)], kSentinel)
                << "width " << width << " kc " << kc << " wrote past the panel at " << i - size;
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace loradb::kernels
