#include "compute/model/dense_linear.h"

#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <vector>

#include "kernels/lora_kernels.h"

namespace loradb::model {

namespace {

// Outputs per parallel work unit: a multiple of every ISA's dense block.
constexpr int64_t kOutputsPerUnit = 64;

bool IsF32Cpu(const at::Tensor& t) { return t.device().is_cpu() && t.scalar_type() == at::kFloat; }

}  // namespace

bool UsesDenseKernel(const at::Tensor& x, const at::Tensor& w, const at::Tensor& bias) {
  static const bool vectorized = kernels::cpu::DenseLinearIsVectorized();
  if (!vectorized || !IsF32Cpu(x) || !IsF32Cpu(w) || w.dim() != 2 || !w.is_contiguous() ||
      x.dim() < 1 || x.size(-1) != w.size(1)) {
    return false;
  }
  if (bias.defined() && (!IsF32Cpu(bias) || bias.dim() != 1 || bias.size(0) != w.size(0))) {
    return false;
  }
  const bool needs_graph =
      x.requires_grad() || w.requires_grad() || (bias.defined() && bias.requires_grad());
  return !(at::GradMode::is_enabled() && needs_graph);
}

at::Tensor BaseLinear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& bias) {
  if (!UsesDenseKernel(x, w, bias)) return at::linear(x, w, bias);
  const int64_t k = w.size(1), n = w.size(0);
  const at::Tensor x2 = x.reshape({-1, k}).contiguous();
  const int64_t rows = x2.size(0);
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
  shape.back() = n;
  at::Tensor y = at::empty({rows, n}, x.options());
  if (rows > 0) {
    const float* xp = x2.data_ptr<float>();
    const float* wp = w.data_ptr<float>();
    float* yp = y.data_ptr<float>();
    const int64_t units = (n + kOutputsPerUnit - 1) / kOutputsPerUnit;
    at::parallel_for(0, units, 1, [&](int64_t begin, int64_t end) {
      kernels::cpu::DenseLinear(xp, rows, k, k, wp, begin * kOutputsPerUnit,
                                std::min(n, end * kOutputsPerUnit), yp, n);
    });
    if (bias.defined()) y.add_(bias);
  }
  return y.view(shape);
}

}  // namespace loradb::model
