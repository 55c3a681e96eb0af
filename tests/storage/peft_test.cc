#include "storage/formats/peft.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "storage/formats/safetensors.h"
#include "storage/util/file_util.h"
#include "tests/test_util.h"

namespace loradb {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// Owns float storage for views built in tests.
struct Tensors {
  std::vector<std::vector<float>> storage;
  std::vector<TensorView> views;
  void Add(const std::string& name, std::vector<int64_t> shape, float base = 0) {
    size_t n = 1;
    for (int64_t d : shape) n *= static_cast<size_t>(d);
    storage.emplace_back(n);
    for (size_t i = 0; i < n; ++i) storage.back()[i] = base + static_cast<float>(i);
    views.push_back({name, DType::kF32, std::move(shape),
                     reinterpret_cast<const std::byte*>(storage.back().data()), n * 4});
  }
};

TEST(PeftNameTest, ParsesLinearAndEmbeddingNames) {
  auto n =
      peft::ParsePeftTensorName("base_model.model.model.layers.3.self_attn.q_proj.lora_A.weight");
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(n->module_key, "model.layers.3.self_attn.q_proj");
  EXPECT_EQ(n->module, "layers.3.self_attn.q_proj");
  EXPECT_EQ(n->side, peft::LoraSide::kA);
  EXPECT_FALSE(n->embedding);

  n = peft::ParsePeftTensorName("base_model.model.model.embed_tokens.lora_embedding_B");
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(n->module, "embed_tokens");
  EXPECT_EQ(n->side, peft::LoraSide::kB);
  EXPECT_TRUE(n->embedding);

  n = peft::ParsePeftTensorName("base_model.model.lm_head.lora_B.weight");
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(n->module_key, "lm_head");
  EXPECT_EQ(n->module, "lm_head");

  for (peft::LoraSide side : {peft::LoraSide::kA, peft::LoraSide::kB}) {
    for (bool emb : {false, true}) {
      std::string name = peft::PeftTensorNameFor("model.layers.0.mlp.up_proj", side, emb);
      auto back = peft::ParsePeftTensorName(name);
      ASSERT_TRUE(back.ok()) << name;
      EXPECT_EQ(back->module_key, "model.layers.0.mlp.up_proj");
      EXPECT_EQ(back->side, side);
      EXPECT_EQ(back->embedding, emb);
    }
  }
}

TEST(PeftNameTest, RejectsNonLoraNamesSayingWhy) {
  auto n =
      peft::ParsePeftTensorName("base_model.model.model.layers.0.q_proj.lora_magnitude_vector");
  ASSERT_FALSE(n.ok());
  EXPECT_THAT(std::string(n.status().message()), HasSubstr("DoRA"));
  n = peft::ParsePeftTensorName("base_model.model.model.layers.0.q_proj.bias");
  ASSERT_FALSE(n.ok());
  EXPECT_THAT(std::string(n.status().message()), HasSubstr("bias"));
  n = peft::ParsePeftTensorName("base_model.model.score.modules_to_save.weight");
  ASSERT_FALSE(n.ok());
  EXPECT_THAT(std::string(n.status().message()), HasSubstr("modules_to_save"));
  EXPECT_FALSE(peft::ParsePeftTensorName(".lora_A.weight").ok());
  EXPECT_FALSE(peft::ParsePeftTensorName("base_model.model..lora_A.weight").ok());
}

TEST(PeftConfigTest, ParsesFieldsAndScales) {
  auto c = peft::ParseLoraConfig(R"({
    "peft_type": "LORA", "r": 8, "lora_alpha": 16, "use_rslora": false,
    "rank_pattern": {"q_proj": 4, "layers\\.1\\..*v_proj": 2},
    "alpha_pattern": {"model.layers.0.self_attn.k_proj": 3.5},
    "target_modules": ["q_proj", "k_proj", "v_proj"],
    "base_model_name_or_path": "Qwen/Qwen3-0.6B", "task_type": "CAUSAL_LM",
    "bias": "none", "use_dora": false, "modules_to_save": null, "lora_dropout": 0.1})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->r, 8);
  EXPECT_EQ(c->lora_alpha, 16);
  EXPECT_EQ(c->rank_pattern.size(), 2u);
  EXPECT_EQ(c->rank_pattern[0].first, "q_proj");  // file order kept
  EXPECT_EQ(c->target_modules, (std::vector<std::string>{"q_proj", "k_proj", "v_proj"}));
  EXPECT_EQ(c->base_model_name_or_path, "Qwen/Qwen3-0.6B");
  EXPECT_EQ(c->task_type, "CAUSAL_LM");

  EXPECT_EQ(c->RankFor("model.layers.0.self_attn.q_proj"), 4);
  EXPECT_EQ(c->RankFor("model.layers.0.self_attn.k_proj"), 8);
  EXPECT_EQ(c->RankFor("model.layers.1.self_attn.v_proj"), 2);
  EXPECT_EQ(c->RankFor("model.layers.11.self_attn.v_proj"), 8);  // "layers\.1\." is anchored
  // A pattern matches a whole dotted suffix, not a substring.
  EXPECT_EQ(c->RankFor("model.layers.0.self_attn.xq_proj"), 8);
  EXPECT_DOUBLE_EQ(c->ScaleFor("model.layers.0.self_attn.q_proj"), 16.0 / 4);
  EXPECT_DOUBLE_EQ(c->ScaleFor("model.layers.0.self_attn.k_proj"), 3.5 / 8);
  EXPECT_DOUBLE_EQ(c->ScaleFor("model.layers.0.mlp.up_proj"), 2.0);

  auto rs = peft::ParseLoraConfig(R"({"r": 16, "lora_alpha": 32, "use_rslora": true})");
  ASSERT_TRUE(rs.ok());
  EXPECT_DOUBLE_EQ(rs->ScaleFor("anything"), 32.0 / 4.0);

  auto regex = peft::ParseLoraConfig(R"({"r": 2, "target_modules": ".*proj"})");
  ASSERT_TRUE(regex.ok());
  EXPECT_TRUE(regex->target_modules_is_regex);
  EXPECT_EQ(regex->lora_alpha, 8);  // PEFT's default
}

