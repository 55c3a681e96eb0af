#include "storage/formats/model_config.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_split.h"

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

// The same tiny qwen3 / qwen3_moe configs as transformers 4 and transformers 5 save them.
constexpr char kDenseV4[] = R"({
  "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 64,
  "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2, "num_attention_heads": 4,
  "num_key_value_heads": 2, "head_dim": 16, "hidden_act": "silu", "rms_norm_eps": 1e-06,
  "rope_theta": 500000.0, "rope_scaling": null, "use_sliding_window": false,
  "sliding_window": null, "max_window_layers": 28, "tie_word_embeddings": true,
  "attention_bias": true, "attention_dropout": 0.0, "torch_dtype": "float32",
  "max_position_embeddings": 128, "transformers_version": "4.57.1"})";
constexpr char kDenseV5[] = R"({
  "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 64,
  "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2, "num_attention_heads": 4,
  "num_key_value_heads": 2, "head_dim": 16, "hidden_act": "silu", "rms_norm_eps": 1e-06,
  "rope_parameters": {"rope_theta": 500000.0, "rope_type": "default"},
  "layer_types": ["full_attention", "full_attention"], "use_sliding_window": false,
  "sliding_window": null, "max_window_layers": 28, "tie_word_embeddings": true,
  "attention_bias": true, "attention_dropout": 0.0, "dtype": "float32",
  "max_position_embeddings": 128, "transformers_version": "5.24.0"})";
constexpr char kMoeV4[] = R"({
  "model_type": "qwen3_moe", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 48,
  "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2,
  "rope_theta": 250000.0, "rope_scaling": null, "num_experts": 4, "num_experts_per_tok": 2,
  "moe_intermediate_size": 16, "decoder_sparse_step": 1, "norm_topk_prob": true,
  "mlp_only_layers": [1], "output_router_logits": false, "router_aux_loss_coef": 0.001,
  "torch_dtype": "float32"})";
constexpr char kMoeV5[] = R"({
  "model_type": "qwen3_moe", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 48,
  "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2,
  "rope_parameters": {"rope_theta": 250000.0, "rope_type": "default"}, "num_local_experts": 4,
  "num_experts_per_tok": 2, "moe_intermediate_size": 16, "decoder_sparse_step": 1,
  "norm_topk_prob": true, "mlp_only_layers": [1], "output_router_logits": false,
  "router_aux_loss_coef": 0.001, "sliding_window": null, "use_sliding_window": false,
  "dtype": "float32"})";

// `base` (a JSON object) with the top-level keys of `patch` set (a null is set, not removed).
std::string Patched(const char* base, const char* patch) {
  nlohmann::json j = nlohmann::json::parse(base);
  j.update(nlohmann::json::parse(patch));
  return j.dump();
}

void ExpectSameConfig(const ModelConfig& a, const ModelConfig& b) {
  EXPECT_EQ(a.ToJson(), b.ToJson());
  EXPECT_EQ(a.LoraModules(), b.LoraModules());
}

TEST(ModelConfigTest, TransformersFourAndFiveLayoutsReadTheSame) {
  auto d4 = ParseModelConfigJson(kDenseV4), d5 = ParseModelConfigJson(kDenseV5);
  ASSERT_TRUE(d4.ok()) << d4.status();
  ASSERT_TRUE(d5.ok()) << d5.status();
  ExpectSameConfig(*d4, *d5);
  EXPECT_EQ(d5->rope_theta, 500000.0);
  EXPECT_EQ(d5->head_dim, 16);
  EXPECT_TRUE(d5->tie_word_embeddings);
  EXPECT_TRUE(d5->attention_bias);
  EXPECT_EQ(d5->torch_dtype, "float32");

  auto m4 = ParseModelConfigJson(kMoeV4), m5 = ParseModelConfigJson(kMoeV5);
  ASSERT_TRUE(m4.ok()) << m4.status();
  ASSERT_TRUE(m5.ok()) << m5.status();
  ExpectSameConfig(*m4, *m5);
  EXPECT_EQ(m5->num_experts, 4);
  EXPECT_EQ(m5->rope_theta, 250000.0);
  EXPECT_TRUE(m5->norm_topk_prob);
  EXPECT_FALSE(m5->IsMoeLayer(1));
  // Both spellings of the expert count, agreeing, read too.
  auto both = ParseModelConfigJson(Patched(kMoeV5, R"({"num_experts": 4})"));
  ASSERT_TRUE(both.ok()) << both.status();
  ExpectSameConfig(*both, *m5);
  // ToJson round-trips.
  auto again = ParseModelConfigJson(m5->ToJson());
  ASSERT_TRUE(again.ok()) << again.status();
  ExpectSameConfig(*again, *m5);
}

