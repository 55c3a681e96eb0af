// Hugging Face checkpoint directories of a Qwen3 base: reading their tensors (through storage's
// safetensors reader, zero-copy over memory maps) and writing random-initialised ones.
#ifndef LORADB_COMPUTE_MODEL_CHECKPOINT_H_
#define LORADB_COMPUTE_MODEL_CHECKPOINT_H_

#include <ATen/ATen.h>

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "storage/formats/model_config.h"
#include "storage/formats/tensor.h"

namespace loradb::model {

// The tensors of `dir`: model.safetensors.index.json (sharded) when present, else
// model.safetensors. NotFound when neither exists; the reader's errors otherwise.
[[nodiscard]] absl::StatusOr<TensorSet> ReadCheckpointTensors(const std::string& dir);

// The std of linear and embedding weights in a random checkpoint.
inline constexpr double kDefaultInitStd = 0.02;

// Writes `dir`/config.json and `dir`/model.safetensors for `config` with weights drawn from a
// CPU generator seeded with `seed` (same seed, same bytes): linear and embedding weights
// N(0, std^2), RMSNorm weights 1 + N(0, 0.1^2) so that a missing norm shows in an oracle test.
// `dtype` is at::kFloat, at::kBFloat16 or at::kHalf. Creates `dir` if needed. `lm_head_std` > 0
// draws the output layer from N(0, lm_head_std^2) instead (same draw order): with a small hidden
// size, std 0.02 bounds every logit at ~0.02 * hidden, too flat a distribution to sample from;
// 1/sqrt(hidden) gives logits of unit variance, a bound of ~sqrt(hidden).
[[nodiscard]] absl::Status WriteRandomCheckpoint(const ModelConfig& config, const std::string& dir,
                                                 uint64_t seed, at::ScalarType dtype,
                                                 double std = kDefaultInitStd,
                                                 double lm_head_std = 0);

// The output layer's std `loradb model init-random` draws by default: 1/sqrt(hidden_size), so the
// logits have unit variance at init (see WriteRandomCheckpoint; docs/trainer.md explains why 0.02
// leaves a tiny base too flat to train with GRPO).
double DefaultLmHeadStd(const ModelConfig& config);

}  // namespace loradb::model

#endif  // LORADB_COMPUTE_MODEL_CHECKPOINT_H_