TEST(PeftConfigTest, ReadsEveryFeatureAndRefusesMalformedValues) {
  auto c = peft::ParseLoraConfig(R"({"r":4,"use_dora":true,"fan_in_fan_out":true,"lora_bias":true,
    "bias":"lora_only","modules_to_save":["classifier","score"],
    "trainable_token_indices":{"embed_tokens":[1,5]},
    "target_parameters":["mlp.experts.down_proj","mlp.experts.gate_up_proj"],
    "layer_replication":[[0,2]],"alora_invocation_tokens":null,"use_qalora":false})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->use_dora);
  EXPECT_TRUE(c->fan_in_fan_out);
  EXPECT_TRUE(c->lora_bias);
  EXPECT_EQ(c->bias, "lora_only");
  EXPECT_EQ(c->modules_to_save, (std::vector<std::string>{"classifier", "score"}));
  ASSERT_EQ(c->trainable_token_indices.size(), 1u);
  EXPECT_EQ(c->trainable_token_indices[0].first, "embed_tokens");
  EXPECT_EQ(c->trainable_token_indices[0].second, (std::vector<int64_t>{1, 5}));
  EXPECT_EQ(c->target_parameters.size(), 2u);
  EXPECT_EQ(c->config_features, uint32_t{peft::kFeatureLayerReplication});
  EXPECT_EQ(peft::PeftConfigFeatures(*c), peft::kFeatureLayerReplication | peft::kFeatureDora);
  auto list = peft::ParseLoraConfig(R"({"r":4,"trainable_token_indices":[3,4,5]})");
  ASSERT_TRUE(list.ok());
  EXPECT_EQ(list->trainable_token_indices[0].first, "");

  struct Case {
    const char* json;
    absl::StatusCode code;
    const char* needle;
  };
  const Case cases[] = {
      {R"({"r":4,"use_dora":"yes"})", absl::StatusCode::kInvalidArgument, "use_dora"},
      {R"({"r":4,"modules_to_save":"score"})", absl::StatusCode::kInvalidArgument,
       "modules_to_save"},
      {R"({"r":4,"bias":"some"})", absl::StatusCode::kInvalidArgument, "bias"},
      {R"({"r":4,"trainable_token_indices":[-1]})", absl::StatusCode::kInvalidArgument,
       "trainable_token_indices"},
      {R"({"r":4,"target_parameters":[3]})", absl::StatusCode::kInvalidArgument,
       "target_parameters"},
      {R"({"peft_type":"IA3"})", absl::StatusCode::kUnimplemented, "peft_type \"IA3\""},
      {R"({"r":0})", absl::StatusCode::kInvalidArgument, "r must be a positive integer"},
      {R"({"r":"8"})", absl::StatusCode::kInvalidArgument, "r must be a positive integer"},
      {R"({"r":4.5})", absl::StatusCode::kInvalidArgument, "r must be a positive integer"},
      {R"({"lora_alpha":"x"})", absl::StatusCode::kInvalidArgument, "lora_alpha"},
      {R"({"rank_pattern":{"q":-1}})", absl::StatusCode::kInvalidArgument, "rank_pattern \"q\""},
      {R"({"rank_pattern":{"(":2}})", absl::StatusCode::kInvalidArgument, "not a valid regex"},
      {R"({"alpha_pattern":{"q":"a"}})", absl::StatusCode::kInvalidArgument, "alpha_pattern"},
      {R"({"target_modules":3})", absl::StatusCode::kInvalidArgument, "target_modules"},
      {R"([1])", absl::StatusCode::kInvalidArgument, "not a JSON object"},
      {R"({"r":)", absl::StatusCode::kInvalidArgument, "not valid JSON"},
  };
  for (const Case& c : cases) {
    auto r = peft::ParseLoraConfig(c.json);
    ASSERT_FALSE(r.ok()) << c.json;
    EXPECT_EQ(r.status().code(), c.code) << c.json << ": " << r.status();
    EXPECT_THAT(std::string(r.status().message()), HasSubstr(c.needle)) << c.json;
  }
}

