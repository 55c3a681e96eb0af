// Scenario `chat_template`: time to render a chat prompt with text/chat_template.h, per request,
// for a typical 4-turn conversation (system, user, assistant, user; add_generation_prompt) with
// the Llama 3.1-style and Qwen3-style templates of tests/testdata/chat_templates. The template is
// parsed once, as a server does at startup; the figure is the render time (messages JSON in,
// prompt out). The goal: under 1% of a ~10 ms decode step, i.e. under 100 us.
//
//   loradb-bench chat_template [--requests N]
#include <CLI/CLI.hpp>
#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bench/bench_util.h"
#include "storage/util/status_macros.h"
#include "text/chat_template.h"

namespace loradb::bench {
namespace {

constexpr char kBench[] = "chat_template";
constexpr char kMessages[] = R"([
  {"role": "system", "content": "You are a helpful assistant that answers briefly and precisely."},
  {"role": "user", "content": "What is the capital of France, and roughly how many people live there?"},
  {"role": "assistant", "content": "Paris; about 2.1 million people live in the city proper and about 12 million in the metropolitan area."},
  {"role": "user", "content": "And which river runs through it? Answer in one sentence, please."}
])";

absl::Status Run(const std::vector<std::string>& args) {
  int requests = 20000;
  CLI::App app("chat_template: render time of a 4-turn chat prompt", kBench);
  app.add_option("--requests", requests, "renders timed per template")->check(CLI::PositiveNumber);
  LORADB_RETURN_IF_ERROR(ParseFlags(&app, args));
  for (const char* name : {"llama3", "qwen3"}) {
    const std::string path =
        absl::StrCat(SourceDir(), "/tests/testdata/chat_templates/", name, ".jinja");
    LORADB_ASSIGN_OR_RETURN(std::unique_ptr<text::ChatTemplate> chat,
                            text::ChatTemplate::Load(path));
    text::ChatTemplate::Request request;
    request.messages_json = kMessages;
    request.add_generation_prompt = true;
    size_t bytes = 0;
    double best = 0;
    for (int rep = 0; rep < 3; ++rep) {
      const double t0 = NowSeconds();
      for (int i = 0; i < requests; ++i) {
        LORADB_ASSIGN_OR_RETURN(std::string prompt, chat->Render(request));
        bytes = prompt.size();
      }
      const double s = (NowSeconds() - t0) / requests;
      best = rep == 0 ? s : std::min(best, s);
    }
    const double us = best * 1e6;
    Emit({{"bench", kBench},
          {"case", "render_4_turns"},
          {"template", name},
          {"prompt_bytes", bytes},
          {"render_us", us}});
    EmitGoal(kBench, absl::StrCat("render_4_turns_", name, "_us"), us,
             "< 100 us (1% of a ~10 ms decode step)", us < 100);
  }
  return absl::OkStatus();
}

LORADB_REGISTER_SCENARIO({kBench,
                          "chat template render time per request (4-turn conversation, Llama "
                          "3.1-style and Qwen3-style templates)",
                          Run,
                          {"--requests", "5000"}});

}  // namespace
}  // namespace loradb::bench
