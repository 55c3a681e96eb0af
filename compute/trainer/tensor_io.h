// Conversions between LibTorch tensors and storage's TensorView / TensorSet, for checkpoints
// and revisions: named tensors go out as CPU, contiguous copies in a chosen dtype that the
// returned object owns; views come back in as fresh tensors (never aliasing the source bytes).
#ifndef LORADB_COMPUTE_TRAINER_TENSOR_IO_H_
#define LORADB_COMPUTE_TRAINER_TENSOR_IO_H_

#include <ATen/ATen.h>

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "storage/formats/tensor.h"

namespace loradb::trainer {

// Named tensors materialised on the CPU with views over them. Movable; the views stay valid
// while the object lives (tensor storage does not move when the vector does).
struct OwnedTensorViews {
  std::vector<at::Tensor> owned;
  std::vector<TensorView> views;
};

// Copies each tensor to a contiguous CPU tensor of `dtype` (F32, BF16, F16 or I64) and makes a
// view named by its key. InvalidArgument for an unsupported dtype.
[[nodiscard]] absl::StatusOr<OwnedTensorViews> ToViews(
    const std::map<std::string, at::Tensor>& tensors, DType dtype);

// A new tensor holding a copy of `view`'s bytes, converted to `dtype` on `device`.
[[nodiscard]] absl::StatusOr<at::Tensor> FromView(const TensorView& view, at::ScalarType dtype,
                                                  at::Device device = at::kCPU);

}  // namespace loradb::trainer

#endif  // LORADB_COMPUTE_TRAINER_TENSOR_IO_H_
