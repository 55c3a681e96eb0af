#include "storage/formats/peft.h"

// GCC 12 reports a false -Wmaybe-uninitialized inside libstdc++'s <regex> automaton when
// building with -fsanitize=address (std::function moves in _NFA::_M_insert_*); the location is
// in system headers included before any local push/pop could cover it.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#include <cmath>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
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

absl::Status Unsupported(absl::string_view feature, absl::string_view value) {
  return absl::UnimplementedError(absl::StrCat("adapter_config.json: ", feature, " = ", value,
                                               " is not supported by loradb (plain LoRA only)"));
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
  // Features that change the math or add tensors loradb does not carry.
  auto flag = [&](const char* key) {
    auto it = j.find(key);
    return it != j.end() && it->is_boolean() && it->get<bool>();
  };
  for (const char* key : {"use_dora", "fan_in_fan_out", "lora_bias", "use_qalora"}) {
    if (flag(key)) return Unsupported(key, "true");
  }
  for (const char* key : {"modules_to_save", "layer_replication", "trainable_token_indices",
                          "target_parameters", "alora_invocation_tokens"}) {
    auto it = j.find(key);
    if (it != j.end() && !IsNullOrEmpty(*it)) return Unsupported(key, it->dump());
  }
  if (auto it = j.find("bias"); it != j.end() && !it->is_null()) {
    if (!it->is_string() || it->get<std::string>() != "none")
      return Unsupported("bias", it->dump());
  }

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
  std::string why;
  if (absl::StrContains(name, "lora_magnitude_vector")) {
    why = " (a DoRA magnitude vector: use_dora is not supported)";
  } else if (absl::StrContains(name, "modules_to_save")) {
    why = " (a modules_to_save weight: not supported)";
  } else if (absl::EndsWith(name, ".base_layer.weight")) {
    why =
        " (a full base-layer weight, saved by PEFT's save_embedding_layers: re-save the adapter "
        "with save_embedding_layers=False)";
  } else if (absl::EndsWith(name, ".bias")) {
    why = " (a bias: only bias = \"none\" is supported)";
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

absl::Status ValidateLoraTensors(const LoraConfig& config, const std::vector<TensorView>& tensors) {
  struct Pair {
    const TensorView* a = nullptr;
    const TensorView* b = nullptr;
    bool embedding = false;
  };
  std::map<std::string, Pair> modules;
  for (const TensorView& t : tensors) {
    LORADB_ASSIGN_OR_RETURN(PeftTensorName n, ParsePeftTensorName(t.name));
    bool floating = t.dtype == DType::kF16 || t.dtype == DType::kBF16 || t.dtype == DType::kF32 ||
                    t.dtype == DType::kF64;
    if (!floating) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor \"", t.name, "\": dtype ", DTypeName(t.dtype), " is not a floating type"));
    }
    if (t.shape.size() != 2) {
      return absl::UnimplementedError(
          absl::StrCat("tensor \"", t.name, "\" has shape ", ShapeString(t.shape),
                       ": only 2-D LoRA weights (linear and embedding layers) are supported"));
    }
    Pair& p = modules[n.module_key];
    if (p.a != nullptr || p.b != nullptr) {
      if (p.embedding != n.embedding) {
        return absl::InvalidArgumentError(absl::StrCat(
            "tensor \"", t.name, "\": module mixes lora_embedding and lora_A/B weights"));
      }
    }
    p.embedding = n.embedding;
    const TensorView*& slot = n.side == LoraSide::kA ? p.a : p.b;
    if (slot != nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor \"", t.name, "\" repeats \"", slot->name, "\""));
    }
    slot = &t;
  }
  for (const auto& [key, p] : modules) {
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
    int want = config.RankFor(key);
    if (rank != want) {
      return absl::InvalidArgumentError(absl::StrCat("module \"", key, "\": weights have rank ",
                                                     rank, " but the config gives it r = ", want));
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