TEST(ModelConfigTest, DefaultsAreTransformersDefaultsForTheModelType) {
  // qwen3: head_dim 128, num_key_value_heads 32 (null: num_attention_heads), rope_theta 10000,
  // untied, no attention bias.
  auto d = ParseModelConfigJson(R"({"model_type": "qwen3", "vocab_size": 64, "hidden_size": 32,
    "intermediate_size": 48, "num_hidden_layers": 1, "num_attention_heads": 32})");
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->head_dim, 128);
  EXPECT_EQ(d->num_key_value_heads, 32);
  EXPECT_EQ(d->rope_theta, 10000.0);
  EXPECT_EQ(d->max_position_embeddings, 32768);
  EXPECT_FALSE(d->tie_word_embeddings);
  EXPECT_FALSE(d->attention_bias);
  auto null_kv = ParseModelConfigJson(Patched(kDenseV5, R"({"num_key_value_heads": null})"));
  ASSERT_TRUE(null_kv.ok()) << null_kv.status();
  EXPECT_EQ(null_kv->num_key_value_heads, 4);
  auto no_hd = ParseModelConfigJson(Patched(kDenseV5, R"({"head_dim": null})"));
  EXPECT_FALSE(no_hd.ok());  // transformers refuses a null head_dim too
  // qwen3_moe: no head_dim field (hidden_size // num_attention_heads), num_key_value_heads 4,
  // norm_topk_prob false, decoder_sparse_step 1.
  auto m = ParseModelConfigJson(R"({"model_type": "qwen3_moe", "vocab_size": 64,
    "hidden_size": 48, "intermediate_size": 48, "num_hidden_layers": 1,
    "num_attention_heads": 4, "num_local_experts": 4, "num_experts_per_tok": 1,
    "moe_intermediate_size": 8})");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->head_dim, 12);
  EXPECT_EQ(m->num_key_value_heads, 4);
  EXPECT_FALSE(m->norm_topk_prob);
  EXPECT_EQ(m->decoder_sparse_step, 1);
  EXPECT_EQ(m->rope_theta, 10000.0);
  // rope_parameters' theta wins over a top-level one (transformers 5's order).
  auto theta = ParseModelConfigJson(Patched(kDenseV5, R"({"rope_theta": 7.0})"));
  ASSERT_TRUE(theta.ok()) << theta.status();
  EXPECT_EQ(theta->rope_theta, 500000.0);
  // A transformers 4 rope_scaling of the default type is plain RoPE.
  auto plain = ParseModelConfigJson(
      Patched(kDenseV4, R"({"rope_scaling": {"type": "default", "rope_theta": 3.0}})"));
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ(plain->rope_theta, 3.0);
}

