// compute/model/torch_dtype.h: the one storage dtype -> at::ScalarType mapping.
#include "compute/model/torch_dtype.h"

#include <gtest/gtest.h>

#include <string>
#include <utility>

namespace loradb::model {
namespace {

TEST(TorchDTypeTest, MapsEveryDTypeLibTorchHas) {
  const std::pair<DType, at::ScalarType> cases[] = {
      {DType::kF32, at::kFloat},  {DType::kBF16, at::kBFloat16}, {DType::kF16, at::kHalf},
      {DType::kF64, at::kDouble}, {DType::kI64, at::kLong},      {DType::kI32, at::kInt}};
  for (const auto& [d, t] : cases) {
    absl::StatusOr<at::ScalarType> got = TorchScalarType(d);
    ASSERT_TRUE(got.ok()) << DTypeName(d) << ": " << got.status();
    EXPECT_EQ(*got, t) << DTypeName(d);
  }
}

TEST(TorchDTypeTest, OthersAreAClearError) {
  for (DType d : {DType::kBool, DType::kU8, DType::kI8, DType::kU16, DType::kF8E4M3}) {
    absl::StatusOr<at::ScalarType> got = TorchScalarType(d);
    EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument) << DTypeName(d);
    EXPECT_NE(got.status().message().find(std::string(DTypeName(d))), absl::string_view::npos)
        << got.status();
  }
}

TEST(TorchDTypeTest, FloatVariantAcceptsOnlyWeightDTypes) {
  for (DType d : {DType::kF32, DType::kBF16, DType::kF16}) {
    absl::StatusOr<at::ScalarType> got = TorchFloatScalarType(d, "x");
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(*got, *TorchScalarType(d));
  }
  for (DType d : {DType::kF64, DType::kI64, DType::kI32, DType::kU8}) {
    absl::StatusOr<at::ScalarType> got = TorchFloatScalarType(d, "adapter tensor \"t\"");
    EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument) << DTypeName(d);
    EXPECT_NE(got.status().message().find("adapter tensor \"t\" has dtype "),
              absl::string_view::npos)
        << got.status();
  }
}

}  // namespace
}  // namespace loradb::model
