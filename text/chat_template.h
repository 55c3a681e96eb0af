// A model's chat template, rendered as transformers' apply_chat_template(messages, tokenize=False)
// renders it: the Jinja template from the model directory's chat_template.jinja, or the
// "chat_template" of its tokenizer_config.json (a string, or a list of named templates), with the
// special tokens tokenizer_config.json names (bos_token, eos_token, unk_token, sep_token,
// pad_token, cls_token, mask_token) as variables. Parsed once; Render is thread-safe, so one
// object serves every request. The engine is text/jinja/template.h; see docs/chat-template.md.
#ifndef LORADB_TEXT_CHAT_TEMPLATE_H_
#define LORADB_TEXT_CHAT_TEMPLATE_H_

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "text/jinja/template.h"

namespace loradb::text {

class ChatTemplate {
 public:
  // Reads `path`: a model directory (chat_template.jinja, else tokenizer_config.json's
  // chat_template; special tokens from tokenizer_config.json when present), a tokenizer_config.json
  // file, or a .jinja file. NotFound when there is no template; InvalidArgument naming the file
  // and the template's syntax error or unsupported construct.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<ChatTemplate>> Load(
      const std::string& path, jinja::Limits limits = {});

  // A template from its source with the given special tokens (name, content).
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<ChatTemplate>> FromSource(
      absl::string_view source, std::vector<std::pair<std::string, std::string>> special_tokens,
      jinja::Limits limits = {});

  struct Request {
    std::string messages_json;  // a JSON array of message objects
    bool add_generation_prompt = false;
    std::string tools_json;      // a JSON array, or empty for none
    std::string documents_json;  // a JSON array, or empty for none
    std::string extra_json;      // a JSON object of more variables (enable_thinking, ...)
    std::string template_name;   // for a list of named templates; empty: as transformers
                                 // picks ("tool_use" with tools, else "default")
  };

  // The rendered prompt. As apply_chat_template does first, keys of a message whose value is null
  // are dropped and reasoning given as reasoning_content / thinking / reasoning is passed under
  // all of those names. Errors: InvalidArgument for bad JSON, messages that are not objects, a
  // variable named messages/tools/documents/add_generation_prompt in extra_json, the template's
  // runtime errors and raise_exception() (its message); ResourceExhausted past a limit.
  [[nodiscard]] absl::StatusOr<std::string> Render(const Request& request) const;

  // The special tokens given to the template, as (name, content).
  const std::vector<std::pair<std::string, std::string>>& special_tokens() const {
    return special_tokens_;
  }
  // The names of the templates (one, "default", for a single template).
  std::vector<std::string> names() const;

 private:
  ChatTemplate() = default;
  std::vector<std::pair<std::string, std::shared_ptr<const jinja::Template>>> templates_;
  std::vector<std::pair<std::string, std::string>> special_tokens_;
};

}  // namespace loradb::text

#endif  // LORADB_TEXT_CHAT_TEMPLATE_H_
