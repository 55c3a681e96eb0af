#include "storage/formats/peft.h"

// GCC 12 reports a false -Wmaybe-uninitialized inside libstdc++'s <regex> automaton when
// building with -fsanitize=address (std::function moves in _NFA::_M_insert_*); the location is
// in system headers included before any local push/pop could cover it.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "storage/formats/safetensors.h"
#include "storage/util/file_util.h"
#include "storage/util/json.h"
#include "storage/util/status_macros.h"

namespace loradb::peft {
namespace {

using Json = nlohmann::ordered_json;

constexpr absl::string_view kPrefix = "base_model.model.";

absl::Status Invalid(absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("adapter_config.json: ", what));
}

// PEFT's get_pattern_key: `key` matches when the whole module key matches `(.*\.)?(pattern)`.
// Patterns were validated at parse time; one that does not compile never matches.
bool PatternMatches(const std::string& pattern, const std::string& module_key) {
  try {
    std::regex re(absl::StrCat("(.*\\.)?(", pattern, ")"), std::regex::ECMAScript);
    return std::regex_match(module_key, re);
  } catch (const std::regex_error&) {
    return false;
  }
}

absl::Status CheckPattern(const std::string& field, const std::string& pattern) {
  try {
    std::regex re(absl::StrCat("(.*\\.)?(", pattern, ")"), std::regex::ECMAScript);
  } catch (const std::regex_error& e) {
    return Invalid(absl::StrCat(field, " key \"", pattern, "\" is not a valid regex: ", e.what()));
  }
  return absl::OkStatus();
}

bool IsNullOrEmpty(const Json& v) {
  return v.is_null() || ((v.is_array() || v.is_object() || v.is_string()) && v.empty());
}

// True when `key` is absent from `j` or null.
bool AbsentOrNull(const Json& j, const char* key) {
  auto it = j.find(key);
  return it == j.end() || it->is_null();
}

Json NumberJson(double v) {
  if (std::floor(v) == v && std::fabs(v) < 1e15) return Json(static_cast<int64_t>(v));
  return Json(v);
}

// Writes a string list field: the list when non-empty; an empty one turns a non-empty value in
// `j` into null and leaves an absent, null or empty one as it is.
void FillStringList(const char* key, const std::vector<std::string>& v, Json* j) {
  if (!v.empty()) {
    (*j)[key] = v;
  } else if (auto it = j->find(key); it != j->end() && !IsNullOrEmpty(*it)) {
    (*j)[key] = nullptr;
  }
}

// Writes the fields of `c` into `j` (which may carry other PEFT keys). Empty optional fields
// leave an absent or null key as it is, so a raw config round-trips unchanged.
void FillJson(const LoraConfig& c, Json* j) {
  (*j)["r"] = c.r;
  (*j)["lora_alpha"] = NumberJson(c.lora_alpha);
  if (c.use_rslora || !AbsentOrNull(*j, "use_rslora")) (*j)["use_rslora"] = c.use_rslora;
  if (!c.rank_pattern.empty() || !AbsentOrNull(*j, "rank_pattern")) {
    Json rank = Json::object();
    for (const auto& [k, v] : c.rank_pattern) rank[k] = v;
    (*j)["rank_pattern"] = rank;
  }
  if (!c.alpha_pattern.empty() || !AbsentOrNull(*j, "alpha_pattern")) {
    Json alpha = Json::object();
    for (const auto& [k, v] : c.alpha_pattern) alpha[k] = NumberJson(v);
    (*j)["alpha_pattern"] = alpha;
  }
  if (c.target_modules_is_regex) {
    (*j)["target_modules"] = c.target_modules.empty() ? std::string() : c.target_modules[0];
  } else if (!c.target_modules.empty() || !AbsentOrNull(*j, "target_modules")) {
    (*j)["target_modules"] = c.target_modules;
  }
  FillStringList("target_parameters", c.target_parameters, j);
  FillStringList("modules_to_save", c.modules_to_save, j);
  for (const auto& [key, value] : {std::pair<const char*, bool>{"use_dora", c.use_dora},
                                   {"lora_bias", c.lora_bias},
                                   {"fan_in_fan_out", c.fan_in_fan_out}}) {
    if (value || !AbsentOrNull(*j, key)) (*j)[key] = value;
  }
  if (c.bias != "none" || !AbsentOrNull(*j, "bias")) (*j)["bias"] = c.bias;
  for (const auto& [key, value] : {std::pair<const char*, const std::string*>{
                                       "base_model_name_or_path", &c.base_model_name_or_path},
                                   {"task_type", &c.task_type}}) {
    if (!value->empty()) {
      (*j)[key] = *value;
    } else if (j->contains(key)) {
      (*j)[key] = nullptr;
    }
  }
}

// Config-only features that change the math: set when the key is true / non-empty.
struct ConfigFeatureKey {
  const char* key;
  PeftFeature feature;
};
constexpr ConfigFeatureKey kConfigFeatureKeys[] = {
    {"layer_replication", kFeatureLayerReplication},
    {"alora_invocation_tokens", kFeatureAlora},
    {"use_qalora", kFeatureQalora},
    {"use_bdlora", kFeatureBdLora},
    {"arrow_config", kFeatureArrow},
    {"kasa_config", kFeatureKasa},
    {"velora_config", kFeatureVelora},
    {"monteclora_config", kFeatureMonteclora},
};

absl::Status ReadBool(const Json& j, const char* key, bool* out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_boolean()) return Invalid(absl::StrCat(key, " must be a boolean, got ", it->dump()));
  *out = it->get<bool>();
  return absl::OkStatus();
}

