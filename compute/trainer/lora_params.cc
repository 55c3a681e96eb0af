#include "compute/trainer/lora_params.h"

#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "compute/trainer/rng.h"
#include "storage/formats/peft.h"
#include "storage/formats/peft_experts.h"
#include "storage/formats/tensor.h"
#include "storage/util/status_macros.h"

namespace loradb::trainer {
namespace {

std::string LastComponent(const std::string& name) {
  const size_t dot = name.rfind('.');
  return dot == std::string::npos ? name : name.substr(dot + 1);
}

at::Tensor UniformTensor(Rng* rng, int64_t rows, int64_t cols, double bound) {
  at::Tensor t = at::empty({rows, cols}, at::kFloat);
  float* p = t.data_ptr<float>();
  for (int64_t i = 0; i < rows * cols; ++i) {
    p[i] = static_cast<float>((2.0 * rng->Uniform() - 1.0) * bound);
  }
  return t;
}

}  // namespace

double LoraConfig::Scale() const {
  return use_rslora ? alpha / std::sqrt(static_cast<double>(rank))
                    : alpha / static_cast<double>(rank);
}

absl::Status ValidateLoraConfig(const LoraConfig& config) {
  if (config.rank < 1) {
    return absl::InvalidArgumentError(absl::StrCat("LoRA rank must be >= 1, got ", config.rank));
  }
  if (!(config.alpha > 0)) {
    return absl::InvalidArgumentError(absl::StrCat("LoRA alpha must be > 0, got ", config.alpha));
  }
  if (config.target_modules.empty() && config.target_parameters.empty()) {
    return absl::InvalidArgumentError("LoRA needs at least one target module or parameter");
  }
  static const std::set<std::string> kUnsupported = {"embed_tokens", "lm_head", "gate"};
  for (const auto& t : config.target_modules) {
    if (kUnsupported.count(t)) {
      return absl::UnimplementedError(absl::StrCat(
          "the model cannot apply LoRA to '", t, "' (supported: q/k/v/o_proj, gate/up/down_proj)"));
    }
  }
  return absl::OkStatus();
}

std::string LoraAName(const std::string& module) {
  return absl::StrCat("base_model.model.model.", module, ".lora_A.weight");
}
std::string LoraBName(const std::string& module) {
  return absl::StrCat("base_model.model.model.", module, ".lora_B.weight");
}

absl::StatusOr<LoraParameters> LoraParameters::Create(const ModelConfig& base,
                                                      const LoraConfig& lora, uint64_t seed,
                                                      at::Device device) {
  LORADB_RETURN_IF_ERROR(ValidateLoraConfig(lora));
  const std::set<std::string> targets(lora.target_modules.begin(), lora.target_modules.end());
  LoraParameters p;
  p.config_ = lora;
  Rng rng(seed);
  const auto new_a = [&](int64_t in) {
    const double bound = 1.0 / std::sqrt(static_cast<double>(in));
    return UniformTensor(&rng, lora.rank, in, bound).to(device).set_requires_grad(true);
  };
  const auto add = [&](std::string name, int64_t in, int64_t out, at::Tensor a) {
    Module mod;
    mod.name = std::move(name);
    mod.in = in;
    mod.out = out;
    mod.a = std::move(a);
    mod.b = at::zeros({out, lora.rank}, at::TensorOptions().dtype(at::kFloat).device(device))
                .set_requires_grad(true);
    p.named_[LoraBName(mod.name)] = mod.b;
    p.modules_.push_back(std::move(mod));
    return &p.modules_.back();
  };
  const bool fused_experts = !lora.target_parameters.empty();
  std::set<std::string> matched;
  for (const ModuleShape& m : base.LoraModules()) {
    const std::string last = LastComponent(m.name);
    if (!targets.count(last) || m.name.rfind("layers.", 0) != 0) continue;
    if (fused_experts && absl::StrContains(m.name, ".mlp.experts.")) continue;
    matched.insert(last);
    const Module* mod = add(m.name, m.in, m.out, new_a(m.in));
    p.named_[LoraAName(mod->name)] = mod->a;
  }
  if (fused_experts) {
    if (!base.is_moe()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "target_parameters [", absl::StrJoin(lora.target_parameters, ", "),
          "]: the base has no experts (LoRA on fused expert parameters needs a MoE base)"));
    }
    const peft::ExpertsLayout layout =
        peft::Qwen3MoeExpertsLayout(base.num_experts, base.hidden_size, base.moe_intermediate_size);
    peft::LoraConfig wanted;
    wanted.target_parameters = lora.target_parameters;
    LORADB_ASSIGN_OR_RETURN(std::vector<size_t> params, peft::TargetedParameters(wanted, layout));
    // peft (on transformers 5) reads these target_modules of a MoE base as the experts' fused
    // parameters, so an adapter naming both would load differently there: refused.
    for (const peft::ExpertParameter& param : layout.params) {
      for (const auto& [part, rows] : param.parts) {
        if (targets.count(part)) {
          return absl::InvalidArgumentError(absl::StrCat(
              "target module '", part, "' with target_parameters on a MoE base: peft reads it as ",
              "the experts' ", param.name, "; adapt the experts through target_parameters only"));
        }
      }
    }
    for (int64_t l = 0; l < base.num_hidden_layers; ++l) {
      if (!base.IsMoeLayer(l)) continue;
      for (int64_t e = 0; e < base.num_experts; ++e) {
        for (size_t i : params) {
          const peft::ExpertParameter& param = layout.params[i];
          // One A per expert and parameter, shared by its parts; named under the first part.
          const at::Tensor a = new_a(param.in);
          std::string first;
          for (const auto& [part, rows] : param.parts) {
            const Module* mod =
                add(absl::StrCat("layers.", l, ".", layout.module, ".", e, ".", part), param.in,
                    rows, a);
            if (first.empty()) {
              first = LoraAName(mod->name);
              p.named_[first] = a;
            } else {
              p.shared_[LoraAName(mod->name)] = first;
            }
          }
        }
      }
    }
  }
  std::vector<std::string> unmatched;
  for (const auto& t : targets) {
    if (!matched.count(t)) unmatched.push_back(t);
  }
  if (!unmatched.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("target modules not in the base: ", absl::StrJoin(unmatched, ", ")));
  }
  return p;
}

