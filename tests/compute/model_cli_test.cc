// `loradb model init-random`: the output layer's std (default 1/sqrt(hidden), --lm-head-std) as
// drawn into the written checkpoint, and the rejection of bad values.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "tests/test_paths.h"
#include "absl/strings/str_cat.h"
#include "compute/model/checkpoint.h"
#include "tests/compute/cli_test_util.h"
#include "tests/test_util.h"

namespace loradb {
namespace {

using testing::Cli;
using testing::CliRun;
using testing::TempDir;

std::string Config(const std::string& name) {
  return std::string(LORADB_SOURCE_DIR) + "/compute/configs/" + name + ".json";
}

// `loradb model init-random --config CONFIG OUT --json EXTRA`.
CliRun InitRandom(const TempDir& dir, const std::string& config, const std::string& out,
                  const std::string& extra) {
  return Cli(
      dir, dir.file("store"),
      absl::StrCat("model init-random --config '", Config(config), "' '", out, "' --json ", extra));
}

// The sample std (about a zero mean) of an F32 tensor of the checkpoint in `dir`.
double SampleStd(const std::string& dir, const std::string& tensor) {
  absl::StatusOr<TensorSet> set = model::ReadCheckpointTensors(dir);
  EXPECT_TRUE(set.ok()) << set.status();
  if (!set.ok()) return -1;
  const TensorView* v = set->Find(tensor);
  EXPECT_NE(v, nullptr) << tensor;
  if (v == nullptr) return -1;
  EXPECT_EQ(v->dtype, DType::kF32);
  const float* x = reinterpret_cast<const float*>(v->data);
  const size_t n = v->nbytes / sizeof(float);
  double sum_sq = 0;
  for (size_t i = 0; i < n; ++i) sum_sq += static_cast<double>(x[i]) * x[i];
  return std::sqrt(sum_sq / static_cast<double>(n));
}

TEST(ModelInitRandomCli, DefaultOutputLayerStdIsOneOverSqrtHidden) {
  TempDir dir;
  const std::string out = dir.file("base");
  CliRun r = InitRandom(dir, "tiny-dense", out, "--seed 3");
  ASSERT_EQ(r.rc, 0) << r.err;
  const double want = 1.0 / std::sqrt(128.0);  // tiny-dense: hidden_size 128
  nlohmann::json doc = nlohmann::json::parse(r.out);
  EXPECT_NEAR(doc["lm_head_std"].get<double>(), want, 1e-12);
  // lm_head.weight is 1024 x 128: the sample std is within ~0.2% of the drawn one; 5% is loose.
  EXPECT_NEAR(SampleStd(out, "lm_head.weight"), want, 0.05 * want);
  // Every other linear and the embeddings keep 0.02.
  EXPECT_NEAR(SampleStd(out, "model.embed_tokens.weight"), 0.02, 0.05 * 0.02);
  EXPECT_NEAR(SampleStd(out, "model.layers.0.mlp.up_proj.weight"), 0.02, 0.05 * 0.02);
}

TEST(ModelInitRandomCli, LmHeadStdFlagSetsTheOutputLayerOnly) {
  TempDir dir;
  for (double std : {0.02, 0.3}) {
    const std::string out = dir.file(absl::StrCat("base-", std));
    CliRun r = InitRandom(dir, "tiny-dense", out, absl::StrCat("--seed 3 --lm-head-std ", std));
    ASSERT_EQ(r.rc, 0) << r.err;
    EXPECT_NEAR(nlohmann::json::parse(r.out)["lm_head_std"].get<double>(), std, 1e-12);
    EXPECT_NEAR(SampleStd(out, "lm_head.weight"), std, 0.05 * std);
    EXPECT_NEAR(SampleStd(out, "model.embed_tokens.weight"), 0.02, 0.05 * 0.02);
  }
}

TEST(ModelInitRandomCli, RejectsABadLmHeadStdAndWritesNothing) {
  TempDir dir;
  for (const char* bad : {"0", "-0.1", "nan", "inf", "-inf", "abc", "''"}) {
    const std::string out = dir.file("base");
    CliRun r = InitRandom(dir, "tiny-dense", out, absl::StrCat("--lm-head-std ", bad));
    EXPECT_NE(r.rc, 0) << bad;
    EXPECT_NE(r.err.find("lm-head-std"), std::string::npos) << bad << ": " << r.err;
    EXPECT_FALSE(std::filesystem::exists(out)) << bad;
  }
}

TEST(ModelInitRandomCli, TiedConfigHasNoSeparateOutputLayer) {
  TempDir dir;
  // tiny-moe ties lm_head to the embeddings: an explicit std is an error, the default is a no-op.
  const std::string out = dir.file("moe");
  CliRun bad = InitRandom(dir, "tiny-moe", out, "--lm-head-std 0.1");
  EXPECT_NE(bad.rc, 0);
  EXPECT_NE(bad.err.find("tie_word_embeddings"), std::string::npos) << bad.err;
  EXPECT_FALSE(std::filesystem::exists(out));
  CliRun ok = InitRandom(dir, "tiny-moe", out, "");
  ASSERT_EQ(ok.rc, 0) << ok.err;
  EXPECT_TRUE(nlohmann::json::parse(ok.out)["lm_head_std"].is_null());
  absl::StatusOr<TensorSet> set = model::ReadCheckpointTensors(out);
  ASSERT_TRUE(set.ok()) << set.status();
  EXPECT_EQ(set->Find("lm_head.weight"), nullptr);
}

}  // namespace
}  // namespace loradb
