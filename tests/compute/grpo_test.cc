// GRPO's parts checked directly: the surrogate's gradient at ratio 1 is REINFORCE's, the
// trainer's GRPO gradient is the advantage times the log-likelihood gradient, rollouts come from
// the current weights at the temperature the loss uses, zero-variance groups are skipped, and
// the random base's output-layer scale decides whether a policy can be confident at all.
#include <ATen/core/grad_mode.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "tests/test_paths.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "compute/model/checkpoint.h"
#include "compute/trainer/losses.h"
#include "compute/trainer/tasks.h"
#include "compute/trainer/trainer.h"
#include "tests/compute/trainer_test_util.h"

namespace loradb::trainer {
namespace {

using ::loradb::testing::TinyTrainerModel;
using ::loradb::testing::TinyUnitLogitModel;

PolicyOptions Options(const std::string& name, uint64_t seed) {
  PolicyOptions o;
  o.name = name;
  o.seed = seed;
  o.lora.rank = 4;
  o.schedule.lr = 1e-2;
  return o;
}

// Prompt [1, 100 + k, 2], completion [200 + k, 3]: the loss covers the two completion targets.
std::vector<Datum> Data(int n, float temperature) {
  std::vector<Datum> out;
  for (int i = 0; i < n; ++i) {
    Datum d;
    d.tokens = {1, 100 + i, 2, 200 + i, 3};
    d.weights = {0, 0, 1, 1};
    d.temperature = temperature;
    out.push_back(d);
  }
  return out;
}

TEST(GrpoLossGradient, AtRatioOneIsMinusAdvantageOverTokens) {
  at::Tensor lp = at::randn({6}, at::TensorOptions().dtype(at::kFloat)).set_requires_grad(true);
  at::Tensor adv = at::tensor({0.5f, 0.5f, -1.5f, -1.5f, 2.0f, 2.0f});
  at::Tensor m = at::tensor({1.0f, 1.0f, 1.0f, 0.0f, 1.0f, 1.0f});
  auto out = GrpoLoss(lp, lp.detach(), adv, m, at::Tensor(), GrpoOptions{});
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->clip_fraction, 0.0);
  EXPECT_NEAR(out->loss.item<float>(), -(0.5 + 0.5 - 1.5 + 2 + 2) / 5.0, 1e-6);
  out->loss.backward();
  // d/d lp of -sum(A m exp(lp - old)) / sum(m) at lp = old: -A m / sum(m).
  EXPECT_TRUE(at::allclose(lp.grad(), -adv * m / 5.0, 1e-6, 1e-7)) << lp.grad();
}

TEST(GrpoTrainerGradient, IsAdvantageTimesLogLikelihoodGradientAtTheSamplingTemperature) {
  // On-policy (sampling log-probs = the current ones), one GRPO datum with advantage A gives
  // A times the gradient of the SFT loss on the same completion at the same temperature: the
  // clipped surrogate reduces to REINFORCE, with the sign that raises rewarded completions.
  constexpr float kT = 0.5f, kA = 0.7f;
  Trainer grpo(&TinyUnitLogitModel()), sft(&TinyUnitLogitModel());
  const std::vector<Datum> data = Data(3, kT);
  for (Trainer* t : {&grpo, &sft}) {
    ASSERT_TRUE(t->AddPolicy(Options("p", 5)).ok());
    ASSERT_TRUE(t->ForwardBackward({{0, LossKind::kCrossEntropy, Data(4, 1.0f)}}).ok());
    ASSERT_TRUE(t->OptimStep(0).ok());  // B != 0, so every factor gets a gradient
  }
  auto lp = grpo.Logprobs(0, data);
  ASSERT_TRUE(lp.ok()) << lp.status();
  std::vector<Datum> rollouts = data;
  for (size_t i = 0; i < rollouts.size(); ++i) {
    rollouts[i].sampling_logprobs = (*lp)[i];
    rollouts[i].advantage = kA;
  }
  auto g = grpo.ForwardBackward({{0, LossKind::kGrpo, rollouts}});
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_NEAR((*g)[0].loss, -kA, 1e-5);  // ratio 1 everywhere
  EXPECT_EQ((*g)[0].metric, 0.0);        // nothing clipped
  ASSERT_TRUE(sft.ForwardBackward({{0, LossKind::kCrossEntropy, data}}).ok());
  for (const auto& [name, t] : grpo.parameters(0).named()) {
    const at::Tensor& want = sft.parameters(0).named().at(name).grad();
    ASSERT_TRUE(t.grad().defined()) << name;
    EXPECT_GT(want.abs().sum().item<float>(), 0) << name;
    EXPECT_TRUE(at::allclose(t.grad(), want * kA, 1e-4, 1e-5))
        << name << " max diff " << (t.grad() - want * kA).abs().max().item<float>() << " max "
        << want.abs().max().item<float>() * kA << " ratio "
        << (t.grad() * want).sum().item<float>() / (want * want).sum().item<float>();
  }
  // A negative advantage pushes the other way.
  Trainer neg(&TinyUnitLogitModel());
  ASSERT_TRUE(neg.AddPolicy(Options("p", 5)).ok());
  ASSERT_TRUE(neg.ForwardBackward({{0, LossKind::kCrossEntropy, Data(4, 1.0f)}}).ok());
  ASSERT_TRUE(neg.OptimStep(0).ok());
  for (Datum& d : rollouts) d.advantage = -kA;
  ASSERT_TRUE(neg.ForwardBackward({{0, LossKind::kGrpo, rollouts}}).ok());
  for (const auto& [name, t] : neg.parameters(0).named()) {
    const at::Tensor& want = sft.parameters(0).named().at(name).grad();
    EXPECT_TRUE(at::allclose(t.grad(), want * -kA, 1e-4, 1e-5)) << name;
  }
}

TEST(GrpoRollouts, ComeFromTheCurrentWeightsAtTheLossTemperature) {
  // Each Sample call uses the weights of the last OptimStep, and the log-probs it records are
  // those of softmax(logits / T), which a datum carrying T reproduces in the loss's forward.
  constexpr double kT = 0.5;
  Trainer t(&TinyUnitLogitModel());
  ASSERT_TRUE(t.AddPolicy(Options("p", 6)).ok());
  const std::vector<int64_t> prompt = {1, 105, 2};
  for (int round = 0; round < 2; ++round) {
    ASSERT_TRUE(t.ForwardBackward({{0, LossKind::kCrossEntropy, Data(8, 1.0f)}}).ok());
    ASSERT_TRUE(t.OptimStep(0).ok());
    auto s = t.Sample({{0, prompt, 2, kT, {}}, {0, prompt, 2, kT, {}}});
    ASSERT_TRUE(s.ok()) << s.status();
    for (const SampleResult& r : *s) {
      Datum d;
      d.tokens = prompt;
      d.tokens.insert(d.tokens.end(), r.tokens.begin(), r.tokens.end());
      d.weights = {0, 0, 1, 1};
      d.temperature = static_cast<float>(kT);
      auto lp = t.Logprobs(0, {d});
      ASSERT_TRUE(lp.ok());
      EXPECT_NEAR((*lp)[0][2], r.logprobs[0], 1e-4) << round;
      EXPECT_NEAR((*lp)[0][3], r.logprobs[1], 1e-4) << round;
      // At T = 1 the same completion has other log-probs: the temperature is really applied.
      d.temperature = 1.0f;
      auto lp1 = t.Logprobs(0, {d});
      ASSERT_TRUE(lp1.ok());
      EXPECT_GT(std::abs((*lp1)[0][2] - r.logprobs[0]), 1e-3) << round;
    }
  }
}

TEST(GrpoStep, ZeroVarianceGroupsAreSkippedAndAllFlatStillSteps) {
  auto task = MakeTask("arithmetic", TinyUnitLogitModel().config().vocab_size, 1);
  ASSERT_TRUE(task.ok());
  StepConfig sc;
  sc.grpo_prompts = 8;
  sc.grpo_group = 4;
  // A fresh policy on the base never earns a reward: every group is flat, the step runs with
  // zero gradient, and the step count advances.
  Trainer fresh(&TinyUnitLogitModel());
  ASSERT_TRUE(fresh.AddPolicy(Options("fresh", 7)).ok());
  auto r = TrainStep(&fresh, {{0, task->get()}}, sc);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ((*r)[0].mean_reward, 0.0);
  EXPECT_EQ((*r)[0].skipped_groups, 0);
  EXPECT_EQ((*r)[0].grad_norm, 0.0);
  EXPECT_EQ(fresh.step(0), 1);
  // After a warm start some groups vary and some do not: the flat ones are left out.
  Trainer warm(&TinyUnitLogitModel());
  ASSERT_TRUE(warm.AddPolicy(Options("warm", 7)).ok());
  StepConfig sft = sc;
  sft.force_sft = true;
  for (int i = 0; i < 15; ++i) ASSERT_TRUE(TrainStep(&warm, {{0, task->get()}}, sft).ok());
  int64_t skipped = 0, steps_with_signal = 0;
  for (int i = 0; i < 4; ++i) {
    auto g = TrainStep(&warm, {{0, task->get()}}, sc);
    ASSERT_TRUE(g.ok()) << g.status();
    // Count the flat groups in the step's rollout records (prompt|completion|reward lines).
    std::vector<float> rewards;
    for (absl::string_view line : absl::StrSplit((*g)[0].rollouts, '\n', absl::SkipEmpty())) {
      float v = 0;
      ASSERT_TRUE(absl::SimpleAtof(line.substr(line.rfind('|') + 1), &v)) << line;
      rewards.push_back(v);
    }
    ASSERT_EQ(rewards.size(), 32u);
    int64_t flat = 0;
    for (size_t s = 0; s < rewards.size(); s += 4) {
      flat += rewards[s] == rewards[s + 1] && rewards[s] == rewards[s + 2] &&
              rewards[s] == rewards[s + 3];
    }
    if (flat < 8) {
      EXPECT_EQ((*g)[0].skipped_groups, flat) << i;
      EXPECT_GT((*g)[0].grad_norm, 0.0) << i;
      ++steps_with_signal;
    }
    skipped += (*g)[0].skipped_groups;
  }
  EXPECT_GT(steps_with_signal, 0);
  EXPECT_GT(skipped, 0);  // the warm start gets some prompts always right or always wrong
}

TEST(GrpoBase, OutputLayerScaleBoundsTheConfidence) {
  // The same SFT training on the default tiny base and on the unit-logit one: the first cannot
  // put even 2% of the probability on the target (its logits are bounded by ~2.6), the second
  // can. This is why GRPO's tests and the demo sample from the unit-logit base.
  auto prob = [](const model::Qwen3Model& m) {
    Trainer t(&m);
    EXPECT_TRUE(t.AddPolicy(Options("p", 8)).ok());
    const std::vector<Datum> data = Data(4, 1.0f);
    for (int i = 0; i < 40; ++i) {
      EXPECT_TRUE(t.ForwardBackward({{0, LossKind::kCrossEntropy, data}}).ok());
      EXPECT_TRUE(t.OptimStep(0).ok());
    }
    auto lp = t.Logprobs(0, data);
    EXPECT_TRUE(lp.ok());
    double p = 0;
    for (const auto& row : *lp) p += std::exp(row[2]) / 4.0;
    return p;
  };
  const double flat = prob(TinyTrainerModel());
  const double unit = prob(TinyUnitLogitModel());
  std::fprintf(stderr, "p(target) after 40 SFT steps: default base %.4f, unit-logit base %.4f\n",
               flat, unit);
  EXPECT_LT(flat, 0.02);
  EXPECT_GT(unit, 0.5);
}

TEST(GrpoBase, RandomCheckpointRejectsABadOutputLayerStd) {
  auto config =
      ReadModelConfig(std::string(LORADB_SOURCE_DIR) + "/compute/configs/tiny-dense.json");
  ASSERT_TRUE(config.ok());
  ::loradb::testing::TempDir dir;
  EXPECT_EQ(model::WriteRandomCheckpoint(*config, dir.path(), 1, at::kFloat, 0.02, -1.0).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(model::WriteRandomCheckpoint(*config, dir.path(), 1, at::kFloat, 0.0).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(std::filesystem::exists(dir.file("model.safetensors")));
}

}  // namespace
}  // namespace loradb::trainer
