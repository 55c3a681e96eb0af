#include "compute/model/dense_linear.h"

#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <vector>

#include "kernels/lora_kernels.h"

namespace loradb::model {

namespace {

// Outputs per parallel work unit: a multiple of every ISA's dense block and GEMM tile width.
constexpr int64_t kOutputsPerUnit = 64;
// Rows per parallel work unit of a GEMM split by rows: a multiple of every ISA's GEMM tile height.
constexpr int64_t kRowsPerUnit = 48;

bool IsF32Cpu(const at::Tensor& t) { return t.device().is_cpu() && t.scalar_type() == at::kFloat; }

// Whether x, w (and bias) are tensors the CPU kernels take: fp32 on the CPU, w a contiguous
// [n, k] matrix matching x's last dimension, and the CPU has their vector code.
bool KernelShapes(const at::Tensor& x, const at::Tensor& w, const at::Tensor& bias) {
  static const bool vectorized = kernels::cpu::DenseLinearIsVectorized();
  if (!vectorized || !IsF32Cpu(x) || !IsF32Cpu(w) || w.dim() != 2 || !w.is_contiguous() ||
      x.dim() < 1 || x.size(-1) != w.size(1)) {
    return false;
  }
  return !bias.defined() || (IsF32Cpu(bias) && bias.dim() == 1 && bias.size(0) == w.size(0));
}

// c [m, n] = a [m, k] @ B across LibTorch's intra-op threads, B as `layout` says (b's row length
// ldb). Threads split the rows, or the columns when there are more of them: each thread packs
// its own panels, and splitting the longer side duplicates the smaller packing.
at::Tensor ParallelGemm(const at::Tensor& a, const at::Tensor& b, kernels::cpu::GemmB layout,
                        int64_t n) {
  const int64_t m = a.size(0), k = a.size(1), ldb = b.size(1);
  at::Tensor c = at::empty({m, n}, a.options());
  if (m == 0 || n == 0) return c;
  const float* ap = a.data_ptr<float>();
  const float* bp = b.data_ptr<float>();
  float* cp = c.data_ptr<float>();
  if (n > m) {
    const int64_t units = (n + kOutputsPerUnit - 1) / kOutputsPerUnit;
    at::parallel_for(0, units, 1, [&](int64_t begin, int64_t end) {
      kernels::cpu::Gemm(ap, k, m, k, bp, ldb, layout, begin * kOutputsPerUnit,
                         std::min(n, end * kOutputsPerUnit), cp, n);
    });
  } else {
    const int64_t units = (m + kRowsPerUnit - 1) / kRowsPerUnit;
    at::parallel_for(0, units, 1, [&](int64_t begin, int64_t end) {
      const int64_t r0 = begin * kRowsPerUnit, r1 = std::min(m, end * kRowsPerUnit);
      kernels::cpu::Gemm(ap + r0 * k, k, r1 - r0, k, bp, ldb, layout, 0, n, cp + r0 * n, n);
    });
  }
  return c;
}

// x @ w^T for a frozen w while autograd records x's graph: the forward and the backward (dx =
// dy @ w) both run through the packed GEMM. Only w is kept for the backward, not x.
class FrozenLinear : public torch::autograd::Function<FrozenLinear> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                            const at::Tensor& w) {
    const at::Tensor x2 = x.reshape({-1, w.size(1)}).contiguous();
    std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
    ctx->saved_data["w"] = w;
    ctx->saved_data["x_shape"] = shape;
    shape.back() = w.size(0);
    return ParallelGemm(x2, w, kernels::cpu::GemmB::kNK, w.size(0)).view(shape);
  }

  static torch::autograd::tensor_list backward(torch::autograd::AutogradContext* ctx,
                                               torch::autograd::tensor_list grads) {
    const at::Tensor w = ctx->saved_data["w"].toTensor();
    const std::vector<int64_t> shape = ctx->saved_data["x_shape"].toIntVector();
    const at::Tensor dy = grads[0].reshape({-1, w.size(0)}).contiguous();
    at::Tensor dx = ParallelGemm(dy, w, kernels::cpu::GemmB::kKN, w.size(1)).view(shape);
    return {dx, at::Tensor()};
  }
};

}  // namespace

bool UsesDenseKernel(const at::Tensor& x, const at::Tensor& w, const at::Tensor& bias) {
  if (!KernelShapes(x, w, bias)) return false;
  const bool needs_graph =
      x.requires_grad() || w.requires_grad() || (bias.defined() && bias.requires_grad());
  return !(at::GradMode::is_enabled() && needs_graph);
}

bool UsesFrozenGemm(const at::Tensor& x, const at::Tensor& w, const at::Tensor& bias) {
  return KernelShapes(x, w, bias) && at::GradMode::is_enabled() && x.requires_grad() &&
         !w.requires_grad() && !(bias.defined() && bias.requires_grad());
}

at::Tensor BaseLinear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& bias) {
  if (UsesFrozenGemm(x, w, bias)) {
    at::Tensor y = FrozenLinear::apply(x, w);
    return bias.defined() ? y + bias : y;
  }
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
