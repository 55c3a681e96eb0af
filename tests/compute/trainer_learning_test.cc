// Toy tasks that prove the trainer learns (fixed seeds, generous but meaningful thresholds), and
// time-sliced multi-policy training matching sequential training. The default run uses short
// schedules; LORADB_SLOW_TESTS=1 adds the long versions with the full thresholds.
#include <gtest/gtest.h>

#include <cstdio>

#include "compute/trainer/tasks.h"
#include "tests/compute/trainer_test_util.h"

namespace loradb::trainer {
namespace {

using ::loradb::testing::TinyTrainerModel;

PolicyOptions Opts(const std::string& name, uint64_t seed, double lr) {
  PolicyOptions o;
  o.name = name;
  o.seed = seed;
  o.lora.rank = 8;
  o.lora.alpha = 16;
  o.schedule.lr = lr;
  return o;
}

std::unique_ptr<Task> Make(const std::string& name) {
  auto t = MakeTask(name, TinyTrainerModel().config().vocab_size, 1);
  EXPECT_TRUE(t.ok()) << t.status();
  return std::move(t).value();
}

double Score(Trainer* t, const Task& task, int policy, double* margin = nullptr) {
  auto s = task.Evaluate(t, policy);
  EXPECT_TRUE(s.ok()) << s.status();
  if (margin != nullptr) *margin = s.ok() ? s->margin : 0;
  return s.ok() ? s->score : -1;
}

void Train(Trainer* t, const Task& task, int steps, const StepConfig& sc) {
  for (int i = 0; i < steps; ++i) {
    auto r = TrainStep(t, {{0, &task}}, sc);
    ASSERT_TRUE(r.ok()) << r.status();
  }
}

void SftMapping(int steps, double want) {
  auto task = Make("mapping");
  Trainer t(&TinyTrainerModel());
  ASSERT_TRUE(t.AddPolicy(Opts("sft", 1, 1e-2)).ok());
  const double before = Score(&t, *task, 0);
  StepConfig sc;
  sc.batch_size = 32;
  Train(&t, *task, steps, sc);
  const double after = Score(&t, *task, 0);
  std::fprintf(stderr, "mapping accuracy %.3f -> %.3f after %d steps\n", before, after, steps);
  EXPECT_LE(before, 0.1);  // chance is 1/vocab
  EXPECT_GE(after, want);
}

TEST(TrainerLearning, SftMappingFromChanceToAccurate) { SftMapping(60, 0.95); }

void DpoPreference(int steps, double want_margin, double want_preferred) {
  auto task = Make("preference");
  Trainer t(&TinyTrainerModel());
  ASSERT_TRUE(t.AddPolicy(Opts("dpo", 2, 1e-2)).ok());
  double m0 = 0, m1 = 0;
  const double p0 = Score(&t, *task, 0, &m0);
  StepConfig sc;
  sc.batch_size = 16;
  Train(&t, *task, steps, sc);
  const double p1 = Score(&t, *task, 0, &m1);
  std::fprintf(stderr, "held-out DPO margin %.4f -> %.4f, preferred %.3f -> %.3f\n", m0, m1, p0,
               p1);
  EXPECT_NEAR(m0, 0.0, 1e-6);  // B = 0: the policy starts as its reference
  EXPECT_GE(m1, want_margin);
  EXPECT_GE(p1, want_preferred);
}

TEST(TrainerLearning, DpoHeldOutMarginRises) { DpoPreference(30, 0.03, 0.75); }

// GRPO after an SFT warm start on the arithmetic task (reward 0.5 per correct digit of a + b),
// on the tiny base with a unit-variance output layer (TinyUnitLogitModel: on the default tiny
// base no policy can put more than ~1.3% of the probability on a token, so rollouts at T = 1
// never earn a reward; see GrpoBase.OutputLayerScaleBoundsTheConfidence). The warm start is 15
// SFT steps at lr 1e-2; the GRPO policy starts from its snapshot (weights and optimizer state)
// with its own lr 3e-3 (at 1e-2 GRPO overshoots and the reward falls back after ~20 steps), 16
// prompts x 8 rollouts per step at T = 1, no KL. The score is what GRPO maximises: the mean
// reward of rollouts at T = 1, estimated on 400 prompts x 4 rollouts = 1,600 samples drawn with
// their own seed (independent of the training draws; standard error ~0.01).
struct GrpoRun {
  double before = 0, after = 0, greedy_before = 0, greedy_after = 0;
};

GrpoRun GrpoArithmetic(uint64_t seed, int steps) {
  GrpoRun run;
  const model::Qwen3Model& base = ::loradb::testing::TinyUnitLogitModel();
  auto made = MakeTask("arithmetic", base.config().vocab_size, 1);
  EXPECT_TRUE(made.ok()) << made.status();
  if (!made.ok()) return run;
  const Task& task = **made;
  Trainer t(&base);
  EXPECT_TRUE(t.AddPolicy(Opts("warm", seed, 1e-2)).ok());
  StepConfig warm_sc;
  warm_sc.batch_size = 32;
  warm_sc.force_sft = true;
  Train(&t, task, 15, warm_sc);
  auto snapshot = t.Snapshot(0);
  EXPECT_TRUE(snapshot.ok()) << snapshot.status();
  auto grpo = t.AddPolicy(Opts("grpo", seed, 3e-3));
  EXPECT_TRUE(grpo.ok()) << grpo.status();
  if (!snapshot.ok() || !grpo.ok()) return run;
  EXPECT_TRUE(t.Restore(*grpo, *snapshot).ok());
  t.rng(*grpo) = Rng(seed + 1000);  // its own stream of prompts and samples
  constexpr double kT = 1.0;
  auto r0 = SampledMeanReward(&t, task, *grpo, kT, 400, 4, 77);
  EXPECT_TRUE(r0.ok()) << r0.status();
  run.greedy_before = Score(&t, task, *grpo);
  StepConfig sc;
  sc.grpo_prompts = 16;
  sc.grpo_group = 8;
  sc.temperature = kT;
  for (int i = 0; i < steps; ++i) {
    auto r = TrainStep(&t, {{*grpo, &task}}, sc);
    EXPECT_TRUE(r.ok()) << r.status();
    if (!r.ok()) return run;
  }
  auto r1 = SampledMeanReward(&t, task, *grpo, kT, 400, 4, 77);
  EXPECT_TRUE(r1.ok()) << r1.status();
  run.greedy_after = Score(&t, task, *grpo);
  run.before = r0.ok() ? *r0 : 0;
  run.after = r1.ok() ? *r1 : 0;
  std::fprintf(stderr,
               "seed %llu: arithmetic mean reward at T=1 (1,600 samples) %.3f after 15 SFT steps "
               "-> %.3f after %d GRPO steps; greedy %.3f -> %.3f\n",
               static_cast<unsigned long long>(seed), run.before, run.after, steps,
               run.greedy_before, run.greedy_after);
  return run;
}

// Measured: seed 3, 40 steps: 0.208 -> 0.404 (greedy 0.330 -> 0.420). On a base whose output layer
// is drawn at 0.02 (flat policies) at T = 0.3 it reaches only 0.314 -> 0.349, and this fails.
TEST(TrainerLearning, GrpoRewardRisesAfterWarmStart) {
  const GrpoRun r = GrpoArithmetic(3, 40);
  EXPECT_GE(r.before, 0.1);  // the warm start earns some reward: GRPO has signal
  EXPECT_LE(r.before, 0.35);
  EXPECT_GE(r.after, r.before + 0.15);
  EXPECT_GE(r.after, 1.5 * r.before);
}

// Two more seeds, 60 steps: 0.255 -> 0.496 and 0.193 -> 0.492. It plateaus near 0.5.
TEST(TrainerLearningSlow, GrpoRewardRisesForOtherSeedsAndLonger) {
  LORADB_SLOW_TEST();
  for (uint64_t seed : {4u, 5u}) {
    const GrpoRun r = GrpoArithmetic(seed, 60);
    EXPECT_GE(r.after, r.before + 0.15) << seed;
    EXPECT_GE(r.after, 1.5 * r.before) << seed;
  }
}

TEST(TrainerLearning, TimeSlicedPoliciesTrainLikeSequentialOnes) {
  // Three policies with three losses: stepping them together (shared sampling and shared
  // forward/backward) gives each the same losses as stepping it alone, up to float
  // reassociation in the larger matmuls.
  auto sft = Make("mapping");
  auto dpo = Make("preference");
  auto grpo = Make("arithmetic");
  Trainer shared(&TinyTrainerModel()), sequential(&TinyTrainerModel());
  for (Trainer* t : {&shared, &sequential}) {
    ASSERT_TRUE(t->AddPolicy(Opts("a", 1, 1e-2)).ok());
    ASSERT_TRUE(t->AddPolicy(Opts("b", 2, 1e-2)).ok());
    ASSERT_TRUE(t->AddPolicy(Opts("c", 3, 1e-2)).ok());
  }
  StepConfig sc;
  sc.batch_size = 8;
  sc.grpo_prompts = 4;
  sc.grpo_group = 4;
  std::vector<std::pair<int, const Task*>> work = {{0, sft.get()}, {1, dpo.get()}, {2, grpo.get()}};
  for (int step = 0; step < 3; ++step) {
    auto together = TrainStep(&shared, work, sc);
    ASSERT_TRUE(together.ok()) << together.status();
    for (size_t i = 0; i < work.size(); ++i) {
      auto alone = TrainStep(&sequential, {work[i]}, sc);
      ASSERT_TRUE(alone.ok()) << alone.status();
      EXPECT_NEAR((*together)[i].loss, (*alone)[0].loss, 1e-4 * (1 + std::abs((*alone)[0].loss)))
          << "policy " << i << " step " << step;
      EXPECT_EQ((*together)[i].rollouts, (*alone)[0].rollouts) << "policy " << i;
    }
  }
}

TEST(TrainerLearningSlow, SftMappingLong) {
  LORADB_SLOW_TEST();
  SftMapping(150, 0.99);
}

TEST(TrainerLearningSlow, DpoLong) {
  LORADB_SLOW_TEST();
  DpoPreference(100, 0.05, 0.8);
}

}  // namespace
}  // namespace loradb::trainer
