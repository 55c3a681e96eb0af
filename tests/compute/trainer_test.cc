// Unit tests of the trainer's parts: RNG, AdamW and schedules, losses, LoRA parameters, the
// Trainer API (gradients, shared multi-policy batches, validation, exact resume).
#include "compute/trainer/trainer.h"

#include <ATen/core/grad_mode.h>
#include <gtest/gtest.h>

#include <cmath>

#include "compute/trainer/tasks.h"
#include "tests/compute/trainer_test_util.h"

namespace loradb::trainer {
namespace {

using ::loradb::testing::TinyTrainerModel;

TEST(TrainerRng, SerializeRestoreContinuesTheStream) {
  Rng a(42);
  for (int i = 0; i < 5; ++i) a.NextU64();
  auto b = Rng::Restore(a.Serialize());
  ASSERT_TRUE(b.ok()) << b.status();
  for (int i = 0; i < 10; ++i) EXPECT_EQ(a.NextU64(), b->NextU64());
  EXPECT_NE(Rng(1).NextU64(), Rng(2).NextU64());
  EXPECT_FALSE(Rng::Restore("xyz").ok());
  EXPECT_FALSE(Rng::Restore(std::string(64, '0')).ok());
  EXPECT_FALSE(Rng::Restore(std::string(63, '0') + "g").ok());
  for (int i = 0; i < 1000; ++i) {
    const double u = a.Uniform();
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    ASSERT_LT(a.Below(7), 7u);
  }
}

TEST(TrainerAdamW, FirstStepMovesByLrTimesSignAndDecays) {
  at::Tensor p = at::tensor({1.0f, -2.0f}).set_requires_grad(true);
  p.mutable_grad() = at::tensor({0.5f, -3.0f});
  AdamWOptions o;
  o.weight_decay = 0.1;
  o.max_grad_norm = 0;  // off
  AdamW opt(o);
  auto st = opt.Step({{"w", p}}, 0.01);
  ASSERT_TRUE(st.ok()) << st.status();
  EXPECT_NEAR(st->grad_norm, std::sqrt(0.25 + 9.0), 1e-6);
  // Bias-corrected first step: m/sqrt(v) = sign(g); decay first: p *= 1 - lr * wd.
  EXPECT_NEAR(p[0].item<float>(), 1.0 * (1 - 0.001) - 0.01, 1e-6);
  EXPECT_NEAR(p[1].item<float>(), -2.0 * (1 - 0.001) + 0.01, 1e-6);
  EXPECT_EQ(opt.step(), 1);
}

TEST(TrainerAdamW, ClipsTheGlobalNorm) {
  at::Tensor p = at::zeros({2}).set_requires_grad(true);
  p.mutable_grad() = at::tensor({30.0f, 40.0f});
  AdamWOptions o;
  o.max_grad_norm = 1.0;
  o.beta1 = 0;  // update = g / (|g| + eps): clipping cancels, but the norm is reported
  AdamW opt(o);
  auto st = opt.Step({{"w", p}}, 0.1);
  ASSERT_TRUE(st.ok());
  EXPECT_NEAR(st->grad_norm, 50.0, 1e-4);
  auto state = opt.ExportState();
  // exp_avg_sq = (1 - beta2) * (clipped g)^2 with clipped g = g / 50.
  EXPECT_NEAR(state["w.exp_avg_sq"][1].item<float>(), 0.001 * 0.8 * 0.8, 1e-7);
}

TEST(TrainerAdamW, StateIsKeyedByNameAndImportChecksIt) {
  at::Tensor a = at::ones({2, 3}).set_requires_grad(true);
  at::Tensor b = at::ones({4}).set_requires_grad(true);
  a.mutable_grad() = at::ones({2, 3});
  b.mutable_grad() = at::ones({4});
  AdamW opt;
  ASSERT_TRUE(opt.Step({{"a", a}, {"b", b}}, 0.1).ok());
  auto state = opt.ExportState();
  EXPECT_EQ(state.size(), 5u);
  ASSERT_TRUE(state.count("a.exp_avg") && state.count("b.exp_avg_sq") && state.count("adamw.step"));

  AdamW fresh;
  // Positions do not matter, names do: a map with the same names in any order restores.
  ASSERT_TRUE(fresh.ImportState(state, {{"b", b}, {"a", a}}).ok());
  EXPECT_EQ(fresh.step(), 1);
  // Wrong shape, missing moments, extra tensors: rejected, state unchanged.
  AdamW other;
  at::Tensor wrong = at::ones({5});
  EXPECT_FALSE(other.ImportState(state, {{"a", a}, {"b", wrong}}).ok());
  EXPECT_FALSE(other.ImportState(state, {{"a", a}}).ok());
  auto missing = state;
  missing.erase("a.exp_avg");
  EXPECT_FALSE(other.ImportState(missing, {{"a", a}, {"b", b}}).ok());
  EXPECT_EQ(other.step(), 0);
}

TEST(TrainerAdamW, NonFiniteGradientIsRejectedWithoutUpdate) {
  at::Tensor p = at::ones({2}).set_requires_grad(true);
  p.mutable_grad() = at::tensor({NAN, 1.0f});
  AdamW opt;
  EXPECT_FALSE(opt.Step({{"w", p}}, 0.1).ok());
  EXPECT_EQ(opt.step(), 0);
  EXPECT_EQ(p[1].item<float>(), 1.0f);
}

TEST(TrainerSchedule, ConstantAndWarmupCosine) {
  LrSchedule c;
  c.lr = 0.5;
  EXPECT_EQ(c.At(0), 0.5);
  EXPECT_EQ(c.At(1000), 0.5);
  LrSchedule s;
  s.kind = LrSchedule::Kind::kCosine;
  s.lr = 1.0;
  s.warmup_steps = 4;
  s.total_steps = 14;
  s.min_lr_ratio = 0.1;
  ASSERT_TRUE(ValidateSchedule(s).ok());
  EXPECT_NEAR(s.At(0), 0.2, 1e-12);
  EXPECT_NEAR(s.At(3), 0.8, 1e-12);
  EXPECT_NEAR(s.At(4), 1.0, 1e-12);
  EXPECT_NEAR(s.At(9), 0.1 + 0.9 * 0.5, 1e-12);
  EXPECT_NEAR(s.At(14), 0.1, 1e-12);
  EXPECT_NEAR(s.At(100), 0.1, 1e-12);
  EXPECT_EQ(s.Name(), "cosine");
  s.total_steps = 3;
  EXPECT_FALSE(ValidateSchedule(s).ok());
  EXPECT_FALSE(ParseScheduleKind("linear").ok());
}

TEST(TrainerLosses, SftIsMaskedMeanNll) {
  at::Tensor logits = at::tensor({0.0f, 0.0f, 2.0f, 0.0f}).reshape({2, 2});
  at::Tensor lp = TokenLogprobs(logits, at::tensor({int64_t{0}, int64_t{0}}));
  EXPECT_NEAR(lp[0].item<float>(), std::log(0.5), 1e-6);
  auto loss = SftLoss(lp, at::tensor({0.0f, 1.0f}));
  ASSERT_TRUE(loss.ok());
  EXPECT_NEAR(loss->item<float>(), -(2.0 - std::log(std::exp(2.0) + 1.0)), 1e-6);
  EXPECT_FALSE(SftLoss(lp, at::zeros({2})).ok());
  EXPECT_FALSE(SftLoss(lp, at::ones({3})).ok());
}

TEST(TrainerLosses, DpoAtTheReferenceIsLog2AndMarginsSign) {
  at::Tensor c = at::tensor({-1.0f, -2.0f}), r = at::tensor({-3.0f, -1.0f});
  auto same = DpoLoss(c, r, c, r, 0.1);
  ASSERT_TRUE(same.ok());
  EXPECT_NEAR(same->loss.item<float>(), std::log(2.0), 1e-6);
  auto moved = DpoLoss(c + 1.0, r, c, r, 0.5);
  ASSERT_TRUE(moved.ok());
  EXPECT_NEAR(moved->margins[0].item<float>(), 0.5, 1e-6);
  EXPECT_LT(moved->loss.item<float>(), std::log(2.0));
  EXPECT_FALSE(DpoLoss(c, r, c, r, 0).ok());
  EXPECT_FALSE(DpoLoss(c, at::ones({3}), c, r, 0.1).ok());
}

TEST(TrainerLosses, GroupAdvantagesAndClippedSurrogate) {
  auto adv = GroupAdvantages({1, 0, 0, 1, 2, 2}, 2);
  ASSERT_TRUE(adv.ok());
  EXPECT_GT((*adv)[0], 0);
  EXPECT_LT((*adv)[1], 0);
  EXPECT_NEAR((*adv)[0] + (*adv)[1], 0, 1e-6);
  EXPECT_EQ((*adv)[4], 0);  // a group with equal rewards carries no signal
  EXPECT_FALSE(GroupAdvantages({1, 2, 3}, 2).ok());

  at::Tensor lp = at::tensor({-1.0f, -1.0f, -1.0f}).set_requires_grad(true);
  at::Tensor old = at::tensor({-1.0f, -1.5f, -1.0f});
  at::Tensor a = at::tensor({1.0f, 1.0f, -1.0f});
  at::Tensor m = at::tensor({1.0f, 1.0f, 0.0f});
  GrpoOptions o;
  auto out = GrpoLoss(lp, old, a, m, at::Tensor(), o);
  ASSERT_TRUE(out.ok()) << out.status();
  // Token 0: ratio 1 -> 1; token 1: ratio e^0.5 clipped to 1.2; token 2 masked.
  EXPECT_NEAR(out->loss.item<float>(), -(1.0 + 1.2) / 2, 1e-5);
  EXPECT_NEAR(out->clip_fraction, 0.5, 1e-9);
  out->loss.backward();
  EXPECT_NEAR(lp.grad()[0].item<float>(), -0.5, 1e-6);
  EXPECT_EQ(lp.grad()[1].item<float>(), 0.0f);  // clipped: no gradient
  o.kl_beta = 0.1;
  EXPECT_FALSE(GrpoLoss(lp, old, a, m, at::Tensor(), o).ok());
  auto kl = GrpoLoss(lp, old, a, m, lp.detach() - 0.5, o);
  ASSERT_TRUE(kl.ok());
  EXPECT_NEAR(kl->mean_kl, std::exp(-0.5) + 0.5 - 1, 1e-6);
}

TEST(TrainerLoraParams, TargetsScaleAndErrors) {
  const auto& m = TinyTrainerModel();
  LoraConfig c;
  c.rank = 4;
  c.alpha = 8;
  c.target_modules = {"q_proj", "down_proj"};
  auto p = LoraParameters::Create(m.config(), c, 1);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->modules().size(), 2u * m.config().num_hidden_layers);
  EXPECT_EQ(p->config().Scale(), 2.0);
  c.use_rslora = true;
  EXPECT_EQ(c.Scale(), 4.0);
  const auto& named = p->named();
  ASSERT_TRUE(named.count("base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"));
  const at::Tensor& b = named.at("base_model.model.model.layers.1.mlp.down_proj.lora_B.weight");
  EXPECT_EQ(b.size(0), m.config().hidden_size);
  EXPECT_EQ(b.abs().sum().item<float>(), 0.0f);
  EXPECT_TRUE(b.requires_grad());
  // Same seed, same initialisation.
  auto q = LoraParameters::Create(m.config(), c, 1);
  ASSERT_TRUE(q.ok());
  EXPECT_TRUE(at::equal(named.begin()->second, q->named().begin()->second));

