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

TEST(PeftConfigTest, RefusesUnsupportedFeaturesByName) {
  struct Case {
    const char* json;
    absl::StatusCode code;
    const char* needle;
  };
  const Case cases[] = {
      {R"({"r":4,"use_dora":true})", absl::StatusCode::kUnimplemented, "use_dora"},
      {R"({"r":4,"modules_to_save":["score"]})", absl::StatusCode::kUnimplemented,
       "modules_to_save"},
      {R"({"r":4,"bias":"all"})", absl::StatusCode::kUnimplemented, "bias"},
      {R"({"r":4,"bias":"lora_only"})", absl::StatusCode::kUnimplemented, "bias"},
      {R"({"r":4,"fan_in_fan_out":true})", absl::StatusCode::kUnimplemented, "fan_in_fan_out"},
      {R"({"r":4,"lora_bias":true})", absl::StatusCode::kUnimplemented, "lora_bias"},
      {R"({"r":4,"layer_replication":[[0,2]]})", absl::StatusCode::kUnimplemented,
       "layer_replication"},
      {R"({"r":4,"trainable_token_indices":[1,2]})", absl::StatusCode::kUnimplemented,
       "trainable_token_indices"},
      {R"({"r":4,"target_parameters":["mlp.experts.gate_up_proj"]})",
       absl::StatusCode::kUnimplemented, "target_parameters"},
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
  // Disabled features are fine.
  EXPECT_TRUE(peft::ParseLoraConfig(R"({"r":4,"use_dora":false,"modules_to_save":[],"bias":"none",)"
                                    R"("layer_replication":null,"fan_in_fan_out":false})")
                  .ok());
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

  ASSERT_TRUE(WriteFileAtomic(dir.file("adapter_config.json"), R"({"r":2,"use_dora":true})").ok());
  r = peft::ReadPeftDir(dir.path());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnimplemented);

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