absl::Status ReadStringList(const Json& j, const char* key, std::vector<std::string>* out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_array()) return Invalid(absl::StrCat(key, " must be a list of strings or null"));
  for (const auto& m : *it) {
    if (!m.is_string()) return Invalid(absl::StrCat(key, " must hold strings"));
    out->push_back(m.get<std::string>());
  }
  return absl::OkStatus();
}

absl::Status ReadTokenIds(const Json& list, const std::string& what, std::vector<int64_t>* out) {
  if (!list.is_array()) return Invalid(absl::StrCat(what, " must be a list of token ids"));
  for (const auto& id : list) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0) {
      return Invalid(absl::StrCat(what, " must hold non-negative integers, got ", id.dump()));
    }
    out->push_back(id.get<int64_t>());
  }
  return absl::OkStatus();
}

// Reads the fields of features beyond plain LoRA into `c`.
absl::Status ParseFeatures(const Json& j, LoraConfig* c) {
  LORADB_RETURN_IF_ERROR(ReadBool(j, "fan_in_fan_out", &c->fan_in_fan_out));
  LORADB_RETURN_IF_ERROR(ReadBool(j, "use_dora", &c->use_dora));
  LORADB_RETURN_IF_ERROR(ReadBool(j, "lora_bias", &c->lora_bias));
  if (auto it = j.find("bias"); it != j.end() && !it->is_null()) {
    if (!it->is_string() || (it->get<std::string>() != "none" && it->get<std::string>() != "all" &&
                             it->get<std::string>() != "lora_only")) {
      return Invalid(
          absl::StrCat("bias must be \"none\", \"all\" or \"lora_only\", got ", it->dump()));
    }
    c->bias = it->get<std::string>();
  }
  LORADB_RETURN_IF_ERROR(ReadStringList(j, "modules_to_save", &c->modules_to_save));
  LORADB_RETURN_IF_ERROR(ReadStringList(j, "target_parameters", &c->target_parameters));
  if (auto it = j.find("trainable_token_indices"); it != j.end() && !it->is_null()) {
    if (it->is_array()) {
      c->trainable_token_indices.emplace_back();
      LORADB_RETURN_IF_ERROR(
          ReadTokenIds(*it, "trainable_token_indices", &c->trainable_token_indices.back().second));
    } else if (it->is_object()) {
      for (auto p = it->begin(); p != it->end(); ++p) {
        c->trainable_token_indices.emplace_back(p.key(), std::vector<int64_t>());
        LORADB_RETURN_IF_ERROR(
            ReadTokenIds(p.value(), absl::StrCat("trainable_token_indices \"", p.key(), "\""),
                         &c->trainable_token_indices.back().second));
      }
    } else {
      return Invalid("trainable_token_indices must be a list, an object or null");
    }
  }
  for (const ConfigFeatureKey& f : kConfigFeatureKeys) {
    auto it = j.find(f.key);
    if (it == j.end() || it->is_null() || IsNullOrEmpty(*it)) continue;
    if (it->is_boolean() && !it->get<bool>()) continue;
    c->config_features |= f.feature;
  }
  return absl::OkStatus();
}

