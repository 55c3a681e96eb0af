#include "storage/formats/model_config.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "storage/util/file_util.h"
#include "storage/util/json.h"
#include "storage/util/status_macros.h"

namespace loradb {
namespace {

using nlohmann::json;

absl::Status Invalid(absl::string_view message) {
  return absl::InvalidArgumentError(absl::StrCat("config.json: ", message));
}

// A value as it appears in the file, cut short for error messages.
std::string Shown(const json& v) {
  std::string s = v.dump();
  if (s.size() > 120) s = absl::StrCat(s.substr(0, 117), "...");
  return s;
}

// `"key": value is not supported: why`.
absl::Status Unsupported(absl::string_view key, const json& value, absl::string_view why) {
  return Invalid(absl::StrCat("\"", key, "\": ", Shown(value), " is not supported: ", why));
}

absl::Status WrongType(absl::string_view key, const json& value, absl::string_view type) {
  return Invalid(absl::StrCat("\"", key, "\" must be ", type, ", got ", Shown(value)));
}

// The value of `key`, or nullptr when absent. A JSON null is a value (transformers' typed
// config fields refuse it unless the field is optional, which each caller decides).
const json* Find(const json& j, absl::string_view key) {
  auto it = j.find(std::string(key));
  return it == j.end() ? nullptr : &*it;
}

absl::StatusOr<int64_t> GetInt(const json& j, absl::string_view key, std::optional<int64_t> dflt) {
  const json* v = Find(j, key);
  if (v == nullptr) {
    if (!dflt.has_value()) return Invalid(absl::StrCat("missing \"", key, "\""));
    return *dflt;
  }
  if (!v->is_number_integer()) return WrongType(key, *v, "an integer");
  if (v->is_number_unsigned() &&
      v->get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    return WrongType(key, *v, "an integer below 2^63");
  }
  return v->get<int64_t>();
}

absl::StatusOr<double> GetNumber(const json& j, absl::string_view key, double dflt) {
  const json* v = Find(j, key);
  if (v == nullptr) return dflt;
  if (!v->is_number()) return WrongType(key, *v, "a number");
  return v->get<double>();
}

absl::StatusOr<bool> GetBool(const json& j, absl::string_view key, bool dflt) {
  const json* v = Find(j, key);
  if (v == nullptr) return dflt;
  if (!v->is_boolean()) return WrongType(key, *v, "a boolean");
  return v->get<bool>();
}

// `"key" is N, outside [lo, hi]` unless lo <= v <= hi.
absl::Status CheckRange(absl::string_view key, int64_t v, int64_t lo, int64_t hi) {
  if (v >= lo && v <= hi) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("\"", key, "\" is ", v, ", outside loradb's bounds [", lo, ", ", hi, "]"));
}

// RoPE: transformers 5 writes `rope_parameters` {"rope_type", "rope_theta"}; transformers 4
// writes a top-level `rope_theta` and a `rope_scaling` object (null for plain RoPE). transformers
// 5 reads both: a non-empty rope_scaling replaces rope_parameters, the dict's rope_theta wins
// over the top-level one, and 10000 applies when neither has one. loradb computes the default
// rope_type only; any other, a partial rotary factor, or a key the default type does not read
// is refused.
absl::Status ReadRope(const json& j, ModelConfig* c) {
  const json* dict = nullptr;
  std::string dict_key;
  for (const char* key : {"rope_scaling", "rope_parameters"}) {
    const json* v = Find(j, key);
    if (v == nullptr || v->is_null()) continue;
    if (!v->is_object()) return WrongType(key, *v, "an object or null");
    if (v->empty()) continue;
    dict = v;
    dict_key = key;
    break;
  }
  // Parameters nested by layer type ({"full_attention": {...}, "sliding_attention": {...}}):
  // sliding layers are refused elsewhere, so the full-attention entry is the one in use.
  if (dict != nullptr && dict->contains("full_attention")) {
    const json& full = (*dict)["full_attention"];
    if (!full.is_object()) {
      return WrongType(absl::StrCat(dict_key, ".full_attention"), full, "an object");
    }
    for (const auto& [k, v] : dict->items()) {
      if (k != "full_attention" && k != "sliding_attention") {
        return Unsupported(absl::StrCat(dict_key, ".", k), v,
                           "per-layer-type RoPE parameters name only full_attention and "
                           "sliding_attention");
      }
    }
    dict = &full;
    dict_key += ".full_attention";
  }
  LORADB_ASSIGN_OR_RETURN(c->rope_theta, GetNumber(j, "rope_theta", 10000.0));
  std::string theta_key = "rope_theta";
  if (dict != nullptr) {
    // The type first: a scaled type's own keys (factor, ...) are reported through it.
    for (const char* k : {"rope_type", "type"}) {
      const json* v = Find(*dict, k);
      if (v == nullptr) continue;
      const std::string key = absl::StrCat(dict_key, ".", k);
      if (!v->is_string()) return WrongType(key, *v, "a string");
      if (v->get<std::string>() != "default") {
        return Unsupported(key, *v,
                           "loradb computes only the default RoPE (rope_type \"default\"); "
                           "scaled RoPE (linear, dynamic, yarn, longrope, llama3, ...) is not "
                           "implemented");
      }
    }
    for (const auto& [k, v] : dict->items()) {
      const std::string key = absl::StrCat(dict_key, ".", k);
      if (k == "rope_type" || k == "type") {
        continue;
      } else if (k == "rope_theta") {
        if (!v.is_number()) return WrongType(key, v, "a number");
        c->rope_theta = v.get<double>();
        theta_key = key;
      } else if (k == "partial_rotary_factor") {
        if (!v.is_number() || v.get<double>() != 1.0) {
          return Unsupported(key, v, "rotary embeddings over part of a head are not implemented");
        }
      } else {
        return Unsupported(key, v, "the default RoPE reads only rope_type and rope_theta");
      }
    }
  }
  if (const json* p = Find(j, "partial_rotary_factor");
      p != nullptr && !p->is_null() && (!p->is_number() || p->get<double>() != 1.0)) {
    return Unsupported("partial_rotary_factor", *p,
                       "rotary embeddings over part of a head are not implemented");
  }
  if (!std::isfinite(c->rope_theta) || c->rope_theta <= 0) {
    return Invalid(
        absl::StrCat("\"", theta_key, "\" must be a positive number, got ", c->rope_theta));
  }
  return absl::OkStatus();
}

// Sliding-window attention is not implemented: refused wherever transformers would use it.
// qwen3: layer i slides when layer_types[i] is "sliding_attention"; without layer_types,
// layers i >= max_window_layers slide when use_sliding_window is true and sliding_window is
// set. qwen3_moe: every layer slides when use_sliding_window is true and sliding_window is set.
absl::Status CheckNoSlidingWindow(const json& j, const ModelConfig& c) {
  LORADB_ASSIGN_OR_RETURN(bool use, GetBool(j, "use_sliding_window", false));
  const json* sw = Find(j, "sliding_window");
  if (sw != nullptr && !sw->is_null() && !sw->is_number_integer()) {
    return WrongType("sliding_window", *sw, "an integer or null");
  }
  // transformers' default sliding_window is 4096 for both model types.
  const bool window = use && (sw == nullptr || !sw->is_null());
  const json* types = Find(j, "layer_types");
  if (types != nullptr && !types->is_null()) {
    if (!types->is_array()) return WrongType("layer_types", *types, "a list of strings");
    if (static_cast<int64_t>(types->size()) != c.num_hidden_layers) {
      return Invalid(absl::StrCat("\"layer_types\" has ", types->size(), " entries for ",
                                  c.num_hidden_layers, " layers"));
    }
    for (size_t i = 0; i < types->size(); ++i) {
      const json& t = (*types)[i];
      const std::string key = absl::StrCat("layer_types[", i, "]");
      if (!t.is_string()) return WrongType(key, t, "a string");
      if (t.get<std::string>() != "full_attention") {
        return Unsupported(key, t,
                           "only full causal attention is implemented (no sliding-window or "
                           "other layer types)");
      }
    }
    if (c.model_type == "qwen3") return absl::OkStatus();
  }
  if (!window) return absl::OkStatus();
  if (c.model_type == "qwen3") {
    LORADB_ASSIGN_OR_RETURN(int64_t max_window_layers, GetInt(j, "max_window_layers", 28));
    if (types != nullptr && !types->is_null()) return absl::OkStatus();
    if (max_window_layers >= c.num_hidden_layers) return absl::OkStatus();
    return Unsupported(
        "use_sliding_window", true,
        absl::StrCat("with sliding_window ", sw == nullptr ? "4096" : Shown(*sw),
                     " and max_window_layers ", max_window_layers, ", layers ",
                     std::max<int64_t>(max_window_layers, 0), "..", c.num_hidden_layers - 1,
                     " use sliding-window attention, which is not implemented"));
  }
  return Unsupported("use_sliding_window", true,
                     absl::StrCat("with sliding_window ", sw == nullptr ? "4096" : Shown(*sw),
                                  " every layer uses sliding-window attention, which is not "
                                  "implemented"));
}

absl::Status ReadMoe(const json& j, ModelConfig* c) {
  // transformers 5 writes num_local_experts (num_experts is an alias of it); 4 writes
  // num_experts. With both, transformers 5 takes num_local_experts: refuse a disagreement.
  const json* local = Find(j, "num_local_experts");
  const json* experts = Find(j, "num_experts");
  if (local != nullptr && experts != nullptr && *local != *experts) {
    return Invalid(absl::StrCat("\"num_local_experts\": ", Shown(*local), " and \"num_experts\": ",
                                Shown(*experts), " disagree (they name the same setting)"));
  }
  LORADB_ASSIGN_OR_RETURN(
      c->num_experts,
      GetInt(j, local != nullptr ? "num_local_experts" : "num_experts", std::nullopt));
  LORADB_ASSIGN_OR_RETURN(c->num_experts_per_tok, GetInt(j, "num_experts_per_tok", std::nullopt));
  LORADB_ASSIGN_OR_RETURN(c->moe_intermediate_size,
                          GetInt(j, "moe_intermediate_size", std::nullopt));
  LORADB_ASSIGN_OR_RETURN(c->decoder_sparse_step, GetInt(j, "decoder_sparse_step", 1));
  LORADB_ASSIGN_OR_RETURN(c->norm_topk_prob, GetBool(j, "norm_topk_prob", false));
  if (const json* v = Find(j, "mlp_only_layers"); v != nullptr && !v->is_null()) {
    if (!v->is_array()) return WrongType("mlp_only_layers", *v, "a list of integers");
    for (const json& e : *v) {
      if (!e.is_number_integer()) return WrongType("mlp_only_layers", *v, "a list of integers");
      c->mlp_only_layers.push_back(e.get<int64_t>());
    }
  }
  // With router logits output on, transformers adds router_aux_loss_coef x the load-balancing
  // loss to the training loss; loradb's trainer does not.
  LORADB_ASSIGN_OR_RETURN(bool router_logits, GetBool(j, "output_router_logits", false));
  if (router_logits) {
    return Unsupported("output_router_logits", true,
                       "the router load-balancing loss is not part of loradb's training loss");
  }
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

absl::Status ModelConfig::Validate() const {
  using L = ModelLimits;
  LORADB_RETURN_IF_ERROR(CheckRange("vocab_size", vocab_size, 1, L::kVocabSize));
  LORADB_RETURN_IF_ERROR(CheckRange("hidden_size", hidden_size, 1, L::kHiddenSize));
  LORADB_RETURN_IF_ERROR(CheckRange("num_hidden_layers", num_hidden_layers, 1, L::kLayers));
  LORADB_RETURN_IF_ERROR(CheckRange("num_attention_heads", num_attention_heads, 1, L::kHeads));
  LORADB_RETURN_IF_ERROR(
      CheckRange("num_key_value_heads", num_key_value_heads, 1, num_attention_heads));
  LORADB_RETURN_IF_ERROR(CheckRange("head_dim", head_dim, 1, L::kHeadDim));
  LORADB_RETURN_IF_ERROR(
      CheckRange("intermediate_size", intermediate_size, 1, L::kIntermediateSize));
  LORADB_RETURN_IF_ERROR(
      CheckRange("max_position_embeddings", max_position_embeddings, 1, L::kPositions));
  if (num_attention_heads % num_key_value_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat("num_attention_heads ", num_attention_heads,
                                                   " is not a multiple of num_key_value_heads ",
                                                   num_key_value_heads));
  }
  if (head_dim % 2 != 0) {
    return absl::InvalidArgumentError(absl::StrCat("head_dim ", head_dim, " is odd (RoPE pairs)"));
  }
  if (!std::isfinite(rms_norm_eps) || rms_norm_eps < 0) {
    return absl::InvalidArgumentError(absl::StrCat("rms_norm_eps ", rms_norm_eps, " is invalid"));
  }
  if (!std::isfinite(rope_theta) || rope_theta <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("rope_theta ", rope_theta, " is invalid"));
  }
  // Each factor is bounded above, so these products fit in int64.
  const int64_t kv_per_token = num_hidden_layers * num_key_value_heads * head_dim;
  if (kv_per_token > L::kKvElementsPerToken) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_hidden_layers x num_key_value_heads x head_dim is ", kv_per_token,
                     " K/V elements per token, above loradb's bound of ", L::kKvElementsPerToken));
  }
  // qwen3_moe without experts (transformers would build dense layers) is refused rather than
  // read as another model type.
  if (is_moe() || model_type == "qwen3_moe") {
    LORADB_RETURN_IF_ERROR(CheckRange("num_experts", num_experts, 1, L::kExperts));
    LORADB_RETURN_IF_ERROR(CheckRange("num_experts_per_tok", num_experts_per_tok, 1, num_experts));
    LORADB_RETURN_IF_ERROR(
        CheckRange("moe_intermediate_size", moe_intermediate_size, 1, L::kIntermediateSize));
    LORADB_RETURN_IF_ERROR(CheckRange("decoder_sparse_step", decoder_sparse_step, 1,
                                      std::numeric_limits<int64_t>::max()));
    if (static_cast<int64_t>(mlp_only_layers.size()) > L::kLayers) {
      return absl::InvalidArgumentError(absl::StrCat("mlp_only_layers has ", mlp_only_layers.size(),
                                                     " entries, above loradb's bound of ",
                                                     L::kLayers));
    }
  }
  // The module table LoraModules() builds, measured without building it.
  // q_out and kv_out are at most kHeads x kHeadDim = 2^21 <= kModuleFeatures.
  const int64_t q_out = num_attention_heads * head_dim, kv_out = num_key_value_heads * head_dim;
  const int64_t widest_mlp = std::max(intermediate_size, is_moe() ? moe_intermediate_size : 0);
  for (int64_t elements : {hidden_size * q_out, hidden_size * widest_mlp, vocab_size * hidden_size,
                           hidden_size * num_experts}) {
    if (elements > L::kModuleElements) {
      return absl::InvalidArgumentError(
          absl::StrCat("a module of ", elements, " weights (in x out) is above loradb's bound of ",
                       L::kModuleElements));
    }
  }
  int64_t modules = 2, elements = 2 * vocab_size * hidden_size;
  for (int64_t l = 0; l < num_hidden_layers; ++l) {
    const int64_t attention = 2 * hidden_size * (q_out + kv_out);
    if (IsMoeLayer(l)) {
      modules += 5 + 3 * num_experts;
      elements += attention + hidden_size * num_experts +
                  3 * num_experts * hidden_size * moe_intermediate_size;
    } else {
      modules += 7;
      elements += attention + 3 * hidden_size * intermediate_size;
    }
  }
  if (modules > L::kModules) {
    return absl::InvalidArgumentError(absl::StrCat("the base would have ", modules,
                                                   " LoRA-targetable modules, above loradb's "
                                                   "bound of ",
                                                   L::kModules));
  }
  if (elements > L::kModelElements) {
    return absl::InvalidArgumentError(absl::StrCat("the base's modules would hold ", elements,
                                                   " weights, above loradb's bound of ",
                                                   L::kModelElements));
  }
  return absl::OkStatus();
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
  j["rope_scaling"] = nullptr;
  j["tie_word_embeddings"] = tie_word_embeddings;
  j["attention_bias"] = attention_bias;
  j["attention_dropout"] = 0.0;
  j["hidden_act"] = "silu";
  j["use_sliding_window"] = false;
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
  LORADB_ASSIGN_OR_RETURN(json j, ParseJson(text, "config.json"));
  if (!j.is_object()) return Invalid("not a JSON object");
  ModelConfig c;
  const json* mt = Find(j, "model_type");
  if (mt == nullptr) return Invalid("missing \"model_type\"");
  if (!mt->is_string()) return WrongType("model_type", *mt, "a string");
  c.model_type = mt->get<std::string>();
  if (c.model_type != "qwen3" && c.model_type != "qwen3_moe") {
    return Invalid(absl::StrCat(
        "model_type \"", c.model_type,
        "\" is not in the Qwen3 family (qwen3, qwen3_moe); register other architectures with an "
        "explicit module table"));
  }
  const bool moe = c.model_type == "qwen3_moe";
  if (const json* q = Find(j, "quantization_config"); q != nullptr && !q->is_null()) {
    return Unsupported("quantization_config", *q,
                       "quantized weights are not computed by loradb (dequantize the checkpoint)");
  }
  LORADB_ASSIGN_OR_RETURN(c.vocab_size, GetInt(j, "vocab_size", std::nullopt));
  LORADB_ASSIGN_OR_RETURN(c.hidden_size, GetInt(j, "hidden_size", std::nullopt));
  LORADB_ASSIGN_OR_RETURN(c.num_hidden_layers, GetInt(j, "num_hidden_layers", std::nullopt));
  LORADB_ASSIGN_OR_RETURN(c.num_attention_heads, GetInt(j, "num_attention_heads", std::nullopt));
  LORADB_ASSIGN_OR_RETURN(c.intermediate_size, GetInt(j, "intermediate_size", std::nullopt));
  // transformers' defaults: Qwen3Config has num_key_value_heads 32 (null: num_attention_heads)
  // and head_dim 128; Qwen3MoeConfig has num_key_value_heads 4 and no head_dim field, so the
  // model takes hidden_size // num_attention_heads.
  if (const json* kv = Find(j, "num_key_value_heads"); kv != nullptr && kv->is_null() && !moe) {
    c.num_key_value_heads = c.num_attention_heads;
  } else {
    LORADB_ASSIGN_OR_RETURN(c.num_key_value_heads, GetInt(j, "num_key_value_heads", moe ? 4 : 32));
  }
  if (c.num_attention_heads <= 0) {
    return Invalid(
        absl::StrCat("\"num_attention_heads\" is ", c.num_attention_heads, ", must be positive"));
  }
  LORADB_ASSIGN_OR_RETURN(c.head_dim,
                          GetInt(j, "head_dim", moe ? c.hidden_size / c.num_attention_heads : 128));
  LORADB_ASSIGN_OR_RETURN(c.max_position_embeddings, GetInt(j, "max_position_embeddings", 32768));
  LORADB_ASSIGN_OR_RETURN(c.rms_norm_eps, GetNumber(j, "rms_norm_eps", 1e-6));
  LORADB_ASSIGN_OR_RETURN(c.tie_word_embeddings, GetBool(j, "tie_word_embeddings", false));
  LORADB_ASSIGN_OR_RETURN(c.attention_bias, GetBool(j, "attention_bias", false));
  if (const json* act = Find(j, "hidden_act"); act != nullptr && *act != "silu") {
    return Unsupported("hidden_act", *act, "the MLP activation is SiLU (\"silu\") only");
  }
  LORADB_ASSIGN_OR_RETURN(double dropout, GetNumber(j, "attention_dropout", 0.0));
  if (dropout != 0.0) {
    return Unsupported("attention_dropout", *Find(j, "attention_dropout"),
                       "loradb's trainer applies no attention dropout");
  }
  // transformers 5 writes "dtype", 4 "torch_dtype"; with both, "dtype" wins.
  for (const char* key : {"torch_dtype", "dtype"}) {
    if (const json* v = Find(j, key); v != nullptr && !v->is_null()) {
      if (!v->is_string()) return WrongType(key, *v, "a string");
      c.torch_dtype = v->get<std::string>();
    }
  }
  LORADB_RETURN_IF_ERROR(ReadRope(j, &c));
  if (moe) LORADB_RETURN_IF_ERROR(ReadMoe(j, &c));
  if (absl::Status s = c.Validate(); !s.ok()) return Invalid(s.message());
  LORADB_RETURN_IF_ERROR(CheckNoSlidingWindow(j, c));
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

