// Micro-kernels of the fast CPU path, compiled once per instruction set (fast_isa_*.cc include
// fast_isa.inc with different compiler flags) and chosen at run time. Internal to kernels/cpu.
// Everything here works on fp32 data; conversions happen while packing.
#ifndef LORADB_KERNELS_CPU_FAST_ISA_H_
#define LORADB_KERNELS_CPU_FAST_ISA_H_

#include <cstdint>

#include "kernels/lora_kernels.h"

namespace loradb::kernels::cpu_internal {

struct IsaKernels {
  const char* name;
  // Shrink block: shrink_k weight rows x shrink_rows activation rows (pointers; pad short blocks
  // by repeating a pointer). out[r * ldo + k] = dot(a[k][0..n), x[r][0..n)).
  // shrink_block[min(rows, 3) - 1] handles 1, 2 or (up to) shrink_rows rows per call. Each
  // weight row's stream prefetches a fixed distance ahead; past the row's end the prefetch skips
  // `wrap_bytes` more, to where the caller's next block reads (for A's contiguous rows, the
  // next block's row at that offset).
  int shrink_k;
  int shrink_rows;
  void (*shrink_block[4])(const float* const* a, const float* const* x, int64_t n,
                          int64_t wrap_bytes, float* out, int64_t ldo);
  // Expand tile: expand_tile output columns at a time, expand_rows rows at a time.
  // acc[r * expand_tile + l] = sum_{k < rank} t[r][k] * bt[k * expand_tile + l].
  int expand_tile;
  int expand_rows;
  void (*expand_block)(const float* bt, int32_t rank, const float* const* t, float* acc);
  // One row without packing (decode): out[l] = sum_k B[o0 + l, k] * t[k] for l < valid.
  void (*expand_row_dot)(const void* b, DType dtype, int32_t rank, int64_t o0, int valid,
                         const float* t, float* out);
  // bt[k * expand_tile + l] = B[o0 + l, k] as fp32 for l < valid, 0 for valid <= l < tile.
  void (*pack_bt)(const void* b, DType dtype, int32_t rank, int64_t o0, int valid, float* bt);
  // dst[0..n) = src[0..n) as fp32.
  void (*to_f32)(const void* src, DType dtype, int64_t n, float* dst);
  // y[l] = round(y[l] + scale * acc[l]) for l < n.
  void (*update_y)(const float* acc, int n, float scale, void* y, DType dtype);
  // Dense block: dense_k weight rows x dense_rows activation rows of a linear layer,
  // out[r * ldo + s] = dot(w[s][0..k), x[r][0..k)). Every output is summed in the same order
  // whatever block it falls in (lanes in k order, then one fixed reduction tree), so a row's
  // result does not depend on the rows beside it. The weight lines `prefetch_bytes` past each
  // row's position are prefetched (the caller passes the distance to the next block).
  int dense_k;
  int dense_rows;
  void (*dense_block)(const float* const* w, const float* const* x, int64_t k,
                      int64_t prefetch_bytes, float* out, int64_t ldo);
  // The same for one activation row: dense_row_k weight rows at a time (more streams in flight
  // than the decode shape, none of its FMAs spent on repeated rows), the same bits per output.
  int dense_row_k;
  void (*dense_row_block)(const float* const* w, const float* const* x, int64_t k,
                          int64_t prefetch_bytes, float* out, int64_t ldo);
  // GEMM tile: c[i * ldc + l] (+)= sum_{p < kc} ap[p * gemm_mr + i] * bp[p * gemm_nr + l] for
  // i < mv <= gemm_mr, l < nv <= gemm_nr, from A packed gemm_mr rows at a time and B packed
  // gemm_nr columns at a time (both k-major). load_c: C's values are the sums' starting points
  // (a K split into blocks continues each sum in k order); otherwise they start at zero.
  int gemm_mr;
  int gemm_nr;
  void (*gemm_tile)(const float* ap, const float* bp, int64_t kc, float* c, int64_t ldc,
                    bool load_c, int mv, int nv);
  // A GEMM operand stored index-major packed into one k-major panel (a transpose):
  // panel[p * width + l] = src[l * ld + p] for l < valid, 0 for valid <= l < width; p < kc.
  void (*pack_rows_t)(const float* src, int64_t ld, int64_t kc, int valid, int width, float* panel);
  // One query against n rows of keys (decode attention's scores): out[t] = scale * dot(q[0..d),
  // rows[t * ld .. t * ld + d)) for t < n.
  void (*dot_rows)(const float* q, const float* rows, int64_t ld, int64_t n, int64_t d, float scale,
                   float* out);
  // Weights over n rows of values (decode attention's output): out[0..d) = sum over t < n, in
  // t order, of p[t] * rows[t * ld .. t * ld + d).
  void (*weighted_rows)(const float* p, const float* rows, int64_t ld, int64_t n, int64_t d,
                        float* out);
  // One row's RMS norm: out[i] = w[i] * (x[i] / sqrt(mean of x^2 over n + eps)); out may be x.
  void (*rms_norm)(const float* x, int64_t n, const float* w, float eps, float* out);
  // exp of every lane of one vector register's worth of floats (tests reach it here).
  void (*exp_lanes)(const float* x, float* out);
  // out[i] = silu(g[i]) * u[i] = g[i] / (1 + exp(-g[i])) * u[i]; out may be g.
  void (*silu_mul)(const float* g, const float* u, int64_t n, float* out);
  // fp32 lanes of one vector register (exp_lanes' count).
  int lanes;
};

const IsaKernels& PortableKernels();
#if defined(LORADB_KERNELS_X86)
const IsaKernels& Avx2Kernels();
const IsaKernels& Avx512Kernels();
#endif

// The best set this CPU supports.
const IsaKernels& BestKernels();

// The set the fast path uses: BestKernels() unless a test forced another (nullptr restores the
// default). Not thread-safe against concurrent kernel calls; for tests only.
const IsaKernels& ActiveKernels();
void ForceKernelsForTesting(const IsaKernels* kernels);

}  // namespace loradb::kernels::cpu_internal

#endif  // LORADB_KERNELS_CPU_FAST_ISA_H_
