#include "compute/model/torch_dtype.h"

#include "absl/strings/str_cat.h"

namespace loradb::model {

absl::StatusOr<at::ScalarType> TorchScalarType(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return at::kFloat;
    case DType::kBF16:
      return at::kBFloat16;
    case DType::kF16:
      return at::kHalf;
    case DType::kF64:
      return at::kDouble;
    case DType::kI64:
      return at::kLong;
    case DType::kI32:
      return at::kInt;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("dtype ", DTypeName(dtype),
                       " has no LibTorch type here (F32, BF16, F16, F64, I64, I32)"));
  }
}

absl::StatusOr<at::ScalarType> TorchFloatScalarType(DType dtype, absl::string_view what) {
  if (dtype != DType::kF32 && dtype != DType::kBF16 && dtype != DType::kF16) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " has dtype ", DTypeName(dtype), "; expected F32, BF16 or F16"));
  }
  return TorchScalarType(dtype);
}

}  // namespace loradb::model
