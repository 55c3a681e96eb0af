// Data-parallel pieces over a ProcessGroup, on the public Trainer API:
//
//   AllReduceGradients  after each rank's ForwardBackward over its shard of the global batch,
//                       one all-reduce of one flat fp32 bucket holding every LoRA factor's
//                       gradient times the rank's loss weight, plus the weight, loss and
//                       accuracy; each rank then holds sum_r(w_r g_r) / sum_r(w_r): exactly the
//                       gradient of the loss over the whole global batch (the trainer's losses
//                       are weighted means: tokens for SFT, pairs for DPO).
//   BroadcastPolicy     rank `root`'s complete PolicySnapshot (masters, AdamW moments, step,
//                       scheduler position, RNG) to every rank, so all replicas start equal
//                       (after a resume from the store, which only rank 0 reads).
#ifndef LORADB_COMPUTE_DISTRIBUTED_DP_SYNC_H_
#define LORADB_COMPUTE_DISTRIBUTED_DP_SYNC_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "compute/distributed/process_group.h"
#include "compute/trainer/trainer.h"

namespace loradb::dist {

struct ReducedStep {
  double weight = 0;    // sum of the ranks' loss weights
  double loss = 0;      // the global batch's loss (weighted mean of the ranks' losses)
  double accuracy = 0;  // weighted mean of the ranks' accuracies
};

// Replaces `policy`'s accumulated gradients (exactly one ForwardBackward since the last step)
// by the weighted average over all ranks. `weight` > 0 is this rank's loss weight, `loss` and
// `accuracy` its report. FailedPrecondition unless exactly one micro-step was accumulated;
// InvalidArgument for weight <= 0; the group's errors as is (gradients are then unchanged).
[[nodiscard]] absl::StatusOr<ReducedStep> AllReduceGradients(ProcessGroup* group,
                                                             trainer::Trainer* trainer, int policy,
                                                             double weight, double loss,
                                                             double accuracy);

// Serialises / restores a PolicySnapshot (a private byte format; both ends run this build).
[[nodiscard]] std::string EncodeSnapshot(const trainer::PolicySnapshot& snapshot);
[[nodiscard]] absl::StatusOr<trainer::PolicySnapshot> DecodeSnapshot(const std::string& bytes);

// Every rank's `policy` becomes rank `root`'s (Trainer::Snapshot / Restore through the group).
[[nodiscard]] absl::Status BroadcastPolicy(ProcessGroup* group, trainer::Trainer* trainer,
                                           int policy, int root = 0);

}  // namespace loradb::dist

#endif  // LORADB_COMPUTE_DISTRIBUTED_DP_SYNC_H_