absl::Status PrefixPath(const absl::Status& s, const std::string& path) {
  return absl::Status(s.code(), absl::StrCat(path, ": ", s.message()));
}

}  // namespace

int LoraConfig::RankFor(const std::string& module_key) const {
  for (const auto& [pattern, rank] : rank_pattern) {
    if (PatternMatches(pattern, module_key)) return rank;
  }
  return r;
}

double LoraConfig::AlphaFor(const std::string& module_key) const {
  for (const auto& [pattern, alpha] : alpha_pattern) {
    if (PatternMatches(pattern, module_key)) return alpha;
  }
  return lora_alpha;
}

double LoraConfig::ScaleFor(const std::string& module_key) const {
  double rank = RankFor(module_key);
  double alpha = AlphaFor(module_key);
  return use_rslora ? alpha / std::sqrt(rank) : alpha / rank;
}

absl::StatusOr<std::string> LoraConfig::ToJson() const {
  if (r <= 0) return Invalid(absl::StrCat("r must be positive, got ", r));
  for (const auto& [k, v] : rank_pattern) {
    if (v <= 0) return Invalid(absl::StrCat("rank_pattern \"", k, "\" must be positive"));
    LORADB_RETURN_IF_ERROR(CheckPattern("rank_pattern", k));
  }
  for (const auto& [k, v] : alpha_pattern) LORADB_RETURN_IF_ERROR(CheckPattern("alpha_pattern", k));
  if (target_modules_is_regex && target_modules.size() != 1) {
    return Invalid("a regex target_modules must be exactly one string");
  }
  Json j = Json::object();
  if (!raw_json.empty()) {
    absl::StatusOr<Json> parsed = ParseJson<Json>(raw_json, "raw_json");
    if (!parsed.ok() || !parsed->is_object()) return Invalid("raw_json is not a JSON object");
    const Json& raw = *parsed;
    j = raw;
    FillJson(*this, &j);
    if (j == raw) return raw_json;
    return j.dump(2);
  }
  // A fresh config in PEFT's own layout (keys sorted, as PEFT's save_pretrained writes them).
  nlohmann::json sorted = {{"peft_type", "LORA"},
                           {"alpha_pattern", nlohmann::json::object()},
                           {"rank_pattern", nlohmann::json::object()},
                           {"base_model_name_or_path", nullptr},
                           {"task_type", nullptr},
                           {"target_modules", nullptr},
                           {"use_rslora", false},
                           {"bias", "none"},
                           {"fan_in_fan_out", false},
                           {"inference_mode", true},
                           {"init_lora_weights", true},
                           {"lora_dropout", 0.0},
                           {"modules_to_save", nullptr},
                           {"use_dora", false}};
  FillJson(*this, &j);
  for (auto it = j.begin(); it != j.end(); ++it) sorted[it.key()] = it.value();
  return sorted.dump(2);
}