// Each setting loradb does not compute is refused, and the error names the key and the value.
TEST(ModelConfigTest, RefusesWhatItDoesNotComputeNamingKeyAndValue) {
  struct Case {
    const char* base;
    const char* patch;
    std::string want;  // substrings of the message, '|'-separated
  };
  const Case cases[] = {
      {kDenseV5, R"({"rope_parameters": {"rope_type": "yarn", "factor": 4.0}})",
       "rope_parameters.rope_type|\"yarn\""},
      {kDenseV5, R"({"rope_parameters": {"rope_type": "nonsense"}})",
       "rope_parameters.rope_type|\"nonsense\""},
      {kDenseV4, R"({"rope_scaling": {"type": "linear", "factor": 2.0}})",
       "rope_scaling.type|\"linear\""},
      {kDenseV4, R"({"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}})",
       "rope_scaling.rope_type|\"dynamic\""},
      {kDenseV5, R"({"rope_parameters": {"rope_type": "default", "factor": 2.0}})",
       "rope_parameters.factor|2.0"},
      {kDenseV5, R"({"partial_rotary_factor": 0.5})", "partial_rotary_factor|0.5"},
      {kDenseV5, R"({"hidden_act": "gelu"})", "hidden_act|\"gelu\""},
      {kDenseV5, R"({"layer_types": ["full_attention", "sliding_attention"]})",
       "layer_types[1]|\"sliding_attention\""},
      {kDenseV4, R"({"use_sliding_window": true, "sliding_window": 8, "max_window_layers": 1})",
       "use_sliding_window|sliding_window 8|max_window_layers 1"},
      {kMoeV5, R"({"use_sliding_window": true, "sliding_window": 8})",
       "use_sliding_window|sliding_window 8"},
      {kDenseV5, R"({"quantization_config": {"quant_method": "fp8"}})", "quantization_config|fp8"},
      {kDenseV5, R"({"attention_dropout": 0.1})", "attention_dropout|0.1"},
      {kMoeV5, R"({"output_router_logits": true})", "output_router_logits|true"},
      {kMoeV5, R"({"num_experts": 8})", "num_local_experts|num_experts|8"},
      {kDenseV5, R"({"head_dim": null})", "head_dim|null"},
      {kMoeV5, R"({"num_key_value_heads": null})", "num_key_value_heads|null"},
      {kDenseV5, R"({"tie_word_embeddings": "yes"})", "tie_word_embeddings|\"yes\""},
      {kDenseV5, R"({"head_dim": 15})", "head_dim"},
  };
  for (const Case& c : cases) {
    const std::string text = Patched(c.base, c.patch);
    auto r = ParseModelConfigJson(text);
    ASSERT_FALSE(r.ok()) << c.patch;
    EXPECT_TRUE(absl::IsInvalidArgument(r.status())) << r.status();
    for (absl::string_view want : absl::StrSplit(c.want, '|')) {
      EXPECT_NE(r.status().message().find(want), absl::string_view::npos)
          << c.patch << " -> " << r.status() << " (want " << want << ")";
    }
  }
  // A sliding window that no layer uses changes nothing and is accepted: use_sliding_window
  // with every layer below max_window_layers, or with explicit full-attention layer types.
  EXPECT_TRUE(ParseModelConfigJson(Patched(kDenseV4, R"({"use_sliding_window": true,
    "sliding_window": 8, "max_window_layers": 2})"))
                  .ok());
  EXPECT_TRUE(ParseModelConfigJson(Patched(kDenseV5, R"({"use_sliding_window": true,
    "sliding_window": 8, "max_window_layers": 0})"))
                  .ok());
  EXPECT_TRUE(ParseModelConfigJson(Patched(kMoeV5, R"({"use_sliding_window": false,
    "sliding_window": 8})"))
                  .ok());
}

