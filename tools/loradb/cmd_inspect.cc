// `loradb inspect PATH [--json]`: lists the tensors (name, dtype, shape, bytes), packed groups,
// metadata and, for PEFT directories, the LoRA config of a safetensors file, a sharded index, a
// PEFT directory or a loradb blob. Blobs are checksum-verified.
#include <cstdio>
#include <iostream>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "storage/formats/blob.h"
#include "storage/formats/detect.h"
#include "storage/formats/peft.h"
#include "storage/formats/safetensors.h"
#include "storage/util/file_util.h"
#include "storage/util/status_macros.h"
#include "tools/loradb/command.h"

namespace loradb::cli {
namespace {

using Json = nlohmann::ordered_json;

struct Inspection {
  TensorFormat format;
  TensorSet tensors;
  std::optional<peft::LoraConfig> config;
  std::optional<BlobLayout> layout;
};

absl::StatusOr<Inspection> Load(const std::string& path) {
  LORADB_ASSIGN_OR_RETURN(TensorFormat format, DetectTensorFormat(path));
  Inspection out{format, {}, std::nullopt, std::nullopt};
  switch (format) {
    case TensorFormat::kSafetensors: {
      LORADB_ASSIGN_OR_RETURN(out.tensors, safetensors::ReadFile(path));
      break;
    }
    case TensorFormat::kShardedIndex: {
      LORADB_ASSIGN_OR_RETURN(out.tensors, safetensors::ReadSharded(path));
      break;
    }
    case TensorFormat::kPeftDir: {
      LORADB_ASSIGN_OR_RETURN(PeftAdapter adapter, ReadPeftDir(path));
      out.config = std::move(adapter.config);
      out.tensors = std::move(adapter.tensors);
      break;
    }
    case TensorFormat::kBlob: {
      LORADB_ASSIGN_OR_RETURN(MappedFile mapped, MappedFile::Open(path));
      auto holder = std::make_shared<MappedFile>(std::move(mapped));
      auto set = ParseBlob(holder->bytes(), holder, /*verify_checksums=*/true);
      if (!set.ok()) {
        return absl::Status(set.status().code(), absl::StrCat(path, ": ", set.status().message()));
      }
      out.tensors = std::move(*set);
      auto stored = out.tensors.metadata().find(peft::kStoredConfigKey);
      if (stored != out.tensors.metadata().end()) {
        LORADB_ASSIGN_OR_RETURN(out.config, peft::ParseLoraConfig(stored->second));
      }
      LORADB_ASSIGN_OR_RETURN(BlobLayout layout, ParseBlobLayout(holder->bytes(), holder->size()));
      out.layout = std::move(layout);
      break;
    }
  }
  return out;
}

Json ConfigJson(const peft::LoraConfig& c) {
  Json j;
  j["r"] = c.r;
  j["lora_alpha"] = c.lora_alpha;
  j["use_rslora"] = c.use_rslora;
  if (c.target_modules_is_regex) {
    j["target_modules"] = c.target_modules.empty() ? "" : c.target_modules[0];
  } else {
    j["target_modules"] = c.target_modules;
  }
  j["rank_pattern"] = Json::object();
  for (const auto& [k, v] : c.rank_pattern) j["rank_pattern"][k] = v;
  j["alpha_pattern"] = Json::object();
  for (const auto& [k, v] : c.alpha_pattern) j["alpha_pattern"][k] = v;
  j["base_model_name_or_path"] = c.base_model_name_or_path;
  j["fan_in_fan_out"] = c.fan_in_fan_out;
  j["use_dora"] = c.use_dora;
  j["lora_bias"] = c.lora_bias;
  j["bias"] = c.bias;
  j["modules_to_save"] = c.modules_to_save;
  j["target_parameters"] = c.target_parameters;
  Json tokens = Json::object();
  for (const auto& [module, ids] : c.trainable_token_indices) tokens[module] = ids;
  j["trainable_token_indices"] = std::move(tokens);
  return j;
}

// The names of the PEFT features (beyond plain LoRA) an adapter uses: a PEFT directory's, or a
// blob's as stored (LoRA on expert parameters is stored per expert).
std::vector<std::string> FeatureNames(const peft::LoraConfig& c, const TensorSet& tensors) {
  std::vector<std::string> names;
  uint32_t used = peft::PeftFeaturesUsed(c, tensors.tensors());
  if (tensors.metadata().count(peft::kStoredConfigKey) != 0) {
    std::vector<std::string> tensor_names;
    for (const TensorView& t : tensors.tensors()) tensor_names.push_back(t.name);
    used = peft::StoredAdapterFeatures(c, tensors.metadata(), tensor_names).value_or(used);
  }
  for (uint32_t bit = 1; bit != 0; bit <<= 1) {
    if ((used & bit) != 0) {
      names.emplace_back(peft::PeftFeatureName(static_cast<peft::PeftFeature>(bit)));
    }
  }
  if (c.fan_in_fan_out) names.emplace_back("fan_in_fan_out");
  return names;
}

Json ToJson(const std::string& path, const Inspection& in) {
  Json j;
  j["format"] = std::string(TensorFormatName(in.format));
  j["path"] = path;
  Json tensors = Json::array();
  for (const TensorView& t : in.tensors.tensors()) {
    tensors.push_back(Json{{"name", t.name},
                           {"dtype", std::string(DTypeName(t.dtype))},
                           {"shape", t.shape},
                           {"nbytes", t.nbytes}});
  }
  j["tensors"] = std::move(tensors);
  j["metadata"] = Json::object();
  for (const auto& [k, v] : in.tensors.metadata()) j["metadata"][k] = v;
  if (in.config) {
    j["config"] = ConfigJson(*in.config);
    j["features"] = FeatureNames(*in.config, in.tensors);
  }
  if (in.layout) {
    Json groups = Json::array();
    for (const BlobPackedGroup& g : in.layout->groups) {
      const BlobStoredTensor& s = in.layout->stored[g.stored_index];
      groups.push_back(Json{{"name", s.name},
                            {"dtype", std::string(DTypeName(s.dtype))},
                            {"shape", s.shape},
                            {"axis", g.axis},
                            {"members", g.members}});
    }
    j["groups"] = std::move(groups);
    j["stored_tensors"] = in.layout->stored.size();
    j["file_bytes"] = in.layout->file_size;
  }
  return j;
}

void PrintText(const std::string& path, const Inspection& in) {
  std::string out;
  absl::StrAppend(&out, "path:     ", path, "\n");
  absl::StrAppend(&out, "format:   ", TensorFormatName(in.format), "\n");
  absl::StrAppend(&out, "tensors:  ", in.tensors.size(), " (", in.tensors.total_bytes(),
                  " bytes)\n");
  if (in.layout) {
    absl::StrAppend(&out, "stored:   ", in.layout->stored.size(), " tensors, ",
                    in.layout->groups.size(), " packed groups, file ", in.layout->file_size,
                    " bytes\n");
  }
  if (in.tensors.metadata().empty()) {
    absl::StrAppend(&out, "metadata: (none)\n");
  } else {
    absl::StrAppend(&out, "metadata:\n");
    for (const auto& [k, v] : in.tensors.metadata()) absl::StrAppend(&out, "  ", k, " = ", v, "\n");
  }
  if (in.config) {
    const peft::LoraConfig& c = *in.config;
    absl::StrAppend(&out, "config:\n  r: ", c.r, "\n  lora_alpha: ", c.lora_alpha,
                    "\n  use_rslora: ", c.use_rslora ? "true" : "false",
                    "\n  target_modules: ", c.target_modules_is_regex ? "regex " : "", "[",
                    absl::StrJoin(c.target_modules, ", "), "]\n  rank_pattern: {");
    absl::StrAppend(&out, absl::StrJoin(c.rank_pattern, ", ", absl::PairFormatter(": ")),
                    "}\n  alpha_pattern: {",
                    absl::StrJoin(c.alpha_pattern, ", ", absl::PairFormatter(": ")), "}\n");
    if (!c.base_model_name_or_path.empty()) {
      absl::StrAppend(&out, "  base_model_name_or_path: ", c.base_model_name_or_path, "\n");
    }
    if (!c.target_parameters.empty()) {
      absl::StrAppend(&out, "  target_parameters: [", absl::StrJoin(c.target_parameters, ", "),
                      "]\n");
    }
    if (!c.modules_to_save.empty()) {
      absl::StrAppend(&out, "  modules_to_save: [", absl::StrJoin(c.modules_to_save, ", "), "]\n");
    }
    const std::vector<std::string> features = FeatureNames(c, in.tensors);
    absl::StrAppend(&out,
                    "features: ", features.empty() ? "(plain LoRA)" : absl::StrJoin(features, "; "),
                    "\n");
  }
  if (in.layout && !in.layout->groups.empty()) {
    absl::StrAppend(&out, "groups:\n");
    for (const BlobPackedGroup& g : in.layout->groups) {
      const BlobStoredTensor& s = in.layout->stored[g.stored_index];
      absl::StrAppend(&out, "  ", s.name, " ", DTypeName(s.dtype), " ", ShapeString(s.shape),
                      " axis ", g.axis, ": ", g.members.size(), " members\n");
    }
  }
  absl::StrAppend(&out, "name\tdtype\tshape\tbytes\n");
  for (const TensorView& t : in.tensors.tensors()) {
    absl::StrAppend(&out, t.name, "\t", DTypeName(t.dtype), "\t", ShapeString(t.shape), "\t",
                    t.nbytes, "\n");
  }
  std::fwrite(out.data(), 1, out.size(), stdout);
}

void SetupInspect(CLI::App* sub, Invocation* inv) {
  auto path = std::make_shared<std::string>();
  auto json = std::make_shared<bool>(false);
  sub->add_option("path", *path,
                  "a .safetensors file, a model.safetensors.index.json, a PEFT adapter directory "
                  "or a loradb blob")
      ->required();
  AddJsonFlag(sub, json.get());
  sub->callback([inv, path, json] {
    inv->run = [path, json]() -> absl::Status {
      LORADB_ASSIGN_OR_RETURN(Inspection in, Load(*path));
      if (*json) {
        std::cout << ToJson(*path, in).dump(-1, ' ', false, Json::error_handler_t::replace) << "\n";
      } else {
        PrintText(*path, in);
      }
      return absl::OkStatus();
    };
  });
}

}  // namespace

LORADB_REGISTER_COMMAND("inspect",
                        "list the tensors, groups, metadata and LoRA config of a safetensors "
                        "file, sharded index, PEFT directory or blob",
                        SetupInspect);

}  // namespace loradb::cli