absl::StatusOr<LoraConfig> ParseLoraConfig(const std::string& json_text) {
  absl::StatusOr<Json> parsed = ParseJson<Json>(json_text, "adapter_config.json");
  if (!parsed.ok()) return parsed.status();
  Json j = *std::move(parsed);
  if (!j.is_object()) return Invalid("not a JSON object");
  LoraConfig c;
  c.raw_json = json_text;

  if (auto it = j.find("peft_type"); it != j.end() && !it->is_null()) {
    if (!it->is_string()) return Invalid("peft_type must be a string");
    if (it->get<std::string>() != "LORA") {
      return absl::UnimplementedError(absl::StrCat("adapter_config.json: peft_type \"",
                                                   it->get<std::string>(),
                                                   "\" is not supported (only LORA)"));
    }
  }
  LORADB_RETURN_IF_ERROR(ParseFeatures(j, &c));

  if (auto it = j.find("r"); it != j.end()) {
    if (!it->is_number_integer() || it->get<int64_t>() <= 0 || it->get<int64_t>() > (1 << 30)) {
      return Invalid(absl::StrCat("r must be a positive integer, got ", it->dump()));
    }
    c.r = static_cast<int>(it->get<int64_t>());
  }
  if (auto it = j.find("lora_alpha"); it != j.end()) {
    if (!it->is_number()) {
      return Invalid(absl::StrCat("lora_alpha must be a number, got ", it->dump()));
    }
    c.lora_alpha = it->get<double>();
  }
  if (auto it = j.find("use_rslora"); it != j.end() && !it->is_null()) {
    if (!it->is_boolean()) return Invalid("use_rslora must be a boolean");
    c.use_rslora = it->get<bool>();
  }
  if (auto it = j.find("rank_pattern"); it != j.end() && !it->is_null()) {
    if (!it->is_object()) return Invalid("rank_pattern must be an object");
    for (auto p = it->begin(); p != it->end(); ++p) {
      if (!p.value().is_number_integer() || p.value().get<int64_t>() <= 0 ||
          p.value().get<int64_t>() > (1 << 30)) {
        return Invalid(absl::StrCat("rank_pattern \"", p.key(),
                                    "\" must be a positive integer, got ", p.value().dump()));
      }
      LORADB_RETURN_IF_ERROR(CheckPattern("rank_pattern", p.key()));
      c.rank_pattern.emplace_back(p.key(), static_cast<int>(p.value().get<int64_t>()));
    }
  }
  if (auto it = j.find("alpha_pattern"); it != j.end() && !it->is_null()) {
    if (!it->is_object()) return Invalid("alpha_pattern must be an object");
    for (auto p = it->begin(); p != it->end(); ++p) {
      if (!p.value().is_number()) {
        return Invalid(absl::StrCat("alpha_pattern \"", p.key(), "\" must be a number, got ",
                                    p.value().dump()));
      }
      LORADB_RETURN_IF_ERROR(CheckPattern("alpha_pattern", p.key()));
      c.alpha_pattern.emplace_back(p.key(), p.value().get<double>());
    }
  }
  if (auto it = j.find("target_modules"); it != j.end() && !it->is_null()) {
    if (it->is_string()) {
      c.target_modules_is_regex = true;
      c.target_modules.push_back(it->get<std::string>());
    } else if (it->is_array()) {
      for (const auto& m : *it) {
        if (!m.is_string()) return Invalid("target_modules must hold strings");
        c.target_modules.push_back(m.get<std::string>());
      }
    } else {
      return Invalid("target_modules must be a string or a list of strings");
    }
  }
  for (const char* key : {"base_model_name_or_path", "task_type"}) {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) continue;
    if (!it->is_string()) return Invalid(absl::StrCat(key, " must be a string or null"));
    (std::string(key) == "task_type" ? c.task_type : c.base_model_name_or_path) =
        it->get<std::string>();
  }
  return c;
}

absl::StatusOr<PeftTensorName> ParsePeftTensorName(const std::string& name) {
  if (ClassifyPeftTensor(name).depth > 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor \"", name, "\" is LoRA on a parameter (target_parameters layout), not a module"));
  }
  struct Suffix {
    absl::string_view text;
    LoraSide side;
    bool embedding;
  };
  static constexpr Suffix kSuffixes[] = {
      {".lora_A.weight", LoraSide::kA, false},
      {".lora_B.weight", LoraSide::kB, false},
      {".lora_embedding_A", LoraSide::kA, true},
      {".lora_embedding_B", LoraSide::kB, true},
  };
  for (const Suffix& s : kSuffixes) {
    if (!absl::EndsWith(name, s.text)) continue;
    absl::string_view key(name);
    key.remove_suffix(s.text.size());
    if (absl::StartsWith(key, kPrefix)) key.remove_prefix(kPrefix.size());
    if (key.empty()) break;
    PeftTensorName out;
    out.module_key = std::string(key);
    if (absl::StartsWith(key, "model.")) key.remove_prefix(6);
    out.module = std::string(key);
    out.side = s.side;
    out.embedding = s.embedding;
    return out;
  }
  // Say which PEFT feature the tensor belongs to, so a consumer's refusal names it.
  std::string why;
  const PeftTensorInfo info = ClassifyPeftTensor(name);
  if (info.kind == PeftTensorKind::kMagnitude) {
    why = " (a DoRA magnitude vector: use_dora)";
  } else if (info.kind == PeftTensorKind::kLoraBias) {
    why = " (a lora_B bias: lora_bias)";
  } else if (info.kind == PeftTensorKind::kTrainableTokens) {
    why = " (trainable token deltas: trainable_token_indices)";
  } else if (absl::EndsWith(name, ".base_layer.weight")) {
    why =
        " (a full base-layer weight, saved by PEFT's save_embedding_layers: re-save the adapter "
        "with save_embedding_layers=False)";
  } else if (absl::EndsWith(name, ".bias")) {
    why = " (a base bias: bias = \"all\" / \"lora_only\")";
  } else if (info.kind == PeftTensorKind::kOther) {
    why = " (a full module weight, as modules_to_save saves)";
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "tensor \"", name,
      "\" is not a PEFT LoRA weight (<module>.lora_A.weight, .lora_B.weight, .lora_embedding_A or "
      ".lora_embedding_B)",
      why));
}

