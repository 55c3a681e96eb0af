#include "storage/formats/detect.h"

#include <gtest/gtest.h>

#include "storage/formats/blob.h"
#include "storage/formats/safetensors.h"
#include "storage/util/file_util.h"
#include "tests/test_util.h"

namespace loradb {
namespace {

TEST(DetectTest, SharedFilesAndWrittenFiles) {
  const std::string jl = testing::TestData("safetensors/safetensors_jl/");
  EXPECT_EQ(*DetectTensorFormat(jl + "non_sharded/model.safetensors"), TensorFormat::kSafetensors);
  EXPECT_EQ(*DetectTensorFormat(jl + "sharded/model.safetensors.index.json"),
            TensorFormat::kShardedIndex);
  EXPECT_EQ(*DetectTensorFormat(
                testing::TestData("safetensors/safetensors_cpp/abuse_attempt_1.safetensors")),
            TensorFormat::kSafetensors);  // the reader then rejects it

  testing::TempDir dir;
  ASSERT_TRUE(WriteFileAtomic(dir.file("b"), *SerializeBlob({}, {})).ok());
  EXPECT_EQ(*DetectTensorFormat(dir.file("b")), TensorFormat::kBlob);
  ASSERT_TRUE(WriteFileAtomic(dir.file("index"), "  {\"weight_map\": {}}").ok());
  EXPECT_EQ(*DetectTensorFormat(dir.file("index")), TensorFormat::kShardedIndex);
  // A safetensors file whose header length starts with the byte '{' (123) stays safetensors.
  std::string header = "{\"__metadata__\":{\"k\":\"" + std::string(97, 'x') + "\"}}";
  header.resize(123, ' ');
  std::string st(8, '\0');
  st[0] = static_cast<char>(header.size());
  ASSERT_EQ(st[0], '{');
  ASSERT_TRUE(WriteFileAtomic(dir.file("s"), st + header).ok());
  EXPECT_EQ(*DetectTensorFormat(dir.file("s")), TensorFormat::kSafetensors);
  EXPECT_TRUE(safetensors::ReadFile(dir.file("s")).ok());

  EXPECT_EQ(DetectTensorFormat(dir.path()).status().code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(WriteFileAtomic(dir.file("adapter_config.json"), "{}").ok());
  EXPECT_EQ(*DetectTensorFormat(dir.path()), TensorFormat::kPeftDir);
  EXPECT_EQ(DetectTensorFormat(dir.file("nope")).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(TensorFormatName(TensorFormat::kShardedIndex), "sharded");
}

}  // namespace
}  // namespace loradb
