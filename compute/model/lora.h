// Multi-LoRA hooks of the Qwen3 model: the adapter weights one forward pass can apply, which
// adapter each row (token) of a batch uses, and the applier that adds the per-row deltas
//   y[row] += scale[a] * B[a] (A[a] x[row])      a = the row's adapter, none when negative
// at every q/k/v/o, gate/up/down and expert projection. `TorchLoraApplier` is the reference
// path (plain torch ops, autograd-friendly); a kernel-backed applier (BGMV/SGMV from kernels/)
// implements the same interface and replaces it without touching the model.
#ifndef LORADB_COMPUTE_MODEL_LORA_H_
#define LORADB_COMPUTE_MODEL_LORA_H_

#include <ATen/ATen.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "storage/formats/model_config.h"

namespace loradb::model {

// The projections of one decoder layer that take a LoRA delta.
enum class LoraTarget : uint8_t { kQ = 0, kK, kV, kO, kGate, kUp, kDown };
inline constexpr int kNumLoraTargets = 7;

// Module-name suffix of a target: "self_attn.q_proj", ..., "mlp.down_proj".
const char* LoraTargetName(LoraTarget target);

// One adapter's factors for one (layer, target). Dense modules: a [r, in], b [out, r].
// Expert projections of a MoE layer are packed (DESIGN.md section 5): a [E, r, in],
// b [E, out, r]; an expert without LoRA has zero factors.
//
// DoRA (PEFT's use_dora): `magnitude` [out] is the module's lora_magnitude_vector m, and
// `dora_scale` [out] = m / ||W + scale * B A||_row (W the base weight; the norm of each output row
// over the merged weight, as PEFT computes it), filled in by Qwen3Model::PrepareAdapter. A DoRA
// row's output is then bias + dora_scale * (W x + scale * B A x), PEFT's result at inference.
// For embed_tokens (PEFT's DoRA embedding) the norm runs over each hidden column of the merged
// [vocab, hidden] table and scales that column of the looked-up row.
struct LoraFactors {
  at::Tensor a;
  at::Tensor b;
  double scale = 1.0;
  at::Tensor magnitude = {};   // undefined: plain LoRA
  at::Tensor dora_scale = {};  // [out] in the factors' dtype; defined once prepared
};

// The token embedding and the LM head, which an adapter can change beyond LoRA on projections.
enum class LoraWholeModule : uint8_t { kEmbedTokens = 0, kLmHead };
inline constexpr int kNumLoraWholeModules = 2;

// A whole-module weight for LoraAdapter::Create: PEFT's modules_to_save (the adapter's own copy of
// `embed_tokens` or `lm_head`, [vocab, hidden]) or a saved base_layer weight
// (save_embedding_layers: `base_layer` set; it must equal the base's weight, checked by
// Qwen3Model::PrepareAdapter).
struct LoraWeightInput {
  std::string module;  // "embed_tokens" or "lm_head"
  at::Tensor weight;
  bool base_layer = false;
};

// One input module for LoraAdapter::Create, named as ModelConfig::LoraModules names them
// (`layers.3.self_attn.q_proj`, `layers.3.mlp.experts.7.up_proj`, `embed_tokens`, `lm_head`) or,
// for a packed expert set, `layers.3.mlp.experts.up_proj` with 3-D factors. `embed_tokens` takes
// PEFT's embedding LoRA: a = lora_embedding_A [r, vocab], b = lora_embedding_B [hidden, r]
// (delta = scale * B A[:, token]). `magnitude` [out]: DoRA (dense projections, embed_tokens,
// lm_head).
struct LoraModuleInput {
  std::string module;
  at::Tensor a;
  at::Tensor b;
  double scale = 1.0;
  at::Tensor magnitude = {};
};

// One adapter's LoRA weights, validated against a base's config and indexed by (layer, target)
// for the forward pass. Tensors are shared, not copied, when they already have the requested
// dtype and device (so a trainer's parameters stay the same tensors and receive gradients).
class LoraAdapter {
 public:
  // InvalidArgument for unknown module names, shape mismatches (each error names the module,
  // DoRA magnitudes included), ranks that differ between A and B or between experts of one
  // packed set, or a module given twice (LoRA and a modules_to_save weight on one module count
  // as twice). Unimplemented for modules the model cannot apply LoRA to (the router) and DoRA
  // on experts. Factors are converted to `dtype` on `device`; `dtype` may differ
  // from the model's (e.g. bf16 factors on an fp32 base: the kernels read them as they are, the
  // torch reference converts them per call). An adapter with DoRA or whole-module weights must
  // pass through Qwen3Model::PrepareAdapter before a forward uses it.
  [[nodiscard]] static absl::StatusOr<LoraAdapter> Create(
      const ModelConfig& config, std::vector<LoraModuleInput> modules, at::ScalarType dtype,
      at::Device device = at::kCPU, std::vector<LoraWeightInput> weights = {});