std::string PeftTensorNameFor(const std::string& module_key, LoraSide side, bool embedding) {
  const char* suffix = embedding
                           ? (side == LoraSide::kA ? ".lora_embedding_A" : ".lora_embedding_B")
                           : (side == LoraSide::kA ? ".lora_A.weight" : ".lora_B.weight");
  return absl::StrCat(kPrefix, module_key, suffix);
}

PeftTensorInfo ClassifyPeftTensor(const std::string& name) {
  struct Suffix {
    absl::string_view text;
    PeftTensorKind kind;
    LoraSide side;
    bool embedding;
  };
  static constexpr Suffix kSuffixes[] = {
      {".lora_A.weight", PeftTensorKind::kLora, LoraSide::kA, false},
      {".lora_B.weight", PeftTensorKind::kLora, LoraSide::kB, false},
      {".lora_embedding_A", PeftTensorKind::kLora, LoraSide::kA, true},
      {".lora_embedding_B", PeftTensorKind::kLora, LoraSide::kB, true},
      {".lora_B.bias", PeftTensorKind::kLoraBias, LoraSide::kB, false},
      {".lora_magnitude_vector", PeftTensorKind::kMagnitude, LoraSide::kA, false},
      {".token_adapter.trainable_tokens_delta", PeftTensorKind::kTrainableTokens, LoraSide::kA,
       false},
  };
  absl::string_view key(name);
  if (absl::StartsWith(key, kPrefix)) key.remove_prefix(kPrefix.size());
  PeftTensorInfo out;
  for (const Suffix& s : kSuffixes) {
    if (!absl::EndsWith(key, s.text) || key.size() == s.text.size()) continue;
    key.remove_suffix(s.text.size());
    out.kind = s.kind;
    out.side = s.side;
    out.embedding = s.embedding;
    while (out.kind == PeftTensorKind::kLora && absl::EndsWith(key, ".base_layer")) {
      key.remove_suffix(std::strlen(".base_layer"));
      ++out.depth;
    }
    out.module_key = std::string(key);
    return out;
  }
  const size_t dot = key.rfind('.');
  out.module_key = std::string(dot == absl::string_view::npos ? key : key.substr(0, dot));
  return out;
}

absl::string_view PeftFeatureName(PeftFeature feature) {
  switch (feature) {
    case kFeatureEmbeddingLora:
      return "embedding LoRA (lora_embedding_A/B)";
    case kFeatureDora:
      return "DoRA (use_dora, lora_magnitude_vector)";
    case kFeatureLoraBias:
      return "lora_bias (lora_B.bias)";
    case kFeatureModulesToSave:
      return "modules_to_save (full module weights)";
    case kFeatureTrainableTokens:
      return "trainable_token_indices (trainable_tokens_delta)";
    case kFeatureTargetParameters:
      return "target_parameters (LoRA on expert parameters)";
    case kFeatureBias:
      return "bias (trained base biases)";
    case kFeatureBaseLayerWeights:
      return "full base_layer weights (save_embedding_layers)";
    case kFeatureLayerReplication:
      return "layer_replication";
    case kFeatureAlora:
      return "alora_invocation_tokens";
    case kFeatureQalora:
      return "use_qalora";
    case kFeatureBdLora:
      return "use_bdlora";
    case kFeatureArrow:
      return "arrow_config";
    case kFeatureKasa:
      return "kasa_config";
    case kFeatureVelora:
      return "velora_config";
    case kFeatureMonteclora:
      return "monteclora_config";
  }
  return "unknown feature";
}

