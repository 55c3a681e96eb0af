// The base model's linear layers and a LoRA's delta through the CPU kernels where they apply.
#ifndef LORADB_COMPUTE_MODEL_DENSE_LINEAR_H_
#define LORADB_COMPUTE_MODEL_DENSE_LINEAR_H_

#include <ATen/ATen.h>

namespace loradb::model {

// at::linear(x, w, bias) on fp32 CPU tensors with a contiguous 2-D w, where the CPU has the
// kernels' vector code, computed across LibTorch's intra-op threads by
// - kernels::cpu::DenseLinear when no autograd graph is being recorded (inference): it streams
//   the weights once without BLAS's packing copy (decode reads every weight for a few rows) and
//   gives each row the same result whatever batch it is in;
// - kernels::cpu::Gemm when autograd records x's graph through a frozen w (training a LoRA on a
//   frozen base): the forward and the backward's dx = dy @ w run on packed panels near the FMA
//   units' peak, and this product's graph node holds only w (at::linear's would hold x too);
// and by at::linear otherwise (w or bias trained, other dtypes or devices).
at::Tensor BaseLinear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& bias = {});

// Whether BaseLinear(x, w, bias) takes the dense kernel.
bool UsesDenseKernel(const at::Tensor& x, const at::Tensor& w, const at::Tensor& bias = {});

// Whether BaseLinear(x, w, bias) takes the GEMM under autograd.
bool UsesFrozenGemm(const at::Tensor& x, const at::Tensor& w, const at::Tensor& bias = {});

// A LoRA's delta scale * (x @ a^T) @ b^T (a [r, in], b [out, r]). While autograd records it on
// fp32 CPU tensors (training), forward and backward run through the dense kernel and the GEMM
// (LibTorch would give BLAS rank-r products it runs far below peak); otherwise LibTorch's
// at::linear, as written.
at::Tensor LoraDelta(const at::Tensor& x, const at::Tensor& a, const at::Tensor& b, double scale);

// Whether LoraDelta(x, a, b, scale) takes the CPU kernels.
bool UsesLoraKernels(const at::Tensor& x, const at::Tensor& a, const at::Tensor& b);

}  // namespace loradb::model

#endif  // LORADB_COMPUTE_MODEL_DENSE_LINEAR_H_