  c.target_modules = {"lm_head"};
  EXPECT_EQ(LoraParameters::Create(m.config(), c, 1).status().code(),
            absl::StatusCode::kUnimplemented);
  c.target_modules = {"nope_proj"};
  EXPECT_FALSE(LoraParameters::Create(m.config(), c, 1).ok());
  c.target_modules = {"q_proj"};
  c.rank = 0;
  EXPECT_FALSE(LoraParameters::Create(m.config(), c, 1).ok());
}

PolicyOptions Options(const std::string& name, uint64_t seed, double lr = 1e-2) {
  PolicyOptions o;
  o.name = name;
  o.seed = seed;
  o.lora.rank = 4;
  o.schedule.lr = lr;
  return o;
}

std::vector<Datum> SftData(Rng* rng, int n) {
  std::vector<Datum> out;
  for (int i = 0; i < n; ++i) {
    Datum d;
    const int64_t k = static_cast<int64_t>(rng->Below(20));
    d.tokens = {1, 100 + k, 2, 200 + k, 3};
    d.weights = {0, 0, 1, 1};
    out.push_back(d);
  }
  return out;
}

TEST(Trainer, OnlyLoraGetsGradientsAndStepsChangeTheLoss) {
  Trainer t(&TinyTrainerModel());
  auto p = t.AddPolicy(Options("acme/a", 1));
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_FALSE(t.AddPolicy(Options("acme/a", 2)).ok());
  Rng rng(3);
  const auto data = SftData(&rng, 8);
  auto before = t.ForwardBackward({{*p, LossKind::kCrossEntropy, data}});
  ASSERT_TRUE(before.ok()) << before.status();
  EXPECT_EQ((*before)[0].tokens, 16);
  EXPECT_EQ(t.micro_steps(*p), 1);
  for (const auto& [name, tensor] : t.parameters(*p).named()) {
    ASSERT_TRUE(tensor.grad().defined()) << name;
  }
  // B starts at zero, so only B receives a gradient at step 0.
  const auto& named = t.parameters(*p).named();
  EXPECT_GT(named.at(LoraBName("layers.0.self_attn.q_proj")).grad().abs().sum().item<float>(), 0);
  for (int i = 0; i < 5; ++i) {
    if (i > 0) {
      ASSERT_TRUE(t.ForwardBackward({{*p, LossKind::kCrossEntropy, data}}).ok());
    }
    auto st = t.OptimStep(*p);
    ASSERT_TRUE(st.ok()) << st.status();
  }
  EXPECT_EQ(t.step(*p), 5);
  EXPECT_EQ(t.OptimStep(*p).status().code(), absl::StatusCode::kFailedPrecondition);
  auto after = t.Evaluate({{*p, LossKind::kCrossEntropy, data}});
  ASSERT_TRUE(after.ok());
  EXPECT_LT((*after)[0].loss, (*before)[0].loss);
}

TEST(Trainer, SharedBatchGivesEachPolicyItsOwnGradients) {
  // Policies A and B in one forward/backward vs each alone: A's gradients must not depend on
  // B's rows (per-row adapters), up to float reassociation.
  Rng rng(5);
  const auto da = SftData(&rng, 4), db = SftData(&rng, 6);
  Trainer shared(&TinyTrainerModel()), alone(&TinyTrainerModel());
  for (Trainer* t : {&shared, &alone}) {
    ASSERT_TRUE(t->AddPolicy(Options("a", 1)).ok());
    ASSERT_TRUE(t->AddPolicy(Options("b", 2)).ok());
    // Make B non-zero so the adapters really act.
    for (int p = 0; p < 2; ++p) {
      ASSERT_TRUE(t->ForwardBackward({{p, LossKind::kCrossEntropy, da}}).ok());
      ASSERT_TRUE(t->OptimStep(p).ok());
    }
  }
  auto r =
      shared.ForwardBackward({{0, LossKind::kCrossEntropy, da}, {1, LossKind::kCrossEntropy, db}});
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(alone.ForwardBackward({{0, LossKind::kCrossEntropy, da}}).ok());
  ASSERT_TRUE(alone.ForwardBackward({{1, LossKind::kCrossEntropy, db}}).ok());
  for (int p = 0; p < 2; ++p) {
    for (const auto& [name, tensor] : shared.parameters(p).named()) {
      const at::Tensor& other = alone.parameters(p).named().at(name);
      EXPECT_TRUE(at::allclose(tensor.grad(), other.grad(), 1e-4, 1e-6)) << p << " " << name;
    }
  }
}

TEST(Trainer, BatchedEqualLengthRowsMatchOneSequenceAtATime) {
  // Equal-length sequences take the model's batched attention, and K policies with the same
  // number of rows each take the stacked (bmm) LoRA path: losses and gradients must equal those
  // of one sequence at a time through the per-sequence loop, up to float reassociation.
  Rng rng(21);
  const auto da = SftData(&rng, 3), db = SftData(&rng, 3), dc = SftData(&rng, 3);
  Trainer shared(&TinyTrainerModel()), alone(&TinyTrainerModel());
  for (Trainer* t : {&shared, &alone}) {
    for (int p = 0; p < 3; ++p) {
      PolicyOptions o = Options(std::string(1, static_cast<char>('a' + p)), 1 + p);
      o.lora.alpha = 8.0 * (p + 1);  // different scales per adapter
      ASSERT_TRUE(t->AddPolicy(o).ok());
      ASSERT_TRUE(t->ForwardBackward({{p, LossKind::kCrossEntropy, da}}).ok());
      ASSERT_TRUE(t->OptimStep(p).ok());
    }
  }
  auto r = shared.ForwardBackward({{0, LossKind::kCrossEntropy, da},
                                   {1, LossKind::kCrossEntropy, db},
                                   {2, LossKind::kCrossEntropy, dc}});
  ASSERT_TRUE(r.ok()) << r.status();
  const std::vector<Datum>* data[3] = {&da, &db, &dc};
  for (int p = 0; p < 3; ++p) {
    double loss = 0;
    for (const Datum& d : *data[p]) {
      auto one = alone.ForwardBackward({{p, LossKind::kCrossEntropy, {d}}});
      ASSERT_TRUE(one.ok()) << one.status();
      loss += (*one)[0].loss / 3.0;  // equal weights per datum: the mean of the three
    }
    EXPECT_NEAR((*r)[p].loss, loss, 1e-5 * (1 + std::abs(loss))) << "policy " << p;
    for (const auto& [name, tensor] : shared.parameters(p).named()) {
      // Three single-datum micro-batches sum to 3x the batch's mean gradient.
      const at::Tensor other = alone.parameters(p).named().at(name).grad() / 3.0;
      EXPECT_TRUE(at::allclose(tensor.grad(), other, 1e-4, 1e-6)) << p << " " << name;
    }
  }
  // Sampling: equal-length prompts of three policies share batched prefill and decode steps;
  // greedy tokens and their log-probs equal each request sampled alone.
  std::vector<SampleRequest> reqs;
  for (int i = 0; i < 6; ++i) reqs.push_back({i % 3, {1, 100 + i, 2, 7}, 3, 0.0, {}});
  auto together = shared.Sample(reqs);
  ASSERT_TRUE(together.ok()) << together.status();
  for (size_t i = 0; i < reqs.size(); ++i) {
    auto single = shared.Sample({reqs[i]});
    ASSERT_TRUE(single.ok());
    EXPECT_EQ((*together)[i].tokens, (*single)[0].tokens) << i;
    for (size_t j = 0; j < (*single)[0].logprobs.size(); ++j) {
      EXPECT_NEAR((*together)[i].logprobs[j], (*single)[0].logprobs[j], 1e-4) << i;
    }
  }
}

TEST(Trainer, BadInputIsRejectedAndLeavesNoGradients) {
  Trainer t(&TinyTrainerModel());
  ASSERT_TRUE(t.AddPolicy(Options("p", 1)).ok());
  Rng rng(1);
  auto good = SftData(&rng, 2);
  auto bad_token = good;
  bad_token[1].tokens[1] = 1 << 20;
  auto bad_weights = good;
  bad_weights[0].weights.pop_back();
  auto short_datum = good;
  short_datum[0].tokens = {1};
  auto zero_mask = good;
  for (auto& d : zero_mask) d.weights.assign(d.weights.size(), 0);
  for (const auto& data : {bad_token, bad_weights, short_datum, zero_mask}) {
    EXPECT_FALSE(t.ForwardBackward({{0, LossKind::kCrossEntropy, data}}).ok());
  }
  EXPECT_FALSE(t.ForwardBackward({{3, LossKind::kCrossEntropy, good}}).ok());
  EXPECT_FALSE(t.ForwardBackward({{0, LossKind::kDpo, {good[0]}}}).ok());
  EXPECT_FALSE(t.ForwardBackward({{0, LossKind::kGrpo, good}}).ok());  // no sampling logprobs
  EXPECT_FALSE(t.ForwardBackward({}).ok());
  EXPECT_EQ(t.micro_steps(0), 0);
  for (const auto& [name, tensor] : t.parameters(0).named()) {
    EXPECT_FALSE(tensor.grad().defined()) << name;
  }
  EXPECT_FALSE(t.Sample({{0, {}, 1, 1.0, {}}}).ok());
  EXPECT_FALSE(t.Sample({{7, {1}, 1, 1.0, {}}}).ok());
}

TEST(Trainer, SampleSharesDecodeBatchesAndMatchesLogprobs) {
  Trainer t(&TinyTrainerModel());
  ASSERT_TRUE(t.AddPolicy(Options("a", 1)).ok());
  ASSERT_TRUE(t.AddPolicy(Options("b", 2)).ok());
  Rng rng(9);
  for (int p = 0; p < 2; ++p) {
    ASSERT_TRUE(t.ForwardBackward({{p, LossKind::kCrossEntropy, SftData(&rng, 4)}}).ok());
    ASSERT_TRUE(t.OptimStep(p).ok());
  }
  std::vector<SampleRequest> reqs = {
      {0, {1, 100, 2}, 4, 1.0, {}}, {1, {1, 101, 2, 7}, 3, 0.0, {}}, {-1, {1, 5}, 2, 0.7, {}}};
  auto out = t.Sample(reqs);
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_EQ((*out)[0].tokens.size(), 4u);
  ASSERT_EQ((*out)[1].tokens.size(), 3u);
  ASSERT_EQ((*out)[2].tokens.size(), 2u);
  // The sampling log-probs equal a full forward's log-probs of the same completion.
  for (int i = 0; i < 2; ++i) {
    Datum d;
    d.tokens = reqs[i].prompt;
    d.tokens.insert(d.tokens.end(), (*out)[i].tokens.begin(), (*out)[i].tokens.end());
    auto lp = t.Logprobs(reqs[i].policy, {d});
    ASSERT_TRUE(lp.ok());
    for (size_t j = 0; j < (*out)[i].tokens.size(); ++j) {
      EXPECT_NEAR((*lp)[0][reqs[i].prompt.size() - 1 + j], (*out)[i].logprobs[j], 1e-4);
    }
  }
  // Stop tokens end a completion early.
  auto stop = t.Sample({{1, {1, 101, 2, 7}, 3, 0.0, {(*out)[1].tokens[0]}}});
  ASSERT_TRUE(stop.ok());
  EXPECT_EQ((*stop)[0].tokens.size(), 1u);
}

// Runs `steps` GRPO+SFT micro-batched steps on `t` and returns the per-step losses.
std::vector<double> RunSteps(Trainer* t, const Task& sft, const Task& grpo, int steps) {
  std::vector<double> losses;
  StepConfig sc;
  sc.batch_size = 8;
  sc.micro_batches = 2;
  sc.grpo_prompts = 2;
  sc.grpo_group = 4;
  for (int i = 0; i < steps; ++i) {
    auto r = TrainStep(t, {{0, &sft}, {1, &grpo}}, sc);
    EXPECT_TRUE(r.ok()) << r.status();
    if (!r.ok()) return losses;
    losses.push_back((*r)[0].loss);
    losses.push_back((*r)[1].loss);
  }
  return losses;
}

TEST(Trainer, SnapshotRestoreResumesBitIdentically) {
  auto sft = MakeTask("mapping", TinyTrainerModel().config().vocab_size, 1);
  auto grpo = MakeTask("arithmetic", TinyTrainerModel().config().vocab_size, 1);
  ASSERT_TRUE(sft.ok() && grpo.ok());
  auto make = [](Trainer* t) {
    PolicyOptions a = Options("a", 11);
    a.schedule.kind = LrSchedule::Kind::kCosine;
    a.schedule.warmup_steps = 2;
    a.schedule.total_steps = 10;
    a.adamw.weight_decay = 0.01;
    PolicyOptions b = Options("b", 12);
    b.grpo.kl_beta = 0.05;
    ASSERT_TRUE(t->AddPolicy(a).ok());
    ASSERT_TRUE(t->AddPolicy(b).ok());
  };
  Trainer full(&TinyTrainerModel());
  make(&full);
  RunSteps(&full, **sft, **grpo, 3);
  // Mid-accumulation too: one extra micro-batch before the snapshot.
  Rng extra(77);
  const auto mid = SftData(&extra, 3);
  ASSERT_TRUE(full.ForwardBackward({{0, LossKind::kCrossEntropy, mid}}).ok());
  auto s0 = full.Snapshot(0);
  auto s1 = full.Snapshot(1);
  ASSERT_TRUE(s0.ok() && s1.ok());
  EXPECT_EQ(s0->micro_steps, 1);
  EXPECT_FALSE(s0->gradients.empty());
  EXPECT_TRUE(s1->gradients.empty());
  ASSERT_TRUE(full.OptimStep(0).ok());
  const auto expected = RunSteps(&full, **sft, **grpo, 3);

  Trainer resumed(&TinyTrainerModel());
  make(&resumed);
  ASSERT_TRUE(resumed.Restore(0, *s0).ok());
  ASSERT_TRUE(resumed.Restore(1, *s1).ok());
  ASSERT_TRUE(resumed.OptimStep(0).ok());
  const auto got = RunSteps(&resumed, **sft, **grpo, 3);
  ASSERT_EQ(got.size(), expected.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i], expected[i]) << i;

  // A snapshot that does not fit is refused and changes nothing.
  PolicySnapshot broken = *s0;
  broken.master.erase(broken.master.begin());
  const at::Tensor before = resumed.parameters(0).named().begin()->second.clone();
  EXPECT_FALSE(resumed.Restore(0, broken).ok());
  broken = *s0;
  broken.rng_state = "zz";
  EXPECT_FALSE(resumed.Restore(0, broken).ok());
  broken = *s0;
  broken.scheduler_name = "constant";
  EXPECT_FALSE(resumed.Restore(0, broken).ok());
  EXPECT_TRUE(at::equal(before, resumed.parameters(0).named().begin()->second));
}

}  // namespace
}  // namespace loradb::trainer
