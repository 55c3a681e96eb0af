// cpu::Gemm: packed-panel matrix multiply around the per-ISA GEMM tile (fast_isa.inc).
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <new>

#include "kernels/cpu/fast_isa.h"
#include "kernels/lora_kernels.h"

namespace loradb::kernels::cpu {

namespace {

// Reduction depth per packed block: a tile's B panel (256 x 32 floats, 32 KiB with AVX-512)
// stays in L1 while the A panels of a row block stream past it from L2.
constexpr int64_t kKc = 256;
// A panels per row block: 12 x 12 rows x 256 (144 KiB with AVX-512) in L2.
constexpr int64_t kMcPanels = 12;
// Columns per packed B block: 256 x 2048 floats (2 MiB), read from L3 once per row block; wider
// than a layer, so A is packed once per K block.
constexpr int64_t kNc = 2048;

// Per-thread packing buffers, grown on demand and kept: a call allocates nothing once warm.
struct PackBuffers {
  std::unique_ptr<float[]> a, b;
  int64_t a_size = 0, b_size = 0;
  static float* Grow(std::unique_ptr<float[]>& p, int64_t& size, int64_t need) {
    if (size < need) {
      p.reset(new (std::align_val_t(64)) float[need]);
      size = need;
    }
    return p.get();
  }
};

// Packs one operand's block: the element at index j and depth p is src[(p0 + p) * ld + j0 + j]
// when the source is depth-major (A stored [k, m], B stored [k, n]), else src[(j0 + j) * ld +
// p0 + p] (A stored [m, k], B stored [n, k]). Indices [0, count) x depth [0, kc) go into panels of
// `width` indices, k-major (panel[p * width + j]); indices past count are zero. A's panels are
// its row panels (width gemm_mr), B's its column panels (width gemm_nr).
void Pack(const cpu_internal::IsaKernels& isa, const float* src, int64_t ld, bool depth_major,
          int64_t p0, int64_t kc, int64_t j0, int64_t count, int width, float* out) {
  for (int64_t l0 = 0; l0 < count; l0 += width) {
    float* panel = out + l0 * kc;
    const int valid = static_cast<int>(std::min<int64_t>(width, count - l0));
    if (depth_major) {
      for (int64_t p = 0; p < kc; ++p) {
        float* dst = panel + p * width;
        std::memcpy(dst, src + (p0 + p) * ld + j0 + l0, sizeof(float) * static_cast<size_t>(valid));
        for (int l = valid; l < width; ++l) dst[l] = 0.0f;
      }
      continue;
    }
    isa.pack_rows_t(src + (j0 + l0) * ld + p0, ld, kc, valid, width, panel);
  }
}

}  // namespace

void Gemm(const float* a, int64_t lda, GemmA a_layout, int64_t m, int64_t k, const float* b,
          int64_t ldb, GemmB b_layout, int64_t j_begin, int64_t j_end, float* c, int64_t ldc) {
  if (m <= 0 || j_end <= j_begin) return;
  if (k <= 0) {
    for (int64_t i = 0; i < m; ++i) std::fill(c + i * ldc + j_begin, c + i * ldc + j_end, 0.0f);
    return;
  }
  const cpu_internal::IsaKernels& isa = cpu_internal::ActiveKernels();
  const int mr = isa.gemm_mr, nr = isa.gemm_nr;
  const int64_t mc_max = kMcPanels * mr;
  const int64_t nc_max = (kNc + nr - 1) / nr * nr;
  thread_local PackBuffers buf;
  float* ap = PackBuffers::Grow(buf.a, buf.a_size, mc_max * kKc);
  float* bp = PackBuffers::Grow(buf.b, buf.b_size, nc_max * kKc);
  for (int64_t jc = j_begin; jc < j_end; jc += nc_max) {
    const int64_t nc = std::min(nc_max, j_end - jc);
    for (int64_t pc = 0; pc < k; pc += kKc) {
      const int64_t kc = std::min(kKc, k - pc);
      Pack(isa, b, ldb, b_layout == GemmB::kKN, pc, kc, jc, nc, nr, bp);
      for (int64_t ic = 0; ic < m; ic += mc_max) {
        const int64_t mc = std::min(mc_max, m - ic);
        Pack(isa, a, lda, a_layout == GemmA::kKM, pc, kc, ic, mc, mr, ap);
        for (int64_t jr = 0; jr < nc; jr += nr) {
          const int nv = static_cast<int>(std::min<int64_t>(nr, nc - jr));
          for (int64_t ir = 0; ir < mc; ir += mr) {
            const int mv = static_cast<int>(std::min<int64_t>(mr, mc - ir));
            isa.gemm_tile(ap + ir * kc, bp + jr * kc, kc, c + (ic + ir) * ldc + jc + jr, ldc,
                          pc > 0, mv, nv);
          }
        }
      }
    }
  }
}

}  // namespace loradb::kernels::cpu
