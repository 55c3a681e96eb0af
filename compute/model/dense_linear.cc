#include "compute/model/dense_linear.h"

#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <utility>
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

// fn(j_begin, j_end) over [0, n) in units of kOutputsPerUnit, across LibTorch's intra-op threads.
template <typename Fn>
void ParallelOverOutputs(int64_t n, const Fn& fn) {
  const int64_t units = (n + kOutputsPerUnit - 1) / kOutputsPerUnit;
  at::parallel_for(0, units, 1, [&](int64_t begin, int64_t end) {
    fn(begin * kOutputsPerUnit, std::min(n, end * kOutputsPerUnit));
  });
}

// A(i, p) of a contiguous 2-D tensor stored as `layout` says: its [m, k].
std::pair<int64_t, int64_t> GemmRowsDepth(const at::Tensor& a, kernels::cpu::GemmA layout) {
  return layout == kernels::cpu::GemmA::kMK ? std::pair{a.size(0), a.size(1)}
                                            : std::pair{a.size(1), a.size(0)};
}

// c [m, n] = A @ B across LibTorch's intra-op threads, A and B contiguous 2-D fp32 tensors read
// as the layouts say. Threads split the rows, or the columns when there are more of them: each
// thread packs its own panels, and splitting the longer side duplicates the smaller packing.
at::Tensor ParallelGemm(const at::Tensor& a, kernels::cpu::GemmA a_layout, const at::Tensor& b,
                        kernels::cpu::GemmB b_layout) {
  const auto [m, k] = GemmRowsDepth(a, a_layout);
  const int64_t n = b_layout == kernels::cpu::GemmB::kNK ? b.size(0) : b.size(1);
  const int64_t lda = a.size(1), ldb = b.size(1);
  at::Tensor c = at::empty({m, n}, a.options());
  if (m == 0 || n == 0) return c;
  const float* ap = a.data_ptr<float>();
  const float* bp = b.data_ptr<float>();
  float* cp = c.data_ptr<float>();
  if (n > m) {
    ParallelOverOutputs(n, [&](int64_t j0, int64_t j1) {
      kernels::cpu::Gemm(ap, lda, a_layout, m, k, bp, ldb, b_layout, j0, j1, cp, n);
    });
  } else {
    const int64_t units = (m + kRowsPerUnit - 1) / kRowsPerUnit;
    at::parallel_for(0, units, 1, [&](int64_t begin, int64_t end) {
      const int64_t r0 = begin * kRowsPerUnit, r1 = std::min(m, end * kRowsPerUnit);
      const float* a0 = a_layout == kernels::cpu::GemmA::kMK ? ap + r0 * lda : ap + r0;
      kernels::cpu::Gemm(a0, lda, a_layout, r1 - r0, k, bp, ldb, b_layout, 0, n, cp + r0 * n, n);
    });
  }
  return c;
}

// x2 [rows, k] @ w^T (w [n, k]) by the dense kernel across LibTorch's intra-op threads.
at::Tensor ParallelDense(const at::Tensor& x2, const at::Tensor& w) {
  const int64_t k = w.size(1), n = w.size(0), rows = x2.size(0);
  at::Tensor y = at::empty({rows, n}, x2.options());
  if (rows == 0) return y;
  const float* xp = x2.data_ptr<float>();
  const float* wp = w.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  ParallelOverOutputs(n, [&](int64_t j0, int64_t j1) {
    kernels::cpu::DenseLinear(xp, rows, k, k, wp, j0, j1, yp, n);
  });
  return y;
}

// A tensor's sizes with the last one replaced.
std::vector<int64_t> WithLast(const at::Tensor& t, int64_t last) {
  std::vector<int64_t> shape(t.sizes().begin(), t.sizes().end());
  shape.back() = last;
  return shape;
}

