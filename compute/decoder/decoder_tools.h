// Torch-free entry point to the decoder for the `loradb generate` CLI: loads a model, opens the
// store when an adapter is named, runs the requests to completion through Decoder (kernel LoRA
// applier) and returns the results. Nothing here exposes LibTorch types.
#ifndef LORADB_COMPUTE_DECODER_DECODER_TOOLS_H_
#define LORADB_COMPUTE_DECODER_DECODER_TOOLS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace loradb::decoder {

struct GenerateToolRequest {
  std::string model_dir;
  // The store; opened (never created) only when some prompt names an adapter.
  std::string store_dir;
  // One entry per prompt: "" (base), "POLICY:ALIAS", "POLICY@SEQ" or a revision id.
  std::vector<std::string> adapters;
  std::vector<std::vector<int64_t>> prompts;
  int64_t max_new_tokens = 16;
  std::vector<int64_t> stop_token_ids;
  double temperature = 0;
  int64_t top_k = 0;
  double top_p = 1.0;
  uint64_t seed = 0;  // request i uses seed + i
  bool record_logits = false;
  // Compute dtype ("f32", "bf16", "f16"); empty: the checkpoint's.
  std::string dtype;
};

struct GenerateToolResult {
  uint64_t revision = 0;
  std::vector<int64_t> tokens;
  std::string finish;  // "length" | "stop"
  int64_t deferred_steps = 0;
  std::vector<std::vector<float>> logits;  // with record_logits
};

// All prompts are submitted at once and decoded together (one batch). A request that fails
// fails the call with its error.
[[nodiscard]] absl::StatusOr<std::vector<GenerateToolResult>> RunGenerate(
    const GenerateToolRequest& request);

}  // namespace loradb::decoder

#endif  // LORADB_COMPUTE_DECODER_DECODER_TOOLS_H_
