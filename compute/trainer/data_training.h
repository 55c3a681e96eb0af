// Training a policy on a user's dataset (`loradb train --data FILE.jsonl`): SFT sequences, DPO
// pairs, or GRPO prompts rewarded by a user program (reward_program.h), with the store policy,
// resume, checkpoints and publishing of RunTraining (train_tools.h). The data walk is fixed by
// the seed and the step (epoch e visits every example once, in a shuffled order of its own), so a
// resumed run continues where it stopped. Exposes no LibTorch types.
#ifndef LORADB_COMPUTE_TRAINER_DATA_TRAINING_H_
#define LORADB_COMPUTE_TRAINER_DATA_TRAINING_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "compute/trainer/train_tools.h"
#include "storage/formats/training_data.h"

namespace loradb::trainer {

struct DataRunOptions {
  const dataset::Dataset* data = nullptr;  // validated (dataset::ReadTrainingData); borrowed
  // Steps when TrainRunOptions::steps is 0: epochs x ceil(examples / examples per step).
  int64_t epochs = 1;
  // Examples (SFT/DPO) or prompts (GRPO) scored before and after training: the first N.
  int64_t eval_examples = 64;
  // GRPO: the reward program (a shell command), how long it may stay silent, and the number of
  // tokens sampled per completion.
  std::string reward_cmd;
  double reward_timeout_s = 60;
  int64_t max_tokens = 16;
  std::vector<int64_t> stop_tokens;  // GRPO: ids that end a completion (included in it)
  // Token ids -> text for the rollouts' "prompt" / "completion" fields (JSON null where it
  // fails: an id without a token); a null function: no text fields.
  std::function<absl::StatusOr<std::string>(const std::vector<int64_t>&)> decode;
};

// The optimizer steps a run on `data` trains to when `run.steps` is 0 (else run.steps).
int64_t DataRunSteps(const TrainRunOptions& run, const DataRunOptions& data);

// Trains `run.policy` on `data`. InvalidArgument for a GRPO dataset without a reward command, a
// reward command for SFT / DPO data, or --warm-start on a dataset; the reward program's errors
// (reward_program.h) stop the run (nothing after the last checkpoint is kept).
[[nodiscard]] absl::StatusOr<TrainRunResult> RunDataTraining(const TrainRunOptions& run,
                                                             const DataRunOptions& data);

}  // namespace loradb::trainer

#endif  // LORADB_COMPUTE_TRAINER_DATA_TRAINING_H_
