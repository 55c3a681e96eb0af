// Data-parallel LoRA training of one policy (`loradb dist-train`): K ranks, each with the whole
// base and the policy's adapter. Per optimizer step every rank draws the same global batch from
// the policy's RNG (identical on all ranks), trains on its contiguous 1/K of it, and the adapter
// gradients are averaged with one all-reduce (dp_sync.h) before the identical AdamW step. Only
// rank 0 opens the store: it resumes from the latest checkpoint and broadcasts the policy state;
// it alone writes checkpoints and publishes the revision, and tells the others whether that
// worked, so all ranks end with the same status. World size 1 runs without a process group.
// Torch-free header (the CLI includes it).
#ifndef LORADB_COMPUTE_DISTRIBUTED_DP_TRAIN_H_
#define LORADB_COMPUTE_DISTRIBUTED_DP_TRAIN_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "compute/trainer/train_tools.h"

namespace loradb::dist {

struct DpTrainResult {
  trainer::TrainRunResult run;  // scores and ids (ids are rank 0's; 0 on other ranks)
  int rank = 0;
  int world_size = 1;
  std::vector<double> losses;  // the global batch's loss at every step trained
  double train_seconds = 0;    // the step loop (no evaluation, no checkpoint), this rank
  int64_t samples = 0;         // global-batch samples trained (sequences or DPO pairs)
  int64_t collective_calls = 0;
  int64_t gradient_allreduces = 0;  // one per step
  double weights_l1 = 0;            // sum |master| over the policy's factors at the end
};

// Runs this process's rank: the group comes from the environment (launcher.h) when
// LORADB_RANK is set, else world size 1. `options.batch_size` is the GLOBAL batch and must
// divide by the world size; `micro_batches` must be 1; the task's loss must be SFT (mapping) or
// DPO (preference) — GRPO is Unimplemented. `options.progress` is called on rank 0 only.
[[nodiscard]] absl::StatusOr<DpTrainResult> RunDpTraining(const trainer::TrainRunOptions& options);

}  // namespace loradb::dist

#endif  // LORADB_COMPUTE_DISTRIBUTED_DP_TRAIN_H_
