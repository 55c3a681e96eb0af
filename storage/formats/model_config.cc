#include "storage/formats/model_config.h"

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "storage/util/file_util.h"
#include "storage/util/status_macros.h"

namespace loradb {
namespace {

using nlohmann::json;

absl::StatusOr<int64_t> GetInt(const json& j, const char* key, bool required, int64_t dflt) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) {
    if (required)
      return absl::InvalidArgumentError(absl::StrCat("config.json: missing \"", key, "\""));
    return dflt;
  }
  if (!it->is_number_integer()) {
    return absl::InvalidArgumentError(
        absl::StrCat("config.json: \"", key, "\" must be an integer"));
  }
  return it->get<int64_t>();
}

absl::StatusOr<double> GetDouble(const json& j, const char* key, double dflt) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return dflt;
  if (!it->is_number()) {
    return absl::InvalidArgumentError(absl::StrCat("config.json: \"", key, "\" must be a number"));
  }
  return it->get<double>();
}

absl::StatusOr<bool> GetBool(const json& j, const char* key, bool dflt) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return dflt;
  if (!it->is_boolean()) {
    return absl::InvalidArgumentError(absl::StrCat("config.json: \"", key, "\" must be a boolean"));
  }
  return it->get<bool>();
}

absl::Status RequirePositive(int64_t v, const char* key) {
  if (v <= 0)
    return absl::InvalidArgumentError(absl::StrCat("config.json: \"", key, "\" must be > 0"));
  return absl::OkStatus();
}

}  // namespace

bool ModelConfig::IsMoeLayer(int64_t layer) const {
  if (num_experts <= 0) return false;
  if (std::find(mlp_only_layers.begin(), mlp_only_layers.end(), layer) != mlp_only_layers.end()) {
    return false;
  }
  return (layer + 1) % std::max<int64_t>(decoder_sparse_step, 1) == 0;
}

std::vector<ModuleShape> ModelConfig::LoraModules() const {
  std::vector<ModuleShape> m;
  const int64_t q_out = num_attention_heads * head_dim;
  const int64_t kv_out = num_key_value_heads * head_dim;
  for (int64_t l = 0; l < num_hidden_layers; ++l) {
    const std::string p = absl::StrCat("layers.", l, ".");
    m.push_back({p + "self_attn.q_proj", hidden_size, q_out});
    m.push_back({p + "self_attn.k_proj", hidden_size, kv_out});
    m.push_back({p + "self_attn.v_proj", hidden_size, kv_out});
    m.push_back({p + "self_attn.o_proj", q_out, hidden_size});
    if (IsMoeLayer(l)) {
      m.push_back({p + "mlp.gate", hidden_size, num_experts});
      for (int64_t e = 0; e < num_experts; ++e) {
        const std::string ep = absl::StrCat(p, "mlp.experts.", e, ".");
        m.push_back({ep + "gate_proj", hidden_size, moe_intermediate_size});
        m.push_back({ep + "up_proj", hidden_size, moe_intermediate_size});
        m.push_back({ep + "down_proj", moe_intermediate_size, hidden_size});
      }
    } else {
      m.push_back({p + "mlp.gate_proj", hidden_size, intermediate_size});
      m.push_back({p + "mlp.up_proj", hidden_size, intermediate_size});
      m.push_back({p + "mlp.down_proj", intermediate_size, hidden_size});
    }
  }
  // Embedding LoRA: lora_embedding_A is [r, vocab], lora_embedding_B is [hidden, r].
  m.push_back({"embed_tokens", vocab_size, hidden_size});
  m.push_back({"lm_head", hidden_size, vocab_size});
  return m;
}

std::string ModelConfig::ToJson() const {
  json j;
  j["architectures"] = json::array({is_moe() ? "Qwen3MoeForCausalLM" : "Qwen3ForCausalLM"});
  j["model_type"] = model_type;
  j["vocab_size"] = vocab_size;
  j["hidden_size"] = hidden_size;
  j["intermediate_size"] = intermediate_size;
  j["num_hidden_layers"] = num_hidden_layers;
  j["num_attention_heads"] = num_attention_heads;
  j["num_key_value_heads"] = num_key_value_heads;
  j["head_dim"] = head_dim;
  j["max_position_embeddings"] = max_position_embeddings;
  j["rms_norm_eps"] = rms_norm_eps;
  j["rope_theta"] = rope_theta;
  j["tie_word_embeddings"] = tie_word_embeddings;
  j["attention_bias"] = attention_bias;
  j["attention_dropout"] = 0.0;
  j["hidden_act"] = "silu";
  j["torch_dtype"] = torch_dtype;
  j["use_cache"] = true;
  if (is_moe()) {
    j["num_experts"] = num_experts;
    j["num_experts_per_tok"] = num_experts_per_tok;
    j["moe_intermediate_size"] = moe_intermediate_size;
    j["decoder_sparse_step"] = decoder_sparse_step;
    j["norm_topk_prob"] = norm_topk_prob;
    j["mlp_only_layers"] = mlp_only_layers;
    j["output_router_logits"] = false;
    j["router_aux_loss_coef"] = 0.0;
  }
  return j.dump(2);
}

