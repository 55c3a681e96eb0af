// The decoder's per-row operations between linear layers (RMS norm, rotary embedding, the gated
// MLP's SiLU product) through the CPU kernels, where LibTorch would run several small operations
// each: at 8 decode rows bench-60m's forward made ~45 LibTorch calls per layer between its
// linears, ~2.4 ms of a ~16 ms step.
#ifndef LORADB_COMPUTE_MODEL_POINTWISE_H_
#define LORADB_COMPUTE_MODEL_POINTWISE_H_

#include <ATen/ATen.h>

#include <initializer_list>

namespace loradb::model {

// Whether the kernels below take these tensors: every one fp32, on the CPU, contiguous, and no
// autograd graph is being recorded through any of them (inference, or a no-grad pass).
bool UsesPointwiseKernels(std::initializer_list<at::Tensor> tensors);

// The functions below take tensors UsesPointwiseKernels accepts, shaped as each says.

// w * (x / sqrt(mean(x^2, last dim) + eps)), a new tensor shaped as x; w has x's last dimension.
at::Tensor RmsNormKernel(const at::Tensor& x, const at::Tensor& w, double eps);

// In place: x [rows, heads, head_dim] = x * cos + rotate_half(x) * sin with cos, sin
// [rows, head_dim], head_dim even; returns x.
at::Tensor& RopeKernel(at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

// In place into g: g = silu(g) * u (g and u of one shape); returns g.
at::Tensor& SiluMulKernel(at::Tensor& g, const at::Tensor& u);

}  // namespace loradb::model

#endif  // LORADB_COMPUTE_MODEL_POINTWISE_H_
