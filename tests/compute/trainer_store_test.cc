// The trainer's state in the store: checkpoints (resume through the store is bit-identical),
// export of revisions with source = checkpoint and the `latest` alias moved.
#include <gtest/gtest.h>

#include "compute/trainer/checkpoint.h"
#include "compute/trainer/tasks.h"
#include "tests/compute/trainer_test_util.h"

namespace loradb::trainer {
namespace {

using ::loradb::testing::TempDir;
using ::loradb::testing::TinyTrainerModel;

PolicyOptions Opts(const std::string& name) {
  PolicyOptions o;
  o.name = name;
  o.seed = 5;
  o.lora.rank = 4;
  o.schedule.lr = 1e-2;
  return o;
}

std::string WriteConfig(const TempDir& dir) {
  const std::string path = dir.file("config.json");
  FILE* f = std::fopen(path.c_str(), "w");
  const std::string json = TinyTrainerModel().config().ToJson();
  std::fwrite(json.data(), 1, json.size(), f);
  std::fclose(f);
  return dir.path();
}

std::vector<double> Steps(Trainer* t, const Task& task, int n, StepConfig sc) {
  std::vector<double> out;
  for (int i = 0; i < n; ++i) {
    auto r = TrainStep(t, {{0, &task}}, sc);
    EXPECT_TRUE(r.ok()) << r.status();
    if (!r.ok()) break;
    out.push_back((*r)[0].loss);
  }
  return out;
}

TEST(TrainerStore, KillAtStepKAndResumeFromTheStoreIsBitIdentical) {
  TempDir dir, model_dir;
  const std::string mdir = WriteConfig(model_dir);
  auto store = Store::Open(dir.path());
  ASSERT_TRUE(store.ok()) << store.status();
  ASSERT_TRUE(EnsurePolicy(store->get(), "tiny", mdir, "acme/grpo").ok());
  ASSERT_TRUE(EnsurePolicy(store->get(), "tiny", mdir, "acme/grpo").ok());  // idempotent
  auto task = MakeTask("arithmetic", TinyTrainerModel().config().vocab_size, 1);
  ASSERT_TRUE(task.ok());
  StepConfig sc;
  sc.grpo_prompts = 2;
  sc.grpo_group = 4;
  PolicyOptions o = Opts("acme/grpo");
  o.grpo.kl_beta = 0.02;

  Trainer full(&TinyTrainerModel());
  ASSERT_TRUE(full.AddPolicy(o).ok());
  Steps(&full, **task, 2, sc);
  auto ck = SaveCheckpoint(store->get(), full, 0, 0, "rollout bytes");
  ASSERT_TRUE(ck.ok()) << ck.status();
  EXPECT_EQ(ck->step, 2u);
  EXPECT_EQ(ck->scheduler_name, "constant");
  const auto expected = Steps(&full, **task, 3, sc);

  // "Killed" after step 2: a fresh process state, restored from the store.
  Trainer resumed(&TinyTrainerModel());
  ASSERT_TRUE(resumed.AddPolicy(o).ok());
  auto latest = LatestCheckpoint(**store, "acme/grpo");
  ASSERT_TRUE(latest.ok());
  EXPECT_EQ(latest->id, ck->id);
  ASSERT_TRUE(LoadCheckpoint(**store, &resumed, 0, latest->id).ok());
  EXPECT_EQ(resumed.step(0), 2);
  const auto got = Steps(&resumed, **task, 3, sc);
  ASSERT_EQ(got.size(), 3u);
  for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i], expected[i]) << "step " << i;
  auto rollout = (*store)->ReadOpaqueBlob(ck->rollout);
  ASSERT_TRUE(rollout.ok());
  EXPECT_EQ(*rollout, "rollout bytes");

