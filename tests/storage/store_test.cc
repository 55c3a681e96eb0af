#include "storage/store/store.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "storage/formats/peft.h"
#include "storage/formats/safetensors.h"
#include "storage/util/file_util.h"
#include "tests/storage/adapter_test_util.h"
#include "tests/test_util.h"

namespace loradb {
namespace {

using ::loradb::testing::Adapter;
using ::loradb::testing::TempDir;

// q_proj: in 8, out 16; k_proj: in 8, out 4.
Adapter MakeAdapter(int64_t r, float seed) {
  Adapter a;
  a.Add("layers.0.self_attn.q_proj", false, r, 8, seed);
  a.Add("layers.0.self_attn.q_proj", true, 16, r, seed + 1);
  a.Add("layers.0.self_attn.k_proj", false, r, 8, seed + 2);
  a.Add("layers.0.self_attn.k_proj", true, 4, r, seed + 3);
  return a;
}

class StoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto s = Store::Open(dir_.file("store"));
    ASSERT_TRUE(s.ok()) << s.status();
    store_ = std::move(*s);
    auto b = store_->AddBaseFromModuleTable(
        "tiny", R"({"modules": [{"name": "layers.0.self_attn.q_proj", "in": 8, "out": 16},
                                {"name": "layers.0.self_attn.k_proj", "in": 8, "out": 4}]})");
    ASSERT_TRUE(b.ok()) << b.status();
    ASSERT_TRUE(store_->CreatePolicy("acme/support", "tiny").ok());
  }
  void ExpectVerifyOk() {
    auto rep = store_->Verify();
    ASSERT_TRUE(rep.ok()) << rep.status();
    EXPECT_TRUE(rep->ok()) << (rep->problems.empty() ? "" : rep->problems[0]);
  }
  TempDir dir_;
  std::unique_ptr<Store> store_;
};

TEST_F(StoreTest, PublishReadBackAndVerify) {
  Adapter a = MakeAdapter(2, 1.0f);
  PublishOptions o;
  o.alias = "serving";
  o.lora.alpha = 4;
  auto r = store_->PublishTensors("acme/support", a.views, o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->lora.r, 2);  // inferred from the tensors
  EXPECT_EQ(r->dtype, "F32");
  EXPECT_EQ(r->blob.tensors, 4u);
  EXPECT_TRUE(std::filesystem::exists(store_->BlobPath(r->blob.hash)));
  auto t = store_->ReadTensors(*r);
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_EQ(t->size(), 4u);
  for (const auto& v : a.views) {
    const TensorView* got = t->Find(v.name);
    ASSERT_NE(got, nullptr) << v.name;
    ASSERT_EQ(got->nbytes, v.nbytes);
    EXPECT_EQ(std::memcmp(got->data, v.data, v.nbytes), 0);
    EXPECT_EQ(got->shape, v.shape);
  }
  EXPECT_EQ(store_->Resolve("acme/support:serving")->id, r->id);
  EXPECT_EQ(store_->Resolve("acme/support:latest")->id, r->id);
  EXPECT_EQ(store_->Resolve("acme/support@1")->id, r->id);
  EXPECT_EQ(store_->Resolve(absl::StrCat(r->id))->id, r->id);
  EXPECT_TRUE(absl::IsInvalidArgument(store_->Resolve("nonsense").status()));
  // Revision ids and seqs are canonical decimal; the policy and alias parts follow the name
  // rules (an empty policy name once reached LMDB as a key).
  for (const std::string bad : {" 1", "1 ", "01", "+1", "0x1", ":serving", "a//b:serving",
                                "acme/support:", "acme/support:1x", "acme/support@01",
                                "acme/support@ 1", "acme/support@", "@1", "x/@1"}) {
    auto st = store_->Resolve(bad).status();
    EXPECT_TRUE(absl::IsInvalidArgument(st)) << "'" << bad << "': " << st;
    EXPECT_NE(st.message().find("bad revision reference '" + bad + "'"), std::string::npos) << st;
  }
  EXPECT_NE(store_->Resolve(":serving").status().message().find("policy name ''"),
            std::string::npos);
  EXPECT_TRUE(absl::IsNotFound(store_->Resolve("acme/support:canary").status()));

  // Identical content shares the blob.
  auto r2 = store_->PublishTensors("acme/support", a.views, o);
  ASSERT_TRUE(r2.ok());
  EXPECT_EQ(r2->blob.hash, r->blob.hash);
  EXPECT_EQ(store_->catalog().GetBlob(r->blob.hash)->refcount, 2u);
  ExpectVerifyOk();
}

