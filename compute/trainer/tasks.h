// Toy tasks that prove the trainer learns, on a tiny random base (no tokenizer: token ids are
// chosen inside the vocabulary), and the step loop that trains one or several policies on them.
//
//   mapping     SFT:  [BOS, key, SEP] -> value, a fixed random bijection of 32 keys onto 32
//                     values. Score: greedy accuracy over all keys (chance ~ 1/vocab).
//   preference  DPO:  [BOS, prompt, SEP] + a token of the "good" set (chosen) vs one of the
//                     "bad" set (rejected). Score: implicit-reward margin and the fraction of
//                     held-out pairs (prompts never trained on) where chosen is preferred.
//   arithmetic  GRPO: [BOS, a, +, b, =] -> the two digits of a + b (a, b in 0..9). Reward:
//                     0.5 per correct digit (partial credit). Score: mean greedy reward over
//                     all 100 prompts. TrainBatch gives SFT data for a warm start.
#ifndef LORADB_COMPUTE_TRAINER_TASKS_H_
#define LORADB_COMPUTE_TRAINER_TASKS_H_

#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "compute/trainer/trainer.h"

namespace loradb::trainer {

struct TaskScore {
  double score = 0;   // accuracy, preferred fraction or mean reward (higher is better)
  double margin = 0;  // DPO: mean held-out implicit reward margin
  // The mean loss over the evaluation data, where the task measures one (dataset tasks);
  // NaN otherwise.
  double loss = std::numeric_limits<double>::quiet_NaN();
};

// One GRPO rollout to reward: `prompt_index` indexes the prompts of the Prompts() call that
// produced `prompt`.
struct Rollout {
  int64_t prompt_index = 0;
  const std::vector<int64_t>* prompt = nullptr;
  const std::vector<int64_t>* completion = nullptr;
};

class Task {
 public:
  virtual ~Task() = default;
  virtual std::string name() const = 0;
  // The loss the task trains with.
  virtual LossKind loss() const = 0;
  // SFT or DPO training data drawn with `rng` (`size` sequences or pairs). For GRPO tasks: SFT
  // data for a warm start.
  virtual std::vector<Datum> TrainBatch(Rng* rng, int64_t size) const = 0;
  // GRPO: `n` prompts drawn with `rng`, the completion length, and the reward of a completion.
  virtual std::vector<std::vector<int64_t>> Prompts(Rng* rng, int64_t n) const;
  virtual int64_t completion_tokens() const { return 1; }
  // GRPO: token ids that end a completion early (included in it).
  virtual std::vector<int64_t> stop_tokens() const { return {}; }
  virtual float Reward(const std::vector<int64_t>& prompt,
                       const std::vector<int64_t>& completion) const;
  // The rewards of the rollouts of prompts from the latest Prompts() call, in order; an error
  // stops the step before anything trains. Default: Reward() of each.
  [[nodiscard]] virtual absl::StatusOr<std::vector<float>> Rewards(
      const std::vector<Rollout>& rollouts) const;
  // Called before each optimizer step's TrainBatch / Prompts with the policy's step so far
  // (dataset tasks walk their data by step, so a resumed run continues where it stopped).
  virtual void BeginStep(int64_t /*step*/) {}
  // Scores `policy` (-1: the base) on the task's evaluation set.
  [[nodiscard]] virtual absl::StatusOr<TaskScore> Evaluate(Trainer* trainer, int policy) const = 0;
};

// "mapping" | "preference" | "arithmetic" for a base with `vocab_size` >= 512; InvalidArgument
// otherwise. `seed` fixes the task's data (e.g. the mapping's permutation).
[[nodiscard]] absl::StatusOr<std::unique_ptr<Task>> MakeTask(const std::string& name,
                                                             int64_t vocab_size, uint64_t seed);

struct StepConfig {
  int64_t batch_size = 32;    // SFT sequences / DPO pairs per step
  int64_t grpo_prompts = 8;   // GRPO prompts per step
  int64_t grpo_group = 8;     // samples per prompt
  double temperature = 1.0;   // GRPO sampling temperature (the loss uses the same)
  int64_t micro_batches = 1;  // gradient accumulation: ForwardBackward calls per step
  // Use SFT on TrainBatch regardless of the task's loss (warm start).
  bool force_sft = false;
};

struct StepReport {
  int policy = 0;
  int64_t step = 0;  // optimizer step after this one
  double loss = 0;   // mean over micro-batches
  double accuracy = 0;
  double metric = 0;
  double grad_norm = 0;
  double lr = 0;
  double mean_reward = 0;  // GRPO: mean reward of this step's rollouts
  int64_t tokens = 0;      // tokens of the step's training sequences (before prefix sharing)
  // GRPO: groups whose rollouts all earned the same reward carry no advantage; they are left out
  // of the loss (and of its token count). When that would leave no rollout (or fewer than the
  // micro-batches), none is skipped: with every advantage 0 the step has zero gradient, and the
  // step count still advances.
  int64_t skipped_groups = 0;
  std::string rollouts;  // GRPO: the step's rollout records (prompt|completion|reward lines)
  // Wall time of the step's phases (shared by every policy of one TrainStep call).
  double sample_s = 0;
  double forward_backward_s = 0;
  double optim_s = 0;
};

// The mean reward of `policy`'s rollouts at `temperature` on `prompts` prompts drawn from
// `seed`, `samples` rollouts each (GRPO tasks; what GRPO maximises, estimated with fixed seeds).
// The policy's own RNG stream is left as it was.
[[nodiscard]] absl::StatusOr<double> SampledMeanReward(Trainer* trainer, const Task& task,
                                                       int policy, double temperature,
                                                       int64_t prompts, int64_t samples,
                                                       uint64_t seed);

// One optimizer step for each (policy, task): GRPO rollouts of all of them share decode
// batches, and micro-batch i of every policy shares one forward/backward. With one entry this
// is plain single-policy training; calling it per policy in turn is the sequential schedule.
[[nodiscard]] absl::StatusOr<std::vector<StepReport>> TrainStep(
    Trainer* trainer, const std::vector<std::pair<int, const Task*>>& work,
    const StepConfig& config);

}  // namespace loradb::trainer

#endif  // LORADB_COMPUTE_TRAINER_TASKS_H_
