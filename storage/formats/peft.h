// PEFT LoRA adapter directories: `adapter_config.json` + `adapter_model.safetensors`, as written
// by Hugging Face PEFT's `save_pretrained`. Every LoRA feature PEFT saves is read and kept (DoRA
// magnitudes, lora_B biases, modules_to_save weights, trainable tokens, target_parameters,
// fan_in_fan_out, ...): tensors are validated against the config that declares them and written
// back unchanged. A consumer that cannot apply a feature refuses the adapter naming it
// (RefuseUnapplied), never by dropping tensors.
#ifndef LORADB_STORAGE_FORMATS_PEFT_H_
#define LORADB_STORAGE_FORMATS_PEFT_H_

#include <map>
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
// The blob metadata key under which an imported adapter_config.json is kept verbatim.
inline constexpr char kStoredConfigKey[] = "loradb.peft_adapter_config";

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
  // Features beyond plain LoRA. They are read from the file; FillJson writes back the ones a
  // conversion may change (target_parameters, target_modules) and raw_json keeps the rest.
  bool fan_in_fan_out =
      false;  // Conv1D-style [in, out] base weights; LoRA A/B stay [r, in] / [out, r]
  bool use_dora = false;
  bool lora_bias = false;
  std::string bias = "none";  // "none", "all" or "lora_only"
  std::vector<std::string> modules_to_save;
  // trainable_token_indices: module -> token ids; a plain list is stored under the key "".
  std::vector<std::pair<std::string, std::vector<int64_t>>> trainable_token_indices;
  std::vector<std::string> target_parameters;  // e.g. "mlp.experts.gate_up_proj"
  // PeftFeature bits of config-only features that change the math (layer_replication, ...).
  uint32_t config_features = 0;
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

// Parses adapter_config.json text. InvalidArgument for malformed JSON, a bad `r` / `lora_alpha`,
// bad patterns or a malformed feature field; Unimplemented for a peft_type other than LORA.
[[nodiscard]] absl::StatusOr<LoraConfig> ParseLoraConfig(const std::string& json_text);

enum class LoraSide : uint8_t { kA, kB };

// The features a PEFT LoRA adapter may use beyond plain LoRA on linear layers (bits).
enum PeftFeature : uint32_t {
  kFeatureEmbeddingLora = 1u << 0,     // lora_embedding_A / lora_embedding_B
  kFeatureDora = 1u << 1,              // use_dora: <module>.lora_magnitude_vector
  kFeatureLoraBias = 1u << 2,          // lora_bias: <module>.lora_B.bias
  kFeatureModulesToSave = 1u << 3,     // modules_to_save: whole-module weights
  kFeatureTrainableTokens = 1u << 4,   // trainable_token_indices: trainable_tokens_delta
  kFeatureTargetParameters = 1u << 5,  // target_parameters: LoRA on (expert) parameters
  kFeatureBias = 1u << 6,              // bias = "all" / "lora_only": trained base biases
  kFeatureBaseLayerWeights = 1u << 7,  // <module>.base_layer.weight (save_embedding_layers)
  kFeatureLayerReplication = 1u << 8,  // layer_replication
  kFeatureAlora = 1u << 9,             // alora_invocation_tokens (activated LoRA)
  kFeatureQalora = 1u << 10,           // use_qalora
  kFeatureBdLora = 1u << 11,           // use_bdlora
  kFeatureArrow = 1u << 12,            // arrow_config
  kFeatureKasa = 1u << 13,             // kasa_config
  kFeatureVelora = 1u << 14,           // velora_config
  kFeatureMonteclora = 1u << 15,       // monteclora_config
};

// The feature's name as PEFT spells it, e.g. "use_dora (lora_magnitude_vector)".
absl::string_view PeftFeatureName(PeftFeature feature);

// What one tensor of a PEFT adapter file is.
enum class PeftTensorKind : uint8_t {
  kLora,             // <module>.lora_A.weight / .lora_B.weight / .lora_embedding_A / _B
  kLoraBias,         // <module>.lora_B.bias
  kMagnitude,        // <module>.lora_magnitude_vector
  kTrainableTokens,  // <module>.token_adapter.trainable_tokens_delta
  kOther,            // any other weight: modules_to_save, base biases, base_layer weights
};

struct PeftTensorInfo {
  PeftTensorKind kind = PeftTensorKind::kOther;
  // Name inside the base model with any trailing ".base_layer" removed (kOther: the name
  // without its last component, e.g. "classifier" for "base_model.model.classifier.weight").
  std::string module_key;
  LoraSide side = LoraSide::kA;
  bool embedding = false;
  // kLora: how many ".base_layer" wrappers precede lora_A/B (target_parameters nesting: PEFT
  // wraps the module once per targeted parameter, the first registered parameter innermost).
  int depth = 0;
};

// Classifies a tensor name of a PEFT adapter file (never fails).
PeftTensorInfo ClassifyPeftTensor(const std::string& name);

// The PeftFeature bits the config itself declares as changing the math (use_dora and the
// config-only features such as layer_replication), and those one tensor named `name` uses.
// kFeatureTargetParameters counts only for tensors in PEFT's target_parameters layout (a
// revision stored in the per-expert layout does not use it).
uint32_t PeftConfigFeatures(const LoraConfig& config);
uint32_t PeftTensorFeatures(const LoraConfig& config, const std::string& name);
// PeftConfigFeatures plus PeftTensorFeatures of every tensor.
uint32_t PeftFeaturesUsed(const LoraConfig& config, const std::vector<TensorView>& tensors);

// The features a stored adapter uses: its tensors are named `names`, its config is the one kept
// in `metadata` under kStoredConfigKey (an import's adapter_config.json), else `fallback`.
// InvalidArgument when the kept config does not parse.
[[nodiscard]] absl::StatusOr<uint32_t> StoredAdapterFeatures(
    const LoraConfig& fallback, const std::map<std::string, std::string>& metadata,
    const std::vector<std::string>& names);

// OK when every bit of `used` is in `applied`; else Unimplemented: "<who> cannot apply <feature
// names> ...", naming every unapplied feature.
[[nodiscard]] absl::Status RefuseUnapplied(uint32_t used, uint32_t applied, absl::string_view who);

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

// Checks that `tensors` form a LoRA adapter `config` can describe: every module has exactly one A
// and one B, both 2-D, with ranks agreeing with each other and with config.RankFor(module_key)
// (for target_parameters, a multiple of it: PEFT stacks r per expert); DoRA magnitudes and
// lora_B biases are 1-D of the module's out size and need use_dora / lora_bias; trainable token
// deltas are [tokens, dim] with one row per configured index; any other tensor needs a config
// feature that saves it (modules_to_save, bias, a base_layer weight). InvalidArgument naming the
// first offending tensor.
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