  // A checkpoint of another policy, or of a different shape, is refused.
  ASSERT_TRUE(EnsurePolicy(store->get(), "tiny", mdir, "acme/other").ok());
  Trainer other(&TinyTrainerModel());
  PolicyOptions wide = Opts("acme/other");
  wide.lora.rank = 8;
  ASSERT_TRUE(other.AddPolicy(wide).ok());
  EXPECT_FALSE(LoadCheckpoint(**store, &other, 0, ck->id).ok());
  auto own = SaveCheckpoint(store->get(), other, 0, 0);
  ASSERT_TRUE(own.ok());
  EXPECT_FALSE(LoadCheckpoint(**store, &resumed, 0, own->id).ok());
  EXPECT_FALSE(LatestCheckpoint(**store, "acme/none").ok());
}

TEST(TrainerStore, MidAccumulationCheckpointKeepsGradients) {
  TempDir dir, model_dir;
  const std::string mdir = WriteConfig(model_dir);
  auto store = Store::Open(dir.path());
  ASSERT_TRUE(store.ok());
  ASSERT_TRUE(EnsurePolicy(store->get(), "tiny", mdir, "p").ok());
  auto task = MakeTask("mapping", TinyTrainerModel().config().vocab_size, 1);
  ASSERT_TRUE(task.ok());
  Trainer a(&TinyTrainerModel()), b(&TinyTrainerModel());
  ASSERT_TRUE(a.AddPolicy(Opts("p")).ok());
  ASSERT_TRUE(b.AddPolicy(Opts("p")).ok());
  Rng data_rng(3);
  const auto d1 = (*task)->TrainBatch(&data_rng, 8);
  const auto d2 = (*task)->TrainBatch(&data_rng, 8);
  ASSERT_TRUE(a.ForwardBackward({{0, LossKind::kCrossEntropy, d1}}).ok());
  auto ck = SaveCheckpoint(store->get(), a, 0, 0);
  ASSERT_TRUE(ck.ok()) << ck.status();
  ASSERT_TRUE(LoadCheckpoint(**store, &b, 0, ck->id).ok());
  EXPECT_EQ(b.micro_steps(0), 1);
  for (Trainer* t : {&a, &b}) {
    ASSERT_TRUE(t->ForwardBackward({{0, LossKind::kCrossEntropy, d2}}).ok());
    ASSERT_TRUE(t->OptimStep(0).ok());
  }
  for (const auto& [name, p] : a.parameters(0).named()) {
    EXPECT_TRUE(at::equal(p, b.parameters(0).named().at(name))) << name;
  }
}

TEST(TrainerStore, PublishForSamplingMakesARevisionFromTheCheckpoint) {
  TempDir dir, model_dir;
  const std::string mdir = WriteConfig(model_dir);
  auto store = Store::Open(dir.path());
  ASSERT_TRUE(store.ok());
  ASSERT_TRUE(EnsurePolicy(store->get(), "tiny", mdir, "acme/sft").ok());
  auto task = MakeTask("mapping", TinyTrainerModel().config().vocab_size, 1);
  ASSERT_TRUE(task.ok());
  Trainer t(&TinyTrainerModel());
  ASSERT_TRUE(t.AddPolicy(Opts("acme/sft")).ok());
  StepConfig sc;
  sc.batch_size = 8;
  Steps(&t, **task, 2, sc);
  auto ck = SaveCheckpoint(store->get(), t, 0, 0);
  ASSERT_TRUE(ck.ok());
  auto rev = PublishForSampling(store->get(), t, 0, ck->id);
  ASSERT_TRUE(rev.ok()) << rev.status();
  EXPECT_EQ(rev->source.kind, SourceKind::kTrained);
  EXPECT_EQ(rev->source.checkpoint_id, ck->id);
  EXPECT_EQ(rev->source.step, 2u);
  auto latest = (*store)->GetRevisionByAlias("acme/sft", "latest");
  ASSERT_TRUE(latest.ok());
  EXPECT_EQ(latest->id, rev->id);
  auto located = (*store)->Locate("acme/sft", "latest");
  ASSERT_TRUE(located.ok()) << located.status();
  ASSERT_TRUE(located->checkpoint.has_value());
  EXPECT_EQ(located->checkpoint->id, ck->id);
  auto tensors = (*store)->ReadTensors(*rev);
  ASSERT_TRUE(tensors.ok());
  EXPECT_EQ(tensors->size(), t.parameters(0).named().size());
  const TensorView* b = tensors->Find(LoraBName("layers.0.self_attn.q_proj"));
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->dtype, DType::kBF16);
  // bf16 of the master.
  at::Tensor want =
      t.parameters(0).named().at(LoraBName("layers.0.self_attn.q_proj")).detach().to(at::kBFloat16);
  EXPECT_EQ(std::memcmp(b->data, want.data_ptr(), b->nbytes), 0);
  // A second export moves `latest` forward.
  Steps(&t, **task, 1, sc);
  auto rev2 = PublishForSampling(store->get(), t, 0, ck->id);
  ASSERT_TRUE(rev2.ok());
  EXPECT_EQ((*store)->GetRevisionByAlias("acme/sft", "latest")->id, rev2->id);
}