namespace {

// The parameter keys ("model.layers.0.mlp.experts.gate_up_proj") target_parameters may name on
// `module_key`, in config order: entries "<module suffix>.<param>" whose module part the key
// ends with (`dotted` is set when one does), and bare "<param>" entries, which any module may
// hold.
struct ParameterKeys {
  std::vector<std::string> keys;
  bool dotted = false;
};
ParameterKeys TargetParameterKeys(const LoraConfig& config, const std::string& module_key) {
  ParameterKeys out;
  for (const std::string& t : config.target_parameters) {
    const size_t dot = t.rfind('.');
    if (dot == std::string::npos) {
      out.keys.push_back(absl::StrCat(module_key, ".", t));
      continue;
    }
    const std::string module = t.substr(0, dot);
    if (module_key == module || absl::EndsWith(module_key, absl::StrCat(".", module))) {
      out.keys.push_back(absl::StrCat(module_key, ".", t.substr(dot + 1)));
      out.dotted = true;
    }
  }
  return out;
}

// PEFT's modules_to_save rule: a module (and everything inside it) is saved whole when its key
// ends with one of the names.
bool InModulesToSave(const LoraConfig& config, const std::string& module_key) {
  for (size_t end = 0; end != std::string::npos;) {
    end = module_key.find('.', end + 1);
    const std::string prefix = module_key.substr(0, end);
    for (const std::string& m : config.modules_to_save) {
      if (absl::EndsWith(prefix, m)) return true;
    }
  }
  return false;
}

// The feature that explains a kOther tensor, or 0 when none of the config's does.
uint32_t OtherTensorFeature(const LoraConfig& config, const std::string& name,
                            const PeftTensorInfo& info) {
  if (absl::EndsWith(name, ".base_layer.weight")) return kFeatureBaseLayerWeights;
  if (InModulesToSave(config, info.module_key)) return kFeatureModulesToSave;
  if (config.bias != "none" && absl::EndsWith(name, ".bias")) return kFeatureBias;
  return config.config_features;  // a LoRA variant's own tensors
}

const std::vector<int64_t>* TokenIndicesFor(const LoraConfig& config,
                                            const std::string& module_key) {
  for (const auto& [module, ids] : config.trainable_token_indices) {
    if (module.empty() || module_key == module ||
        absl::EndsWith(module_key, absl::StrCat(".", module))) {
      return &ids;
    }
  }
  return nullptr;
}

bool IsFloating(DType d) {
  return d == DType::kF16 || d == DType::kBF16 || d == DType::kF32 || d == DType::kF64;
}

absl::Status BadTensor(const TensorView& t, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat("tensor \"", t.name, "\": ", why));
}

}  // namespace

uint32_t PeftConfigFeatures(const LoraConfig& config) {
  return config.config_features | (config.use_dora ? kFeatureDora : 0u);
}

uint32_t PeftTensorFeatures(const LoraConfig& config, const std::string& name) {
  const PeftTensorInfo n = ClassifyPeftTensor(name);
  switch (n.kind) {
    case PeftTensorKind::kLora: {
      uint32_t used = n.embedding ? kFeatureEmbeddingLora : 0u;
      if (n.depth > 0 || TargetParameterKeys(config, n.module_key).dotted) {
        used |= kFeatureTargetParameters;
      }
      return used;
    }
    case PeftTensorKind::kLoraBias:
      return kFeatureLoraBias;
    case PeftTensorKind::kMagnitude:
      return kFeatureDora;
    case PeftTensorKind::kTrainableTokens:
      return kFeatureTrainableTokens;
    case PeftTensorKind::kOther: {
      const uint32_t f = OtherTensorFeature(config, name, n);
      return f != 0 ? f : kFeatureModulesToSave;
    }
  }
  return 0;
}

uint32_t PeftFeaturesUsed(const LoraConfig& config, const std::vector<TensorView>& tensors) {
  uint32_t used = PeftConfigFeatures(config);
  if (!config.target_parameters.empty()) used |= kFeatureTargetParameters;
  for (const TensorView& t : tensors) used |= PeftTensorFeatures(config, t.name);
  return used;
}

absl::StatusOr<uint32_t> StoredAdapterFeatures(const LoraConfig& fallback,
                                               const std::map<std::string, std::string>& metadata,
                                               const std::vector<std::string>& names) {
  LoraConfig kept;
  const LoraConfig* config = &fallback;
  if (auto it = metadata.find(kStoredConfigKey); it != metadata.end()) {
    LORADB_ASSIGN_OR_RETURN(kept, ParseLoraConfig(it->second));
    // A stored adapter's LoRA is per module: target_parameters were converted on import.
    kept.target_parameters.clear();
    config = &kept;
  }
  uint32_t used = PeftConfigFeatures(*config);
  for (const std::string& name : names) used |= PeftTensorFeatures(*config, name);
  return used;
}

