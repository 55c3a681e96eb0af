// PEFT LoRA adapter directories: `adapter_config.json` + `adapter_model.safetensors`, as written
// by Hugging Face PEFT's `save_pretrained`. Only plain LoRA is supported; every config feature
// that changes the math or adds tensors (DoRA, modules_to_save, biases, fan_in_fan_out, ...) is
// refused with an error naming it, never dropped silently.
#ifndef LORADB_STORAGE_FORMATS_PEFT_H_
#define LORADB_STORAGE_FORMATS_PEFT_H_

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "storage/formats/tensor.h"

namespace loradb::peft {

inline constexpr char kConfigFile[] = "adapter_config.json";
inline constexpr char kWeightsFile[] = "adapter_model.safetensors";

// The LoRA part of a PEFT adapter_config.json.
struct LoraConfig {
  int r = 8;
  double lora_alpha = 8;
  bool use_rslora = false;
  // Module-key regex -> rank / alpha, in file order (PEFT takes the first pattern that matches).
  std::vector<std::pair<std::string, int>> rank_pattern;
  std::vector<std::pair<std::string, double>> alpha_pattern;
  // Module names, or one regex when `target_modules_is_regex` (PEFT accepts a string).
  std::vector<std::string> target_modules;
  bool target_modules_is_regex = false;
  std::string base_model_name_or_path;  // empty when null
  std::string task_type;                // empty when null
  // The adapter_config.json text this config was read from (empty for a config built in code).
  // WritePeftDir writes it back verbatim when the fields above still agree with it.
  std::string raw_json;

  // The rank and alpha PEFT gives `module_key` (e.g. "model.layers.3.self_attn.q_proj", the
  // module's name inside the base model): the first rank/alpha pattern `p` for which the whole
  // key matches `(.*\.)?(p)`, else r / lora_alpha.
  int RankFor(const std::string& module_key) const;
  double AlphaFor(const std::string& module_key) const;
  // LoRA scaling for `module_key`: alpha / r, or alpha / sqrt(r) with use_rslora.
  double ScaleFor(const std::string& module_key) const;

  // The adapter_config.json text for this config: `raw_json` when it agrees with the fields,
  // else a PEFT-style document (raw_json's other keys kept) with the fields written in.
  [[nodiscard]] absl::StatusOr<std::string> ToJson() const;
};

// Parses adapter_config.json text. InvalidArgument for malformed JSON, a missing or bad `r` /
// `lora_alpha`, bad patterns, or a peft_type other than LORA; Unimplemented naming the feature
// for use_dora, modules_to_save, bias != "none", fan_in_fan_out, lora_bias, layer_replication,
// trainable_token_indices, target_parameters, alora_invocation_tokens, use_qalora.
[[nodiscard]] absl::StatusOr<LoraConfig> ParseLoraConfig(const std::string& json_text);

enum class LoraSide : uint8_t { kA, kB };

// A parsed PEFT LoRA tensor name, e.g.
// "base_model.model.model.layers.3.self_attn.q_proj.lora_A.weight" ->
// module_key "model.layers.3.self_attn.q_proj", module "layers.3.self_attn.q_proj", side A.
struct PeftTensorName {
  std::string module_key;  // name inside the base model (what PEFT's patterns match)
  std::string module;      // module_key without a leading "model."
  LoraSide side = LoraSide::kA;
  bool embedding = false;  // lora_embedding_A / lora_embedding_B (no ".weight")
};

// Parses a PEFT LoRA tensor name; InvalidArgument when `name` is not one (e.g. a DoRA
// magnitude vector, a bias, or a modules_to_save weight).
[[nodiscard]] absl::StatusOr<PeftTensorName> ParsePeftTensorName(const std::string& name);

// The saved-file tensor name for `module_key` and `side` (inverse of ParsePeftTensorName).
std::string PeftTensorNameFor(const std::string& module_key, LoraSide side, bool embedding);

struct PeftAdapter {
  LoraConfig config;
  TensorSet tensors;  // named as in the file; views into the mapped adapter_model.safetensors
};

// Checks that `tensors` form a LoRA adapter `config` can describe: every name parses, every
// module has exactly one A and one B, both 2-D, with ranks agreeing with each other and with
// config.RankFor(module_key). InvalidArgument naming the first offending tensor.
[[nodiscard]] absl::Status ValidateLoraTensors(const LoraConfig& config,
                                               const std::vector<TensorView>& tensors);

// Reads `dir`/adapter_config.json and `dir`/adapter_model.safetensors, validated as above.
[[nodiscard]] absl::StatusOr<PeftAdapter> ReadPeftDir(const std::string& dir);

// Validates, then writes `dir`/adapter_config.json (config.ToJson()) and
// `dir`/adapter_model.safetensors (metadata {"format": "pt"}, as PEFT writes), creating `dir`
// if needed. Each file is written crash-safely.
[[nodiscard]] absl::Status WritePeftDir(const std::string& dir, const LoraConfig& config,
                                        const std::vector<TensorView>& tensors);

}  // namespace loradb::peft

namespace loradb {
using peft::LoraConfig;
using peft::PeftAdapter;
using peft::ReadPeftDir;
using peft::WritePeftDir;
}  // namespace loradb

#endif  // LORADB_STORAGE_FORMATS_PEFT_H_
