// One tensor-parallel rank's Qwen3 model and adapters (docs/distributed.md section 2).
// The rank's model is an ordinary model::Qwen3Model built over the rank's slice of the base
// (tp_shard.h) with TpLocalConfig's config (its heads and MLP widths divided by the degree);
// a PartialSumReducer installed on it sums the row-parallel outputs (after o_proj and
// down_proj / the expert block, LoRA deltas included) across the group, so every rank ends each
// layer with the same full hidden state and computes the same (replicated) logits.
// Adapters are sliced the same way and validated against the local config.
#ifndef LORADB_COMPUTE_DISTRIBUTED_TP_MODEL_H_
#define LORADB_COMPUTE_DISTRIBUTED_TP_MODEL_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "compute/distributed/tp_shard.h"
#include "compute/model/lora.h"
#include "compute/model/qwen3_model.h"
#include "storage/catalog/records.h"
#include "storage/formats/peft.h"
#include "storage/formats/tensor.h"
#include "storage/tiers/device_slots.h"

namespace loradb::distributed {

// Loads the whole checkpoint at `dir` (config.json + safetensors) and builds rank `spec.rank`'s
// model over a copy of its slice (the whole checkpoint's map is dropped afterwards). The model's
// config() is the local one. Errors: Qwen3Model::Load's, TpLocalConfig's (heads not divisible).
[[nodiscard]] absl::StatusOr<std::unique_ptr<model::Qwen3Model>> LoadTpModel(
    const std::string& dir, const TpShardSpec& spec, const model::LoadOptions& options = {});

// A rank's adapter: its slice of tensors (kept alive here) indexed for the forward pass.
struct TpAdapter {
  TensorSet shard;
  model::LoraAdapter adapter;
};

// Builds the adapter for a rank's model from the rank's slice `shard` (PEFT names, as
// ReadAdapterShard / ShardAdapter return), each module scaled per `config` (alpha / r). The
// factors are read in place when `dtype` matches. Errors: InvalidArgument for unparsable names,
// a module lacking A or B, or shapes that do not fit the local config (e.g. a shard of another
// degree); Unimplemented for embedding LoRA.
[[nodiscard]] absl::StatusOr<std::unique_ptr<TpAdapter>> BuildTpAdapter(
    const model::Qwen3Model& local_model, TensorSet shard, const peft::LoraConfig& config);

// The same over a rank's shard resident in a TP-placed device tier (tiers::DeviceSlotsOptions::tp
// = this rank): the factors are read from the slot's memory, on `slot_device` (at::kCPU for the
// host backend, the CUDA device of the arena otherwise); the lease holding `slot` must outlive
// the adapter. Errors as BuildTpAdapter's, plus FailedPrecondition when the slot was sliced for
// another placement than `spec`.
[[nodiscard]] absl::StatusOr<model::LoraAdapter> BuildTpAdapterFromSlot(
    const model::Qwen3Model& local_model, const tiers::DeviceAdapter& slot, const TpShardSpec& spec,
    const peft::LoraConfig& config, at::Device slot_device);

}  // namespace loradb::distributed

#endif  // LORADB_COMPUTE_DISTRIBUTED_TP_MODEL_H_
