// Torch-free entry point to the trainer for the `loradb train` command and scripts: trains one
// policy on a task (a toy task, or a dataset: data_training.h) with checkpoints in a store,
// resuming from the policy's latest checkpoint, and publishes the result as a revision. Exposes
// no LibTorch types.
#ifndef LORADB_COMPUTE_TRAINER_TRAIN_TOOLS_H_
#define LORADB_COMPUTE_TRAINER_TRAIN_TOOLS_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace loradb::model {
class Qwen3Model;
}  // namespace loradb::model

namespace loradb::trainer {

// One optimizer step of a run, for progress displays.
struct StepProgress {
  int64_t step = 0;        // the optimizer step reached
  int64_t first_step = 0;  // the step the run started (or resumed) at
  int64_t last_step = 0;   // the step the run trains to
  std::string loss_kind;   // sft | dpo | grpo
  double loss = 0;
  double lr = 0;
  double grad_norm = 0;
  std::string metric_name;  // acc (SFT) | margin (DPO) | reward (GRPO)
  double metric = 0;
  int64_t tokens = 0;  // tokens of the step's training sequences
  double seconds = 0;  // wall time of the step
};

struct TrainRunOptions {
  std::string model_dir;  // HF checkpoint directory of the base
  std::string store_dir;  // the store (created if missing)
  std::string base_name;  // base name in the store; default: the model dir's name
  std::string policy;     // policy name (created on the base if missing)
  std::string task;       // mapping | preference | arithmetic
  int64_t steps = 100;    // train until the policy's optimizer step reaches this
  int64_t rank = 8;
  double alpha = 16;
  bool rslora = false;
  // PEFT target_modules (last name components); empty: the LoraConfig default (every attention
  // and MLP projection), or only the attention projections when target_parameters is set.
  std::vector<std::string> target_modules;
  // PEFT target_parameters: fused MoE expert parameters ("gate_up_proj", "down_proj").
  std::vector<std::string> target_parameters;
  double lr = 5e-3;
  std::string schedule = "constant";  // constant | cosine
  int64_t warmup_steps = 0;
  uint64_t seed = 0;
  int64_t batch_size = 32;
  int64_t micro_batches = 1;
  int64_t grpo_prompts = 8;
  int64_t grpo_group = 8;
  double temperature = 1.0;  // GRPO sampling temperature
  // GRPO only: SFT steps first when the policy starts from scratch (a random base never earns
  // reward on arithmetic).
  int64_t warm_start_steps = 0;
  int64_t checkpoint_every = 0;  // 0: only at the end
  bool resume = true;            // continue from the latest checkpoint when there is one
  bool publish = true;           // publish a revision and move `alias` at the end
  std::string alias = "latest";
  // DPO / GRPO reference: a revision ("ID", "POLICY:ALIAS", "POLICY@SEQ"); empty: the base.
  std::string reference;
  // LibTorch intra-op threads; 0: one per hardware core.
  int64_t threads = 0;
  // Called with one line per event, and per step unless `on_step` is set.
  std::function<void(const std::string&)> progress;
  // Called after each optimizer step (progress bars, JSON lines).
  std::function<void(const StepProgress&)> on_step;
};

struct TrainRunResult {
  int64_t start_step = 0;  // the step training resumed at (0 for a fresh policy)
  int64_t end_step = 0;
  double start_score = 0;  // the task's score before and after (TaskScore::score)
  double end_score = 0;
  // The task's evaluation loss before and after (TaskScore::loss; NaN for the toy tasks).
  double start_loss = 0;
  double end_loss = 0;
  int64_t tokens = 0;        // tokens trained on in this run
  double train_seconds = 0;  // wall time of this run's steps
  double last_loss = 0;
  uint64_t checkpoint_id = 0;
  uint64_t revision_id = 0;
};

[[nodiscard]] absl::StatusOr<TrainRunResult> RunTraining(const TrainRunOptions& options);

class Task;
// Makes the task a run trains on, once the base is loaded.
using TaskFactory =
    std::function<absl::StatusOr<std::unique_ptr<Task>>(const model::Qwen3Model& model)>;

// RunTraining on the task `make_task` returns (options.task is not read): the same store
// policy, resume, checkpoints and publishing.
[[nodiscard]] absl::StatusOr<TrainRunResult> RunTaskTraining(const TrainRunOptions& options,
                                                             const TaskFactory& make_task);

}  // namespace loradb::trainer

#endif  // LORADB_COMPUTE_TRAINER_TRAIN_TOOLS_H_
