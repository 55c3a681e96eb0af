// Store::AddBase, the one place every base is registered (HTTP, CLI and C API all reach it):
// module tables and architectures outside ModelLimits are refused before the catalog is
// touched, and the store stays as it was.
#include <gtest/gtest.h>

#include <string>

#include "storage/store/store.h"
#include "storage/util/file_util.h"
#include "tests/test_util.h"

namespace loradb {
namespace {

using ::loradb::testing::TempDir;

TEST(StoreBaseLimits, RefusesOversizedBasesFromEveryForm) {
  TempDir dir;
  auto s = Store::Open(dir.file("store"));
  ASSERT_TRUE(s.ok()) << s.status();
  Store& store = **s;
  const std::string tables[] = {
      R"({"modules": [{"name": "a", "in": 4611686018427387904, "out": 16}]})",
      R"({"modules": [{"name": "a", "in": 16777216, "out": 16777216}]})",
      R"({"modules": [{"name": "a", "in": 0, "out": 16}]})",
      R"({"modules": [{"name": "", "in": 16, "out": 16}]})",
      R"({"modules": [{"name": "a", "in": 16, "out": 16}],
          "architecture": {"num_layers": 2147483647}})",
      R"({"modules": [{"name": "a", "in": 16, "out": 16}],
          "architecture": {"hidden_size": -1}})",
      R"({"modules": [{"name": "a", "in": 16, "out": 16}], "junk": )" + std::string(200, '[') +
          std::string(200, ']') + "}",
  };
  for (const std::string& t : tables) {
    auto b = store.AddBaseFromModuleTable("t", t);
    EXPECT_TRUE(absl::IsInvalidArgument(b.status())) << t << " -> " << b.status();
  }
  BaseRecord direct;
  direct.name = "d";
  direct.modules = {{"a", int64_t{1} << 40, 1}};
  EXPECT_TRUE(absl::IsInvalidArgument(store.AddBase(direct).status()));
  // The issue's config: every size huge; nothing is built from it.
  ASSERT_TRUE(WriteFileAtomic(dir.file("config.json"),
                              R"({"model_type":"qwen3","hidden_size":1099511627776,)"
                              R"("num_hidden_layers":2147483647,"num_attention_heads":1,)"
                              R"("num_key_value_heads":1,"head_dim":1099511627776,)"
                              R"("intermediate_size":1099511627776,"vocab_size":1099511627776})")
                  .ok());
  EXPECT_TRUE(
      absl::IsInvalidArgument(store.AddBaseFromConfig("c", dir.file("config.json")).status()));
  auto bases = store.ListBases();
  ASSERT_TRUE(bases.ok());
  EXPECT_TRUE(bases->empty());
  // In bounds: accepted.
  auto ok =
      store.AddBaseFromModuleTable("t", R"({"modules": [{"name": "a", "in": 16777216, "out": 4096}],
               "architecture": {"num_layers": 1024, "hidden_size": 131072}})");
  EXPECT_TRUE(ok.ok()) << ok.status();
}

}  // namespace
}  // namespace loradb