int64_t LoraParameters::num_parameters() const {
  int64_t n = 0;
  for (const auto& [name, t] : named_) n += t.numel();
  return n;
}

absl::StatusOr<model::LoraAdapter> LoraParameters::BuildAdapter(const ModelConfig& base,
                                                                at::ScalarType dtype,
                                                                at::Device device) const {
  std::vector<model::LoraModuleInput> inputs;
  inputs.reserve(modules_.size());
  const double scale = config_.Scale();
  for (const Module& m : modules_) {
    model::LoraModuleInput in;
    in.module = m.name;
    // Differentiable casts: the adapter's factors are functions of the masters.
    in.a = m.a.to(device, dtype);
    in.b = m.b.to(device, dtype);
    in.scale = scale;
    inputs.push_back(std::move(in));
  }
  return model::LoraAdapter::Create(base, std::move(inputs), dtype, device);
}

absl::Status LoraParameters::SetScaling(double alpha, bool use_rslora) {
  if (!(alpha > 0) || !std::isfinite(alpha)) {
    return absl::InvalidArgumentError(absl::StrCat("LoRA alpha must be > 0, got ", alpha));
  }
  config_.alpha = alpha;
  config_.use_rslora = use_rslora;
  return absl::OkStatus();
}

absl::Status LoraParameters::Assign(const std::map<std::string, at::Tensor>& values) {
  for (const auto& [name, t] : named_) {
    auto it = values.find(name);
    if (it == values.end()) {
      return absl::InvalidArgumentError(absl::StrCat("missing LoRA tensor ", name));
    }
    if (!it->second.sizes().equals(t.sizes())) {
      return absl::InvalidArgumentError(absl::StrCat(
          "LoRA tensor ", name, " has shape ",
          ::loradb::ShapeString({it->second.sizes().begin(), it->second.sizes().end()}),
          ", expected ", ::loradb::ShapeString({t.sizes().begin(), t.sizes().end()})));
    }
  }
  for (const auto& [name, t] : values) {
    if (!named_.count(name)) {
      return absl::InvalidArgumentError(absl::StrCat("unexpected LoRA tensor ", name));
    }
  }
  at::NoGradGuard no_grad;
  for (auto& [name, t] : named_) t.copy_(values.at(name));
  return absl::OkStatus();
}

}  // namespace loradb::trainer
