// Multi-LoRA kernels: the public types and the CPU entry points.
//
// Every row i of a batch applies its own low-rank update
//
//   y[i, y_offset + o] += scale[a] * sum_k B_a[o, k] * (sum_j A_a[k, j] * x[i, j])
//
// where a is the row's adapter (negative = no adapter: the row is left untouched). The work is
// split like Punica/S-LoRA: Shrink computes the rank intermediate t = x A^T (fp32), Expand adds
// scale * t B^T into y, and ShrinkExpand does both without a caller-visible intermediate.
//
// Layout contracts (PEFT stores lora_A / lora_B weights like this):
//   A_a is [rank_a, in_features] row-major, B_a is [out_features, rank_a] row-major, both
//   contiguous. In the MoE form A_a is [num_experts, rank_a, in_features] and B_a is
//   [num_experts, out_features, rank_a] (the packed 3-D expert tensors of the blob format), and
//   each row also names an expert.
//   x is [rows, in_features] with a row stride; y is [rows, >= y_offset + out_features] with a row
//   stride, and the update goes into the column slice [y_offset, y_offset + out_features) (e.g.
//   the q, k or v part of a fused qkv output).
// Numerics: x/y and weights may each be fp32, bf16 or fp16; products are accumulated in fp32, the
// rank intermediate is fp32, and y is read, updated in fp32 and rounded (nearest-even) once.
//
// Row mapping: BGMV gives one adapter per row (decode); SGMV gives segments of consecutive rows
// sharing one adapter (prefill). Ranks differ per adapter (1..kMaxRank, no padding); adapters are
// reached through tables of pointers, so weights can live anywhere (an adapter cache, a device
// arena).
//
// The CPU implementations here (reference:: and cpu::) and the CUDA ones (kernels/cuda/
// lora_cuda.h) take the same arguments; CUDA takes a cudaStream_t where the CPU takes a
// CpuContext*. This header needs neither Abseil nor LibTorch.
#ifndef LORADB_KERNELS_LORA_KERNELS_H_
#define LORADB_KERNELS_LORA_KERNELS_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace loradb::kernels {

// Largest supported LoRA rank.
inline constexpr int32_t kMaxRank = 256;

// Element types of activations and weights.
enum class DType : uint8_t { kF32 = 0, kBF16 = 1, kF16 = 2 };

// Bytes per element of `dtype`.
size_t DTypeSize(DType dtype);
// "f32", "bf16" or "f16".
const char* DTypeName(DType dtype);

// Outcome of a kernel call: OK, or an invalid-argument message. On error nothing was written.
class [[nodiscard]] KernelStatus {
 public:
  KernelStatus() = default;
  static KernelStatus Ok() { return KernelStatus(); }
  static KernelStatus InvalidArgument(std::string message) {
    KernelStatus s;
    s.ok_ = false;
    s.message_ = std::move(message);
    return s;
  }
  bool ok() const { return ok_; }
  // Empty when ok().
  const std::string& message() const { return message_; }

 private:
  bool ok_ = true;
  std::string message_;
};

// Input activations: element (i, j) is at data[i * stride + j] (stride in elements).
struct ConstRows {
  const void* data = nullptr;
  DType dtype = DType::kF32;
  int64_t stride = 0;
};

// Output activations: the update for (i, o) goes to data[i * stride + offset + o].
struct OutputRows {
  void* data = nullptr;
  DType dtype = DType::kF32;
  int64_t stride = 0;
  int64_t offset = 0;  // y_offset: first column of the slice this projection writes
};

// The fp32 rank intermediate: t[i, k] is at data[i * stride + k]; stride >= the largest rank
// used. Shrink writes t[i, 0..rank_a) of every row that has an adapter; Expand reads them.
struct RankBuffer {
  float* data = nullptr;
  int64_t stride = 0;
};

// The adapters of one projection (in_features -> out_features). All tables have num_adapters
// entries and are not owned. For CUDA calls the tables and what they point to are device memory.
struct AdapterTable {
  int32_t num_adapters = 0;
  int64_t in_features = 0;
  int64_t out_features = 0;
  DType dtype = DType::kF32;       // dtype of every A and B
  const void* const* a = nullptr;  // a[j] -> A_j (see the layout contract above)
  const void* const* b = nullptr;  // b[j] -> B_j
  const int32_t* ranks = nullptr;  // 0..max_rank; a rank-0 adapter adds nothing
  const float* scales = nullptr;   // e.g. lora_alpha / r
  // Host-side upper bound of ranks[] (<= kMaxRank); CUDA sizes its scratch with it.
  int32_t max_rank = 0;
  int32_t num_experts = 0;  // 0: dense; > 0: MoE, weights are the packed 3-D expert tensors
};