// The request body of a hostile `POST /v1/bases`: every size huge. Refused before anything is
// sized by it, naming a field.
TEST(ModelConfigTest, RefusesSizesAboveTheLimits) {
  auto huge = ParseModelConfigJson(
      R"({"model_type":"qwen3","hidden_size":1099511627776,"num_hidden_layers":2147483647,)"
      R"("num_attention_heads":1,"num_key_value_heads":1,"head_dim":1099511627776,)"
      R"("intermediate_size":1099511627776,"vocab_size":1099511627776})");
  ASSERT_FALSE(huge.ok());
  EXPECT_TRUE(absl::IsInvalidArgument(huge.status()));
  EXPECT_NE(huge.status().message().find("outside loradb's bounds"), absl::string_view::npos)
      << huge.status();
  const std::pair<const char*, const char*> fields[] = {
      {R"({"num_hidden_layers": 1025})", "num_hidden_layers"},
      {R"({"hidden_size": 131073})", "hidden_size"},
      {R"({"vocab_size": 16777217})", "vocab_size"},
      {R"({"head_dim": 2050})", "head_dim"},
      {R"({"intermediate_size": 1048577})", "intermediate_size"},
      {R"({"num_attention_heads": 2048, "num_key_value_heads": 2048})", "num_attention_heads"},
      {R"({"num_key_value_heads": 8})", "num_key_value_heads"},
      {R"({"max_position_embeddings": 16777217})", "max_position_embeddings"},
      {R"({"vocab_size": 9223372036854775807})", "vocab_size"},
      {R"({"vocab_size": 18446744073709551615})", "vocab_size"},
      {R"({"vocab_size": -3})", "vocab_size"},
      // Each size in bounds, their product not: 2^24 x 2^17 embedding weights.
      {R"({"vocab_size": 16777216, "hidden_size": 131072})", "weights"},
      // 1024 layers x 1024 kv heads x 2048 head_dim K/V elements per token.
      {R"({"num_hidden_layers": 1024, "num_attention_heads": 1024, "num_key_value_heads": 1024,
         "head_dim": 2048})",
       "per token"},
  };
  for (const auto& [patch, want] : fields) {
    auto r = ParseModelConfigJson(Patched(kDenseV5, patch));
    ASSERT_FALSE(r.ok()) << patch;
    EXPECT_NE(r.status().message().find(want), absl::string_view::npos) << r.status();
  }
  for (const char* patch : {R"({"num_local_experts": 4097})", R"({"num_local_experts": 0})"}) {
    auto experts = ParseModelConfigJson(Patched(kMoeV5, patch));
    EXPECT_NE(experts.status().message().find("num_experts"), absl::string_view::npos)
        << experts.status();
  }
  // 1024 layers x 4096 experts x 3 projections: each size in bounds, the module table not.
  auto table = ParseModelConfigJson(
      Patched(kMoeV5, R"({"num_local_experts": 4096, "num_hidden_layers": 1024})"));
  EXPECT_NE(table.status().message().find("modules"), absl::string_view::npos) << table.status();
  // The limits admit a real large MoE (Qwen3-235B-A22B).
  auto big = ParseModelConfigJson(R"({"model_type": "qwen3_moe", "vocab_size": 151936,
    "hidden_size": 4096, "intermediate_size": 12288, "num_hidden_layers": 94,
    "num_attention_heads": 64, "num_key_value_heads": 4, "head_dim": 128,
    "num_experts": 128, "num_experts_per_tok": 8, "moe_intermediate_size": 1536,
    "max_position_embeddings": 40960, "rope_theta": 1000000.0})");
  ASSERT_TRUE(big.ok()) << big.status();
  EXPECT_EQ(big->LoraModules().size(), 94u * (5 + 3 * 128) + 2);
}

TEST(ModelConfigTest, ValidateChecksConfigsBuiltInCode) {
  auto c = ParseModelConfigJson(kDenseV5);
  ASSERT_TRUE(c.ok());
  EXPECT_TRUE(c->Validate().ok());
  ModelConfig bad = *c;
  bad.num_hidden_layers = int64_t{1} << 40;
  EXPECT_TRUE(absl::IsInvalidArgument(bad.Validate()));
  bad = *c;
  bad.num_key_value_heads = 3;
  EXPECT_TRUE(absl::IsInvalidArgument(bad.Validate()));
}

TEST(ModelConfigTest, ModuleTableLimits) {
  EXPECT_TRUE(CheckModuleTable({{"a", 16, 32}, {"b", 1 << 24, 4096}}).ok());
  const std::vector<ModuleShape> bad[] = {
      {{"a", int64_t{1} << 62, 16}},
      {{"a", 16, 0}},
      {{"a", -1, 16}},
      {{"", 16, 16}},
      {{std::string(2000, 'x'), 16, 16}},
      {{"a", 1 << 24, 1 << 24}},  // one module of 2^48 weights
  };
  for (const auto& table : bad) {
    absl::Status s = CheckModuleTable(table);
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << table[0].in << " " << s;
  }
  std::vector<ModuleShape> many(ModelLimits::kModules + 1, ModuleShape{"m", 1, 1});
  EXPECT_TRUE(absl::IsInvalidArgument(CheckModuleTable(many)));
  // 2^10 modules of 2^34 weights: each in bounds, 2^44 in all is not.
  std::vector<ModuleShape> heavy(1024, ModuleShape{"m", 1 << 17, 1 << 17});
  EXPECT_TRUE(absl::IsInvalidArgument(CheckModuleTable(heavy)));
}

TEST(ModelConfigTest, DeepJsonIsRefusedBeforeParsing) {
  std::string deep = R"({"model_type":"qwen3","junk":)" + std::string(100000, '[') +
                     std::string(100000, ']') + "}";
  auto r = ParseModelConfigJson(deep);
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(absl::IsInvalidArgument(r.status()));
  EXPECT_NE(r.status().message().find("deeper than"), absl::string_view::npos) << r.status();
}

}  // namespace
}  // namespace loradb