TEST(PeftFeatureTest, ClassifiesTensorsAndRefusesUnappliedFeaturesByName) {
  const std::string q = "base_model.model.model.layers.0.self_attn.q_proj";
  auto info = peft::ClassifyPeftTensor(q + ".lora_magnitude_vector");
  EXPECT_EQ(info.kind, peft::PeftTensorKind::kMagnitude);
  EXPECT_EQ(info.module_key, "model.layers.0.self_attn.q_proj");
  EXPECT_EQ(peft::ClassifyPeftTensor(q + ".lora_B.bias").kind, peft::PeftTensorKind::kLoraBias);
  info = peft::ClassifyPeftTensor(
      "base_model.model.model.layers.1.mlp.experts.base_layer.lora_B.weight");
  EXPECT_EQ(info.kind, peft::PeftTensorKind::kLora);
  EXPECT_EQ(info.depth, 1);
  EXPECT_EQ(info.module_key, "model.layers.1.mlp.experts");
  info = peft::ClassifyPeftTensor("base_model.model.classifier.weight");
  EXPECT_EQ(info.kind, peft::PeftTensorKind::kOther);
  EXPECT_EQ(info.module_key, "classifier");
  EXPECT_FALSE(peft::ParsePeftTensorName(
                   "base_model.model.model.layers.1.mlp.experts.base_layer.lora_B.weight")
                   .ok());

  auto c = peft::ParseLoraConfig(R"({"r":2,"use_dora":true,"modules_to_save":["classifier"]})");
  ASSERT_TRUE(c.ok());
  std::vector<std::string> names = {q + ".lora_A.weight", q + ".lora_B.weight",
                                    q + ".lora_magnitude_vector",
                                    "base_model.model.classifier.weight"};
  auto used = peft::StoredAdapterFeatures(peft::LoraConfig(),
                                          {{peft::kStoredConfigKey, c->raw_json}}, names);
  ASSERT_TRUE(used.ok());
  EXPECT_EQ(*used, peft::kFeatureDora | peft::kFeatureModulesToSave);
  absl::Status st = peft::RefuseUnapplied(*used, peft::kFeatureModulesToSave, "the decoder");
  EXPECT_EQ(st.code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(std::string(st.message()), HasSubstr("the decoder cannot apply DoRA"));
  EXPECT_THAT(std::string(st.message()), Not(HasSubstr("modules_to_save")));
  EXPECT_TRUE(peft::RefuseUnapplied(*used, *used, "x").ok());
}

TEST(PeftFeatureTest, ValidatesFeatureTensorsAgainstTheirModule) {
  const std::string q = "model.layers.0.self_attn.q_proj";
  auto base = [&](Tensors* t) {
    t->Add(peft::PeftTensorNameFor(q, peft::LoraSide::kA, false), {2, 8});
    t->Add(peft::PeftTensorNameFor(q, peft::LoraSide::kB, false), {6, 2});
  };
  auto config = [](const char* json) { return *peft::ParseLoraConfig(json); };
  struct Case {
    const char* config;
    std::string extra;
    std::vector<int64_t> shape;
    const char* needle;  // nullptr: valid
  };
  const std::string p = "base_model.model." + q;
  const Case cases[] = {
      {R"({"r":2,"use_dora":true})", p + ".lora_magnitude_vector", {6}, nullptr},
      {R"({"r":2,"use_dora":true})", p + ".lora_magnitude_vector", {5}, "want [6]"},
      {R"({"r":2})", p + ".lora_magnitude_vector", {6}, "use_dora is not true"},
      {R"({"r":2,"lora_bias":true})", p + ".lora_B.bias", {6}, nullptr},
      {R"({"r":2,"lora_bias":true})", p + ".lora_B.bias", {6, 1}, "lora_B bias has shape"},
      {R"({"r":2})", p + ".lora_B.bias", {6}, "lora_bias is not true"},
      {R"({"r":2,"trainable_token_indices":[1,2,3]})",
       "base_model.model.model.embed_tokens.token_adapter.trainable_tokens_delta",
       {3, 8},
       nullptr},
      {R"({"r":2,"trainable_token_indices":[1,2,3]})",
       "base_model.model.model.embed_tokens.token_adapter.trainable_tokens_delta",
       {2, 8},
       "one row per trainable_token_indices entry"},
      {R"({"r":2,"modules_to_save":["score"]})", "base_model.model.score.weight", {3, 8}, nullptr},
      {R"({"r":2,"modules_to_save":["classifier"]})",
       "base_model.model.pre_classifier.bias",
       {8},
       nullptr},  // PEFT's own rule: the module key ends with the name
      {R"({"r":2})", "base_model.model.score.weight", {3, 8}, "no config feature saves it"},
      {R"({"r":2})", "base_model.model.model.embed_tokens.base_layer.weight", {4, 8}, nullptr},
      {R"({"r":2,"bias":"all"})", "base_model.model.model.norm.bias", {8}, nullptr},
  };
  for (const Case& c : cases) {
    Tensors t;
    base(&t);
    t.Add(c.extra, c.shape);
    absl::Status st = peft::ValidateLoraTensors(config(c.config), t.views);
    if (c.needle == nullptr) {
      EXPECT_TRUE(st.ok()) << c.extra << ": " << st;
    } else {
      EXPECT_THAT(std::string(st.message()), HasSubstr(c.needle)) << c.extra << ": " << st;
    }
  }
}

TEST(PeftDirTest, WriteThenReadRoundTrip) {
  peft::LoraConfig config;
  config.r = 2;
  config.lora_alpha = 4;
  config.rank_pattern = {{"v_proj", 1}};
  config.target_modules = {"q_proj", "v_proj"};
  config.base_model_name_or_path = "tiny";
  Tensors t;
  t.Add(peft::PeftTensorNameFor("model.layers.0.self_attn.q_proj", peft::LoraSide::kA, false),
        {2, 8});
  t.Add(peft::PeftTensorNameFor("model.layers.0.self_attn.q_proj", peft::LoraSide::kB, false),
        {8, 2}, 100);
  t.Add(peft::PeftTensorNameFor("model.layers.0.self_attn.v_proj", peft::LoraSide::kA, false),
        {1, 8}, 200);
  t.Add(peft::PeftTensorNameFor("model.layers.0.self_attn.v_proj", peft::LoraSide::kB, false),
        {4, 1}, 300);
  testing::TempDir dir;
  std::string out = dir.file("adapter");
  ASSERT_TRUE(peft::WritePeftDir(out, config, t.views).ok());

  auto back = peft::ReadPeftDir(out);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->config.r, 2);
  EXPECT_EQ(back->config.rank_pattern, config.rank_pattern);
  EXPECT_EQ(back->config.target_modules, config.target_modules);
  EXPECT_EQ(back->config.base_model_name_or_path, "tiny");
  EXPECT_EQ(back->tensors.metadata().at("format"), "pt");
  ASSERT_EQ(back->tensors.size(), 4u);
  for (const TensorView& v : t.views) {
    const TensorView* got = back->tensors.Find(v.name);
    ASSERT_NE(got, nullptr);
    EXPECT_EQ(got->shape, v.shape);
    EXPECT_EQ(std::memcmp(got->data, v.data, v.nbytes), 0);
  }
  EXPECT_DOUBLE_EQ(back->config.ScaleFor("model.layers.0.self_attn.v_proj"), 4.0);

  // Re-exporting what was read re-creates both files byte for byte.
  std::string again = dir.file("again");
  ASSERT_TRUE(peft::WritePeftDir(again, back->config, back->tensors.tensors()).ok());
  for (const char* f : {peft::kConfigFile, peft::kWeightsFile}) {
    EXPECT_EQ(*ReadFileToString(out + "/" + f), *ReadFileToString(again + "/" + f)) << f;
  }
}

