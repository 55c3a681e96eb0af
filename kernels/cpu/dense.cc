// cpu::DenseLinear: x @ w^T for the base model's linear layers, in blocks of the per-ISA dense
// micro-kernel (fast_isa.inc).
#include <algorithm>
#include <cstdint>

#include "kernels/cpu/fast_isa.h"
#include "kernels/lora_kernels.h"

namespace loradb::kernels::cpu {

namespace {

// Rows of x per pass over the weights: 64 rows of a 1536-wide layer (384 KiB) stay in L2 while
// every weight block meets them; longer inputs read the weights once per 64 rows.
constexpr int64_t kRowChunk = 64;
constexpr int kMaxBlock = 16;  // dense_k, dense_rows and dense_row_k of every ISA: at most this

}  // namespace

void DenseLinear(const float* x, int64_t rows, int64_t ldx, int64_t k, const float* w,
                 int64_t j_begin, int64_t j_end, float* y, int64_t ldy) {
  const cpu_internal::IsaKernels& isa = cpu_internal::ActiveKernels();
  // One row (a single sequence's decode step) takes the one-row block: same sums, no repeated
  // rows.
  const bool one_row = rows == 1;
  const int bk = one_row ? isa.dense_row_k : isa.dense_k, br = one_row ? 1 : isa.dense_rows;
  const auto block = one_row ? isa.dense_row_block : isa.dense_block;
  // The weight block after the current one: each row's line at the same offset.
  const int64_t prefetch = static_cast<int64_t>(bk) * k * static_cast<int64_t>(sizeof(float));
  const float* wp[kMaxBlock];
  const float* xp[kMaxBlock];
  float part[kMaxBlock * kMaxBlock];
  for (int64_t c0 = 0; c0 < rows; c0 += kRowChunk) {
    const int64_t c1 = std::min(rows, c0 + kRowChunk);
    for (int64_t j0 = j_begin; j0 < j_end; j0 += bk) {
      const int nj = static_cast<int>(std::min<int64_t>(bk, j_end - j0));
      // A short block repeats its last weight row; those outputs are dropped.
      for (int s = 0; s < bk; ++s) wp[s] = w + (j0 + std::min(s, nj - 1)) * k;
      for (int64_t r0 = c0; r0 < c1; r0 += br) {
        const int nr = static_cast<int>(std::min<int64_t>(br, c1 - r0));
        for (int r = 0; r < br; ++r) xp[r] = x + (r0 + std::min(r, nr - 1)) * ldx;
        if (nj == bk && nr == br) {
          block(wp, xp, k, prefetch, y + r0 * ldy + j0, ldy);
          continue;
        }
        block(wp, xp, k, prefetch, part, bk);
        for (int r = 0; r < nr; ++r)
          for (int s = 0; s < nj; ++s) y[(r0 + r) * ldy + j0 + s] = part[r * bk + s];
      }
    }
  }
}

bool DenseLinearIsVectorized() {
  return &cpu_internal::ActiveKernels() != &cpu_internal::PortableKernels();
}

}  // namespace loradb::kernels::cpu
