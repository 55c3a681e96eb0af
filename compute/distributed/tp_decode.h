// A tensor-parallel greedy decode over a mixed-adapter batch: what the TP tests and
// `loradb-bench dist tp` run on every rank of a TP group. Each rank loads its slice
// of the base (LoadTpModel) and acquires its shard of every revision's adapter through the
// store's residency tiers placed for its rank (StoreTiers with DeviceSlotsOptions::tp: the CPU
// tier holds the whole revision, or the rank's derived blob with `derived_dir`; the device slots
// hold only the rank's shard), then runs one prefill and `steps` decode
// forwards over `sequences` sequences whose adapters cycle through the revisions and the base
// (mixed in every batch). With a reducer the ranks' row-parallel outputs are summed after
// o_proj and down_proj; every rank then holds the same logits and picks the same tokens.
#ifndef LORADB_COMPUTE_DISTRIBUTED_TP_DECODE_H_
#define LORADB_COMPUTE_DISTRIBUTED_TP_DECODE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "compute/distributed/tp_shard.h"
#include "compute/model/qwen3_model.h"
#include "storage/formats/model_config.h"
#include "storage/formats/tensor.h"

namespace loradb::distributed {

struct TpDecodeOptions {
  std::string model_dir;            // config.json + model.safetensors (whole)
  std::string store_dir;            // store holding `revisions` (may be empty with none)
  std::vector<uint64_t> revisions;  // adapters of the batch; sequence s uses
                                    // revisions[s % (n + 1)], the base when that is n
  int64_t sequences = 8;
  int64_t prompt_len = 8;
  int64_t steps = 8;  // decode forwards after the prefill
  uint64_t seed = 1;  // prompt token ids
  // Empty: the CPU tier holds whole revisions and the device slots slice them at copy. Set: the
  // CPU tier holds each revision's pre-sliced derived blob for this rank, built here on first use
  // (StoreTiersOptions::tp_derived_dir).
  std::string derived_dir;
  bool record_logits = true;
  at::Device device = at::kCPU;  // where the rank's model runs (CUDA for NCCL)
};

struct TpDecodeResult {
  // Per forward (prefill, then each decode step): fp32 logits of every sequence's last row,
  // [sequences * vocab] row-major. Empty without record_logits.
  std::vector<std::vector<float>> logits;
  // Greedy tokens per sequence.
  std::vector<std::vector<int64_t>> tokens;
  double load_ms = 0;     // base + adapter shards
  double prefill_ms = 0;  // the prefill forward
  double decode_ms = 0;   // all decode forwards (argmax included)
  int64_t decode_tokens = 0;
  uint64_t adapter_slot_bytes = 0;   // bytes of this rank's adapter shards in its device slots
  uint64_t adapter_whole_bytes = 0;  // the revisions' whole blobs, for comparison
  int64_t local_heads = 0;           // attention heads this rank computes
};

// Runs the decode on rank `spec.rank`. `reducer` sums across the group (null only for degree 1;
// InvalidArgument otherwise). Errors: loading (model, store, blobs), forward errors (a failed
// collective comes back as InternalError naming it), InvalidArgument for bad options.
[[nodiscard]] absl::StatusOr<TpDecodeResult> RunTpDecode(const TpDecodeOptions& options,
                                                         const TpShardSpec& spec,
                                                         const model::PartialSumReducer* reducer);

// Random fp32 LoRA factors (PEFT names) on every q/k/v/o and gate/up/down projection (experts
// included) of `config`: A [rank, in], B [out, rank] (B non-zero), N(0, stddev^2), deterministic
// per seed. For tests and benchmarks.
[[nodiscard]] absl::StatusOr<TensorSet> MakeRandomLoraTensors(const ModelConfig& config,
                                                              int64_t rank, uint64_t seed,
                                                              double stddev = 0.1);

}  // namespace loradb::distributed

#endif  // LORADB_COMPUTE_DISTRIBUTED_TP_DECODE_H_
