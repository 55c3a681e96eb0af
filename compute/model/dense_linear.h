// The base model's linear layers: x @ w^T (+ bias) through the CPU dense kernel where it applies.
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

}  // namespace loradb::model

#endif  // LORADB_COMPUTE_MODEL_DENSE_LINEAR_H_
