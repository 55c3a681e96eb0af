// The time-sliced scheduler: K policies stepped by several worker threads in cohorts train like
// the same policies stepped one after another, and bad input is refused before any step.
#include "compute/trainer/time_slicer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>

#include "tests/compute/trainer_test_util.h"

namespace loradb::trainer {
namespace {

using ::loradb::testing::TinyTrainerModel;

PolicyOptions Opts(const std::string& name, uint64_t seed) {
  PolicyOptions o;
  o.name = name;
  o.seed = seed;
  o.schedule.lr = 1e-2;
  return o;
}

std::unique_ptr<Task> Make(const std::string& name) {
  auto t = MakeTask(name, TinyTrainerModel().config().vocab_size, 1);
  EXPECT_TRUE(t.ok()) << t.status();
  return std::move(t).value();
}

StepConfig SmallSteps() {
  StepConfig sc;
  sc.batch_size = 8;
  sc.grpo_prompts = 4;
  sc.grpo_group = 4;
  return sc;
}

// Runs `work` time-sliced with `workers` / `cohort` and one after another on two fresh trainers
// and compares every step's loss and rollouts.
void ExpectLikeSequential(int64_t workers, int64_t cohort) {
  auto sft = Make("mapping");
  auto dpo = Make("preference");
  auto grpo = Make("arithmetic");
  auto grpo2 = Make("arithmetic");
  Trainer sliced(&TinyTrainerModel()), sequential(&TinyTrainerModel());
  for (Trainer* t : {&sliced, &sequential}) {
    for (int i = 0; i < 4; ++i) ASSERT_TRUE(t->AddPolicy(Opts(absl::StrCat("p", i), i + 1)).ok());
  }
  std::vector<std::pair<int, const Task*>> work = {
      {0, sft.get()}, {1, dpo.get()}, {2, grpo.get()}, {3, grpo2.get()}};
  const StepConfig sc = SmallSteps();
  TimeSliceOptions to;
  to.steps = 3;
  to.workers = workers;
  to.max_cohort = cohort;
  auto r = TrainTimeSliced(&sliced, work, sc, to);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->reports.size(), work.size());
  EXPECT_GE(r->cohort_steps, 3);
  for (size_t i = 0; i < work.size(); ++i) {
    ASSERT_EQ(r->reports[i].size(), 3u) << "policy " << i;
    EXPECT_EQ(sliced.step(work[i].first), 3);
    for (int step = 0; step < 3; ++step) {
      auto alone = TrainStep(&sequential, {work[i]}, sc);
      ASSERT_TRUE(alone.ok()) << alone.status();
      const StepReport& got = r->reports[i][step];
      EXPECT_EQ(got.policy, work[i].first);
      EXPECT_EQ(got.step, step + 1);
      EXPECT_NEAR(got.loss, (*alone)[0].loss, 1e-4 * (1 + std::abs((*alone)[0].loss)))
          << "policy " << i << " step " << step;
      EXPECT_EQ(got.rollouts, (*alone)[0].rollouts) << "policy " << i << " step " << step;
    }
  }
}

TEST(TimeSlicer, TwoWorkersOnePolicyPerStepTrainLikeSequential) { ExpectLikeSequential(2, 1); }

TEST(TimeSlicer, TwoWorkersSharedCohortsTrainLikeSequential) { ExpectLikeSequential(2, 0); }

TEST(TimeSlicer, OneWorkerAllPoliciesSharedTrainLikeSequential) { ExpectLikeSequential(1, 0); }

TEST(TimeSlicer, BadInputIsRefusedBeforeAnyStep) {
  auto grpo = Make("arithmetic");
  Trainer t(&TinyTrainerModel());
  ASSERT_TRUE(t.AddPolicy(Opts("a", 1)).ok());
  ASSERT_TRUE(t.AddPolicy(Opts("b", 2)).ok());
  const StepConfig sc = SmallSteps();
  TimeSliceOptions to;
  EXPECT_EQ(TrainTimeSliced(&t, {}, sc, to).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(TrainTimeSliced(&t, {{0, grpo.get()}, {0, grpo.get()}}, sc, to).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(TrainTimeSliced(&t, {{2, grpo.get()}}, sc, to).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(TrainTimeSliced(&t, {{0, nullptr}}, sc, to).status().code(),
            absl::StatusCode::kInvalidArgument);
  TimeSliceOptions bad = to;
  bad.workers = 0;
  EXPECT_EQ(TrainTimeSliced(&t, {{0, grpo.get()}}, sc, bad).status().code(),
            absl::StatusCode::kInvalidArgument);
  bad = to;
  bad.steps = 0;
  EXPECT_EQ(TrainTimeSliced(&t, {{0, grpo.get()}}, sc, bad).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(t.step(0), 0);
  EXPECT_EQ(t.step(1), 0);
}

TEST(TimeSlicer, AFailingStepStopsTheRunWithItsError) {
  // More micro-batches than data in a step: TrainStep refuses it; the run returns that error.
  auto grpo = Make("arithmetic");
  Trainer t(&TinyTrainerModel());
  ASSERT_TRUE(t.AddPolicy(Opts("a", 1)).ok());
  ASSERT_TRUE(t.AddPolicy(Opts("b", 2)).ok());
  StepConfig sc = SmallSteps();
  sc.micro_batches = 1000;
  TimeSliceOptions to;
  to.steps = 2;
  auto r = TrainTimeSliced(&t, {{0, grpo.get()}, {1, grpo.get()}}, sc, to);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  EXPECT_EQ(t.step(0), 0);
  EXPECT_EQ(t.step(1), 0);
}

}  // namespace
}  // namespace loradb::trainer
