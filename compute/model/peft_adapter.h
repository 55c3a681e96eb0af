// PEFT LoRA adapter directories as LoraAdapters for the Qwen3 model: reads the directory through
// storage's PEFT reader, takes each module's scale from its config (lora_alpha / r, or
// / sqrt(r) with use_rslora; rank_pattern / alpha_pattern honoured), and validates the modules
// against the base.
#ifndef LORADB_COMPUTE_MODEL_PEFT_ADAPTER_H_
#define LORADB_COMPUTE_MODEL_PEFT_ADAPTER_H_

#include <ATen/ATen.h>

#include <string>

#include "absl/status/statusor.h"
#include "compute/model/lora.h"
#include "storage/formats/model_config.h"
#include "storage/formats/peft.h"

namespace loradb::model {

// The adapter in `peft` as factors of `dtype` (copied out of the file's views). Errors: those of
// LoraAdapter::Create (module names, shapes), Unimplemented for embedding LoRA.
[[nodiscard]] absl::StatusOr<LoraAdapter> LoraAdapterFromPeft(const ModelConfig& config,
                                                              const peft::PeftAdapter& peft,
                                                              at::ScalarType dtype);

// Reads `dir` (adapter_config.json + adapter_model.safetensors) and converts it as above.
[[nodiscard]] absl::StatusOr<LoraAdapter> LoadPeftAdapter(const ModelConfig& config,
                                                          const std::string& dir,
                                                          at::ScalarType dtype);

}  // namespace loradb::model

#endif  // LORADB_COMPUTE_MODEL_PEFT_ADAPTER_H_