TEST_F(StoreTest, CompatibilityRuleRejectsAndLeavesStoreUnchanged) {
  Adapter wrong_dim;
  wrong_dim.Add("layers.0.self_attn.q_proj", false, 2, 9, 0);  // in 9 != 8
  wrong_dim.Add("layers.0.self_attn.q_proj", true, 16, 2, 0);
  auto st = store_->PublishTensors("acme/support", wrong_dim.views, {});
  EXPECT_TRUE(absl::IsInvalidArgument(st.status())) << st.status();
  EXPECT_NE(st.status().message().find("q_proj"), std::string::npos);

  Adapter wrong_module;
  wrong_module.Add("layers.0.mlp.up_proj", false, 2, 8, 0);
  st = store_->PublishTensors("acme/support", wrong_module.views, {});
  EXPECT_TRUE(absl::IsInvalidArgument(st.status())) << st.status();
  EXPECT_NE(st.status().message().find("not in base"), std::string::npos);

  Adapter not_lora;
  not_lora.Add("layers.0.self_attn.q_proj", false, 2, 8, 0);
  not_lora.views[0].name = "base_model.model.model.layers.0.self_attn.q_proj.lora_magnitude_vector";
  EXPECT_TRUE(
      absl::IsInvalidArgument(store_->PublishTensors("acme/support", not_lora.views, {}).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(store_->PublishTensors("acme/support", {}, {}).status()));
  EXPECT_TRUE(
      absl::IsNotFound(store_->PublishTensors("nope", MakeAdapter(2, 0).views, {}).status()));
  PublishOptions bad_alias;
  bad_alias.alias = "bad alias";
  EXPECT_TRUE(absl::IsInvalidArgument(
      store_->PublishTensors("acme/support", MakeAdapter(2, 0).views, bad_alias).status()));

  // Creating the policy on the fly happens only with a successful publish.
  PublishOptions create;
  create.create_policy_base = "tiny";
  EXPECT_FALSE(store_->PublishTensors("new/policy", wrong_dim.views, create).ok());
  EXPECT_TRUE(absl::IsNotFound(store_->GetPolicy("new/policy").status()));
  create.create_policy_base = "nobase";
  EXPECT_TRUE(absl::IsNotFound(
      store_->PublishTensors("new/policy", MakeAdapter(2, 0).views, create).status()));
  EXPECT_TRUE(absl::IsNotFound(store_->GetPolicy("new/policy").status()));

  EXPECT_TRUE(store_->ListAllRevisions(0, 0)->items.empty());
  create.create_policy_base = "tiny";
  auto created = store_->PublishTensors("new/policy", MakeAdapter(2, 0).views, create);
  ASSERT_TRUE(created.ok()) << created.status();
  EXPECT_EQ(created->seq, 1u);
  EXPECT_EQ(store_->GetPolicy("new/policy")->base, "tiny");
  ASSERT_TRUE(store_->DeleteRevision(created->id).ok());
  auto rep = store_->Verify();
  ASSERT_TRUE(rep.ok());
  EXPECT_TRUE(rep->ok());
  // Nothing of the failed publishes was written; the deleted revision's blob is reclaimable.
  EXPECT_EQ(rep->reclaimable.size(), 1u);
}

TEST_F(StoreTest, VerifyFindsCorruptionMissingBlobsAndReportsOrphans) {
  auto r1 = store_->PublishTensors("acme/support", MakeAdapter(2, 1).views, {});
  auto r2 = store_->PublishTensors("acme/support", MakeAdapter(2, 2).views, {});
  ASSERT_TRUE(r1.ok() && r2.ok());
  ExpectVerifyOk();
  // An orphan file is reclaimable, not a problem.
  ASSERT_TRUE(WriteFileAtomic(store_->blob_root() + "/zz-orphan", "x").ok());
  auto rep = store_->Verify();
  ASSERT_TRUE(rep.ok());
  EXPECT_TRUE(rep->ok());
  ASSERT_EQ(rep->reclaimable.size(), 1u);
  // Deleting a revision makes its blob reclaimable.
  ASSERT_TRUE(store_->DeleteRevision(r2->id).ok());
  rep = store_->Verify();
  EXPECT_TRUE(rep->ok());
  EXPECT_EQ(rep->reclaimable.size(), 2u);
  EXPECT_TRUE(
      absl::IsFailedPrecondition(store_->ReadTensors(*store_->GetRevision(r2->id)).status()));

  // Flip one byte of r1's blob: Verify and reads both report it.
  const std::string path = store_->BlobPath(r1->blob.hash);
  auto bytes = ReadFileToString(path);
  ASSERT_TRUE(bytes.ok());
  (*bytes)[bytes->size() - 1] ^= 1;
  ASSERT_TRUE(WriteFileAtomic(path, *bytes).ok());
  rep = store_->Verify();
  ASSERT_TRUE(rep.ok());
  EXPECT_FALSE(rep->ok());
  EXPECT_TRUE(absl::IsDataLoss(store_->ReadTensors(*r1).status()));
  std::filesystem::remove(path);
  rep = store_->Verify();
  EXPECT_FALSE(rep->ok());
  EXPECT_NE(rep->problems[0].find("missing"), std::string::npos);
}

TEST_F(StoreTest, CheckpointsAndLocate) {
  Adapter master = MakeAdapter(2, 5);
  Adapter moments = MakeAdapter(2, 6);
  CheckpointParts parts;
  parts.master = master.views;
  parts.optimizer = moments.views;
  parts.scheduler_name = "cosine";
  parts.scheduler_position = 42;
  parts.rng_state = "rng";
  parts.rollout = "rollout records";
  auto ck = store_->PutCheckpoint("acme/support", 42, 0, parts);
  ASSERT_TRUE(ck.ok()) << ck.status();
  EXPECT_EQ(*store_->ReadOpaqueBlob(ck->rollout), "rollout records");
  auto opt = store_->ReadCheckpointTensors(ck->optimizer);
  ASSERT_TRUE(opt.ok());
  EXPECT_EQ(opt->size(), 4u);
  EXPECT_TRUE(store_->ReadCheckpointTensors(ck->gradients)->tensors().empty());

  PublishOptions o;
  o.alias = "serving";
  o.source.kind = SourceKind::kTrained;
  o.source.checkpoint_id = ck->id;
  o.source.step = 42;
  auto r = store_->PublishTensors("acme/support", master.views, o);
  ASSERT_TRUE(r.ok());
  auto loc = store_->Locate("acme/support", "serving");
  ASSERT_TRUE(loc.ok()) << loc.status();
  EXPECT_EQ(loc->base.name, "tiny");
  ASSERT_TRUE(loc->checkpoint.has_value());
  EXPECT_EQ(loc->checkpoint->id, ck->id);
  EXPECT_EQ(loc->revision.id, r->id);
  EXPECT_EQ(loc->location.tier, Tier::kStorage);
  EXPECT_EQ(store_->ListCheckpoints("acme/support")->size(), 1u);
  EXPECT_EQ(loc->location.blob_path, store_->BlobPath(r->blob.hash));
  EXPECT_TRUE(absl::IsNotFound(store_->Locate("acme/support", "canary").status()));
  EXPECT_EQ(store_->catalog().GetBlob(r->blob.hash)->refcount, 1u);
  EXPECT_EQ(store_->catalog().GetBlob(ck->master.hash)->kind, BlobKind::kCheckpoint);
  ExpectVerifyOk();
  CheckpointParts empty;
  EXPECT_TRUE(absl::IsInvalidArgument(store_->PutCheckpoint("acme/support", 1, 0, empty).status()));
}

TEST_F(StoreTest, AliasesRollbackDeleteThroughStore) {
  auto r1 = store_->PublishTensors("acme/support", MakeAdapter(2, 1).views, {});
  auto r2 = store_->PublishTensors("acme/support", MakeAdapter(2, 2).views, {});
  ASSERT_TRUE(r1.ok() && r2.ok());
  ASSERT_TRUE(store_->SetAlias("acme/support", "serving", r1->id).ok());
  ASSERT_TRUE(store_->SetAlias("acme/support", "serving", r2->id).ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(store_->DeleteRevision(r2->id)));
  EXPECT_EQ(*store_->Rollback("acme/support", "serving"), r1->id);
  ASSERT_TRUE(store_->DeleteRevision(r2->id).ok());
  auto page = store_->ListRevisions("acme/support", 0, 10);
  ASSERT_TRUE(page.ok());
  ASSERT_EQ(page->items.size(), 1u);
  EXPECT_EQ(store_->ListAliases("acme/support")->size(), 1u);
  auto log = store_->AliasLog("acme/support", "serving");
  ASSERT_TRUE(log.ok());
  ASSERT_EQ(log->size(), 3u);
  EXPECT_EQ(log->back().reason, "rollback");
  ASSERT_TRUE(store_->SetEvalScore(r1->id, "win_rate", 0.75f).ok());
  EXPECT_FLOAT_EQ(store_->GetRevision(r1->id)->evals.at("win_rate"), 0.75f);
  EXPECT_TRUE(absl::IsNotFound(store_->SetEvalScore(999, "x", 1)));
  ExpectVerifyOk();
}

TEST_F(StoreTest, PeftDirImportExportRoundTripsBytes) {
  Adapter a;
  a.Add("layers.0.self_attn.q_proj", false, 4, 8, 1);
  a.Add("layers.0.self_attn.q_proj", true, 16, 4, 2);
  a.Add("layers.0.self_attn.k_proj", false, 2, 8, 3);
  a.Add("layers.0.self_attn.k_proj", true, 4, 2, 4);
  const std::string cfg_text =
      R"({"peft_type": "LORA", "r": 4, "lora_alpha": 8, "use_rslora": true, )"
      R"("rank_pattern": {"k_proj": 2}, "alpha_pattern": {"k_proj": 3}, )"
      R"("target_modules": ["q_proj", "k_proj"], "task_type": "CAUSAL_LM"})";
  auto cfg = peft::ParseLoraConfig(cfg_text);
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  ASSERT_TRUE(peft::WritePeftDir(dir_.file("in"), *cfg, a.views).ok());
  PublishOptions o;
  o.alias = "serving";
  auto r = store_->PublishPeftDir("acme/support", dir_.file("in"), o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->lora.r, 4);
  EXPECT_FLOAT_EQ(r->lora.alpha, 8);
  EXPECT_TRUE(r->lora.use_rslora);
  ASSERT_EQ(r->lora.modules.size(), 2u);
  EXPECT_EQ(r->source.origin, dir_.file("in"));
  EXPECT_EQ(r->source.content_hash.size(), 32u);
  ASSERT_TRUE(store_->ExportPeftDir(*r, dir_.file("out")).ok());
  for (const char* f : {"adapter_config.json", "adapter_model.safetensors"}) {
    auto in = ReadFileToString(dir_.file(absl::StrCat("in/", f)));
    auto out = ReadFileToString(dir_.file(absl::StrCat("out/", f)));
    ASSERT_TRUE(in.ok() && out.ok());
    EXPECT_EQ(*in, *out) << f;
  }
  // Settings-only export (no stored config) still loads with the same ranks.
  auto t = store_->ReadTensors(*r);
  ASSERT_TRUE(t.ok());
  PublishOptions plain;
  plain.lora = r->lora;
  auto r2 = store_->PublishTensors("acme/support", t->tensors(), plain);
  ASSERT_TRUE(r2.ok()) << r2.status();
  ASSERT_TRUE(store_->ExportPeftDir(*r2, dir_.file("out2")).ok());
  auto back = peft::ReadPeftDir(dir_.file("out2"));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->config.RankFor("model.layers.0.self_attn.k_proj"), 2);
  EXPECT_DOUBLE_EQ(back->config.ScaleFor("model.layers.0.self_attn.k_proj"), 3 / std::sqrt(2.0));
  // Settings without target modules: the export names them from the tensors (peft would
  // otherwise fall back to its per-model defaults and skip every other tensor). The fixture's
  // base is a module table, not a known causal LM: the task stays unset.
  plain.lora.target_modules.clear();
  auto r3 = store_->PublishTensors("acme/support", t->tensors(), plain);
  ASSERT_TRUE(r3.ok()) << r3.status();
  ASSERT_TRUE(store_->ExportPeftDir(*r3, dir_.file("out3")).ok());
  auto named = peft::ReadPeftDir(dir_.file("out3"));
  ASSERT_TRUE(named.ok()) << named.status();
  EXPECT_EQ(named->config.target_modules, (std::vector<std::string>{"k_proj", "q_proj"}));
  EXPECT_EQ(named->config.task_type, "");

  // DoRA is stored with its magnitudes and exported unchanged; a magnitude of the wrong shape
  // is refused by name and changes nothing.
  const std::string dora_cfg =
      R"({"peft_type": "LORA", "r": 4, "lora_alpha": 8, "use_dora": true, )"
      R"("rank_pattern": {"k_proj": 2}, "target_modules": ["q_proj", "k_proj"]})";
  std::vector<TensorView> dora = a.views;
  std::vector<float> mags(16, 1.5f);
  dora.push_back({"base_model.model.model.layers.0.self_attn.q_proj.lora_magnitude_vector",
                  DType::kF32,
                  {16},
                  reinterpret_cast<const std::byte*>(mags.data()),
                  64});
  ASSERT_TRUE(peft::WritePeftDir(dir_.file("dora"), *peft::ParseLoraConfig(dora_cfg), dora).ok());
  auto stored = store_->PublishPeftDir("acme/support", dir_.file("dora"));
  ASSERT_TRUE(stored.ok()) << stored.status();
  ASSERT_TRUE(store_->ExportPeftDir(*stored, dir_.file("dora-out")).ok());
  for (const char* f : {"adapter_config.json", "adapter_model.safetensors"}) {
    EXPECT_EQ(*ReadFileToString(dir_.file(absl::StrCat("dora/", f))),
              *ReadFileToString(dir_.file(absl::StrCat("dora-out/", f))))
        << f;
  }
  dora.back().shape = {8};
  dora.back().nbytes = 32;
  ASSERT_TRUE(safetensors::WriteFile(dir_.file("dora/adapter_model.safetensors"), dora, {}).ok());
  auto bad = store_->PublishPeftDir("acme/support", dir_.file("dora"));
  EXPECT_TRUE(absl::IsInvalidArgument(bad.status())) << bad.status();
  EXPECT_NE(bad.status().message().find("DoRA magnitude has shape [8], want [16]"),
            std::string::npos)
      << bad.status();
  EXPECT_EQ(store_->ListRevisions("acme/support", 0, 0)->items.size(), 4u);
  ExpectVerifyOk();
}