// Which adapter (and, for MoE, which expert) each row uses. Build it with Bgmv() or Sgmv().
// For CUDA calls the index arrays are device memory.
struct RowMapping {
  int64_t num_rows = 0;
  // BGMV form: row_adapter[i] (< 0: no adapter); row_expert[i] for MoE tables.
  const int32_t* row_adapter = nullptr;
  const int32_t* row_expert = nullptr;
  // SGMV form: segment s covers rows [segment_starts[s], segment_starts[s + 1]) and uses
  // segment_adapter[s] (< 0: none) and, for MoE, segment_expert[s]. Starts are non-decreasing,
  // within [0, num_rows]; rows outside every segment are left untouched.
  int64_t num_segments = 0;
  const int32_t* segment_starts = nullptr;  // num_segments + 1 entries
  const int32_t* segment_adapter = nullptr;
  const int32_t* segment_expert = nullptr;

  static RowMapping Bgmv(int64_t num_rows, const int32_t* row_adapter,
                         const int32_t* row_expert = nullptr) {
    RowMapping m;
    m.num_rows = num_rows;
    m.row_adapter = row_adapter;
    m.row_expert = row_expert;
    return m;
  }
  static RowMapping Sgmv(int64_t num_rows, int64_t num_segments, const int32_t* segment_starts,
                         const int32_t* segment_adapter, const int32_t* segment_expert = nullptr) {
    RowMapping m;
    m.num_rows = num_rows;
    m.num_segments = num_segments;
    m.segment_starts = segment_starts;
    m.segment_adapter = segment_adapter;
    m.segment_expert = segment_expert;
    return m;
  }
  bool is_segmented() const { return segment_starts != nullptr; }
};

// Argument checks shared by every implementation. `host_indices` says whether the table's
// ranks/scales and the mapping's index arrays may be read here (true for the CPU); when false
// (CUDA) only the scalars and pointers are checked, and on the device an out-of-range adapter,
// expert or rank makes the row be skipped.
KernelStatus ValidateShrink(const ConstRows& x, const AdapterTable& w, const RowMapping& m,
                            const RankBuffer& t, bool host_indices);
KernelStatus ValidateExpand(const RankBuffer& t, const AdapterTable& w, const RowMapping& m,
                            const OutputRows& y, bool host_indices);
KernelStatus ValidateShrinkExpand(const ConstRows& x, const AdapterTable& w, const RowMapping& m,
                                  const OutputRows& y, bool host_indices);

// The oracle: plain fp32 loops, one thread. Same contracts as the cpu:: functions.
namespace reference {
KernelStatus Shrink(const ConstRows& x, const AdapterTable& w, const RowMapping& m,
                    const RankBuffer& t);
KernelStatus Expand(const RankBuffer& t, const AdapterTable& w, const RowMapping& m,
                    const OutputRows& y);
KernelStatus ShrinkExpand(const ConstRows& x, const AdapterTable& w, const RowMapping& m,
                          const OutputRows& y);
}  // namespace reference

namespace cpu {

// Worker threads for the fast CPU kernels (the CPU's counterpart of a stream). Calls made with
// one context must not overlap; distinct contexts may be used concurrently.
class CpuContext {
 public:
  // num_threads <= 0: std::thread::hardware_concurrency().
  explicit CpuContext(int num_threads = 0);
  ~CpuContext();
  CpuContext(const CpuContext&) = delete;
  CpuContext& operator=(const CpuContext&) = delete;

  int num_threads() const;
  // Instruction set the fast kernels use on this CPU: "avx512", "avx2" or "portable".
  static const char* Isa();

  struct Impl;
  Impl* impl() const { return impl_.get(); }

