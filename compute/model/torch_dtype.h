// Storage dtypes (storage/formats/tensor.h) as LibTorch scalar types: the one mapping compute/
// uses, so a dtype added on one side is added everywhere at once.
#ifndef LORADB_COMPUTE_MODEL_TORCH_DTYPE_H_
#define LORADB_COMPUTE_MODEL_TORCH_DTYPE_H_

#include <c10/core/ScalarType.h>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "storage/formats/tensor.h"

namespace loradb::model {

// The at:: scalar type of `dtype`: F32, BF16, F16, F64, I64 and I32 have one; InvalidArgument
// naming the dtype for the others (unsigned, bool, I8/I16, FP8).
[[nodiscard]] absl::StatusOr<at::ScalarType> TorchScalarType(DType dtype);

// The same for the float dtypes weights and LoRA factors come in (F32, BF16, F16 only):
// InvalidArgument "<what> has dtype <D>; expected F32, BF16 or F16" for any other, where `what`
// names the tensor (e.g. `adapter tensor "x"`).
[[nodiscard]] absl::StatusOr<at::ScalarType> TorchFloatScalarType(DType dtype,
                                                                  absl::string_view what);

}  // namespace loradb::model

#endif  // LORADB_COMPUTE_MODEL_TORCH_DTYPE_H_