TEST(StorePack, MoeExpertsPackedAndReadBackByOriginalNames) {
  TempDir dir;
  auto s = Store::Open(dir.file("store"));
  ASSERT_TRUE(s.ok());
  std::string table = R"({"modules":[)";
  for (int e = 0; e < 4; ++e) {
    table += absl::StrCat(e ? "," : "", R"({"name":"layers.0.mlp.experts.)", e,
                          R"(.up_proj","in":8,"out":12})");
  }
  table += "]}";
  ASSERT_TRUE((*s)->AddBaseFromModuleTable("moe", table).ok());
  ASSERT_TRUE((*s)->CreatePolicy("m", "moe").ok());
  Adapter a;
  for (int e = 0; e < 4; ++e) {
    const std::string m = absl::StrCat("layers.0.mlp.experts.", e, ".up_proj");
    a.Add(m, false, 2, 8, static_cast<float>(e));
    a.Add(m, true, 12, 2, static_cast<float>(10 + e));
  }
  PublishOptions pack;
  pack.pack = true;
  auto packed = (*s)->PublishTensors("m", a.views, pack);
  ASSERT_TRUE(packed.ok()) << packed.status();
  EXPECT_EQ(packed->layout, Layout::kPacked);
  EXPECT_EQ(packed->blob.tensors, 8u);
  auto plain = (*s)->PublishTensors("m", a.views, {});
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(plain->layout, Layout::kPlain);
  EXPECT_NE(plain->blob.hash, packed->blob.hash);
  auto t = (*s)->ReadTensors(*packed);
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_EQ(t->size(), 8u);
  for (const auto& v : a.views) {
    const TensorView* got = t->Find(v.name);
    ASSERT_NE(got, nullptr) << v.name;
    EXPECT_EQ(got->shape, v.shape);
    ASSERT_EQ(got->nbytes, v.nbytes);
    EXPECT_EQ(std::memcmp(got->data, v.data, v.nbytes), 0) << v.name;
  }
  ASSERT_TRUE((*s)->ExportPeftDir(*packed, dir.file("p")).ok());
  ASSERT_TRUE((*s)->ExportPeftDir(*plain, dir.file("q")).ok());
  EXPECT_EQ(*ReadFileToString(dir.file("p/adapter_model.safetensors")),
            *ReadFileToString(dir.file("q/adapter_model.safetensors")));
  auto rep = (*s)->Verify();
  ASSERT_TRUE(rep.ok());
  EXPECT_TRUE(rep->ok());
}

