#include "compute/trainer/tensor_io.h"

#include "absl/strings/str_cat.h"
#include "compute/model/torch_dtype.h"
#include "storage/util/status_macros.h"

namespace loradb::trainer {

absl::StatusOr<OwnedTensorViews> ToViews(const std::map<std::string, at::Tensor>& tensors,
                                         DType dtype) {
  LORADB_ASSIGN_OR_RETURN(at::ScalarType st, model::TorchScalarType(dtype));
  OwnedTensorViews out;
  out.owned.reserve(tensors.size());
  out.views.reserve(tensors.size());
  for (const auto& [name, t] : tensors) {
    if (!t.defined()) return absl::InvalidArgumentError(absl::StrCat("tensor ", name, " is empty"));
    at::Tensor c = t.detach().to(at::kCPU, st).contiguous();
    if (c.data_ptr() == t.data_ptr()) c = c.clone();  // never alias a live parameter
    TensorView v;
    v.name = name;
    v.dtype = dtype;
    v.shape.assign(c.sizes().begin(), c.sizes().end());
    v.data = static_cast<const std::byte*>(c.data_ptr());
    v.nbytes = static_cast<size_t>(c.nbytes());
    out.owned.push_back(std::move(c));
    out.views.push_back(std::move(v));
  }
  return out;
}

absl::StatusOr<at::Tensor> FromView(const TensorView& view, at::ScalarType dtype,
                                    at::Device device) {
  LORADB_ASSIGN_OR_RETURN(at::ScalarType src, model::TorchScalarType(view.dtype));
  LORADB_ASSIGN_OR_RETURN(uint64_t nbytes, CheckedNumBytes(view.shape, view.dtype));
  if (nbytes != view.nbytes) {
    return absl::InvalidArgumentError(absl::StrCat("tensor ", view.name, " has ", view.nbytes,
                                                   " bytes but its shape ", ShapeString(view.shape),
                                                   " needs ", nbytes));
  }
  at::Tensor t = at::empty(view.shape, at::TensorOptions().dtype(src));
  if (nbytes > 0) std::memcpy(t.data_ptr(), view.data, nbytes);
  return t.to(device, dtype);
}

}  // namespace loradb::trainer