absl::StatusOr<ModelConfig> ParseModelConfigJson(absl::string_view text) {
  json j = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError("config.json: not a JSON object");
  }
  ModelConfig c;
  auto mt = j.find("model_type");
  if (mt == j.end() || !mt->is_string()) {
    return absl::InvalidArgumentError("config.json: missing \"model_type\"");
  }
  c.model_type = mt->get<std::string>();
  if (c.model_type != "qwen3" && c.model_type != "qwen3_moe") {
    return absl::InvalidArgumentError(absl::StrCat(
        "config.json: model_type \"", c.model_type,
        "\" is not in the Qwen3 family (qwen3, qwen3_moe); register other architectures with an "
        "explicit module table"));
  }
  LORADB_ASSIGN_OR_RETURN(c.vocab_size, GetInt(j, "vocab_size", true, 0));
  LORADB_ASSIGN_OR_RETURN(c.hidden_size, GetInt(j, "hidden_size", true, 0));
  LORADB_ASSIGN_OR_RETURN(c.num_hidden_layers, GetInt(j, "num_hidden_layers", true, 0));
  LORADB_ASSIGN_OR_RETURN(c.num_attention_heads, GetInt(j, "num_attention_heads", true, 0));
  LORADB_ASSIGN_OR_RETURN(c.num_key_value_heads,
                          GetInt(j, "num_key_value_heads", false, c.num_attention_heads));
  LORADB_ASSIGN_OR_RETURN(
      c.head_dim, GetInt(j, "head_dim", false,
                         c.num_attention_heads > 0 ? c.hidden_size / c.num_attention_heads : 0));
  LORADB_ASSIGN_OR_RETURN(c.intermediate_size, GetInt(j, "intermediate_size", true, 0));
  LORADB_ASSIGN_OR_RETURN(c.max_position_embeddings,
                          GetInt(j, "max_position_embeddings", false, 32768));
  LORADB_ASSIGN_OR_RETURN(c.rms_norm_eps, GetDouble(j, "rms_norm_eps", 1e-6));
  LORADB_ASSIGN_OR_RETURN(c.rope_theta, GetDouble(j, "rope_theta", 1e6));
  LORADB_ASSIGN_OR_RETURN(c.tie_word_embeddings, GetBool(j, "tie_word_embeddings", false));
  LORADB_ASSIGN_OR_RETURN(c.attention_bias, GetBool(j, "attention_bias", false));
  if (auto it = j.find("torch_dtype"); it != j.end() && it->is_string()) {
    c.torch_dtype = it->get<std::string>();
  }
  if (c.model_type == "qwen3_moe") {
    LORADB_ASSIGN_OR_RETURN(c.num_experts, GetInt(j, "num_experts", true, 0));
    LORADB_ASSIGN_OR_RETURN(c.num_experts_per_tok, GetInt(j, "num_experts_per_tok", true, 0));
    LORADB_ASSIGN_OR_RETURN(c.moe_intermediate_size, GetInt(j, "moe_intermediate_size", true, 0));
    LORADB_ASSIGN_OR_RETURN(c.decoder_sparse_step, GetInt(j, "decoder_sparse_step", false, 1));
    LORADB_ASSIGN_OR_RETURN(c.norm_topk_prob, GetBool(j, "norm_topk_prob", false));
    if (auto it = j.find("mlp_only_layers"); it != j.end() && !it->is_null()) {
      if (!it->is_array()) {
        return absl::InvalidArgumentError("config.json: \"mlp_only_layers\" must be a list");
      }
      for (const auto& v : *it) {
        if (!v.is_number_integer()) {
          return absl::InvalidArgumentError("config.json: \"mlp_only_layers\" must hold integers");
        }
        c.mlp_only_layers.push_back(v.get<int64_t>());
      }
    }
    LORADB_RETURN_IF_ERROR(RequirePositive(c.num_experts, "num_experts"));
    LORADB_RETURN_IF_ERROR(RequirePositive(c.num_experts_per_tok, "num_experts_per_tok"));
    LORADB_RETURN_IF_ERROR(RequirePositive(c.moe_intermediate_size, "moe_intermediate_size"));
    LORADB_RETURN_IF_ERROR(RequirePositive(c.decoder_sparse_step, "decoder_sparse_step"));
    if (c.num_experts_per_tok > c.num_experts) {
      return absl::InvalidArgumentError("config.json: num_experts_per_tok > num_experts");
    }
  }
  LORADB_RETURN_IF_ERROR(RequirePositive(c.vocab_size, "vocab_size"));
  LORADB_RETURN_IF_ERROR(RequirePositive(c.hidden_size, "hidden_size"));
  LORADB_RETURN_IF_ERROR(RequirePositive(c.num_hidden_layers, "num_hidden_layers"));
  LORADB_RETURN_IF_ERROR(RequirePositive(c.num_attention_heads, "num_attention_heads"));
  LORADB_RETURN_IF_ERROR(RequirePositive(c.num_key_value_heads, "num_key_value_heads"));
  LORADB_RETURN_IF_ERROR(RequirePositive(c.head_dim, "head_dim"));
  LORADB_RETURN_IF_ERROR(RequirePositive(c.intermediate_size, "intermediate_size"));
  if (c.num_attention_heads % c.num_key_value_heads != 0) {
    return absl::InvalidArgumentError(
        "config.json: num_attention_heads must be a multiple of num_key_value_heads");
  }
  return c;
}

absl::StatusOr<ModelConfig> ReadModelConfig(const std::string& path) {
  std::string file = path;
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    file = (std::filesystem::path(path) / "config.json").string();
  LORADB_ASSIGN_OR_RETURN(std::string text, ReadFileToString(file));
  auto c = ParseModelConfigJson(text);
  if (!c.ok())
    return absl::Status(c.status().code(), absl::StrCat(file, ": ", c.status().message()));
  return c;
}

}  // namespace loradb
