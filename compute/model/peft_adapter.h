// PEFT LoRA adapters as LoraAdapters for the Qwen3 model: reads a directory through storage's
// PEFT reader (or takes a stored revision's tensors), takes each module's scale from its config
// (lora_alpha / r, or / sqrt(r) with use_rslora; rank_pattern / alpha_pattern honoured), and
// validates the modules against the base. Beyond plain LoRA on projections the model applies
// DoRA, embedding LoRA, LoRA on lm_head, modules_to_save of embed_tokens / lm_head and saved
// base_layer weights equal to the base's (kAppliedPeftFeatures); target_parameters adapters are
// converted to per-expert LoRA; any other feature refuses the adapter by name.
#ifndef LORADB_COMPUTE_MODEL_PEFT_ADAPTER_H_
#define LORADB_COMPUTE_MODEL_PEFT_ADAPTER_H_

#include <ATen/ATen.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "compute/model/lora.h"
#include "compute/model/qwen3_model.h"
#include "storage/formats/model_config.h"
#include "storage/formats/peft.h"

namespace loradb::model {

// The PEFT features (peft::PeftFeature bits) the model applies.
inline constexpr uint32_t kAppliedPeftFeatures = peft::kFeatureDora | peft::kFeatureModulesToSave |
                                                 peft::kFeatureEmbeddingLora |
                                                 peft::kFeatureBaseLayerWeights;

// One tensor of a PEFT adapter, named as in adapter_model.safetensors.
struct PeftNamedTensor {
  std::string name;
  at::Tensor tensor;
};

// The LoraAdapter::Create inputs of a PEFT adapter in the per-module layout.
struct PeftModelInputs {
  std::vector<LoraModuleInput> modules;
  std::vector<LoraWeightInput> weights;
};

// Sorts `tensors` into LoRA modules (scales from `config`), DoRA magnitudes, modules_to_save and
// base_layer weights. InvalidArgument (prefixed by `who`) for a module lacking lora_A or lora_B,
// a DoRA magnitude without LoRA factors; Unimplemented for tensors of features the model does not
// apply (callers refuse those by name first with peft::RefuseUnapplied) and for modules_to_save
// of modules other than embed_tokens and lm_head.
[[nodiscard]] absl::StatusOr<PeftModelInputs> PeftInputs(const peft::LoraConfig& config,
                                                         std::vector<PeftNamedTensor> tensors,
                                                         const std::string& who);

// The adapter in `peft` as factors of `dtype` (copied out of the file's views), not yet prepared
// (Qwen3Model::PrepareAdapter). A target_parameters adapter is converted to per-expert LoRA for
// `config`'s experts first. Errors: Unimplemented naming each PEFT feature the model does not
// apply; those of PeftInputs, peft::UnfuseTargetParameters and LoraAdapter::Create.
[[nodiscard]] absl::StatusOr<LoraAdapter> LoraAdapterFromPeft(const ModelConfig& config,
                                                              const peft::PeftAdapter& peft,
                                                              at::ScalarType dtype);

// Reads `dir` (adapter_config.json + adapter_model.safetensors), converts it as above for
// `model` and prepares it for that model.
[[nodiscard]] absl::StatusOr<LoraAdapter> LoadPeftAdapter(const Qwen3Model& model,
                                                          const std::string& dir);

}  // namespace loradb::model

#endif  // LORADB_COMPUTE_MODEL_PEFT_ADAPTER_H_
