#include "storage/formats/model_config.h"

#include <gtest/gtest.h>

namespace loradb {
namespace {

constexpr char kDense[] = R"({
  "model_type": "qwen3", "vocab_size": 151936, "hidden_size": 2560, "intermediate_size": 9728,
  "num_hidden_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
  "rope_theta": 1000000, "rms_norm_eps": 1e-6, "tie_word_embeddings": true})";

constexpr char kMoe[] = R"({
  "model_type": "qwen3_moe", "vocab_size": 151936, "hidden_size": 2048, "intermediate_size": 6144,
  "num_hidden_layers": 48, "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128,
  "num_experts": 128, "num_experts_per_tok": 8, "moe_intermediate_size": 768,
  "decoder_sparse_step": 1, "norm_topk_prob": true, "mlp_only_layers": []})";

TEST(ModelConfigTest, Qwen3_4BModules) {
  auto c = ParseModelConfigJson(kDense);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE(c->is_moe());
  auto mods = c->LoraModules();
  ASSERT_EQ(mods.size(), 36u * 7 + 2);
  EXPECT_EQ(mods[0], (ModuleShape{"layers.0.self_attn.q_proj", 2560, 4096}));
  EXPECT_EQ(mods[1], (ModuleShape{"layers.0.self_attn.k_proj", 2560, 1024}));
  EXPECT_EQ(mods[3], (ModuleShape{"layers.0.self_attn.o_proj", 4096, 2560}));
  EXPECT_EQ(mods[6], (ModuleShape{"layers.0.mlp.down_proj", 9728, 2560}));
}

TEST(ModelConfigTest, Qwen3MoeModulesAndRoundTrip) {
  auto c = ParseModelConfigJson(kMoe);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->IsMoeLayer(0));
  auto mods = c->LoraModules();
  // Per layer: q/k/v/o + router + 128 experts x 3.
  EXPECT_EQ(mods.size(), 48u * (4 + 1 + 128 * 3) + 2);
  EXPECT_EQ(mods[5], (ModuleShape{"layers.0.mlp.experts.0.gate_proj", 2048, 768}));
  auto again = ParseModelConfigJson(c->ToJson());
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->LoraModules(), mods);
}

TEST(ModelConfigTest, MlpOnlyLayersAndSparseStep) {
  std::string j = R"({"model_type":"qwen3_moe","vocab_size":10,"hidden_size":8,
    "intermediate_size":16,"num_hidden_layers":4,"num_attention_heads":2,"num_key_value_heads":1,
    "num_experts":4,"num_experts_per_tok":2,"moe_intermediate_size":4,"decoder_sparse_step":2,
    "mlp_only_layers":[3]})";
  auto c = ParseModelConfigJson(j);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->head_dim, 4);
  EXPECT_FALSE(c->IsMoeLayer(0));
  EXPECT_TRUE(c->IsMoeLayer(1));
  EXPECT_FALSE(c->IsMoeLayer(2));
  EXPECT_FALSE(c->IsMoeLayer(3));
}

TEST(ModelConfigTest, RejectsBadConfigs) {
  EXPECT_FALSE(ParseModelConfigJson("not json").ok());
  EXPECT_FALSE(ParseModelConfigJson("[]").ok());
  auto llama = ParseModelConfigJson(R"({"model_type":"llama","vocab_size":1})");
  EXPECT_NE(llama.status().message().find("Qwen3 family"), absl::string_view::npos);
  auto missing = ParseModelConfigJson(R"({"model_type":"qwen3","vocab_size":10})");
  EXPECT_NE(missing.status().message().find("hidden_size"), absl::string_view::npos);
  auto neg = ParseModelConfigJson(R"({"model_type":"qwen3","vocab_size":10,"hidden_size":-8,
    "intermediate_size":16,"num_hidden_layers":1,"num_attention_heads":2})");
  EXPECT_FALSE(neg.ok());
  auto gqa = ParseModelConfigJson(R"({"model_type":"qwen3","vocab_size":10,"hidden_size":8,
    "intermediate_size":16,"num_hidden_layers":1,"num_attention_heads":3,"num_key_value_heads":2})");
  EXPECT_FALSE(gqa.ok());
}

}  // namespace
}  // namespace loradb