 private:
  std::unique_ptr<Impl> impl_;
};

// Fast CPU path: groups rows by (adapter, expert), blocks for cache, uses SIMD (AVX-512 or AVX2
// chosen at run time) and the context's threads. ctx == nullptr runs on the calling thread.
// On an invalid argument nothing is written and the message says what is wrong.
KernelStatus Shrink(const ConstRows& x, const AdapterTable& w, const RowMapping& m,
                    const RankBuffer& t, CpuContext* ctx);
KernelStatus Expand(const RankBuffer& t, const AdapterTable& w, const RowMapping& m,
                    const OutputRows& y, CpuContext* ctx);
KernelStatus ShrinkExpand(const ConstRows& x, const AdapterTable& w, const RowMapping& m,
                          const OutputRows& y, CpuContext* ctx);

// The base model's linear layer on fp32 data, without bias: y[r * ldy + j] = sum_i
// x[r * ldx + i] * w[j * k + i] for r < rows and j in [j_begin, j_end), with w row-major [n, k]
// (PyTorch's Linear weight). Built for decode, where a few rows meet a weight matrix read from
// memory once: the weights stream through the dense micro-kernel once per 64 rows, prefetched a
// block ahead, with no packing copy. Every output is summed in the same order whatever `rows`,
// the j range or the caller's split into calls (a row's result does not depend on its batch).
// Runs on the calling thread; callers split [0, n) across threads.
void DenseLinear(const float* x, int64_t rows, int64_t ldx, int64_t k, const float* w,
                 int64_t j_begin, int64_t j_end, float* y, int64_t ldy);

// How Gemm reads its left-hand matrix a: kMK is a[i * lda + p] (row-major [m, k]), kKM is
// a[p * lda + i] (row-major [k, m]: c = a^T @ B, the weight gradients of a LoRA).
enum class GemmA { kMK, kKM };
// How Gemm reads its right-hand matrix b: kNK is b[j * ldb + p] (row-major [n, k], a Linear
// weight: c = A @ b^T), kKN is b[p * ldb + j] (row-major [k, n]: c = A @ b).
enum class GemmB { kNK, kKN };

// c[i * ldc + j] = sum_{p < k} A(i, p) * B(p, j) for i < m and j in [j_begin, j_end), A and B
// read as a_layout and b_layout say. Built for many rows (prefill, training's forward and
// backward): blocks of A and B are packed into contiguous panels that stay in L1/L2 while a
// register tile of C accumulates, so the arithmetic runs near the FMA units' peak. Every output
// is one sum in k order, the same whatever m, the j range or the caller's split into calls. Runs
// on the calling thread (packing buffers are per thread); callers split rows or columns across
// threads.
void Gemm(const float* a, int64_t lda, GemmA a_layout, int64_t m, int64_t k, const float* b,
          int64_t ldb, GemmB b_layout, int64_t j_begin, int64_t j_end, float* c, int64_t ldc);

// Attention of one new token (a decode step) over `len` cached keys and values, fp32:
// out[h * head_dim + j] = sum_t softmax_t(scale * q[h] . K[g][t]) * V[g][t][j] for each query head
// h < heads, with g = h / (heads / kv_heads) its key/value head (grouped-query attention). q is
// [heads, head_dim]; K[g][t] starts at k + g * head_stride + t * head_dim, likewise V in v (a KV
// cache laid out [kv_heads, capacity, head_dim] has head_stride = capacity * head_dim). A
// sequence's result depends on its own q, K and V only. Runs on the calling thread; len >= 1.
void DecodeAttention(const float* q, int64_t heads, int64_t kv_heads, int64_t head_dim,
                     const float* k, const float* v, int64_t head_stride, int64_t len, float scale,
                     float* out);

// RMS norm of `rows` rows of n floats (row r at x + r * n), as Qwen3's RMSNorm computes it in
// fp32: out[r * n + i] = w[i] * (x[r * n + i] / sqrt(mean over i of x^2 + eps)). out may be x.
// Runs on the calling thread.
void RmsNormRows(const float* x, int64_t rows, int64_t n, const float* w, float eps, float* out);

// out[i] = silu(g[i]) * u[i] for i < n, silu(v) = v / (1 + exp(-v)) with exp within 2 ulp: the
// gated MLP's middle. out may be g. Runs on the calling thread.
void SiluMul(const float* g, const float* u, int64_t n, float* out);

// Rotary position embedding in place on `rows` rows of `heads` heads of head_dim floats (x[r][h]
// at x + (r * heads + h) * head_dim), with the row's cos and sin tables (cos[r * head_dim + i]):
// x = x * cos + rotate_half(x) * sin, rotate_half(x) = (-x[half..], x[..half]) (the
// GPT-NeoX / Qwen3 layout). head_dim is even. Runs on the calling thread.
void RopeRows(float* x, int64_t rows, int64_t heads, int64_t head_dim, const float* cos,
              const float* sin);

// Whether DenseLinear runs vector code on this CPU (AVX-512 or AVX2); with only the portable set
// a BLAS library is the better choice.
bool DenseLinearIsVectorized();

}  // namespace cpu
}  // namespace loradb::kernels

#endif  // LORADB_KERNELS_LORA_KERNELS_H_
