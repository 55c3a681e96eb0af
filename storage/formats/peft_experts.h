// PEFT's target_parameters layout (LoRA on fused MoE expert parameters, as peft >= 0.17 saves it
// for transformers 5 models) and its conversion to and from the per-expert target_modules layout
// (`experts.{e}.gate_proj` ...) that loradb packs, serves and trains. docs/format-blob.md
// describes the mapping.
#ifndef LORADB_STORAGE_FORMATS_PEFT_EXPERTS_H_
#define LORADB_STORAGE_FORMATS_PEFT_EXPERTS_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "storage/formats/peft.h"
#include "storage/formats/tensor.h"

namespace loradb::peft {

// One fused expert parameter of a base, stored [experts, out, in], whose `out` rows are the
// per-expert modules `parts` one after another (gate_up_proj: gate_proj rows, then up_proj).
struct ExpertParameter {
  std::string name;  // "gate_up_proj"
  int64_t in = 0;
  std::vector<std::pair<std::string, int64_t>> parts;  // per-expert module, its rows
  int64_t out() const;
};

// The expert parameters of every MoE layer of a base.
struct ExpertsLayout {
  std::string module;  // the experts module inside a layer, e.g. "mlp.experts"
  int64_t num_experts = 0;
  // In the module's registration order: PEFT wraps the module once per targeted parameter in
  // this order, so the first targeted parameter is the innermost (most ".base_layer"s).
  std::vector<ExpertParameter> params;
};

// Qwen3-MoE as transformers 5 builds it: mlp.experts.gate_up_proj [E, 2 * I, H] (gate rows, then
// up rows) and mlp.experts.down_proj [E, H, I].
ExpertsLayout Qwen3MoeExpertsLayout(int64_t num_experts, int64_t hidden_size,
                                    int64_t moe_intermediate_size);

// The layout's parameters that `config.target_parameters` names, as indices into layout.params
// in registration order. An entry is `[<module suffix>.]<parameter>` ("gate_up_proj",
// "mlp.experts.gate_up_proj"), matched as PEFT matches it (the parameter's full key ends with
// the entry). InvalidArgument naming an entry the layout lacks.
[[nodiscard]] absl::StatusOr<std::vector<size_t>> TargetedParameters(const LoraConfig& config,
                                                                     const ExpertsLayout& layout);

// Converts an adapter in PEFT's target_parameters layout to per-expert LoRA. For each layer and
// targeted parameter with rank r over E experts, PEFT's A [r * E, in] holds expert e's A in rows
// [e * r, (e + 1) * r) and B [out, r * E] holds expert e's column k at column k * E + e; expert e
// of part `m` (rows [o, o + rows) of `out`) becomes
//   <prefix>layers.L.<module>.e.m.lora_A.weight = A_e               [r, in]
//   <prefix>layers.L.<module>.e.m.lora_B.weight = B_e[o:o + rows]   [rows, r]
// so every part's delta equals the fused delta's rows. Other tensors are kept as they are.
// `per_expert` receives the config describing the result (PerExpertConfig). InvalidArgument
// naming the tensor or parameter: a target_parameters entry the layout lacks, an expert count
// that disagrees with the layout, a shape that disagrees with the parameter.
[[nodiscard]] absl::StatusOr<TensorSet> UnfuseTargetParameters(const LoraConfig& config,
                                                               const TensorSet& tensors,
                                                               const ExpertsLayout& layout,
                                                               LoraConfig* per_expert);

// The inverse of UnfuseTargetParameters, bit for bit: `tensors` in the per-expert layout, `config`
// the target_parameters config. FailedPrecondition when the parts of one fused parameter no longer
// share their A (as after training), which the fused layout cannot express.
[[nodiscard]] absl::StatusOr<TensorSet> FuseTargetParameters(const LoraConfig& config,
                                                             const TensorSet& tensors,
                                                             const ExpertsLayout& layout);

// `config` (target_parameters) rewritten for the per-expert layout of `tensors` (either layout):
// target_parameters removed, the parts added to target_modules, and rank/alpha patterns
// prepended where needed so each per-expert module keeps its parameter's r and alpha.
[[nodiscard]] absl::StatusOr<LoraConfig> PerExpertConfig(const LoraConfig& config,
                                                         const std::vector<TensorView>& tensors,
                                                         const ExpertsLayout& layout);

}  // namespace loradb::peft

#endif  // LORADB_STORAGE_FORMATS_PEFT_EXPERTS_H_
