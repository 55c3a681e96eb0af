// Qwen3Model with adapters beyond plain LoRA on projections: DoRA, LoRA on lm_head and (as PEFT's
// embedding LoRA) on embed_tokens, an adapter's own embed_tokens / lm_head (modules_to_save).
// Each alone equals a base with the adapter merged into its weights; in a mixed batch (each
// sequence its own adapter or none) every row equals that sequence run alone, with and without
// a KV cache and through the kernel applier.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "compute/model/checkpoint.h"
#include "compute/model/kernel_lora_applier.h"
#include "compute/model/qwen3_model.h"
#include "tests/test_paths.h"
#include "tests/test_util.h"

namespace loradb::model {
namespace {

using ::loradb::testing::TempDir;

ModelConfig Config(const std::string& name) {
  absl::StatusOr<ModelConfig> c =
      ReadModelConfig(std::string(LORADB_SOURCE_DIR) + "/compute/configs/" + name + ".json");
  EXPECT_TRUE(c.ok()) << c.status();
  return *c;
}

at::Tensor Ids(std::vector<int64_t> ids) {
  return at::from_blob(ids.data(), {static_cast<int64_t>(ids.size())}, at::kLong).clone();
}

double RelErr(const at::Tensor& a, const at::Tensor& b) {
  return ((a.to(at::kDouble) - b.to(at::kDouble)).abs().max() / b.to(at::kDouble).abs().max())
      .item<double>();
}

// A base model over owned tensors (HF names), so tests can merge adapters into copies.
struct Base {
  ModelConfig config;
  std::map<std::string, at::Tensor> weights;
  std::unique_ptr<Qwen3Model> model;
};

std::unique_ptr<Qwen3Model> Build(const ModelConfig& c,
                                  const std::map<std::string, at::Tensor>& tensors) {
  auto owned = std::make_shared<std::vector<at::Tensor>>();
  auto set = std::make_shared<TensorSet>(owned);
  for (const auto& [name, t] : tensors) {
    at::Tensor x = t.to(at::kFloat).contiguous().clone();
    owned->push_back(x);
    EXPECT_TRUE(set->Add(TensorView{name, DType::kF32, x.sizes().vec(),
                                    static_cast<const std::byte*>(x.data_ptr()), x.nbytes()})
                    .ok());
  }
  absl::StatusOr<std::unique_ptr<Qwen3Model>> m = Qwen3Model::FromTensors(c, set);
  EXPECT_TRUE(m.ok()) << m.status();
  return m.ok() ? std::move(*m) : nullptr;
}

Base MakeBase(const TempDir& dir, const std::string& name) {
  Base b;
  b.config = Config(name);
  const std::string path = dir.file(name);
  absl::Status st = WriteRandomCheckpoint(b.config, path, 3, at::kFloat);
  EXPECT_TRUE(st.ok()) << st;
  absl::StatusOr<TensorSet> set = ReadCheckpointTensors(path);
  EXPECT_TRUE(set.ok()) << set.status();
  for (const TensorView& v : set->tensors()) {
    b.weights[v.name] = at::from_blob(const_cast<std::byte*>(v.data), v.shape, at::kFloat).clone();
  }
  b.model = Build(b.config, b.weights);
  return b;
}

// The base's weights with an untied head (so embed_tokens and lm_head can differ).
std::map<std::string, at::Tensor> Untied(const Base& b, ModelConfig* config) {
  std::map<std::string, at::Tensor> w = b.weights;
  *config = b.config;
  if (config->tie_word_embeddings) {
    config->tie_word_embeddings = false;
    w["lm_head.weight"] = w["model.embed_tokens.weight"];
  }
  return w;
}

// Random LoRA (optionally DoRA) factors for the dense projections of `c`.
std::vector<LoraModuleInput> Projections(const ModelConfig& c, uint64_t seed, bool dora) {
  at::manual_seed(seed);
  std::vector<LoraModuleInput> mods;
  for (const ModuleShape& s : c.LoraModules()) {
    if (s.name.find("_proj") == std::string::npos || s.name.find("experts") != std::string::npos) {
      continue;
    }
    LoraModuleInput m{s.name, at::randn({3, s.in}) * 0.1, at::randn({s.out, 3}) * 0.1, 1.5};
    if (dora) m.magnitude = at::rand({s.out}) + 0.5;
    mods.push_back(std::move(m));
  }
  return mods;
}

// W merged as PEFT merges it: W + s B A, and for DoRA m / ||W + s B A||_row times that.
at::Tensor Merged(const at::Tensor& w, const LoraModuleInput& m) {
  at::Tensor merged =
      w.to(at::kDouble) + m.scale * at::matmul(m.b.to(at::kDouble), m.a.to(at::kDouble));
  if (m.magnitude.defined()) {
    merged = merged * (m.magnitude.to(at::kDouble) / merged.norm(2, {1})).unsqueeze(1);
  }
  return merged.to(at::kFloat);
}

std::string WeightName(const std::string& module) {
  return module == "lm_head" ? "lm_head.weight" : "model." + module + ".weight";
}

at::Tensor Logits(const Qwen3Model& m, const std::vector<int64_t>& ids, const LoraAdapter* a) {
  LoraBatch lb;
  ForwardInput in;
  in.token_ids = Ids(ids);
  if (a != nullptr) {
    lb.adapters = {a};
    lb.row_slot.assign(ids.size(), 0);
    in.lora = &lb;
  }
  absl::StatusOr<ForwardOutput> out = m.Forward(in);
  EXPECT_TRUE(out.ok()) << out.status();
  return out.ok() ? out->logits : at::Tensor();
}

LoraAdapter Prepared(const Qwen3Model& m, std::vector<LoraModuleInput> mods,
                     std::vector<LoraWeightInput> weights = {}) {
  absl::StatusOr<LoraAdapter> a =
      LoraAdapter::Create(m.config(), std::move(mods), at::kFloat, at::kCPU, std::move(weights));
  EXPECT_TRUE(a.ok()) << a.status();
  absl::Status st = m.PrepareAdapter(&*a);
  EXPECT_TRUE(st.ok()) << st;
  return std::move(*a);
}

// The feature adapters of the tests, with the merged weights each equals.
struct FeatureAdapters {
  std::vector<LoraAdapter> adapters;
  std::vector<std::unique_ptr<Qwen3Model>> merged;  // same order
  std::vector<std::string> names;
};

FeatureAdapters MakeFeatureAdapters(const Base& b) {
  const ModelConfig& c = b.config;
  FeatureAdapters f;
  const std::vector<int64_t> shape = {c.vocab_size, c.hidden_size};
  auto add = [&](const std::string& name, std::vector<LoraModuleInput> mods,
                 std::vector<LoraWeightInput> weights) {
    ModelConfig mc;
    std::map<std::string, at::Tensor> w = Untied(b, &mc);
    for (const LoraModuleInput& m : mods) {
      if (m.module == "embed_tokens") {  // PEFT's embedding LoRA: A [r, vocab], B [hidden, r]
        // As a linear layer [hidden, vocab] over one-hot tokens (DoRA norms per hidden row).
        w["model.embed_tokens.weight"] = Merged(w["model.embed_tokens.weight"].t(), m).t();
      } else {
        w[WeightName(m.module)] = Merged(w[WeightName(m.module)], m);
      }
    }
    for (const LoraWeightInput& x : weights) {
      if (!x.base_layer) w[WeightName(x.module)] = x.weight;
    }
    f.merged.push_back(Build(mc, w));
    f.adapters.push_back(Prepared(*b.model, std::move(mods), std::move(weights)));
    f.names.push_back(name);
  };
  at::manual_seed(77);
  const at::Tensor own_head = at::randn(shape) * 0.05, own_embed = at::randn(shape) * 0.05;
  add("dora", Projections(c, 10, /*dora=*/true), {});
  add("plain", Projections(c, 11, /*dora=*/false), {});
  {
    std::vector<LoraModuleInput> mods = Projections(c, 12, false);
    mods.push_back({"lm_head", at::randn({2, c.hidden_size}) * 0.1,
                    at::randn({c.vocab_size, 2}) * 0.1, 2.0, at::rand({c.vocab_size}) + 0.5});
    add("lm_head_dora", std::move(mods), {});
  }
  add("lm_head_mts", Projections(c, 13, false), {{"lm_head", own_head, false}});
  {
    std::vector<LoraModuleInput> mods = Projections(c, 14, false);
    mods.push_back(
        {"embed_tokens", at::randn({4, c.vocab_size}), at::randn({c.hidden_size, 4}), 0.5});
    // A saved base_layer copy (PEFT's save_embedding_layers) equal to the base: no change.
    add("embed_lora", std::move(mods),
        {{"embed_tokens", b.weights.at("model.embed_tokens.weight"), true}});
  }
  {
    std::vector<LoraModuleInput> mods;
    mods.push_back({"embed_tokens", at::randn({2, c.vocab_size}) * 0.1,
                    at::randn({c.hidden_size, 2}) * 0.1, 2.0, at::rand({c.hidden_size}) + 0.5});
    add("embed_dora", std::move(mods), {});
  }
  add("embed_mts_lm_head_lora",
      {{"lm_head", at::randn({2, c.hidden_size}) * 0.1, at::randn({c.vocab_size, 2}) * 0.1, 1.0}},
      {{"embed_tokens", own_embed, false}});
  return f;
}

class PeftFeaturesTest : public ::testing::TestWithParam<const char*> {};

TEST_P(PeftFeaturesTest, EachAdapterAloneEqualsItsMergedWeights) {
  TempDir dir;
  Base b = MakeBase(dir, GetParam());
  ASSERT_NE(b.model, nullptr);
  FeatureAdapters f = MakeFeatureAdapters(b);
  const std::vector<int64_t> ids = {4, 8, 15, 16, 23, 42, 1000};
  const at::Tensor plain = Logits(*b.model, ids, nullptr);
  for (size_t i = 0; i < f.adapters.size(); ++i) {
    ASSERT_NE(f.merged[i], nullptr);
    const at::Tensor got = Logits(*b.model, ids, &f.adapters[i]);
    const at::Tensor want = Logits(*f.merged[i], ids, nullptr);
    EXPECT_LT(RelErr(got, want), 1e-5) << f.names[i];
    EXPECT_GT(RelErr(got, plain), 1e-3) << f.names[i] << " changes nothing (vacuous)";
  }
}

TEST_P(PeftFeaturesTest, MixedBatchRowsEqualEachSequenceAlone) {
  TempDir dir;
  Base b = MakeBase(dir, GetParam());
  ASSERT_NE(b.model, nullptr);
  FeatureAdapters f = MakeFeatureAdapters(b);
  // One sequence per adapter plus two base-only ones, lengths differing.
  std::vector<std::vector<int64_t>> seqs;
  std::vector<int32_t> slot_of_seq;
  LoraBatch lb;
  for (size_t i = 0; i < f.adapters.size(); ++i) lb.adapters.push_back(&f.adapters[i]);
  for (size_t i = 0; i < f.adapters.size() + 2; ++i) {
    std::vector<int64_t> s;
    for (size_t t = 0; t < 3 + i % 3; ++t)
      s.push_back(static_cast<int64_t>((i * 131 + t * 17) % 1000));
    seqs.push_back(s);
    slot_of_seq.push_back(i < f.adapters.size() ? static_cast<int32_t>(i) : -1);
  }
  std::swap(slot_of_seq[1], slot_of_seq.back());  // a base-only row between adapter rows
  std::vector<int64_t> all;
  ForwardInput in;
  for (size_t i = 0; i < seqs.size(); ++i) {
    all.insert(all.end(), seqs[i].begin(), seqs[i].end());
    in.seq_lens.push_back(static_cast<int64_t>(seqs[i].size()));
    lb.row_slot.insert(lb.row_slot.end(), seqs[i].size(), slot_of_seq[i]);
  }
  in.token_ids = Ids(all);
  in.lora = &lb;

  std::vector<at::Tensor> alone;
  for (size_t i = 0; i < seqs.size(); ++i) {
    alone.push_back(
        Logits(*b.model, seqs[i], slot_of_seq[i] < 0 ? nullptr : &f.adapters[slot_of_seq[i]]));
  }
  auto check = [&](const std::string& what) {
    absl::StatusOr<ForwardOutput> out = b.model->Forward(in);
    ASSERT_TRUE(out.ok()) << out.status();
    int64_t row = 0;
    for (size_t i = 0; i < seqs.size(); ++i) {
      const int64_t n = static_cast<int64_t>(seqs[i].size());
      EXPECT_LT(RelErr(out->logits.narrow(0, row, n), alone[i]), 1e-5) << what << " seq " << i;
      row += n;
    }
    // Last-row logits only (what decode computes): the same rows.
    ForwardInput last = in;
    last.last_row_logits_only = true;
    absl::StatusOr<ForwardOutput> lo = b.model->Forward(last);
    ASSERT_TRUE(lo.ok()) << lo.status();
    for (size_t i = 0; i < seqs.size(); ++i) {
      EXPECT_LT(RelErr(lo->logits[static_cast<int64_t>(i)], alone[i][-1]), 1e-5)
          << what << " last row of seq " << i;
    }
  };
  check("torch applier");
  KernelLoraApplier kernel(1);
  b.model->set_lora_applier(&kernel);
  check("kernel applier");
  EXPECT_GT(kernel.kernel_calls(), 0);

  // With a KV cache: prefill all but the last token of each, then one decode step of all.
  KvCache cache = b.model->NewKvCache();
  ForwardInput pre, step;
  LoraBatch lp = lb, ls = lb;
  lp.row_slot.clear();
  ls.row_slot.clear();
  std::vector<int64_t> pre_ids, step_ids;
  for (size_t i = 0; i < seqs.size(); ++i) {
    const KvCache::SeqId id = cache.AddSequence(8);
    pre.cache_seqs.push_back(id);
    step.cache_seqs.push_back(id);
    pre_ids.insert(pre_ids.end(), seqs[i].begin(), seqs[i].end() - 1);
    pre.seq_lens.push_back(static_cast<int64_t>(seqs[i].size()) - 1);
    lp.row_slot.insert(lp.row_slot.end(), seqs[i].size() - 1, slot_of_seq[i]);
    step_ids.push_back(seqs[i].back());
    step.seq_lens.push_back(1);
    ls.row_slot.push_back(slot_of_seq[i]);
  }
  pre.token_ids = Ids(pre_ids);
  pre.lora = &lp;
  pre.last_row_logits_only = true;
  step.token_ids = Ids(step_ids);
  step.lora = &ls;
  ASSERT_TRUE(b.model->Forward(pre, &cache).ok());
  absl::StatusOr<ForwardOutput> out = b.model->Forward(step, &cache);
  ASSERT_TRUE(out.ok()) << out.status();
  for (size_t i = 0; i < seqs.size(); ++i) {
    EXPECT_LT(RelErr(out->logits[static_cast<int64_t>(i)], alone[i][-1]), 1e-5)
        << "decode step, seq " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Kinds, PeftFeaturesTest, ::testing::Values("tiny-dense", "tiny-moe"));

TEST(PeftFeaturesErrorsTest, BadInputsAreRefusedByName) {
  TempDir dir;
  Base b = MakeBase(dir, "tiny-moe");
  ASSERT_NE(b.model, nullptr);
  const ModelConfig& c = b.config;
  const int64_t h = c.hidden_size, q = c.num_attention_heads * c.head_dim;
  // A DoRA magnitude of the wrong shape.
  LoraModuleInput m{"layers.0.self_attn.q_proj", at::randn({2, h}), at::randn({q, 2}), 1.0,
                    at::ones({q - 1})};
  absl::StatusOr<LoraAdapter> a = LoraAdapter::Create(c, {m}, at::kFloat);
  EXPECT_EQ(a.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(a.status().message().find("DoRA magnitude"), std::string::npos) << a.status();
  EXPECT_NE(a.status().message().find("q_proj"), std::string::npos) << a.status();
  // DoRA on experts is not applied.
  LoraModuleInput e{"layers.0.mlp.experts.1.up_proj", at::randn({2, h}),
                    at::randn({c.moe_intermediate_size, 2}), 1.0,
                    at::ones({c.moe_intermediate_size})};
  EXPECT_EQ(LoraAdapter::Create(c, {e}, at::kFloat).status().code(),
            absl::StatusCode::kUnimplemented);
  LoraModuleInput emb{"embed_tokens", at::randn({2, c.vocab_size}), at::randn({h, 2}), 1.0,
                      at::ones({c.vocab_size})};
  EXPECT_EQ(LoraAdapter::Create(c, {emb}, at::kFloat).status().code(),
            absl::StatusCode::kInvalidArgument);  // the magnitude is per hidden column
  // A whole-module weight of the wrong shape, or of a module that cannot be replaced.
  EXPECT_EQ(LoraAdapter::Create(c, {}, at::kFloat, at::kCPU,
                                {{"lm_head", at::zeros({c.vocab_size, h + 1}), false}})
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(LoraAdapter::Create(c, {}, at::kFloat, at::kCPU, {{"norm", at::zeros({h}), false}})
                .status()
                .code(),
            absl::StatusCode::kUnimplemented);
  // LoRA and a modules_to_save weight on one module.
  LoraModuleInput head{"lm_head", at::randn({2, h}), at::randn({c.vocab_size, 2}), 1.0};
  EXPECT_EQ(LoraAdapter::Create(c, {head}, at::kFloat, at::kCPU,
                                {{"lm_head", at::zeros({c.vocab_size, h}), false}})
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);

  // An unprepared adapter is refused by Forward; a base_layer weight unlike the base's by
  // PrepareAdapter (the adapter stays unprepared).
  absl::StatusOr<LoraAdapter> dora = LoraAdapter::Create(
      c, {{"layers.0.self_attn.q_proj", at::randn({2, h}), at::randn({q, 2}), 1.0, at::ones({q})}},
      at::kFloat);
  ASSERT_TRUE(dora.ok()) << dora.status();
  LoraBatch lb{{&*dora}, {0, 0}};
  ForwardInput in;
  in.token_ids = Ids({1, 2});
  in.lora = &lb;
  EXPECT_EQ(b.model->Forward(in).status().code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(b.model->PrepareAdapter(&*dora).ok());
  EXPECT_TRUE(b.model->Forward(in).ok());
  absl::StatusOr<LoraAdapter> resized =
      LoraAdapter::Create(c, {}, at::kFloat, at::kCPU,
                          {{"embed_tokens", b.weights.at("model.embed_tokens.weight") + 1, true}});
  ASSERT_TRUE(resized.ok()) << resized.status();
  absl::Status st = b.model->PrepareAdapter(&*resized);
  EXPECT_EQ(st.code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(st.message().find("base_layer"), std::string::npos) << st;
  EXPECT_FALSE(resized->prepared());
}

}  // namespace
}  // namespace loradb::model
