// The trainer's state in the store (DESIGN.md section 2): a policy's PolicySnapshot becomes a
// training checkpoint (master weights, AdamW moments + step, accumulated gradients, scheduler
// position, RNG state, rollout records -> blobs + a checkpoint record), and its current weights
// become an adapter revision in serving layout (`source` = the checkpoint) that moves an alias.
//
// Blob contents: `master` holds the fp32 factors by PEFT name; `optimizer` holds
// `<name>.exp_avg`, `<name>.exp_avg_sq` and `adamw.step`; `gradients` holds
// `trainer.micro_steps` (I64 [1]) and, when it is > 0, the accumulated gradient of every factor
// by PEFT name. `rng_state` is Rng::Serialize (64 hex digits); `rollout` is opaque bytes.
#ifndef LORADB_COMPUTE_TRAINER_CHECKPOINT_H_
#define LORADB_COMPUTE_TRAINER_CHECKPOINT_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "compute/trainer/trainer.h"
#include "storage/store/store.h"

namespace loradb::trainer {

// Registers `base_name` from `model_dir`'s config.json (unless a base of that name exists) and
// creates the policy `policy` on it (unless it exists). FailedPrecondition when the policy
// exists on another base.
[[nodiscard]] absl::Status EnsurePolicy(Store* store, const std::string& base_name,
                                        const std::string& model_dir, const std::string& policy);

// Writes `policy`'s snapshot as a checkpoint of the store policy with the trainer policy's
// name, at its optimizer step, with `parent` (0: none) and `rollout` records.
[[nodiscard]] absl::StatusOr<CheckpointRecord> SaveCheckpoint(Store* store, const Trainer& trainer,
                                                              int policy, uint64_t parent,
                                                              const std::string& rollout = "");

// Reads checkpoint `id` (checksums verified) and restores it into `policy`. InvalidArgument
// when the checkpoint belongs to another policy or does not fit its parameters (the trainer's
// state is unchanged then).
[[nodiscard]] absl::Status LoadCheckpoint(const Store& store, Trainer* trainer, int policy,
                                          uint64_t id);

// The training state checkpoint `record` holds (checksums verified), whichever policy it
// belongs to: restoring it into another policy of the same LoRA shape continues that training.
[[nodiscard]] absl::StatusOr<PolicySnapshot> ReadSnapshot(const Store& store,
                                                          const CheckpointRecord& record);

// The policy's checkpoint with the highest (step, id). NotFound when it has none.
[[nodiscard]] absl::StatusOr<CheckpointRecord> LatestCheckpoint(const Store& store,
                                                                const std::string& policy);

// Publishes `policy`'s current weights as a revision (factors in `dtype`, bf16 by default;
// LoRA settings from the policy) with source = trained from `checkpoint_id` at the current step,
// and moves `alias` to it in the same transaction (`latest`, the store's implicit alias of the
// newest revision, moves by itself).
[[nodiscard]] absl::StatusOr<RevisionRecord> PublishForSampling(Store* store,
                                                                const Trainer& trainer, int policy,
                                                                uint64_t checkpoint_id,
                                                                const std::string& alias = "latest",
                                                                DType dtype = DType::kBF16);

// Makes published revision `ref` ("ID", "POLICY:ALIAS" or "POLICY@SEQ") the reference of
// `policy` for DPO and GRPO's KL term: its factors in fp32, each module scaled as PEFT scales it
// (alpha / r, rsLoRA, per-module patterns). FailedPrecondition when the revision is deleted or
// belongs to another base than the policy's store policy; NotFound for an unknown reference.
// The policy's previous reference stays on error.
[[nodiscard]] absl::Status SetReferenceFromRevision(const Store& store, Trainer* trainer,
                                                    int policy, const std::string& ref);

}  // namespace loradb::trainer

#endif  // LORADB_COMPUTE_TRAINER_CHECKPOINT_H_
