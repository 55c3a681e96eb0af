// The trainer's state in the store: checkpoints (resume through the store is bit-identical),
// export of revisions with source = checkpoint and the `latest` alias moved.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>

#include "compute/trainer/checkpoint.h"
#include "compute/trainer/tasks.h"
#include "storage/formats/peft.h"
#include "storage/util/status_macros.h"
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
  // Exported for peft: every adapted module named, a causal LM task.
  TempDir out;
  ASSERT_TRUE((*store)->ExportPeftDir(*rev, out.path()).ok());
  auto exported = ReadPeftDir(out.path());
  ASSERT_TRUE(exported.ok()) << exported.status();
  EXPECT_EQ(exported->config.task_type, "CAUSAL_LM");
  EXPECT_EQ(exported->config.target_modules, t.options(0).lora.target_modules);
  // A second export moves `latest` forward.
  Steps(&t, **task, 1, sc);
  auto rev2 = PublishForSampling(store->get(), t, 0, ck->id);
  ASSERT_TRUE(rev2.ok());
  EXPECT_EQ((*store)->GetRevisionByAlias("acme/sft", "latest")->id, rev2->id);
}

// A random tiny-moe base written into `dir` and loaded.
absl::StatusOr<std::unique_ptr<model::Qwen3Model>> TinyMoeModel(const TempDir& dir) {
  LORADB_ASSIGN_OR_RETURN(ModelConfig config, ReadModelConfig(std::string(LORADB_SOURCE_DIR) +
                                                              "/compute/configs/tiny-moe.json"));
  LORADB_RETURN_IF_ERROR(model::WriteRandomCheckpoint(config, dir.path(), 7, at::kFloat, 0.02));
  return model::Qwen3Model::Load(dir.path());
}

// Trainer policy 0 on the tiny-moe base in `model_dir`, checkpointed and published as `policy`
// (alias "latest", fp32).
absl::StatusOr<RevisionRecord> PublishTinyMoePolicy(Store* store, const Trainer& t,
                                                    const TempDir& model_dir,
                                                    const std::string& policy) {
  LORADB_RETURN_IF_ERROR(EnsurePolicy(store, "tiny-moe", model_dir.path(), policy));
  LORADB_ASSIGN_OR_RETURN(CheckpointRecord ck, SaveCheckpoint(store, t, 0, 0));
  return PublishForSampling(store, t, 0, ck.id, "latest", DType::kF32);
}

// LoRA on the fused MoE expert parameters (PEFT's target_parameters): each expert's gate_proj
// and up_proj train one shared A, the published revision exports in PEFT's fused layout, and the
// per-expert export shows the shared A under both parts.
TEST(TrainerStore, FusedExpertParametersTrainAndExportInPeftLayout) {
  TempDir model_dir, dir, out_fused, out_per_expert;
  auto model = TinyMoeModel(model_dir);
  ASSERT_TRUE(model.ok()) << model.status();
  const ModelConfig& c = (*model)->config();
  int64_t moe_layers = 0;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) moe_layers += c.IsMoeLayer(l) ? 1 : 0;
  ASSERT_GT(moe_layers, 0);

  PolicyOptions o = Opts("acme/experts");
  o.lora.target_modules = {"q_proj"};
  o.lora.target_parameters = {"gate_up_proj", "mlp.experts.down_proj"};
  Trainer t(model->get());
  ASSERT_TRUE(t.AddPolicy(o).ok());
  const LoraParameters& params = t.parameters(0);
  const int64_t experts = moe_layers * c.num_experts;
  // q_proj everywhere; per expert A + 2 B (gate_up_proj) and A + B (down_proj).
  EXPECT_EQ(params.named().size(), static_cast<size_t>(2 * c.num_hidden_layers + 5 * experts));
  EXPECT_EQ(params.shared().size(), static_cast<size_t>(experts));
  const std::string gate = "layers.0.mlp.experts.3.gate_proj",
                    up = "layers.0.mlp.experts.3.up_proj";
  ASSERT_EQ(params.shared().at(LoraAName(up)), LoraAName(gate));

  auto task = MakeTask("mapping", c.vocab_size, 1);
  ASSERT_TRUE(task.ok());
  StepConfig sc;
  sc.batch_size = 8;
  const at::Tensor a_before = params.named().at(LoraAName(gate)).detach().clone();
  Steps(&t, **task, 2, sc);
  EXPECT_FALSE(at::equal(params.named().at(LoraAName(gate)), a_before));
  EXPECT_GT(params.named().at(LoraBName(up)).abs().sum().item<float>(), 0.0f);

  auto store = Store::Open(dir.path());
  ASSERT_TRUE(store.ok());
  auto rev = PublishTinyMoePolicy(store->get(), t, model_dir, "acme/experts");
  ASSERT_TRUE(rev.ok()) << rev.status();

  // Fused (as trained): PEFT's names and shapes, the config's target_parameters kept.
  ASSERT_TRUE((*store)->ExportPeftDir(*rev, out_fused.path()).ok());
  auto fused = ReadPeftDir(out_fused.path());
  ASSERT_TRUE(fused.ok()) << fused.status();
  EXPECT_EQ(fused->config.target_parameters, o.lora.target_parameters);
  const int64_t r = o.lora.rank, e = c.num_experts;
  // PEFT wraps the experts once per targeted parameter, in registration order: gate_up_proj is
  // the inner one (".base_layer"), down_proj the outer.
  const TensorView* gu_a =
      fused->tensors.Find("base_model.model.model.layers.0.mlp.experts.base_layer.lora_A.weight");
  const TensorView* gu_b =
      fused->tensors.Find("base_model.model.model.layers.0.mlp.experts.base_layer.lora_B.weight");
  const TensorView* down_a =
      fused->tensors.Find("base_model.model.model.layers.0.mlp.experts.lora_A.weight");
  ASSERT_TRUE(gu_a && gu_b && down_a);
  EXPECT_EQ(gu_a->shape, (std::vector<int64_t>{r * e, c.hidden_size}));
  EXPECT_EQ(gu_b->shape, (std::vector<int64_t>{2 * c.moe_intermediate_size, r * e}));
  EXPECT_EQ(down_a->shape, (std::vector<int64_t>{r * e, c.moe_intermediate_size}));
  // Expert 3's A is rows [3r, 4r) of the fused A, bit for bit.
  const at::Tensor master = params.named().at(LoraAName(gate)).detach().contiguous();
  EXPECT_EQ(std::memcmp(reinterpret_cast<const float*>(gu_a->data) + 3 * r * c.hidden_size,
                        master.data_ptr<float>(), master.nbytes()),
            0);

  // Per expert: gate_proj and up_proj carry the same A.
  ASSERT_TRUE((*store)
                  ->ExportPeftDir(*rev, out_per_expert.path(), Store::PeftExportLayout::kPerExpert)
                  .ok());
  auto per = ReadPeftDir(out_per_expert.path());
  ASSERT_TRUE(per.ok()) << per.status();
  EXPECT_TRUE(per->config.target_parameters.empty());
  const TensorView* ga = per->tensors.Find(LoraAName(gate));
  const TensorView* ua = per->tensors.Find(LoraAName(up));
  ASSERT_TRUE(ga && ua);
  ASSERT_EQ(ga->nbytes, ua->nbytes);
  EXPECT_EQ(std::memcmp(ga->data, ua->data, ga->nbytes), 0);
}

