// libFuzzer target for the chat template engine (tools/dev fuzz chat_template SECONDS): the input
// is template text. Whatever the bytes, parsing returns a status and a template that parses
// renders a small conversation into text or a status, within the limits: no crash, no hang, no
// output past the output limit.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "text/jinja/template.h"
#include "text/jinja/value.h"

namespace {

using loradb::text::jinja::Limits;
using loradb::text::jinja::Template;
using loradb::text::jinja::Value;

void Check(bool ok) {
  if (!ok) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Limits limits;
  limits.max_template_bytes = 64 << 10;
  limits.max_output_bytes = 1 << 20;
  limits.max_loop_iterations = 1 << 14;
  limits.max_steps = 200'000;
  limits.max_call_depth = 16;
  limits.max_nesting = 64;
  const std::string source(reinterpret_cast<const char*>(data), size);
  auto parsed = Template::Parse(source, limits);
  if (!parsed.ok()) return 0;
  static const auto messages = loradb::text::jinja::ParseJson(
      R"([{"role": "system", "content": "sys"}, {"role": "user", "content": "hi é"},
          {"role": "assistant", "content": null, "tool_calls": [{"function": {"name": "f",
           "arguments": {"a": 1}}}]}, {"role": "tool", "content": "r"}])",
      "messages");
  Check(messages.ok());
  std::vector<std::pair<std::string, Value>> vars = {
      {"messages", *messages},
      {"bos_token", Value::String("<s>")},
      {"eos_token", Value::String("</s>")},
      {"add_generation_prompt", Value::Bool(true)},
      {"tools", Value::None()}};
  auto text = (*parsed)->Render(vars);
  if (text.ok()) Check(text->size() <= limits.max_output_bytes);
  return 0;
}