TEST(StoreBases, FromQwen3ConfigAndWeights) {
  TempDir dir;
  auto s = Store::Open(dir.file("store"));
  ASSERT_TRUE(s.ok());
  ModelConfig cfg;
  cfg.model_type = "qwen3";
  cfg.vocab_size = 64;
  cfg.hidden_size = 16;
  cfg.intermediate_size = 32;
  cfg.num_hidden_layers = 2;
  cfg.num_attention_heads = 2;
  cfg.num_key_value_heads = 1;
  cfg.head_dim = 8;
  cfg.max_position_embeddings = 128;
  ASSERT_TRUE(WriteFileAtomic(dir.file("config.json"), cfg.ToJson()).ok());
  auto b = (*s)->AddBaseFromConfig("qwen3-tiny", dir.file("config.json"));
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->arch.family, "qwen3");
  EXPECT_EQ(b->arch.num_layers, 2);
  const ModuleShape* q = b->FindModule("layers.1.self_attn.q_proj");
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(q->in, 16);
  EXPECT_EQ(q->out, 16);
  EXPECT_TRUE(b->weights_fingerprint.empty());
  Adapter w = MakeAdapter(2, 0);
  ASSERT_TRUE(safetensors::WriteFile(dir.file("model.safetensors"), w.views, {}).ok());
  auto fp = (*s)->AddBaseFromConfig("qwen3-tiny-w", dir.file("config.json"),
                                    dir.file("model.safetensors"));
  ASSERT_TRUE(fp.ok()) << fp.status();
  EXPECT_EQ(fp->weights_fingerprint.size(), 32u);
  EXPECT_TRUE(absl::IsAlreadyExists(
      (*s)->AddBaseFromConfig("qwen3-tiny", dir.file("config.json")).status()));
  EXPECT_FALSE((*s)->AddBaseFromConfig("x", dir.file("missing.json")).ok());
  EXPECT_TRUE(absl::IsInvalidArgument((*s)->AddBaseFromModuleTable("y", "{]").status()));
  EXPECT_TRUE(absl::IsInvalidArgument(
      (*s)->AddBaseFromModuleTable("y", R"({"modules":[{"name":"a","in":"x","out":1}]})")
          .status()));
  EXPECT_EQ((*s)->ListBases()->size(), 2u);
}

TEST(StoreOpen, RegularFileIsNotAStoreDirectory) {
  TempDir dir;
  ASSERT_TRUE(WriteFileAtomic(dir.file("file"), "x").ok());
  for (bool create : {true, false}) {
    StoreOptions o;
    o.create_if_missing = create;
    auto s = Store::Open(dir.file("file"), o);
    EXPECT_TRUE(absl::IsInvalidArgument(s.status())) << s.status();
    EXPECT_NE(s.status().message().find("not a store directory"), std::string::npos) << s.status();
  }
  EXPECT_EQ(*ReadFileToString(dir.file("file")), "x");  // untouched
}

TEST(StoreOpen, SeparateBlobRootAndMissingStore) {
  TempDir dir;
  StoreOptions o;
  o.blob_root = dir.file("shared-blobs");
  auto s = Store::Open(dir.file("store"), o);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ((*s)->blob_root(), dir.file("shared-blobs"));
  StoreOptions no_create;
  no_create.create_if_missing = false;
  EXPECT_TRUE(absl::IsNotFound(Store::Open(dir.file("nothing"), no_create).status()));
}

}  // namespace
}  // namespace loradb
