// Torch-free entry points to the Qwen3 model for the `loradb model` CLI and scripts: writing a
// random checkpoint, describing a checkpoint, computing logits. Nothing here exposes LibTorch
// types, so callers outside compute/ can include it.
#ifndef LORADB_COMPUTE_MODEL_MODEL_TOOLS_H_
#define LORADB_COMPUTE_MODEL_MODEL_TOOLS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "storage/formats/model_config.h"
#include "storage/util/hash.h"

namespace loradb::model {

// "f32", "bf16" or "f16"; InvalidArgument otherwise.
[[nodiscard]] absl::Status CheckDTypeName(const std::string& dtype);

// Reads the config at `config_path` (file or directory) and writes a random checkpoint to
// `out_dir` (see WriteRandomCheckpoint). Returns the new checkpoint's weights fingerprint.
[[nodiscard]] absl::StatusOr<Hash128> InitRandomCheckpoint(const std::string& config_path,
                                                           const std::string& out_dir,
                                                           uint64_t seed, const std::string& dtype);

struct ModelSummary {
  ModelConfig config;
  Hash128 fingerprint;
  int64_t num_parameters = 0;
  std::string dtype;  // the checkpoint's compute dtype: "f32", "bf16", "f16"
};
[[nodiscard]] absl::StatusOr<ModelSummary> DescribeModel(const std::string& model_dir);

struct LogitsRequest {
  std::string model_dir;
  std::vector<int64_t> token_ids;
  // Tokens run as one prefill through the KV cache; the rest are decoded one at a time with
  // the cache. <= 0 or >= token count: one full-sequence forward without a cache.
  int64_t prefill = 0;
  // Compute dtype ("f32", "bf16", "f16"); empty: the checkpoint's.
  std::string dtype;
};
// Logits at every position, [tokens][vocab], as fp32.
[[nodiscard]] absl::StatusOr<std::vector<std::vector<float>>> ComputeLogits(
    const LogitsRequest& request);

}  // namespace loradb::model

#endif  // LORADB_COMPUTE_MODEL_MODEL_TOOLS_H_
