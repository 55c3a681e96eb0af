// Tiny random Qwen3 bases for the trainer's tests, written once per test binary.
#ifndef LORADB_TESTS_COMPUTE_TRAINER_TEST_UTIL_H_
#define LORADB_TESTS_COMPUTE_TRAINER_TEST_UTIL_H_

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>

#include "tests/test_paths.h"
#include "compute/model/checkpoint.h"
#include "compute/model/qwen3_model.h"
#include "storage/formats/model_config.h"
#include "tests/test_util.h"

namespace loradb::testing {

// The tiny dense config (compute/configs/tiny-dense.json) with two layers and fp32 random
// weights (seed 7) in `dir`; `unit_logits` draws the output layer from N(0, 1/hidden) instead of
// N(0, 0.02^2) like every other linear.
inline std::unique_ptr<model::Qwen3Model> MakeTinyTrainerModel(const std::string& dir,
                                                               bool unit_logits) {
  // One intra-op thread: the tiny model's ops are too small to gain from more, and it keeps
  // losses reproducible regardless of the machine's core count.
  at::set_num_threads(1);
  auto config =
      ReadModelConfig(std::string(LORADB_SOURCE_DIR) + "/compute/configs/tiny-dense.json");
  EXPECT_TRUE(config.ok()) << config.status();
  // Two layers keep the learning tests fast on two cores.
  config->num_hidden_layers = 2;
  const double lm_head_std =
      unit_logits ? 1.0 / std::sqrt(static_cast<double>(config->hidden_size)) : 0.0;
  absl::Status s = model::WriteRandomCheckpoint(*config, dir, 7, at::kFloat, 0.02, lm_head_std);
  EXPECT_TRUE(s.ok()) << s;
  auto loaded = model::Qwen3Model::Load(dir);
  EXPECT_TRUE(loaded.ok()) << loaded.status();
  return std::move(loaded).value();
}

// The tiny base (every linear N(0, 0.02^2)), loaded once and shared (read-only) by every test of
// the binary. Its output layer bounds every logit at ~0.02 * 128 = 2.6 (the final RMSNorm fixes
// |h| ~ sqrt(128)), so no adapter can give a token more than ~1.3% of the probability: fine for
// argmax accuracy and DPO margins, too flat to sample rewards from at temperature 1.
inline const model::Qwen3Model& TinyTrainerModel() {
  static TempDir* dir = new TempDir();
  static std::unique_ptr<model::Qwen3Model> m = MakeTinyTrainerModel(dir->path(), false);
  return *m;
}

// The same base with the output layer drawn from N(0, 1/128) (logits of unit variance at init,
// a bound of ~11 nats): a policy trained on it can become confident, as a real model's logits
// are, so sampled rollouts earn what its argmax would.
inline const model::Qwen3Model& TinyUnitLogitModel() {
  static TempDir* dir = new TempDir();
  static std::unique_ptr<model::Qwen3Model> m = MakeTinyTrainerModel(dir->path(), true);
  return *m;
}

}  // namespace loradb::testing

#endif  // LORADB_TESTS_COMPUTE_TRAINER_TEST_UTIL_H_
