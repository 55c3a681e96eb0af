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
struct LoraFactors {
  at::Tensor a;
  at::Tensor b;
  double scale = 1.0;
};

// One input module for LoraAdapter::Create, named as ModelConfig::LoraModules names them
// (`layers.3.self_attn.q_proj`, `layers.3.mlp.experts.7.up_proj`) or, for a packed expert set,
// `layers.3.mlp.experts.up_proj` with 3-D factors.
struct LoraModuleInput {
  std::string module;
  at::Tensor a;
  at::Tensor b;
  double scale = 1.0;
};

// One adapter's LoRA weights, validated against a base's config and indexed by (layer, target)
// for the forward pass. Tensors are shared, not copied, when they already have the requested
// dtype and device (so a trainer's parameters stay the same tensors and receive gradients).
class LoraAdapter {
 public:
  // InvalidArgument for unknown module names, shape mismatches (each error names the module),
  // ranks that differ between A and B or between experts of one packed set, or a module given
  // twice. Unimplemented for modules the model cannot apply LoRA to (router, embeddings,
  // lm_head). Factors are converted to `dtype` on `device`; `dtype` may differ from the
  // model's (e.g. bf16 factors on an fp32 base: the kernels read them as they are, the torch
  // reference converts them per call).
  [[nodiscard]] static absl::StatusOr<LoraAdapter> Create(const ModelConfig& config,
                                                          std::vector<LoraModuleInput> modules,
                                                          at::ScalarType dtype,
                                                          at::Device device = at::kCPU);

  // Factors for (layer, target), or nullptr when this adapter does not touch that module.
  const LoraFactors* Find(int64_t layer, LoraTarget target) const {
    const auto& slot =
        table_[static_cast<size_t>(layer) * kNumLoraTargets + static_cast<size_t>(target)];
    return slot.has_value() ? &*slot : nullptr;
  }
  int64_t max_rank() const { return max_rank_; }
  size_t num_modules() const { return num_modules_; }

 private:
  std::vector<std::optional<LoraFactors>> table_;  // layer * kNumLoraTargets + target
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