absl::Status CheckModuleTable(const std::vector<ModuleShape>& modules) {
  using L = ModelLimits;
  if (static_cast<int64_t>(modules.size()) > L::kModules) {
    return absl::InvalidArgumentError(absl::StrCat(
        "module table: ", modules.size(), " modules, above loradb's bound of ", L::kModules));
  }
  int64_t total = 0;
  for (const ModuleShape& m : modules) {
    if (m.name.empty() || static_cast<int64_t>(m.name.size()) > L::kModuleNameBytes) {
      return absl::InvalidArgumentError(absl::StrCat("module table: a module name must have 1 to ",
                                                     L::kModuleNameBytes, " bytes, got ",
                                                     m.name.size()));
    }
    for (auto [what, v] : {std::pair<const char*, int64_t>{"in", m.in}, {"out", m.out}}) {
      if (v < 1 || v > L::kModuleFeatures) {
        return absl::InvalidArgumentError(absl::StrCat("module table: \"", m.name, "\" ", what, " ",
                                                       v, " is outside loradb's bounds [1, ",
                                                       L::kModuleFeatures, "]"));
      }
    }
    const int64_t elements = m.in * m.out;  // each factor <= 2^24
    if (elements > L::kModuleElements) {
      return absl::InvalidArgumentError(
          absl::StrCat("module table: \"", m.name, "\" has ", elements,
                       " weights (in x out), above loradb's bound of ", L::kModuleElements));
    }
    total += elements;  // <= 2^20 modules x 2^36: fits in int64
  }
  if (total > L::kModelElements) {
    return absl::InvalidArgumentError(absl::StrCat(
        "module table: ", total, " weights in all, above loradb's bound of ", L::kModelElements));
  }
  return absl::OkStatus();
}

}  // namespace loradb
