// libFuzzer target for the JSON loradb reads from users (tools/dev fuzz json_inputs SECONDS):
// request bodies and module tables (ParseJson, CheckModuleTable), config.json
// (ParseModelConfigJson) and adapter_config.json (peft::ParseLoraConfig). Whatever the bytes,
// each must return a status without crashing or recursing past the depth limit; what one
// accepts must satisfy its contract (a bounded, valid config whose ToJson reads back equal; an
// adapter config whose ToJson reads back).
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "storage/formats/model_config.h"
#include "storage/formats/peft.h"
#include "storage/util/json.h"

namespace {

void Check(bool ok) {
  if (!ok) std::abort();
}

// Nesting depth of a parsed value, without recursion.
int Depth(const nlohmann::json& root) {
  int deepest = 0;
  std::vector<std::pair<const nlohmann::json*, int>> stack = {{&root, 0}};
  while (!stack.empty()) {
    auto [v, d] = stack.back();
    stack.pop_back();
    if (!v->is_structured()) continue;
    deepest = std::max(deepest, d + 1);
    for (const auto& child : *v) stack.push_back({&child, d + 1});
  }
  return deepest;
}

// A request body of `POST /v1/bases` in its module-table form, as the routes read it.
void FuzzModuleTable(const nlohmann::json& body) {
  if (!body.is_object() || !body.contains("modules") || !body["modules"].is_array()) return;
  std::vector<loradb::ModuleShape> modules;
  for (const auto& m : body["modules"]) {
    if (!m.is_object() || !m.contains("name") || !m["name"].is_string() || !m.contains("in") ||
        !m["in"].is_number_integer() || !m.contains("out") || !m["out"].is_number_integer()) {
      return;
    }
    modules.push_back(
        {m["name"].get<std::string>(), m["in"].get<int64_t>(), m["out"].get<int64_t>()});
  }
  if (!loradb::CheckModuleTable(modules).ok()) return;
  for (const auto& m : modules) {
    Check(m.in >= 1 && m.out >= 1 && m.in * m.out <= loradb::ModelLimits::kModuleElements);
  }
}

void FuzzModelConfig(const std::string& text) {
  auto c = loradb::ParseModelConfigJson(text);
  if (!c.ok()) return;
  Check(c->Validate().ok());
  // Small module tables are built (a large one is bounded but slow to build per input).
  const int64_t per_layer = c->is_moe() ? 5 + 3 * c->num_experts : 7;
  if (c->num_hidden_layers * per_layer <= 4096) {
    std::vector<loradb::ModuleShape> modules = c->LoraModules();
    Check(loradb::CheckModuleTable(modules).ok());
  }
  auto again = loradb::ParseModelConfigJson(c->ToJson());
  Check(again.ok());
  Check(again->ToJson() == c->ToJson());
}

void FuzzAdapterConfig(const std::string& text) {
  auto c = loradb::peft::ParseLoraConfig(text);
  if (!c.ok()) return;
  auto json = c->ToJson();
  if (!json.ok()) return;
  Check(loradb::peft::ParseLoraConfig(*json).ok());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto parsed = loradb::ParseJson(text, "input");
  if (parsed.ok()) {
    Check(Depth(*parsed) <= loradb::kMaxJsonDepth);
    // dump() and copies recurse over nesting: bounded by the depth limit.
    auto again = loradb::ParseJson(parsed->dump(), "dump");
    Check(again.ok() && *again == *parsed);
    FuzzModuleTable(*parsed);
    // A body's "config" object reaches the config reader as text, as in the routes.
    if (parsed->is_object() && parsed->contains("config"))
      FuzzModelConfig((*parsed)["config"].dump());
  }
  FuzzModelConfig(text);
  FuzzAdapterConfig(text);
  return 0;
}