TEST(PeftDirTest, RawConfigKeptVerbatimUnlessFieldsChange) {
  const std::string raw =
      "{\n  \"alpha_pattern\": {},\n  \"lora_alpha\": 16,\n  \"lora_dropout\": 0.05,\n"
      "  \"peft_type\": \"LORA\",\n  \"r\": 8,\n  \"rank_pattern\": {},\n"
      "  \"target_modules\": [\"q_proj\"],\n  \"custom_key\": [1, 2]\n}";
  auto c = peft::ParseLoraConfig(raw);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(*c->ToJson(), raw);
  c->lora_alpha = 32;
  auto changed = c->ToJson();
  ASSERT_TRUE(changed.ok());
  EXPECT_THAT(*changed, HasSubstr("\"lora_alpha\": 32"));
  EXPECT_THAT(*changed, HasSubstr("\"custom_key\""));
  EXPECT_THAT(*changed, HasSubstr("\"lora_dropout\": 0.05"));
  auto reparsed = peft::ParseLoraConfig(*changed);
  ASSERT_TRUE(reparsed.ok());
  EXPECT_EQ(reparsed->lora_alpha, 32);
}

TEST(PeftDirTest, RejectsInconsistentTensors) {
  peft::LoraConfig config;
  config.r = 2;
  const std::string q = "model.layers.0.self_attn.q_proj";
  auto check = [&](const Tensors& t, const std::string& needle) {
    absl::Status st = peft::ValidateLoraTensors(config, t.views);
    EXPECT_FALSE(st.ok()) << needle;
    EXPECT_THAT(std::string(st.message()), HasSubstr(needle));
    testing::TempDir dir;
    EXPECT_FALSE(peft::WritePeftDir(dir.file("x"), config, t.views).ok());
    EXPECT_FALSE(std::filesystem::exists(dir.file("x")));  // nothing written
  };
  {
    Tensors t;
    t.Add(peft::PeftTensorNameFor(q, peft::LoraSide::kA, false), {2, 8});
    check(t, "has only a LoRA A weight");
  }
  {
    Tensors t;
    t.Add(peft::PeftTensorNameFor(q, peft::LoraSide::kA, false), {2, 8});
    t.Add(peft::PeftTensorNameFor(q, peft::LoraSide::kB, false), {8, 3});
    check(t, "disagree on the rank");
  }
  {
    Tensors t;
    t.Add(peft::PeftTensorNameFor(q, peft::LoraSide::kA, false), {4, 8});
    t.Add(peft::PeftTensorNameFor(q, peft::LoraSide::kB, false), {8, 4});
    check(t, "rank 4 but the config gives it r = 2");
  }
  {
    Tensors t;
    t.Add(peft::PeftTensorNameFor(q, peft::LoraSide::kA, false), {2, 8, 1});
    t.Add(peft::PeftTensorNameFor(q, peft::LoraSide::kB, false), {8, 2});
    check(t, "only 2-D");
  }
  {
    Tensors t;
    t.Add(peft::PeftTensorNameFor(q, peft::LoraSide::kA, false), {2, 8});
    t.Add(peft::PeftTensorNameFor(q, peft::LoraSide::kB, false), {8, 2});
    t.Add("base_model.model.model.layers.0.self_attn.q_proj.lora_magnitude_vector", {8});
    check(t, "DoRA");
  }
}

TEST(PeftDirTest, ReadErrorsNameTheProblem) {
  testing::TempDir dir;
  auto r = peft::ReadPeftDir(dir.path());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("adapter_config.json"));

  ASSERT_TRUE(WriteFileAtomic(dir.file("adapter_config.json"), R"({"r":2,"bias":7})").ok());
  r = peft::ReadPeftDir(dir.path());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("bias"));

  ASSERT_TRUE(WriteFileAtomic(dir.file("adapter_config.json"), R"({"r":2})").ok());
  ASSERT_TRUE(WriteFileAtomic(dir.file("adapter_model.bin"), "pickle").ok());
  r = peft::ReadPeftDir(dir.path());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("adapter_model.bin"));

  ASSERT_TRUE(WriteFileAtomic(dir.file("adapter_model.safetensors"), "garbage!!").ok());
  r = peft::ReadPeftDir(dir.path());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("adapter_model.safetensors"));
}

}  // namespace
}  // namespace loradb
