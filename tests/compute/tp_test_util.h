// Shared by the TP tests: a tiny config whose heads divide by 2 and 4, and a random base with a
// store holding three adapters on it.
#ifndef LORADB_TESTS_COMPUTE_TP_TEST_UTIL_H_
#define LORADB_TESTS_COMPUTE_TP_TEST_UTIL_H_

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "tests/test_paths.h"
#include "absl/strings/str_cat.h"
#include "compute/distributed/process_group.h"
#include "compute/distributed/tp_decode.h"
#include "compute/model/checkpoint.h"
#include "storage/store/store.h"
#include "tests/compute/cli_test_util.h"
#include "tests/test_util.h"

namespace loradb::distributed {

using ::loradb::testing::Cli;
using ::loradb::testing::CliRun;
using ::loradb::testing::Slurp;
using ::loradb::testing::TempDir;

// tiny-dense / tiny-moe with 8 heads and 4 KV heads (head_dim 16).
inline ModelConfig TpConfig(const std::string& name) {
  absl::StatusOr<ModelConfig> c =
      ReadModelConfig(std::string(LORADB_SOURCE_DIR) + "/compute/configs/" + name + ".json");
  EXPECT_TRUE(c.ok()) << c.status();
  c->num_attention_heads = 8;
  c->num_key_value_heads = 4;
  c->head_dim = 16;
  return *c;
}

// A random base and a store with three adapters on it (the MoE ones packed).
struct TpFixture {
  TempDir dir;
  ModelConfig config;
  TpDecodeOptions options;

  explicit TpFixture(const std::string& name) {
    config = TpConfig(name);
    options.model_dir = dir.file("model");
    options.store_dir = dir.file("store");
    EXPECT_TRUE(model::WriteRandomCheckpoint(config, options.model_dir, 5, at::kFloat).ok());
    absl::StatusOr<std::unique_ptr<Store>> store = Store::Open(options.store_dir);
    EXPECT_TRUE(store.ok()) << store.status();
    EXPECT_TRUE((*store)
                    ->AddBaseFromConfig("tiny", options.model_dir + "/config.json",
                                        options.model_dir + "/model.safetensors")
                    .ok());
    for (uint64_t seed = 1; seed <= 3; ++seed) {
      absl::StatusOr<TensorSet> t = MakeRandomLoraTensors(config, 4, seed);
      EXPECT_TRUE(t.ok()) << t.status();
      PublishOptions o;
      o.create_policy_base = "tiny";
      o.lora.r = 4;
      o.lora.alpha = static_cast<float>(4 + 2 * seed);
      o.lora.use_rslora = seed == 2;
      o.pack = config.is_moe();
      absl::StatusOr<RevisionRecord> rev =
          (*store)->PublishTensors("p" + std::to_string(seed), t->tensors(), o);
      EXPECT_TRUE(rev.ok()) << rev.status();
      if (rev.ok()) options.revisions.push_back(rev->id);
    }
    options.sequences = 8;  // adapters 0,1,2, base, 0,1,2, base
    options.prompt_len = 5;
    options.steps = 4;
  }
};

// max |a - b| / max |b|.
inline double MaxRelErr(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0, scale = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::abs(static_cast<double>(a[i]) - b[i]));
    scale = std::max(scale, std::abs(static_cast<double>(b[i])));
  }
  return diff / scale;
}

}  // namespace loradb::distributed

#endif  // LORADB_TESTS_COMPUTE_TP_TEST_UTIL_H_
