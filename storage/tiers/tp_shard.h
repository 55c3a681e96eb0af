// Tensor-parallel (TP) sharding of a Qwen3 base and of its LoRA adapters
// (docs/distributed.md section 2). Rank r of TP degree t keeps:
// - column-parallel projections (q/k/v, gate/up, per expert too): the base weight's output rows
//   [r*out/t, (r+1)*out/t) and LoRA B's same rows; LoRA A is replicated;
// - row-parallel projections (o, down): the base weight's input columns [r*in/t, (r+1)*in/t)
//   and LoRA A's same columns; LoRA B is replicated (the partial outputs are summed by one
//   all-reduce after the projection, LoRA delta included);
// - everything else (embeddings, norms, q_norm/k_norm, the MoE router, lm_head) replicated;
//   an o_proj bias is kept by rank 0 only (zeros elsewhere) so the all-reduce adds it once.
// Attention heads and KV heads split evenly across ranks, so the rank's slice of a projection
// holds whole heads. Everything here works on bytes (TensorView / TensorSet): no LibTorch. This is
// the one definition of the rules: the device tier (device_slots.h: DeviceSlotsOptions::tp) slices
// adapters with it, and compute/distributed/ (the TP model, decode and export) uses it too.
#ifndef LORADB_STORAGE_TIERS_TP_SHARD_H_
#define LORADB_STORAGE_TIERS_TP_SHARD_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "storage/formats/model_config.h"
#include "storage/formats/tensor.h"

namespace loradb::tiers {

// One rank's place in a TP group (the TP placement of a device tier): rank r of `degree` ranks
// (the TP world size).
struct TpShardSpec {
  int rank = 0;
  int degree = 1;
};

// InvalidArgument unless degree >= 1 and 0 <= rank < degree.
[[nodiscard]] absl::Status ValidateTpShard(const TpShardSpec& spec);

// The config one rank's model has: attention heads, KV heads and MLP widths divided by
// `degree` (hidden size, head_dim, vocabulary unchanged). A Qwen3Model built from this config
// over ShardBaseCheckpoint's tensors is the rank's slice of the whole model. InvalidArgument
// (naming the field) when num_attention_heads, num_key_value_heads, intermediate_size or
// moe_intermediate_size is not divisible by `degree`, or degree < 1.
[[nodiscard]] absl::StatusOr<ModelConfig> TpLocalConfig(const ModelConfig& config, int degree);

// How one tensor is split across ranks.
enum class TpAxis : uint8_t {
  kReplicated = 0,  // every rank holds the whole tensor
  kOut,             // split along the output dimension: dim ndim-2 of a matrix (or of a packed
                    // [experts, out, in] tensor), dim 0 of a vector (bias)
  kIn,              // split along the input dimension: the last dim
  kFirstRankOnly,   // rank 0 holds it, the others hold zeros of the same shape (o_proj bias)
};
const char* TpAxisName(TpAxis axis);

// The split of a base checkpoint tensor, by its Hugging Face name
// ("model.layers.3.self_attn.q_proj.weight", "model.layers.1.mlp.experts.5.down_proj.weight").
TpAxis BaseTensorAxis(const std::string& name);
// The split of a LoRA tensor, by its PEFT name
// ("base_model.model.model.layers.3.self_attn.o_proj.lora_A.weight") or a packed MoE name
// ("...layers.3.mlp.experts.up_proj.lora_B.weight"): B of q/k/v/gate/up by output rows, A of
// o/down by input columns, everything else (and any unparsable name) replicated.
TpAxis AdapterTensorAxis(const std::string& name);

// The dimension index `axis` splits in a tensor of rank `ndim`; -1 for kReplicated /
// kFirstRankOnly. InvalidArgument for a 0-d tensor, or kIn on a 1-d one.
[[nodiscard]] absl::StatusOr<int> TpSplitDim(TpAxis axis, size_t ndim, const std::string& name);

// Copies `spec`'s slice of every tensor of `whole` (split per `axis_of(name)`) into one new
// owned, 64-byte aligned buffer; names, dtypes and metadata are kept, shapes shrink along the
// split dimension. InvalidArgument (naming the tensor) when a split dimension is not divisible
// by the degree.
[[nodiscard]] absl::StatusOr<TensorSet> SliceTensors(
    const TensorSet& whole, const std::function<TpAxis(const std::string&)>& axis_of,
    const TpShardSpec& spec);

// The rank's slice of a whole base checkpoint (HF names), after checking TpLocalConfig.
[[nodiscard]] absl::StatusOr<TensorSet> ShardBaseCheckpoint(const ModelConfig& config,
                                                            const TensorSet& whole,
                                                            const TpShardSpec& spec);
// The rank's slice of a whole adapter (PEFT names), after checking TpLocalConfig.
[[nodiscard]] absl::StatusOr<TensorSet> ShardAdapter(const ModelConfig& config,
                                                     const TensorSet& whole,
                                                     const TpShardSpec& spec);

// The metadata keys of an adapter tensor set that already is one rank's shard (a derived blob,
// tp_shard_load.h): its degree, rank and the source blob's content hash (hex).
inline constexpr char kTpDegreeKey[] = "tp_degree";
inline constexpr char kTpRankKey[] = "tp_rank";
inline constexpr char kTpSourceKey[] = "tp_source";

// What a tier with TP placement `spec` holds of an adapter whose host copy is `host` (PEFT
// names): `host` itself when spec.degree == 1 or when `host` already is `spec`'s shard (its
// metadata has kTpDegreeKey / kTpRankKey equal to `spec`'s); otherwise `spec`'s slice of it
// (SliceTensors with AdapterTensorAxis), stored in `*scratch`, which the result then points to.
// Errors: InvalidArgument for a bad spec or a split dimension not divisible by the degree
// (naming the tensor); FailedPrecondition when `host` is a shard of another placement.
[[nodiscard]] absl::StatusOr<const TensorSet*> AdapterShardFor(const TensorSet& host,
                                                               const TpShardSpec& spec,
                                                               TensorSet* scratch);

// The reverse of ShardAdapter: `shards[r]` is rank r's adapter state (shards.size() is the
// degree); returns the whole adapter, tensors in rank 0's order, split tensors concatenated in
// rank order, replicated ones taken from rank 0. InvalidArgument when the shards disagree on
// names, dtypes or unsplit dimensions, or when a replicated tensor differs between ranks (they
// must stay identical: a sign that the ranks trained apart).
[[nodiscard]] absl::StatusOr<TensorSet> GatherAdapterShards(
    const std::vector<const TensorSet*>& shards);

}  // namespace loradb::tiers

#endif  // LORADB_STORAGE_TIERS_TP_SHARD_H_
