#include "text/chat_template.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "storage/util/status_macros.h"

namespace loradb::text {
namespace {

using jinja::Value;

constexpr const char* kSpecialNames[] = {"bos_token", "eos_token", "unk_token", "sep_token",
                                         "pad_token", "cls_token", "mask_token"};
constexpr const char* kReasoningFields[] = {"reasoning_content", "thinking", "reasoning"};

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) return absl::DataLossError(absl::StrCat(path, ": read error"));
  return text.str();
}

absl::Status Annotate(const absl::Status& s, absl::string_view origin) {
  return absl::Status(s.code(), absl::StrCat(origin, ": ", s.message()));
}

// A message as apply_chat_template passes it on: keys with null values dropped, reasoning under
// each of its names ({"thinking": r, **message, "reasoning_content": r}).
Value NormalizeMessage(const Value& message) {
  Value out = Value::MakeDict();
  Value reasoning;
  for (const char* field : kReasoningFields) {
    const Value* r = message.dict().Find(field);
    if (r != nullptr && !r->is_none()) {
      reasoning = *r;
      break;
    }
  }
  if (!reasoning.is_undefined()) out.mutable_dict().Set("thinking", reasoning);
  for (const auto& [k, v] : message.dict().entries) {
    if (!v.is_none()) out.mutable_dict().Set(k, v);
  }
  if (!reasoning.is_undefined()) out.mutable_dict().Set("reasoning_content", reasoning);
  return out;
}

}  // namespace

absl::StatusOr<std::unique_ptr<ChatTemplate>> ChatTemplate::FromSource(
    absl::string_view source, std::vector<std::pair<std::string, std::string>> special_tokens,
    jinja::Limits limits) {
  std::unique_ptr<ChatTemplate> t(new ChatTemplate());
  LORADB_ASSIGN_OR_RETURN(auto parsed, jinja::Template::Parse(source, limits));
  t->templates_.emplace_back("default", std::move(parsed));
  t->special_tokens_ = std::move(special_tokens);
  return t;
}

absl::StatusOr<std::unique_ptr<ChatTemplate>> ChatTemplate::Load(const std::string& path,
                                                                 jinja::Limits limits) {
  std::error_code ec;
  std::string config_path, jinja_path;
  if (std::filesystem::is_directory(path, ec)) {
    config_path = (std::filesystem::path(path) / "tokenizer_config.json").string();
    jinja_path = (std::filesystem::path(path) / "chat_template.jinja").string();
    if (!std::filesystem::exists(jinja_path, ec)) jinja_path.clear();
    if (!std::filesystem::exists(config_path, ec)) config_path.clear();
  } else if (absl::EndsWith(path, ".jinja")) {
    jinja_path = path;
  } else {
    config_path = path;
  }
  std::unique_ptr<ChatTemplate> t(new ChatTemplate());
  Value config;
  if (!config_path.empty()) {
    LORADB_ASSIGN_OR_RETURN(std::string text, ReadFile(config_path));
    LORADB_ASSIGN_OR_RETURN(config, jinja::ParseJson(text, config_path));
    if (!config.is_dict()) {
      return absl::InvalidArgumentError(absl::StrCat(config_path, ": expected a JSON object"));
    }
    for (const char* name : kSpecialNames) {
      const Value* v = config.dict().Find(name);
      if (v == nullptr || v->is_none()) continue;
      if (v->is_string()) {
        t->special_tokens_.emplace_back(name, v->str());
      } else if (v->is_dict() && v->dict().Find("content") != nullptr &&
                 v->dict().Find("content")->is_string()) {
        t->special_tokens_.emplace_back(name, v->dict().Find("content")->str());
      } else {
        return absl::InvalidArgumentError(
            absl::StrCat(config_path, ": ", name, " is neither a string nor {\"content\": ...}"));
      }
    }
  }
  if (!jinja_path.empty()) {
    LORADB_ASSIGN_OR_RETURN(std::string source, ReadFile(jinja_path));
    auto parsed = jinja::Template::Parse(source, limits);
    if (!parsed.ok()) return Annotate(parsed.status(), jinja_path);
    t->templates_.emplace_back("default", *std::move(parsed));
    return t;
  }
  const Value* chat = config.is_dict() ? config.dict().Find("chat_template") : nullptr;
  if (chat == nullptr || chat->is_none()) {
    return absl::NotFoundError(
        absl::StrCat(path,
                     ": no chat template (neither chat_template.jinja nor a chat_template in "
                     "tokenizer_config.json)"));
  }
  if (chat->is_string()) {
    auto parsed = jinja::Template::Parse(chat->str(), limits);
    if (!parsed.ok()) return Annotate(parsed.status(), config_path + ": chat_template");
    t->templates_.emplace_back("default", *std::move(parsed));
    return t;
  }
  if (!chat->is_list()) {
    return absl::InvalidArgumentError(
        absl::StrCat(config_path, ": chat_template is neither a string nor a list"));
  }
  for (const Value& item : chat->items()) {
    const Value* name = item.is_dict() ? item.dict().Find("name") : nullptr;
    const Value* source = item.is_dict() ? item.dict().Find("template") : nullptr;
    if (name == nullptr || source == nullptr || !name->is_string() || !source->is_string()) {
      return absl::InvalidArgumentError(
          absl::StrCat(config_path, ": each chat_template entry needs a string name and template"));
    }
    auto parsed = jinja::Template::Parse(source->str(), limits);
    if (!parsed.ok()) {
      return Annotate(parsed.status(),
                      absl::StrCat(config_path, ": chat_template \"", name->str(), "\""));
    }
    t->templates_.emplace_back(name->str(), *std::move(parsed));
  }
  if (t->templates_.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(config_path, ": chat_template is empty"));
  }
  return t;
}

