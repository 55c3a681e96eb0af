// PEFT adapter directories -> LoraAdapter: scales from the config, DoRA magnitudes, embedding
// LoRA and modules_to_save weights, errors for modules the base does not have and refusals
// naming the PEFT features the model does not apply.
#include "compute/model/peft_adapter.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "storage/formats/peft.h"
#include "tests/test_paths.h"
#include "tests/test_util.h"

namespace loradb::model {
namespace {

using ::loradb::testing::TempDir;

ModelConfig Dense() {
  absl::StatusOr<ModelConfig> c =
      ReadModelConfig(std::string(LORADB_SOURCE_DIR) + "/compute/configs/tiny-dense.json");
  EXPECT_TRUE(c.ok()) << c.status();
  return *c;
}

TensorView View(const std::string& name, const at::Tensor& t) {
  return TensorView{name, DType::kF32, t.sizes().vec(), static_cast<const std::byte*>(t.data_ptr()),
                    t.nbytes()};
}

absl::Status WriteAdapter(const std::string& dir, const std::string& config_json,
                          const std::vector<std::pair<std::string, at::Tensor>>& tensors) {
  absl::StatusOr<peft::LoraConfig> cfg = peft::ParseLoraConfig(config_json);
  if (!cfg.ok()) return cfg.status();
  std::vector<TensorView> views;
  for (const auto& [name, t] : tensors) views.push_back(View(name, t));
  return peft::WritePeftDir(dir, *cfg, views);
}

absl::StatusOr<LoraAdapter> Load(const ModelConfig& c, const std::string& dir) {
  absl::StatusOr<peft::PeftAdapter> p = peft::ReadPeftDir(dir);
  if (!p.ok()) return p.status();
  return LoraAdapterFromPeft(c, *p, at::kFloat);
}

TEST(PeftAdapterTest, ScalesComeFromTheConfig) {
  const ModelConfig c = Dense();
  const int64_t h = c.hidden_size, q = c.num_attention_heads * c.head_dim;
  const at::Tensor qa = at::randn({2, h}), qb = at::randn({q, 2});
  const at::Tensor da = at::randn({4, c.intermediate_size}), db = at::randn({h, 4});
  TempDir dir;
  ASSERT_TRUE(WriteAdapter(dir.path(),
                           R"({"peft_type":"LORA","r":4,"lora_alpha":8,"use_rslora":true,)"
                           R"("rank_pattern":{"q_proj":2},"alpha_pattern":{"q_proj":3},)"
                           R"("target_modules":["q_proj","down_proj"]})",
                           {{"base_model.model.model.layers.1.self_attn.q_proj.lora_A.weight", qa},
                            {"base_model.model.model.layers.1.self_attn.q_proj.lora_B.weight", qb},
                            {"base_model.model.model.layers.2.mlp.down_proj.lora_A.weight", da},
                            {"base_model.model.model.layers.2.mlp.down_proj.lora_B.weight", db}})
                  .ok());
  absl::StatusOr<LoraAdapter> a = Load(c, dir.path());
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->num_modules(), 2u);
  EXPECT_EQ(a->max_rank(), 4);
  const LoraFactors* fq = a->Find(1, LoraTarget::kQ);
  const LoraFactors* fd = a->Find(2, LoraTarget::kDown);
  ASSERT_NE(fq, nullptr);
  ASSERT_NE(fd, nullptr);
  EXPECT_EQ(a->Find(0, LoraTarget::kQ), nullptr);
  EXPECT_DOUBLE_EQ(fq->scale, 3.0 / std::sqrt(2.0));  // rsLoRA with the patterns' r and alpha
  EXPECT_DOUBLE_EQ(fd->scale, 8.0 / 2.0);             // alpha / sqrt(r) = 8 / 2
  EXPECT_TRUE(at::equal(fq->a, qa));
  EXPECT_TRUE(at::equal(fd->b, db));
}

TEST(PeftAdapterTest, ModulesTheBaseLacksAreRejected) {
  const ModelConfig c = Dense();
  const int64_t h = c.hidden_size, q = c.num_attention_heads * c.head_dim;
  TempDir dir;
  ASSERT_TRUE(
      WriteAdapter(
          dir.path(), R"({"peft_type":"LORA","r":2,"lora_alpha":2})",
          {{"base_model.model.model.layers.7.self_attn.q_proj.lora_A.weight", at::zeros({2, h})},
           {"base_model.model.model.layers.7.self_attn.q_proj.lora_B.weight", at::zeros({q, 2})}})
          .ok());
  absl::StatusOr<LoraAdapter> a = Load(c, dir.path());
  EXPECT_EQ(a.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(a.status().message().find("layers.7.self_attn.q_proj"), std::string::npos);

  TempDir wrong_shape;
  ASSERT_TRUE(WriteAdapter(wrong_shape.path(), R"({"peft_type":"LORA","r":2,"lora_alpha":2})",
                           {{"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight",
                             at::zeros({2, h + 3})},
                            {"base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight",
                             at::zeros({q, 2})}})
                  .ok());
  EXPECT_EQ(Load(c, wrong_shape.path()).status().code(), absl::StatusCode::kInvalidArgument);

  TempDir embed;
  ASSERT_TRUE(
      WriteAdapter(
          embed.path(), R"({"peft_type":"LORA","r":2,"lora_alpha":2})",
          {{"base_model.model.model.embed_tokens.lora_embedding_A", at::zeros({2, c.vocab_size})},
           {"base_model.model.model.embed_tokens.lora_embedding_B", at::zeros({h, 2})}})
          .ok());
  EXPECT_EQ(Load(c, embed.file("missing")).status().code(), absl::StatusCode::kNotFound);
}

TEST(PeftAdapterTest, DoraEmbeddingLoraAndModulesToSaveAreRead) {
  const ModelConfig c = Dense();
  const int64_t h = c.hidden_size, q = c.num_attention_heads * c.head_dim;
  const at::Tensor mag = at::rand({q}) + 0.5, head = at::randn({c.vocab_size, h});
  TempDir dir;
  ASSERT_TRUE(
      WriteAdapter(
          dir.path(),
          R"({"peft_type":"LORA","r":2,"lora_alpha":4,"use_dora":true,)"
          R"("target_modules":["q_proj","embed_tokens"],"modules_to_save":["lm_head"]})",
          {{"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight", at::randn({2, h})},
           {"base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight", at::randn({q, 2})},
           {"base_model.model.model.layers.0.self_attn.q_proj.lora_magnitude_vector", mag},
           {"base_model.model.model.embed_tokens.lora_embedding_A", at::randn({2, c.vocab_size})},
           {"base_model.model.model.embed_tokens.lora_embedding_B", at::randn({h, 2})},
           {"base_model.model.lm_head.weight", head}})
          .ok());
  absl::StatusOr<LoraAdapter> a = Load(c, dir.path());
  ASSERT_TRUE(a.ok()) << a.status();
  const LoraFactors* fq = a->Find(0, LoraTarget::kQ);
  ASSERT_NE(fq, nullptr);
  EXPECT_TRUE(at::equal(fq->magnitude, mag));
  EXPECT_DOUBLE_EQ(fq->scale, 2.0);
  const LoraFactors* fe = a->FindWhole(LoraWholeModule::kEmbedTokens);
  ASSERT_NE(fe, nullptr);
  EXPECT_EQ(fe->a.size(1), c.vocab_size);
  EXPECT_TRUE(at::equal(a->ReplacedWeight(LoraWholeModule::kLmHead), head));
  EXPECT_FALSE(a->prepared());  // DoRA scales come from the base's weights
}

TEST(PeftAdapterTest, UnappliedFeaturesAreRefusedByName) {
  const ModelConfig c = Dense();
  const int64_t h = c.hidden_size, q = c.num_attention_heads * c.head_dim;
  TempDir dir;
  ASSERT_TRUE(
      WriteAdapter(
          dir.path(),
          R"({"peft_type":"LORA","r":2,"lora_alpha":2,"lora_bias":true,"target_modules":["q_proj"]})",
          {{"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight", at::zeros({2, h})},
           {"base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight", at::zeros({q, 2})},
           {"base_model.model.model.layers.0.self_attn.q_proj.lora_B.bias", at::zeros({q})}})
          .ok());
  absl::StatusOr<LoraAdapter> a = Load(c, dir.path());
  EXPECT_EQ(a.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(a.status().message().find("lora_bias"), std::string::npos) << a.status();
}

}  // namespace
}  // namespace loradb::model
