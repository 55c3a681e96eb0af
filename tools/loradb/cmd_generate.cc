// `loradb generate`: runs the multi-LoRA decoder (compute/decoder) on token-id prompts, each
// with an adapter from the store (`--adapter POLICY:ALIAS`, `POLICY@SEQ`, a revision id) or the
// base alone, and prints the generated token ids. Built only with LibTorch.
#ifdef LORADB_COMPUTE_AVAILABLE

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "compute/decoder/decoder_tools.h"
#include "tools/loradb/command.h"

namespace loradb::cli {
namespace {

absl::StatusOr<std::vector<int64_t>> ParseIdList(const std::string& flag, const std::string& text,
                                                 bool allow_empty) {
  std::vector<int64_t> ids;
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    int64_t id = 0;
    if (!absl::SimpleAtoi(part, &id)) {
      return absl::InvalidArgumentError(absl::StrCat(flag, ": \"", part, "\" is not an integer"));
    }
    ids.push_back(id);
  }
  if (ids.empty() && !allow_empty) {
    return absl::InvalidArgumentError(absl::StrCat(flag, ": no token ids"));
  }
  return ids;
}

struct GenerateArgs {
  std::string model, stop, dtype;
  std::vector<std::string> prompts, adapters;
  int64_t max_tokens = 16, top_k = 0;
  double temperature = 0, top_p = 1;
  uint64_t seed = 0;
  bool logits = false, json = false;
};

void SetupGenerate(CLI::App* sub, Invocation* inv) {
  auto a = std::make_shared<GenerateArgs>();
  sub->add_option("--model", a->model, "base checkpoint directory (config.json + safetensors)")
      ->required();
  sub->add_option("--prompt-ids", a->prompts,
                  "comma-separated token ids; repeat for several prompts decoded in one batch")
      ->required();
  sub->add_option("--adapter", a->adapters,
                  "POLICY:ALIAS, POLICY@SEQ or a revision id from --store; one for all prompts "
                  "or one per prompt (default: the base alone)");
  sub->add_option("--max-tokens", a->max_tokens, "tokens to generate per prompt (default 16)");
  sub->add_option("--stop-ids", a->stop, "comma-separated stop token ids");
  sub->add_option("--temperature", a->temperature, "0 = greedy (default)");
  sub->add_option("--top-k", a->top_k, "sample among the k most likely tokens (0: all)");
  sub->add_option("--top-p", a->top_p, "nucleus sampling mass (default 1)");
  sub->add_option("--seed", a->seed, "sampling seed (prompt i uses seed + i)");
  sub->add_option("--dtype", a->dtype, "compute dtype f32 | bf16 | f16 (default: weights')");
  sub->add_flag("--logits", a->logits,
                "with --json: also print the logits of every position (prompt and generated)");
  AddJsonFlag(sub, &a->json);
  sub->callback([inv, a] {
    inv->run = [inv, a]() -> absl::Status {
      decoder::GenerateToolRequest req;
      req.model_dir = a->model;
      req.store_dir = inv->global.store;
      for (const std::string& p : a->prompts) {
        absl::StatusOr<std::vector<int64_t>> ids = ParseIdList("--prompt-ids", p, false);
        if (!ids.ok()) return ids.status();
        req.prompts.push_back(std::move(*ids));
      }
      if (a->adapters.empty()) {
        req.adapters.assign(req.prompts.size(), "");
      } else if (a->adapters.size() == 1) {
        req.adapters.assign(req.prompts.size(), a->adapters[0]);
      } else if (a->adapters.size() == req.prompts.size()) {
        req.adapters = a->adapters;
      } else {
        return absl::InvalidArgumentError(absl::StrCat("--adapter given ", a->adapters.size(),
                                                       " times for ", req.prompts.size(),
                                                       " prompts: give one, or one per prompt"));
      }
      absl::StatusOr<std::vector<int64_t>> stop = ParseIdList("--stop-ids", a->stop, true);
      if (!stop.ok()) return stop.status();
      req.stop_token_ids = *stop;
      req.max_new_tokens = a->max_tokens;
      req.temperature = a->temperature;
      req.top_k = a->top_k;
      req.top_p = a->top_p;
      req.seed = a->seed;
      req.dtype = a->dtype;
      req.record_logits = a->logits;
      if (a->logits && !a->json) return absl::InvalidArgumentError("--logits needs --json");
      absl::StatusOr<std::vector<decoder::GenerateToolResult>> res = decoder::RunGenerate(req);
      if (!res.ok()) return res.status();
      if (a->json) {
        nlohmann::json out = nlohmann::json::array();
        for (size_t i = 0; i < res->size(); ++i) {
          const decoder::GenerateToolResult& r = (*res)[i];
          nlohmann::json j = {{"prompt_ids", req.prompts[i]}, {"adapter", req.adapters[i]},
                              {"revision", r.revision},       {"tokens", r.tokens},
                              {"finish", r.finish},           {"deferred_steps", r.deferred_steps}};
          if (a->logits) j["logits"] = r.logits;
          out.push_back(std::move(j));
        }
        PrintJson(req.prompts.size() == 1 ? out[0] : nlohmann::json{{"results", out}});
      } else {
        for (const decoder::GenerateToolResult& r : *res) {
          std::printf("%s\n", absl::StrJoin(r.tokens, ",").c_str());
        }
      }
      return absl::OkStatus();
    };
  });
}

LORADB_REGISTER_COMMAND("generate",
                        "generate token ids with the base model and adapters from the store",
                        SetupGenerate);

}  // namespace
}  // namespace loradb::cli

#endif  // LORADB_COMPUTE_AVAILABLE