absl::Status RefuseUnapplied(uint32_t used, uint32_t applied, absl::string_view who) {
  const uint32_t missing = used & ~applied;
  if (missing == 0) return absl::OkStatus();
  std::vector<std::string> names;
  for (uint32_t bit = 1; bit != 0; bit <<= 1) {
    if ((missing & bit) != 0) names.emplace_back(PeftFeatureName(static_cast<PeftFeature>(bit)));
  }
  return absl::UnimplementedError(
      absl::StrCat(who, " cannot apply ", absl::StrJoin(names, ", "),
                   ", which this adapter uses (the adapter stays stored and exports unchanged)"));
}

absl::Status ValidateLoraTensors(const LoraConfig& config, const std::vector<TensorView>& tensors) {
  struct Pair {
    const TensorView* a = nullptr;
    const TensorView* b = nullptr;
    bool embedding = false;
  };
  // (module key, base_layer depth) -> its LoRA pair.
  std::map<std::pair<std::string, int>, Pair> modules;
  std::vector<std::pair<const TensorView*, PeftTensorInfo>> extras;
  for (const TensorView& t : tensors) {
    PeftTensorInfo n = ClassifyPeftTensor(t.name);
    if (n.kind != PeftTensorKind::kOther && !IsFloating(t.dtype)) {
      return BadTensor(t, absl::StrCat("dtype ", DTypeName(t.dtype), " is not a floating type"));
    }
    if (n.kind != PeftTensorKind::kLora) {
      extras.emplace_back(&t, std::move(n));
      continue;
    }
    if (t.shape.size() != 2) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor \"", t.name, "\" has shape ", ShapeString(t.shape),
          ": only 2-D LoRA weights (linear, embedding and expert layers) are supported"));
    }
    Pair& p = modules[{n.module_key, n.depth}];
    if ((p.a != nullptr || p.b != nullptr) && p.embedding != n.embedding) {
      return BadTensor(t, "module mixes lora_embedding and lora_A/B weights");
    }
    p.embedding = n.embedding;
    const TensorView*& slot = n.side == LoraSide::kA ? p.a : p.b;
    if (slot != nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor \"", t.name, "\" repeats \"", slot->name, "\""));
    }
    slot = &t;
  }
  for (const auto& [where, p] : modules) {
    const std::string& key = where.first;
    if (p.a == nullptr || p.b == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("module \"", key, "\" has only a LoRA ",
                                                     p.a == nullptr ? "B" : "A", " weight (\"",
                                                     (p.a ? p.a : p.b)->name, "\")"));
    }
    int64_t rank = p.a->shape[0];
    if (p.b->shape[1] != rank) {
      return absl::InvalidArgumentError(absl::StrCat(
          "module \"", key, "\": A ", ShapeString(p.a->shape), " and B ", ShapeString(p.b->shape),
          " disagree on the rank (A is [r, in], B is [out, r])"));
    }
    const ParameterKeys found = TargetParameterKeys(config, key);
    const std::vector<std::string>& params = found.keys;
    // A module is LoRA on parameters when nested, when a dotted entry names it, or when a bare
    // entry could and its A does not read as plain LoRA (r rows).
    const bool on_parameters =
        where.second > 0 || found.dotted || (!params.empty() && rank != config.RankFor(key));
    if (on_parameters) {
      // target_parameters: PEFT nests one wrapper per targeted parameter of the module and
      // stacks r rows per expert into A ([r * experts, in]).
      if (static_cast<size_t>(where.second) >= params.size()) {
        return absl::InvalidArgumentError(
            absl::StrCat("tensor \"", p.a->name, "\": ", where.second,
                         " base_layer wrapper(s), but target_parameters names ", params.size(),
                         " parameter(s) of module \"", key, "\""));
      }
      bool fits = false;
      for (const std::string& param : params) fits |= rank % config.RankFor(param) == 0;
      if (!fits) {
        return absl::InvalidArgumentError(
            absl::StrCat("module \"", key, "\" (target_parameters): lora_A has ", rank,
                         " rows, not a multiple of the rank the config gives its parameters"));
      }
      continue;
    }
    int want = config.RankFor(key);
    if (rank != want) {
      return absl::InvalidArgumentError(absl::StrCat("module \"", key, "\": weights have rank ",
                                                     rank, " but the config gives it r = ", want));
    }
  }
  for (const auto& [t, n] : extras) {
    auto pair = modules.find({n.module_key, 0});
    const TensorView* b = pair == modules.end() ? nullptr : pair->second.b;
    switch (n.kind) {
      case PeftTensorKind::kLoraBias:
      case PeftTensorKind::kMagnitude: {
        const bool dora = n.kind == PeftTensorKind::kMagnitude;
        if (dora ? !config.use_dora : !config.lora_bias) {
          return BadTensor(*t, dora ? "a DoRA magnitude vector, but use_dora is not true"
                                    : "a lora_B bias, but lora_bias is not true");
        }
        if (b == nullptr) return BadTensor(*t, "its module has no LoRA A/B weights");
        if (t->shape.size() != 1 || t->shape[0] != b->shape[0]) {
          return BadTensor(*t, absl::StrCat(dora ? "DoRA magnitude" : "lora_B bias", " has shape ",
                                            ShapeString(t->shape), ", want [", b->shape[0],
                                            "] (the out size of ", b->name, ")"));
        }
        break;
      }
      case PeftTensorKind::kTrainableTokens: {
        const std::vector<int64_t>* ids = TokenIndicesFor(config, n.module_key);
        if (ids == nullptr) {
          return BadTensor(*t,
                           "trainable token deltas, but trainable_token_indices names no "
                           "such module");
        }
        if (t->shape.size() != 2 || t->shape[0] != static_cast<int64_t>(ids->size())) {
          return BadTensor(*t, absl::StrCat("trainable token delta has shape ",
                                            ShapeString(t->shape), ", want [", ids->size(),
                                            ", dim] (one row per trainable_token_indices entry)"));
        }
        break;
      }
      case PeftTensorKind::kOther:
        if (OtherTensorFeature(config, t->name, n) == 0) {
          return BadTensor(*t,
                           "not a PEFT LoRA weight (<module>.lora_A.weight, .lora_B.weight, "
                           ".lora_embedding_A/B, .lora_B.bias, .lora_magnitude_vector) and no "
                           "config feature saves it (modules_to_save, bias, base_layer weights)");
        }
        break;
      case PeftTensorKind::kLora:
        break;
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<PeftAdapter> ReadPeftDir(const std::string& dir) {
  const std::string config_path = absl::StrCat(dir, "/", kConfigFile);
  const std::string weights_path = absl::StrCat(dir, "/", kWeightsFile);
  auto text = ReadFileToString(config_path);
  if (!text.ok()) return text.status();
  auto config = ParseLoraConfig(*text);
  if (!config.ok()) return PrefixPath(config.status(), dir);
  std::error_code ec;
  if (!std::filesystem::exists(weights_path, ec) &&
      std::filesystem::exists(absl::StrCat(dir, "/adapter_model.bin"), ec)) {
    return absl::UnimplementedError(absl::StrCat(
        dir, ": adapter_model.bin (pickle) is not supported; save the adapter as safetensors"));
  }
  LORADB_ASSIGN_OR_RETURN(TensorSet tensors, safetensors::ReadFile(weights_path));
  absl::Status st = ValidateLoraTensors(*config, tensors.tensors());
  if (!st.ok()) return PrefixPath(st, weights_path);
  return PeftAdapter{std::move(*config), std::move(tensors)};
}

absl::Status WritePeftDir(const std::string& dir, const LoraConfig& config,
                          const std::vector<TensorView>& tensors) {
  LORADB_ASSIGN_OR_RETURN(std::string json, config.ToJson());
  LORADB_RETURN_IF_ERROR(ValidateLoraTensors(config, tensors));
  LORADB_RETURN_IF_ERROR(CreateDirectories(dir));
  // Weights first: a directory whose config exists always has its weights.
  LORADB_RETURN_IF_ERROR(
      safetensors::WriteFile(absl::StrCat(dir, "/", kWeightsFile), tensors, {{"format", "pt"}}));
  return WriteFileAtomic(absl::StrCat(dir, "/", kConfigFile), json);
}

}  // namespace loradb::peft
