// The base model's linear layers: x @ w^T (+ bias) through the CPU dense kernel where it applies.
#ifndef LORADB_COMPUTE_MODEL_DENSE_LINEAR_H_
#define LORADB_COMPUTE_MODEL_DENSE_LINEAR_H_

#include <ATen/ATen.h>

namespace loradb::model {

// at::linear(x, w, bias), computed by kernels::cpu::DenseLinear across LibTorch's intra-op
// threads when no autograd graph is being recorded and x, w (and bias) are fp32 CPU tensors with
// a contiguous 2-D w and the CPU has the kernel's vector code; otherwise by at::linear. The dense
// kernel streams the weights once without BLAS's packing copy (decode reads every weight for a
// few rows) and gives each row the same result whatever batch it is in.
at::Tensor BaseLinear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& bias = {});

// Whether BaseLinear(x, w, bias) takes the dense kernel.
bool UsesDenseKernel(const at::Tensor& x, const at::Tensor& w, const at::Tensor& bias = {});

}  // namespace loradb::model

#endif  // LORADB_COMPUTE_MODEL_DENSE_LINEAR_H_
