#include "compute/baselines/gather_bmm.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <exception>
#include <string>

namespace loradb::compute::baselines {

namespace {

at::Tensor Wrap(const float* p, at::IntArrayRef shape) {
  return at::from_blob(const_cast<float*>(p), shape, at::TensorOptions().dtype(at::kFloat));
}

}  // namespace

absl::Status GatherBmmLora(const float* x, const float* a, const float* b, const int32_t* idx,
                           const float* scales, int64_t rows, int64_t in, int64_t out, int64_t rank,
                           int64_t num_adapters, float* y) {
  if (rows < 0 || in <= 0 || out <= 0 || rank <= 0 || num_adapters <= 0) {
    return absl::InvalidArgumentError("GatherBmmLora: sizes must be positive");
  }
  if (rows == 0) return absl::OkStatus();
  try {
    at::Tensor index =
        at::from_blob(const_cast<int32_t*>(idx), {rows}, at::TensorOptions().dtype(at::kInt))
            .to(at::kLong);
    at::Tensor has = index.ge(0);
    index = index.clamp_min(0);
    if (index.max().item<int64_t>() >= num_adapters) {
      return absl::InvalidArgumentError("GatherBmmLora: adapter index >= num_adapters");
    }
    at::Tensor ta = Wrap(a, {num_adapters, rank, in}).index_select(0, index);   // [rows, r, in]
    at::Tensor tb = Wrap(b, {num_adapters, out, rank}).index_select(0, index);  // [rows, out, r]
    at::Tensor tx = Wrap(x, {rows, in, 1});
    at::Tensor t = at::bmm(ta, tx);                // [rows, r, 1]
    at::Tensor delta = at::bmm(tb, t).squeeze(2);  // [rows, out]
    at::Tensor s = Wrap(scales, {num_adapters}).index_select(0, index) * has.to(at::kFloat);
    Wrap(y, {rows, out}).add_(delta * s.unsqueeze(1));
  } catch (const std::exception& e) {
    return absl::InternalError(std::string("GatherBmmLora: ") + e.what());
  }
  return absl::OkStatus();
}

absl::Status TorchLinear(const float* x, const float* w, int64_t rows, int64_t in, int64_t out,
                         float* y) {
  if (rows < 0 || in <= 0 || out <= 0) {
    return absl::InvalidArgumentError("TorchLinear: sizes must be positive");
  }
  if (rows == 0) return absl::OkStatus();
  try {
    at::Tensor ty = Wrap(y, {rows, out});
    at::mm_out(ty, Wrap(x, {rows, in}), Wrap(w, {out, in}).t());
  } catch (const std::exception& e) {
    return absl::InternalError(std::string("TorchLinear: ") + e.what());
  }
  return absl::OkStatus();
}

int TorchNumThreads() { return at::get_num_threads(); }

}  // namespace loradb::compute::baselines
