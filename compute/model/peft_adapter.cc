#include "compute/model/peft_adapter.h"

#include <cstring>
#include <map>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "compute/model/torch_dtype.h"
#include "storage/formats/peft_experts.h"
#include "storage/util/status_macros.h"

namespace loradb::model {
namespace {

absl::StatusOr<at::Tensor> CopyView(const TensorView& v) {
  LORADB_ASSIGN_OR_RETURN(
      at::ScalarType st,
      TorchFloatScalarType(v.dtype, absl::StrCat("adapter tensor \"", v.name, "\"")));
  // Views may be unaligned for the dtype: copy bytewise into a fresh tensor.
  at::Tensor t = at::empty(v.shape, at::TensorOptions(st));
  std::memcpy(t.data_ptr(), v.data, v.nbytes);
  return t;
}

// "model.layers.0.self_attn.q_proj" -> "layers.0.self_attn.q_proj" (the model's module names).
std::string ModelModuleName(std::string key) {
  if (absl::StartsWith(key, "model.")) key.erase(0, 6);
  return key;
}

}  // namespace

absl::StatusOr<PeftModelInputs> PeftInputs(const peft::LoraConfig& config,
                                           std::vector<PeftNamedTensor> tensors,
                                           const std::string& who) {
  struct Module {
    std::string key;
    at::Tensor a, b, magnitude;
  };
  std::map<std::string, Module> modules;
  PeftModelInputs out;
  for (PeftNamedTensor& t : tensors) {
    const peft::PeftTensorInfo info = peft::ClassifyPeftTensor(t.name);
    switch (info.kind) {
      case peft::PeftTensorKind::kLora: {
        LORADB_ASSIGN_OR_RETURN(peft::PeftTensorName n, peft::ParsePeftTensorName(t.name));
        Module& m = modules[n.module];
        m.key = n.module_key;
        (n.side == peft::LoraSide::kA ? m.a : m.b) = std::move(t.tensor);
        break;
      }
      case peft::PeftTensorKind::kMagnitude: {
        Module& m = modules[ModelModuleName(info.module_key)];
        m.key = info.module_key;
        m.magnitude = std::move(t.tensor);
        break;
      }
      case peft::PeftTensorKind::kOther: {
        const bool base_layer = absl::EndsWith(t.name, ".base_layer.weight");
        if (!base_layer && !absl::EndsWith(t.name, ".weight")) {
          return absl::UnimplementedError(
              absl::StrCat(who, ": tensor \"", t.name, "\" (a module's bias) is not applied"));
        }
        std::string key = info.module_key;
        if (base_layer) key.resize(key.size() - std::strlen(".base_layer"));
        out.weights.push_back({ModelModuleName(key), std::move(t.tensor), base_layer});
        break;
      }
      default:
        return absl::UnimplementedError(
            absl::StrCat(who, ": tensor \"", t.name, "\" belongs to a PEFT feature not applied"));
    }
  }
  for (auto& [name, m] : modules) {
    if (!m.a.defined() || !m.b.defined()) {
      return absl::InvalidArgumentError(
          absl::StrCat(who, ": module \"", name, "\" lacks lora_A or lora_B",
                       m.magnitude.defined() ? " (it has a DoRA magnitude vector)" : ""));
    }
    out.modules.push_back(
        {name, std::move(m.a), std::move(m.b), config.ScaleFor(m.key), std::move(m.magnitude)});
  }
  return out;
}

absl::StatusOr<LoraAdapter> LoraAdapterFromPeft(const ModelConfig& config,
                                                const peft::PeftAdapter& adapter,
                                                at::ScalarType dtype) {
  const peft::LoraConfig* lora = &adapter.config;
  const TensorSet* set = &adapter.tensors;
  peft::LoraConfig per_expert;
  std::optional<TensorSet> unfused;
  if (!adapter.config.target_parameters.empty()) {
    // LoRA on fused expert parameters: served as the per-expert LoRA it is equal to.
    if (!config.is_moe()) {
      return absl::InvalidArgumentError(absl::StrCat("target_parameters adapter on a ",
                                                     config.model_type, " base without experts"));
    }
    LORADB_ASSIGN_OR_RETURN(unfused,
                            peft::UnfuseTargetParameters(
                                adapter.config, adapter.tensors,
                                peft::Qwen3MoeExpertsLayout(config.num_experts, config.hidden_size,
                                                            config.moe_intermediate_size),
                                &per_expert));
    lora = &per_expert;
    set = &*unfused;
  }
  // A PEFT feature the model does not apply refuses the adapter by name (never dropped).
  LORADB_RETURN_IF_ERROR(peft::RefuseUnapplied(peft::PeftFeaturesUsed(*lora, set->tensors()),
                                               kAppliedPeftFeatures,
                                               "the model's PEFT adapter loader"));
  std::vector<PeftNamedTensor> tensors;
  for (const TensorView& v : set->tensors()) {
    LORADB_ASSIGN_OR_RETURN(at::Tensor t, CopyView(v));
    tensors.push_back({v.name, std::move(t)});
  }
  LORADB_ASSIGN_OR_RETURN(PeftModelInputs in,
                          PeftInputs(*lora, std::move(tensors), "PEFT adapter"));
  return LoraAdapter::Create(config, std::move(in.modules), dtype, at::kCPU, std::move(in.weights));
}

absl::StatusOr<LoraAdapter> LoadPeftAdapter(const Qwen3Model& model, const std::string& dir) {
  LORADB_ASSIGN_OR_RETURN(peft::PeftAdapter adapter, peft::ReadPeftDir(dir));
  try {
    LORADB_ASSIGN_OR_RETURN(LoraAdapter a,
                            LoraAdapterFromPeft(model.config(), adapter, model.dtype()));
    LORADB_RETURN_IF_ERROR(model.PrepareAdapter(&a));
    return a;
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("PEFT adapter: ", e.what_without_backtrace()));
  }
}

}  // namespace loradb::model
