// A tiny random Qwen3 base for the trainer's tests, written once per test binary.
#ifndef LORADB_TESTS_COMPUTE_TRAINER_TEST_UTIL_H_
#define LORADB_TESTS_COMPUTE_TRAINER_TEST_UTIL_H_

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "compute/model/checkpoint.h"
#include "compute/model/qwen3_model.h"
#include "storage/formats/model_config.h"
#include "tests/test_util.h"

namespace loradb::testing {

// The tiny dense config (compute/configs/tiny-dense.json) with fp32 random weights (seed 7),
// loaded once and shared (read-only) by every test of the binary.
inline const model::Qwen3Model& TinyTrainerModel() {
  static TempDir* dir = new TempDir();
  static std::unique_ptr<model::Qwen3Model> m = [] {
    // One intra-op thread: the tiny model's ops are too small to gain from more, and it keeps
    // losses reproducible regardless of the machine's core count.
    at::set_num_threads(1);
    auto config =
        ReadModelConfig(std::string(LORADB_SOURCE_DIR) + "/compute/configs/tiny-dense.json");
    EXPECT_TRUE(config.ok()) << config.status();
    // Two layers keep the learning tests fast on two cores.
    config->num_hidden_layers = 2;
    absl::Status s = model::WriteRandomCheckpoint(*config, dir->path(), 7, at::kFloat);
    EXPECT_TRUE(s.ok()) << s;
    auto loaded = model::Qwen3Model::Load(dir->path());
    EXPECT_TRUE(loaded.ok()) << loaded.status();
    return std::move(loaded).value();
  }();
  return *m;
}

}  // namespace loradb::testing

#endif  // LORADB_TESTS_COMPUTE_TRAINER_TEST_UTIL_H_
