// Torch-free entry points to the Qwen3 model for the `loradb model` CLI and scripts: writing a
// random checkpoint, describing a checkpoint, computing logits. Nothing here exposes LibTorch
// types, so callers outside compute/ can include it.
#ifndef LORADB_COMPUTE_MODEL_MODEL_TOOLS_H_
#define LORADB_COMPUTE_MODEL_MODEL_TOOLS_H_

#include <cstdint>
#include <optional>
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
// `lm_head_std` is the std of lm_head.weight: unset means DefaultLmHeadStd (1/sqrt(hidden));
// a given value must be finite and > 0, and is InvalidArgument for a config that ties lm_head to
// the embeddings (there is no separate output layer to draw). Bad arguments write nothing.
// `lm_head_std_used`, when not null, receives the std drawn (0 for a tied config).
[[nodiscard]] absl::StatusOr<Hash128> InitRandomCheckpoint(
    const std::string& config_path, const std::string& out_dir, uint64_t seed,
    const std::string& dtype, std::optional<double> lm_head_std = std::nullopt,
    double* lm_head_std_used = nullptr);

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
  // A PEFT LoRA adapter directory applied to every token; empty: base only.
  std::string adapter_dir;
};
// Logits at every position, [tokens][vocab], as fp32.
[[nodiscard]] absl::StatusOr<std::vector<std::vector<float>>> ComputeLogits(
    const LogitsRequest& request);

// One decode-throughput measurement: `batch` sequences prefilled with `prompt_len` random tokens
// in one batched forward, then `steps` greedy decode steps through the KV cache, every step one
// forward of `batch` rows. Rows use `num_adapters` distinct random rank-`rank` adapters on every
// q/k/v/o/gate/up/down projection (0: base only; adapters assigned round-robin to sequences),
// applied by the kernels (applier "kernel") or the torch reference ("torch").
struct DecodeBenchOptions {
  std::string model_dir;
  int64_t batch = 16;
  int64_t prompt_len = 16;
  int64_t steps = 8;
  int64_t num_adapters = 0;
  int64_t rank = 16;
  std::string applier = "kernel";
  // Adapter factor dtype: "f32" or "bf16" (the serving layout).
  std::string adapter_dtype = "f32";
  uint64_t seed = 1;
  // LibTorch intra-op threads and the kernels' CPU threads; <= 0 leaves LibTorch's setting.
  int threads = 1;
};
struct DecodeBenchResult {
  double prefill_tokens_per_s = 0;
  double decode_tokens_per_s = 0;
  double decode_step_ms_p50 = 0;
  int64_t kernel_calls = 0;
  int64_t fallback_calls = 0;
};
[[nodiscard]] absl::StatusOr<DecodeBenchResult> RunDecodeBenchmark(
    const DecodeBenchOptions& options);

}  // namespace loradb::model

#endif  // LORADB_COMPUTE_MODEL_MODEL_TOOLS_H_
