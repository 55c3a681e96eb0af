// The oracle: the multi-LoRA update written as plain fp32 loops, one thread, no blocking.
#include <vector>

#include "kernels/cpu/convert.h"
#include "kernels/cpu/row_groups.h"
#include "kernels/lora_kernels.h"

namespace loradb::kernels::reference {

using cpu_internal::ExpertA;
using cpu_internal::ExpertB;
using cpu_internal::ForEachMappedRow;

namespace {

// t[k] = sum_j A[k, j] * x[j] for k < rank.
void ShrinkRow(const void* x_row, DType x_dtype, const void* a, DType w_dtype, int64_t in,
               int32_t rank, float* t) {
  for (int32_t k = 0; k < rank; ++k) {
    float acc = 0.0f;
    for (int64_t j = 0; j < in; ++j) {
      acc += LoadAsFloat(a, w_dtype, k * in + j) * LoadAsFloat(x_row, x_dtype, j);
    }
    t[k] = acc;
  }
}

// y[o] += scale * sum_k B[o, k] * t[k] for o < out.
void ExpandRow(const float* t, const void* b, DType w_dtype, int64_t out, int32_t rank, float scale,
               void* y_row, DType y_dtype) {
  for (int64_t o = 0; o < out; ++o) {
    float acc = 0.0f;
    for (int32_t k = 0; k < rank; ++k) acc += LoadAsFloat(b, w_dtype, o * rank + k) * t[k];
    float v = LoadAsFloat(y_row, y_dtype, o) + scale * acc;
    StoreFromFloat(y_row, y_dtype, o, v);
  }
}

const void* RowPtr(const void* base, DType dtype, int64_t row, int64_t stride, int64_t col) {
  return static_cast<const char*>(base) +
         (row * stride + col) * static_cast<int64_t>(DTypeSize(dtype));
}

void* RowPtr(void* base, DType dtype, int64_t row, int64_t stride, int64_t col) {
  return static_cast<char*>(base) + (row * stride + col) * static_cast<int64_t>(DTypeSize(dtype));
}

}  // namespace

KernelStatus Shrink(const ConstRows& x, const AdapterTable& w, const RowMapping& m,
                    const RankBuffer& t) {
  KernelStatus s = ValidateShrink(x, w, m, t, /*host_indices=*/true);
  if (!s.ok()) return s;
  ForEachMappedRow(w, m, [&](int64_t i, int32_t a, int32_t e) {
    ShrinkRow(RowPtr(x.data, x.dtype, i, x.stride, 0), x.dtype, ExpertA(w, a, e), w.dtype,
              w.in_features, w.ranks[a], t.data + i * t.stride);
  });
  return s;
}

KernelStatus Expand(const RankBuffer& t, const AdapterTable& w, const RowMapping& m,
                    const OutputRows& y) {
  KernelStatus s = ValidateExpand(t, w, m, y, /*host_indices=*/true);
  if (!s.ok()) return s;
  ForEachMappedRow(w, m, [&](int64_t i, int32_t a, int32_t e) {
    ExpandRow(t.data + i * t.stride, ExpertB(w, a, e), w.dtype, w.out_features, w.ranks[a],
              w.scales[a], RowPtr(y.data, y.dtype, i, y.stride, y.offset), y.dtype);
  });
  return s;
}

KernelStatus ShrinkExpand(const ConstRows& x, const AdapterTable& w, const RowMapping& m,
                          const OutputRows& y) {
  KernelStatus s = ValidateShrinkExpand(x, w, m, y, /*host_indices=*/true);
  if (!s.ok()) return s;
  std::vector<float> t(kMaxRank);
  ForEachMappedRow(w, m, [&](int64_t i, int32_t a, int32_t e) {
    ShrinkRow(RowPtr(x.data, x.dtype, i, x.stride, 0), x.dtype, ExpertA(w, a, e), w.dtype,
              w.in_features, w.ranks[a], t.data());
    ExpandRow(t.data(), ExpertB(w, a, e), w.dtype, w.out_features, w.ranks[a], w.scales[a],
              RowPtr(y.data, y.dtype, i, y.stride, y.offset), y.dtype);
  });
  return s;
}

}  // namespace loradb::kernels::reference
