// Time-sliced training of K policies on one resident base: a scheduler that runs TrainStep
// (tasks.h) on cohorts of policies from several worker threads, so while one worker decodes a
// cohort's rollouts another runs a cohort's forward/backward and optimizer step (the trainer
// and the decoder are kept busy), and the policies of one cohort share decode batches and
// forward/backward batches (per-row adapters).
//
// Each policy still takes its own steps in order (on-policy GRPO: rollouts of step s use the
// weights after step s - 1), and its data comes from its own RNG stream, so a policy trains the
// same whether it runs alone, in a cohort, or beside other cohorts (up to float reassociation
// in larger matmuls). Only cohorts of distinct policies run at once: the Trainer allows calls on
// disjoint policies from different threads.
#ifndef LORADB_COMPUTE_TRAINER_TIME_SLICER_H_
#define LORADB_COMPUTE_TRAINER_TIME_SLICER_H_

#include <cstdint>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "compute/trainer/tasks.h"
#include "compute/trainer/trainer.h"

namespace loradb::trainer {

struct TimeSliceOptions {
  int64_t steps = 1;    // optimizer steps per policy
  int64_t workers = 2;  // threads stepping cohorts at once (each runs ops on one core)
  // Policies per cohort (one shared TrainStep); 0: ceil(K / workers).
  int64_t max_cohort = 0;
};

// What one run did.
struct TimeSliceResult {
  // reports[i][s]: work[i]'s step s.
  std::vector<std::vector<StepReport>> reports;
  int64_t cohort_steps = 0;  // TrainStep calls made
  // Sums over those calls of the phase times; phases of different workers overlap in time.
  double sample_s = 0;
  double forward_backward_s = 0;
  double optim_s = 0;
};

// Trains every (policy, task) of `work` for `options.steps` steps with `config`. Cohorts are
// formed greedily: a free worker takes the idle policies with the fewest steps done (up to
// max_cohort). InvalidArgument for empty work, a policy listed twice, steps / workers < 1 or a
// negative max_cohort; the first failing step stops the run and its error is returned (policies
// may then have taken different numbers of steps).
[[nodiscard]] absl::StatusOr<TimeSliceResult> TrainTimeSliced(
    Trainer* trainer, const std::vector<std::pair<int, const Task*>>& work,
    const StepConfig& config, const TimeSliceOptions& options);

}  // namespace loradb::trainer

#endif  // LORADB_COMPUTE_TRAINER_TIME_SLICER_H_