TEST(TrainerStore, FusedExpertParametersRefusedWhereTheBaseLacksThem) {
  LoraConfig lora;
  lora.target_modules = {"q_proj"};
  lora.target_parameters = {"gate_up_proj"};
  auto dense = LoraParameters::Create(TinyTrainerModel().config(), lora, 1);
  ASSERT_EQ(dense.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(dense.status().message().find("target_parameters"), std::string::npos);
  auto moe = ReadModelConfig(std::string(LORADB_SOURCE_DIR) + "/compute/configs/tiny-moe.json");
  ASSERT_TRUE(moe.ok());
  lora.target_parameters = {"mlp.experts.gate_proj"};
  auto bad = LoraParameters::Create(*moe, lora, 1);
  ASSERT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("mlp.experts.gate_proj"), std::string::npos)
      << bad.status();
  // An expert part among the target modules: peft would read it as the fused parameter.
  lora.target_parameters = {"gate_up_proj"};
  lora.target_modules = {"q_proj", "up_proj"};
  auto both = LoraParameters::Create(*moe, lora, 1);
  ASSERT_EQ(both.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(both.status().message().find("'up_proj'"), std::string::npos) << both.status();
  // Only target_parameters: no target module is needed.
  lora.target_modules.clear();
  lora.target_parameters = {"down_proj"};
  auto only = LoraParameters::Create(*moe, lora, 1);
  ASSERT_TRUE(only.ok()) << only.status();
  EXPECT_TRUE(only->shared().empty());  // down_proj has one part: nothing shared
}

// Per-expert LoRA trained on a qwen3_moe base's experts: the default export refuses it (peft on
// transformers >= 5 would skip those tensors silently) and says how to get each layout;
// --layout per-expert writes it.
TEST(TrainerStore, PerExpertMoeLoraExportsOnlyWhenAskedForByName) {
  TempDir model_dir, dir, out_default, out_per_expert;
  auto model = TinyMoeModel(model_dir);
  ASSERT_TRUE(model.ok()) << model.status();
  PolicyOptions o = Opts("acme/per-expert");
  o.lora.target_modules = {"q_proj", "gate_proj", "up_proj", "down_proj"};
  Trainer t(model->get());
  ASSERT_TRUE(t.AddPolicy(o).ok());
  auto store = Store::Open(dir.path());
  ASSERT_TRUE(store.ok());
  auto rev = PublishTinyMoePolicy(store->get(), t, model_dir, "acme/per-expert");
  ASSERT_TRUE(rev.ok()) << rev.status();

  const absl::Status refused = (*store)->ExportPeftDir(*rev, out_default.path());
  ASSERT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
  EXPECT_NE(refused.message().find("--layout per-expert"), std::string::npos) << refused;
  EXPECT_NE(refused.message().find("--target-parameters"), std::string::npos) << refused;
  EXPECT_FALSE(std::filesystem::exists(out_default.path() + "/adapter_model.safetensors"));

  ASSERT_TRUE((*store)
                  ->ExportPeftDir(*rev, out_per_expert.path(), Store::PeftExportLayout::kPerExpert)
                  .ok());
  auto per = ReadPeftDir(out_per_expert.path());
  ASSERT_TRUE(per.ok()) << per.status();
  EXPECT_TRUE(per->config.target_parameters.empty());
  EXPECT_NE(per->tensors.Find(LoraAName("layers.0.mlp.experts.3.gate_proj")), nullptr);
  EXPECT_NE(per->tensors.Find(LoraBName("layers.0.mlp.experts.3.down_proj")), nullptr);
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
