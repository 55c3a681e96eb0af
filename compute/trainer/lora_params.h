// A policy's trainable LoRA parameters: fp32 master factors A [r, in] and B [out, r] for every
// chosen module of a base, named as PEFT saves them
// (`base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight`), leaf tensors that require
// grad. The base itself is never touched. The model sees them through a model::LoraAdapter built
// over the same tensors (cast to the model dtype inside autograd), so gradients reach the master.
#ifndef LORADB_COMPUTE_TRAINER_LORA_PARAMS_H_
#define LORADB_COMPUTE_TRAINER_LORA_PARAMS_H_

#include <ATen/ATen.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "compute/model/lora.h"
#include "storage/formats/model_config.h"

namespace loradb::trainer {

// Which modules get LoRA and how it is scaled.
struct LoraConfig {
  int64_t rank = 8;
  double alpha = 16.0;
  bool use_rslora = false;  // scale alpha / sqrt(r) instead of alpha / r
  // Last name component of the modules to adapt (PEFT's target_modules).
  std::vector<std::string> target_modules = {"q_proj",    "k_proj",  "v_proj",   "o_proj",
                                             "gate_proj", "up_proj", "down_proj"};
  // Fused MoE expert parameters to adapt (PEFT's target_parameters, e.g. "gate_up_proj",
  // "mlp.experts.down_proj"). Each expert gets one A per parameter, shared by the parameter's
  // parts (gate_proj and up_proj of gate_up_proj), and one B per part: exactly what PEFT's
  // fused factors express, so the trained adapter exports in that layout. When set, the experts
  // are adapted only through it and target_modules may not name the experts' parts (gate_proj,
  // up_proj, down_proj), which peft on transformers 5 would read as the fused parameters.
  std::vector<std::string> target_parameters;
  // The applied scale: alpha / r, or alpha / sqrt(r) with rsLoRA.
  double Scale() const;
};

// InvalidArgument when rank < 1, alpha <= 0 or neither a target module nor a target parameter is
// given; Unimplemented for targets the model cannot adapt (embed_tokens, lm_head, the MoE router).
[[nodiscard]] absl::Status ValidateLoraConfig(const LoraConfig& config);

// PEFT tensor names of a module.
std::string LoraAName(const std::string& module);
std::string LoraBName(const std::string& module);

class LoraParameters {
 public:
  struct Module {
    std::string name;  // `layers.0.self_attn.q_proj`
    int64_t in = 0, out = 0;
    at::Tensor a, b;  // fp32 masters, requires_grad
  };

  // One module per base module whose last name component is in `lora.target_modules`
  // (InvalidArgument naming a target module that matches none), plus the per-expert modules of
  // `lora.target_parameters` (InvalidArgument on a base without experts or for a parameter its
  // experts lack). A is drawn uniformly from +-1/sqrt(in) (PEFT's kaiming-uniform bound) from
  // `seed`; B is zero, so the adapter starts as the identity.
  [[nodiscard]] static absl::StatusOr<LoraParameters> Create(const ModelConfig& base,
                                                             const LoraConfig& lora, uint64_t seed,
                                                             at::Device device = at::kCPU);

  const LoraConfig& config() const { return config_; }
  const std::vector<Module>& modules() const { return modules_; }
  // Every trained factor by PEFT name (the same tensors as modules()); a shared expert A appears
  // once, under its first part's name.
  const std::map<std::string, at::Tensor>& named() const { return named_; }
  // The other parts' names of shared expert A factors -> the name in named() they share.
  const std::map<std::string, std::string>& shared() const { return shared_; }
  int64_t num_parameters() const;

  // An adapter over the masters for a model computing in `dtype` (the cast is part of the
  // autograd graph, so backward through the model fills the masters' .grad).
  [[nodiscard]] absl::StatusOr<model::LoraAdapter> BuildAdapter(const ModelConfig& base,
                                                                at::ScalarType dtype,
                                                                at::Device device) const;

  // Changes the applied scaling (alpha, rsLoRA) without touching the factors, e.g. when a
  // checkpoint trained with other settings is restored. InvalidArgument when alpha <= 0.
  [[nodiscard]] absl::Status SetScaling(double alpha, bool use_rslora);

  // Overwrites the masters from `values` (by PEFT name). InvalidArgument, with nothing changed,
  // when a name is missing or extra or a shape differs.
  [[nodiscard]] absl::Status Assign(const std::map<std::string, at::Tensor>& values);

 private:
  LoraConfig config_;
  std::vector<Module> modules_;
  std::map<std::string, std::string> shared_;
  std::map<std::string, at::Tensor> named_;
};

}  // namespace loradb::trainer

#endif  // LORADB_COMPUTE_TRAINER_LORA_PARAMS_H_
