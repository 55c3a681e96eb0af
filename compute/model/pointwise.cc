#include "compute/model/pointwise.h"

#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>

#include "kernels/lora_kernels.h"

namespace loradb::model {

namespace {

// Rows per parallel work unit: enough floats that splitting a decode step's few rows across
// threads does not cost more than it saves.
int64_t RowGrain(int64_t row_size) { return std::max<int64_t>(1, (int64_t{1} << 14) / row_size); }

}  // namespace

bool UsesPointwiseKernels(std::initializer_list<at::Tensor> tensors) {
  const bool grad = at::GradMode::is_enabled();
  return std::all_of(tensors.begin(), tensors.end(), [&](const at::Tensor& t) {
    return t.defined() && t.device().is_cpu() && t.scalar_type() == at::kFloat &&
           t.is_contiguous() && !(grad && t.requires_grad());
  });
}

at::Tensor RmsNormKernel(const at::Tensor& x, const at::Tensor& w, double eps) {
  const int64_t n = x.size(-1), rows = n == 0 ? 0 : x.numel() / n;
  at::Tensor out = at::empty_like(x);
  const float* xp = x.data_ptr<float>();
  const float* wp = w.data_ptr<float>();
  float* op = out.data_ptr<float>();
  at::parallel_for(0, rows, RowGrain(n), [&](int64_t begin, int64_t end) {
    kernels::cpu::RmsNormRows(xp + begin * n, end - begin, n, wp, static_cast<float>(eps),
                              op + begin * n);
  });
  return out;
}

at::Tensor& RopeKernel(at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const int64_t rows = x.size(0), heads = x.size(1), hd = x.size(2);
  float* xp = x.data_ptr<float>();
  const float* cp = cos.data_ptr<float>();
  const float* sp = sin.data_ptr<float>();
  at::parallel_for(0, rows, RowGrain(heads * hd), [&](int64_t begin, int64_t end) {
    kernels::cpu::RopeRows(xp + begin * heads * hd, end - begin, heads, hd, cp + begin * hd,
                           sp + begin * hd);
  });
  return x;
}

at::Tensor& SiluMulKernel(at::Tensor& g, const at::Tensor& u) {
  const int64_t n = g.size(-1), rows = n == 0 ? 0 : g.numel() / n;
  float* gp = g.data_ptr<float>();
  const float* up = u.data_ptr<float>();
  at::parallel_for(0, rows, RowGrain(n), [&](int64_t begin, int64_t end) {
    kernels::cpu::SiluMul(gp + begin * n, up + begin * n, (end - begin) * n, gp + begin * n);
  });
  return g;
}

}  // namespace loradb::model
