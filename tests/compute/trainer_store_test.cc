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

}  // namespace
}  // namespace loradb::trainer