std::vector<std::string> ChatTemplate::names() const {
  std::vector<std::string> out;
  for (const auto& [name, t] : templates_) out.push_back(name);
  return out;
}

absl::StatusOr<std::string> ChatTemplate::Render(const Request& request) const {
  LORADB_ASSIGN_OR_RETURN(Value messages, jinja::ParseJson(request.messages_json, "messages"));
  if (!messages.is_list()) return absl::InvalidArgumentError("messages: expected a JSON array");
  std::vector<Value> normalized;
  for (size_t i = 0; i < messages.items().size(); ++i) {
    const Value& m = messages.items()[i];
    if (!m.is_dict()) {
      return absl::InvalidArgumentError(
          absl::StrCat("messages[", i, "]: expected a JSON object, got ", m.TypeName()));
    }
    normalized.push_back(NormalizeMessage(m));
  }
  Value tools = Value::None(), documents = Value::None();
  if (!request.tools_json.empty()) {
    LORADB_ASSIGN_OR_RETURN(tools, jinja::ParseJson(request.tools_json, "tools"));
    if (!tools.is_list() && !tools.is_none()) {
      return absl::InvalidArgumentError("tools: expected a JSON array");
    }
  }
  if (!request.documents_json.empty()) {
    LORADB_ASSIGN_OR_RETURN(documents, jinja::ParseJson(request.documents_json, "documents"));
    if (!documents.is_list() && !documents.is_none()) {
      return absl::InvalidArgumentError("documents: expected a JSON array");
    }
  }
  // The template: by name; else as transformers picks among named ones.
  const jinja::Template* chosen = nullptr;
  const auto find = [&](absl::string_view name) -> const jinja::Template* {
    for (const auto& [n, t] : templates_) {
      if (n == name) return t.get();
    }
    return nullptr;
  };
  if (!request.template_name.empty()) {
    chosen = find(request.template_name);
    if (chosen == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("no chat template named \"", request.template_name,
                       "\" (have: ", absl::StrJoin(names(), ", "), ")"));
    }
  } else if (templates_.size() == 1) {
    chosen = templates_[0].second.get();
  } else {
    if (tools.is_list()) chosen = find("tool_use");
    if (chosen == nullptr) chosen = find("default");
    if (chosen == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("the model has several chat templates and none is named \"default\" (have: ",
                       absl::StrJoin(names(), ", "), ")"));
    }
  }
  std::vector<std::pair<std::string, Value>> vars;
  for (const auto& [name, content] : special_tokens_)
    vars.emplace_back(name, Value::String(content));
  if (!request.extra_json.empty()) {
    LORADB_ASSIGN_OR_RETURN(Value extra, jinja::ParseJson(request.extra_json, "extra variables"));
    if (!extra.is_dict()) return absl::InvalidArgumentError("extra variables: expected an object");
    for (const auto& [k, v] : extra.dict().entries) {
      if (k == "messages" || k == "tools" || k == "documents" || k == "add_generation_prompt") {
        return absl::InvalidArgumentError(
            absl::StrCat("extra variables: \"", k, "\" is set by the request itself"));
      }
      vars.emplace_back(k, v);
    }
  }
  vars.emplace_back("messages", Value::MakeList(std::move(normalized)));
  vars.emplace_back("tools", tools);
  vars.emplace_back("documents", documents);
  vars.emplace_back("add_generation_prompt", Value::Bool(request.add_generation_prompt));
  return chosen->Render(vars);
}

}  // namespace loradb::text