TEST(TrainerStore, CheckpointKeepsAlphaAndRsLoraAndResumeUsesThem) {
  TempDir dir, model_dir;
  const std::string mdir = WriteConfig(model_dir);
  auto store = Store::Open(dir.path());
  ASSERT_TRUE(store.ok());
  ASSERT_TRUE(EnsurePolicy(store->get(), "tiny", mdir, "acme/rs").ok());
  auto task = MakeTask("mapping", TinyTrainerModel().config().vocab_size, 1);
  ASSERT_TRUE(task.ok());
  StepConfig sc;
  sc.batch_size = 8;
  PolicyOptions trained = Opts("acme/rs");
  trained.lora.alpha = 7.3;  // not exact in fp32: the checkpoint keeps it exactly
  trained.lora.use_rslora = true;
  Trainer full(&TinyTrainerModel());
  ASSERT_TRUE(full.AddPolicy(trained).ok());
  Steps(&full, **task, 2, sc);
  auto ck = SaveCheckpoint(store->get(), full, 0, 0);
  ASSERT_TRUE(ck.ok()) << ck.status();
  const auto expected = Steps(&full, **task, 2, sc);

  // Resumed by a trainer configured with the defaults (alpha 16, no rsLoRA).
  Trainer resumed(&TinyTrainerModel());
  ASSERT_TRUE(resumed.AddPolicy(Opts("acme/rs")).ok());
  ASSERT_EQ(resumed.options(0).lora.alpha, 16.0);
  ASSERT_TRUE(LoadCheckpoint(**store, &resumed, 0, ck->id).ok());
  EXPECT_EQ(resumed.options(0).lora.alpha, 7.3);
  EXPECT_TRUE(resumed.options(0).lora.use_rslora);
  EXPECT_EQ(resumed.parameters(0).config().alpha, 7.3);
  EXPECT_TRUE(resumed.parameters(0).config().use_rslora);
  const auto got = Steps(&resumed, **task, 2, sc);
  ASSERT_EQ(got.size(), 2u);
  for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i], expected[i]) << "step " << i;

  // A snapshot without recorded scaling (alpha 0, as before it was recorded) keeps the
  // policy's own, and then the losses differ: the equality above depends on the scaling.
  auto snap = resumed.Snapshot(0);
  ASSERT_TRUE(snap.ok());
  Trainer full2(&TinyTrainerModel()), old(&TinyTrainerModel());
  ASSERT_TRUE(full2.AddPolicy(trained).ok());
  ASSERT_TRUE(old.AddPolicy(Opts("acme/rs")).ok());
  ASSERT_TRUE(LoadCheckpoint(**store, &full2, 0, ck->id).ok());
  auto at_ck = full2.Snapshot(0);
  ASSERT_TRUE(at_ck.ok());
  PolicySnapshot legacy = *at_ck;
  legacy.lora_alpha = 0;
  ASSERT_TRUE(old.Restore(0, legacy).ok());
  EXPECT_EQ(old.options(0).lora.alpha, 16.0);
  EXPECT_FALSE(old.options(0).lora.use_rslora);
  const auto unscaled = Steps(&old, **task, 1, sc);
  ASSERT_EQ(unscaled.size(), 1u);
  EXPECT_NE(unscaled[0], expected[0]);
  Trainer wrong(&TinyTrainerModel());
  ASSERT_TRUE(wrong.AddPolicy(Opts("acme/rs")).ok());
  // A bad recorded alpha or another rank is refused with nothing changed.
  PolicySnapshot bad = *snap;
  bad.lora_alpha = -1;
  EXPECT_FALSE(wrong.Restore(0, bad).ok());
  bad = *snap;
  bad.lora_rank = 5;
  EXPECT_FALSE(wrong.Restore(0, bad).ok());
  EXPECT_EQ(wrong.options(0).lora.alpha, 16.0);
  EXPECT_EQ(wrong.step(0), 0);
}