  // Factors for (layer, target), or nullptr when this adapter does not touch that module.
  const LoraFactors* Find(int64_t layer, LoraTarget target) const {
    const auto& slot =
        table_[static_cast<size_t>(layer) * kNumLoraTargets + static_cast<size_t>(target)];
    return slot.has_value() ? &*slot : nullptr;
  }
  LoraFactors* FindMutable(int64_t layer, LoraTarget target) {
    auto& slot = table_[static_cast<size_t>(layer) * kNumLoraTargets + static_cast<size_t>(target)];
    return slot.has_value() ? &*slot : nullptr;
  }
  // LoRA on embed_tokens / lm_head, or nullptr.
  const LoraFactors* FindWhole(LoraWholeModule m) const {
    const auto& slot = whole_lora_[static_cast<size_t>(m)];
    return slot.has_value() ? &*slot : nullptr;
  }
  LoraFactors* FindWholeMutable(LoraWholeModule m) {
    auto& slot = whole_lora_[static_cast<size_t>(m)];
    return slot.has_value() ? &*slot : nullptr;
  }
  // The adapter's own weight of embed_tokens / lm_head (modules_to_save), undefined when none.
  const at::Tensor& ReplacedWeight(LoraWholeModule m) const {
    return replaced_[static_cast<size_t>(m)];
  }
  // Saved base_layer weights, which must equal the base's (Qwen3Model::PrepareAdapter checks).
  const at::Tensor& BaseLayerWeight(LoraWholeModule m) const {
    return base_layer_[static_cast<size_t>(m)];
  }
  // True when a forward needs more than the per-projection LoRA table: DoRA, whole-module LoRA or
  // weights. Such an adapter is usable once `prepared()`.
  bool has_extras() const { return has_dora_ || has_whole_; }
  bool has_dora() const { return has_dora_; }
  bool has_whole_modules() const { return has_whole_; }
  bool prepared() const { return prepared_; }
  void set_prepared() { prepared_ = true; }
  int64_t max_rank() const { return max_rank_; }
  size_t num_modules() const { return num_modules_; }

 private:
  std::vector<std::optional<LoraFactors>> table_;  // layer * kNumLoraTargets + target
  std::optional<LoraFactors> whole_lora_[kNumLoraWholeModules];
  at::Tensor replaced_[kNumLoraWholeModules];
  at::Tensor base_layer_[kNumLoraWholeModules];
  bool has_dora_ = false;
  bool has_whole_ = false;
  bool prepared_ = true;  // false while DoRA scales or base_layer checks are pending
  int64_t max_rank_ = 0;
  size_t num_modules_ = 0;
};

// Which adapter each row of a forward batch uses. `row_slot[i]` indexes `adapters` or is
// negative for "base only". Adapters are borrowed and must outlive the forward call.
struct LoraBatch {
  std::vector<const LoraAdapter*> adapters;
  std::vector<int32_t> row_slot;
};

// The rows of a batch grouped by adapter slot (segments, as SGMV wants them), computed once per
// forward and shared by every layer.
struct LoraRowGroups {
  std::vector<int32_t> slots;    // distinct slots used, ascending (no negatives)
  std::vector<at::Tensor> rows;  // per slot: int64 row indices into the batch, ascending
  at::Tensor row_slot;           // int32 [rows], -1 for none (what BGMV wants)
  // Per slot (same order as `slots`), known on the host: its first row and row count.
  // `contiguous` when every slot's rows form one contiguous range.
  std::vector<int64_t> first_row, num_rows;
  bool contiguous = false;
  bool empty() const { return slots.empty(); }
};

// Validates `batch` for `num_rows` rows (InvalidArgument on a size mismatch, an out-of-range
// slot or a null adapter) and groups its rows.
[[nodiscard]] absl::StatusOr<LoraRowGroups> GroupLoraRows(const LoraBatch& batch, int64_t num_rows,
                                                          at::Device device = at::kCPU);

// Adds the multi-LoRA delta of one projection.
class LoraApplier {
 public:
  virtual ~LoraApplier() = default;
  // Returns y + delta, where for every row r with adapter a = batch slot of r that has factors
  // for (layer, target): delta[r] = scale * B (A x[r]). `expert` >= 0 selects that expert's
  // slice of packed factors; then `rows` (int64, into the batch) says which batch row each row
  // of x/y is, since an expert sees only the rows routed to it. `rows` is undefined for dense
  // projections (row i of x is batch row i).
  virtual at::Tensor Apply(const at::Tensor& x, const at::Tensor& y, int64_t layer,
                           LoraTarget target, int64_t expert, const at::Tensor& rows,
                           const LoraBatch& batch, const LoraRowGroups& groups) const = 0;
};

// The reference applier: per adapter, gather its rows, two matmuls, scatter-add back.
// Out-of-place and differentiable with respect to x and the factors.
class TorchLoraApplier final : public LoraApplier {
 public:
  at::Tensor Apply(const at::Tensor& x, const at::Tensor& y, int64_t layer, LoraTarget target,
                   int64_t expert, const at::Tensor& rows, const LoraBatch& batch,
                   const LoraRowGroups& groups) const override;
};

}  // namespace loradb::model

#endif  // LORADB_COMPUTE_MODEL_LORA_H_