// x @ w^T for a frozen w while autograd records x's graph: the forward and the backward (dx =
// dy @ w) both run through the packed GEMM. Only w is kept for the backward, not x.
class FrozenLinear : public torch::autograd::Function<FrozenLinear> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                            const at::Tensor& w) {
    const at::Tensor x2 = x.reshape({-1, w.size(1)}).contiguous();
    ctx->saved_data["w"] = w;
    ctx->saved_data["x_shape"] = x.sizes().vec();
    return ParallelGemm(x2, kernels::cpu::GemmA::kMK, w, kernels::cpu::GemmB::kNK)
        .view(WithLast(x, w.size(0)));
  }

  static torch::autograd::tensor_list backward(torch::autograd::AutogradContext* ctx,
                                               torch::autograd::tensor_list grads) {
    const at::Tensor w = ctx->saved_data["w"].toTensor();
    const std::vector<int64_t> shape = ctx->saved_data["x_shape"].toIntVector();
    const at::Tensor dy = grads[0].reshape({-1, w.size(0)}).contiguous();
    at::Tensor dx =
        ParallelGemm(dy, kernels::cpu::GemmA::kMK, w, kernels::cpu::GemmB::kKN).view(shape);
    return {dx, at::Tensor()};
  }
};

// A LoRA's delta scale * (x @ a^T) @ b^T (a [r, in], b [out, r]) while autograd records it: the
// rank-r products run through the dense kernel and the GEMM in both directions, where LibTorch
// would hand BLAS skinny products it runs far below the FMA units' peak. Keeps x, a, b and
// ts = scale * x @ a^T for the backward:
//   dts = dd @ b, dt = scale * dts, db = dd^T @ ts, da = dt^T @ x, dx = dt @ a.
class LoraDeltaFn : public torch::autograd::Function<LoraDeltaFn> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                            const at::Tensor& a, const at::Tensor& b, double scale) {
    const at::Tensor x2 = x.reshape({-1, a.size(1)}).contiguous();
    const at::Tensor ts = ParallelDense(x2, a).mul_(scale);
    ctx->save_for_backward({x2, a, b, ts});
    ctx->saved_data["scale"] = scale;
    ctx->saved_data["x_shape"] = x.sizes().vec();
    return ParallelGemm(ts, kernels::cpu::GemmA::kMK, b, kernels::cpu::GemmB::kNK)
        .view(WithLast(x, b.size(0)));
  }

  static torch::autograd::tensor_list backward(torch::autograd::AutogradContext* ctx,
                                               torch::autograd::tensor_list grads) {
    using kernels::cpu::GemmA;
    using kernels::cpu::GemmB;
    const torch::autograd::variable_list saved = ctx->get_saved_variables();
    const at::Tensor &x2 = saved[0], &a = saved[1], &b = saved[2], &ts = saved[3];
    const double scale = ctx->saved_data["scale"].toDouble();
    const at::Tensor dd = grads[0].reshape({-1, b.size(0)}).contiguous();
    const at::Tensor dt = ParallelDense(dd, b.t().contiguous()).mul_(scale);
    at::Tensor dx, da, db;
    if (ctx->needs_input_grad(0)) {
      dx = ParallelGemm(dt, GemmA::kMK, a, GemmB::kKN)
               .view(ctx->saved_data["x_shape"].toIntVector());
    }
    if (ctx->needs_input_grad(1)) da = ParallelGemm(dt, GemmA::kKM, x2, GemmB::kKN);
    if (ctx->needs_input_grad(2))
      db = ParallelGemm(ts, GemmA::kKM, dd, GemmB::kKN).t().contiguous();
    return {dx, da, db, at::Tensor()};
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

bool UsesLoraKernels(const at::Tensor& x, const at::Tensor& a, const at::Tensor& b) {
  return KernelShapes(x, a, at::Tensor()) && KernelShapes(a.t(), b, at::Tensor()) &&
         at::GradMode::is_enabled() &&
         (x.requires_grad() || a.requires_grad() || b.requires_grad());
}

at::Tensor LoraDelta(const at::Tensor& x, const at::Tensor& a, const at::Tensor& b, double scale) {
  if (UsesLoraKernels(x, a, b)) return LoraDeltaFn::apply(x, a, b, scale);
  return at::linear(at::linear(x, a), b) * scale;
}

at::Tensor BaseLinear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& bias) {
  if (UsesFrozenGemm(x, w, bias)) {
    at::Tensor y = FrozenLinear::apply(x, w);
    return bias.defined() ? y + bias : y;
  }
  if (!UsesDenseKernel(x, w, bias)) return at::linear(x, w, bias);
  at::Tensor y = ParallelDense(x.reshape({-1, w.size(1)}).contiguous(), w);
  if (bias.defined()) y.add_(bias);
  return y.view(WithLast(x, w.size(0)));
}

}  // namespace loradb::model