TEST(TrainerStore, DpoReferenceFromAStoreRevision) {
  TempDir dir, model_dir;
  const std::string mdir = WriteConfig(model_dir);
  auto store = Store::Open(dir.path());
  ASSERT_TRUE(store.ok());
  ASSERT_TRUE(EnsurePolicy(store->get(), "tiny", mdir, "acme/ref").ok());
  ASSERT_TRUE(EnsurePolicy(store->get(), "tiny", mdir, "acme/dpo").ok());
  auto sft = MakeTask("mapping", TinyTrainerModel().config().vocab_size, 1);
  auto pref = MakeTask("preference", TinyTrainerModel().config().vocab_size, 1);
  ASSERT_TRUE(sft.ok() && pref.ok());

  // The reference: a policy trained a little (so it differs from the base), published in fp32
  // with rsLoRA scaling.
  Trainer t(&TinyTrainerModel());
  PolicyOptions ro = Opts("acme/ref");
  ro.lora.use_rslora = true;
  ASSERT_TRUE(t.AddPolicy(ro).ok());
  StepConfig sc;
  sc.batch_size = 8;
  Steps(&t, **sft, 3, sc);
  auto ck = SaveCheckpoint(store->get(), t, 0, 0);
  ASSERT_TRUE(ck.ok());
  auto rev = PublishForSampling(store->get(), t, 0, ck->id, "ref", DType::kF32);
  ASSERT_TRUE(rev.ok()) << rev.status();

  ASSERT_TRUE(t.AddPolicy(Opts("acme/dpo")).ok());
  // Bad references leave the policy's reference (the base) in place.
  EXPECT_EQ(SetReferenceFromRevision(**store, &t, 1, "acme/ref:nope").code(),
            absl::StatusCode::kNotFound);
  EXPECT_FALSE(SetReferenceFromRevision(**store, &t, 7, "acme/ref:ref").ok());
  Rng rng(11);
  const auto pairs = (*pref)->TrainBatch(&rng, 4);
  auto base_ref = t.Evaluate({{1, LossKind::kDpo, pairs}});
  ASSERT_TRUE(base_ref.ok()) << base_ref.status();
  EXPECT_NEAR((*base_ref)[0].metric, 0.0, 1e-7);  // the fresh policy equals the base

  ASSERT_TRUE(SetReferenceFromRevision(**store, &t, 1, "acme/ref:ref").ok());
  auto with_ref = t.Evaluate({{1, LossKind::kDpo, pairs}});
  ASSERT_TRUE(with_ref.ok()) << with_ref.status();
  // Expected margin: beta * ((pol_c - ref_c) - (pol_r - ref_r)) with ref = policy 0's weights.
  auto pol = t.Logprobs(1, pairs);
  auto ref = t.Logprobs(0, pairs);
  ASSERT_TRUE(pol.ok() && ref.ok());
  double want = 0;
  for (size_t i = 0; i < pairs.size(); i += 2) {
    double c = 0, r = 0;
    for (size_t j = 0; j < pairs[i].weights.size(); ++j) {
      c += pairs[i].weights[j] * ((*pol)[i][j] - (*ref)[i][j]);
      r += pairs[i + 1].weights[j] * ((*pol)[i + 1][j] - (*ref)[i + 1][j]);
    }
    want += t.options(1).dpo_beta * (c - r);
  }
  want /= static_cast<double>(pairs.size() / 2);
  EXPECT_GT(std::abs(want), 1e-4);  // the reference really differs from the base
  EXPECT_NEAR((*with_ref)[0].metric, want, 1e-5 + 1e-3 * std::abs(want));
}

}  // namespace
}  // namespace loradb::trainer
