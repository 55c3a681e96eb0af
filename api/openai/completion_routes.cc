#include "api/openai/completion_routes.h"

#include <algorithm>
#include <cmath>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <limits>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "api/http/reply_stream.h"
#include "api/http/router.h"
#include "storage/store/store.h"
#include "storage/util/json.h"
#include "storage/util/status_macros.h"

namespace loradb::openai {
namespace {

using nlohmann::json;

// The request fields read (vLLM's CompletionRequest names); anything else is refused by name.
const std::vector<std::string> kFields = {
    "model", "prompt", "max_tokens", "temperature", "top_p", "top_k", "seed", "stop",
    "stop_token_ids", "n", "logprobs", "echo", "stream", "stream_options", "user", "ignore_eos",
    "return_token_ids", "return_tokens_as_token_ids", "skip_special_tokens",
    "include_stop_str_in_output",
    // Accepted only at the value that leaves the math unchanged (see NeutralOnly).
    "presence_penalty", "frequency_penalty", "repetition_penalty", "min_p", "min_tokens", "best_of",
    "logit_bias", "suffix"};

absl::Status Invalid(const std::string& message) { return absl::InvalidArgumentError(message); }

absl::StatusOr<std::optional<double>> GetNumber(const json& obj, const std::string& key) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return std::optional<double>();
  if (!it->is_number()) return Invalid(absl::StrCat("'", key, "' must be a number"));
  const double v = it->get<double>();
  if (!std::isfinite(v)) return Invalid(absl::StrCat("'", key, "' must be finite"));
  return std::optional<double>(v);
}

absl::StatusOr<std::optional<int64_t>> GetInt(const json& obj, const std::string& key) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return std::optional<int64_t>();
  if (it->is_number_unsigned()) {
    const uint64_t v = it->get<uint64_t>();
    if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return Invalid(absl::StrCat("'", key, "' is out of range"));
    }
    return std::optional<int64_t>(static_cast<int64_t>(v));
  }
  if (!it->is_number_integer()) return Invalid(absl::StrCat("'", key, "' must be an integer"));
  return std::optional<int64_t>(it->get<int64_t>());
}

absl::StatusOr<bool> GetFlag(const json& obj, const std::string& key, bool fallback) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return fallback;
  if (!it->is_boolean()) return Invalid(absl::StrCat("'", key, "' must be true or false"));
  return it->get<bool>();
}

// Fields loradb does not implement are accepted only at their neutral value, so a request that
// asks for different math is refused by name rather than served differently.
absl::Status NeutralOnly(const json& body, int64_t n) {
  static const std::pair<const char*, double> kNeutral[] = {{"presence_penalty", 0},
                                                            {"frequency_penalty", 0},
                                                            {"repetition_penalty", 1},
                                                            {"min_p", 0},
                                                            {"min_tokens", 0}};
  for (const auto& [key, neutral] : kNeutral) {
    LORADB_ASSIGN_OR_RETURN(std::optional<double> v, GetNumber(body, key));
    if (v.has_value() && *v != neutral) {
      return Invalid(absl::StrCat("'", key, "' is not supported (only ", neutral, ")"));
    }
  }
  LORADB_ASSIGN_OR_RETURN(std::optional<int64_t> best_of, GetInt(body, "best_of"));
  if (best_of.has_value() && *best_of != n) {
    return Invalid("'best_of' is not supported (only equal to n)");
  }
  auto bias = body.find("logit_bias");
  if (bias != body.end() && !bias->is_null() && !(bias->is_object() && bias->empty())) {
    return Invalid("'logit_bias' is not supported");
  }
  auto suffix = body.find("suffix");
  if (suffix != body.end() && !suffix->is_null() && !(suffix->is_string() && suffix->empty())) {
    return Invalid("'suffix' is not supported");
  }
  auto user = body.find("user");
  if (user != body.end() && !user->is_null() && !user->is_string()) {
    return Invalid("'user' must be a string");
  }
  return absl::OkStatus();
}

// Number of code points of UTF-8 text (what Python's len gives; text_offset counts these).
int64_t CodePoints(const std::string& s) {
  int64_t n = 0;
  for (unsigned char ch : s) n += (ch & 0xC0) != 0x80;
  return n;
}

// The largest end <= `end` that does not cut a UTF-8 character of `s`.
size_t CharBoundary(const std::string& s, size_t end) {
  while (end > 0 && end < s.size() && (static_cast<unsigned char>(s[end]) & 0xC0) == 0x80) --end;
  return end;
}

struct Params {
  std::string model;
  std::vector<std::vector<int64_t>> prompts;
  std::vector<std::string> prompt_texts;   // for echo: the text sent, or the ids decoded
  std::optional<int64_t> max_tokens = 16;  // nullopt: the rest of the context
  double temperature = 1.0, top_p = 1.0;
  int64_t top_k = 0;
  uint64_t seed = 0;
  std::vector<std::string> stop;
  std::vector<int64_t> stop_ids;  // the request's (stop as ids, stop_token_ids)
  int64_t n = 1;
  int64_t logprobs = -1;
  bool echo = false, stream = false, include_usage = false, ignore_eos = false;
  bool return_token_ids = false, tokens_as_ids = false, skip_special = true;
  bool include_stop_str = false;
};

// One choice (prompt i, sample j) of a request, filled on the driver thread.
struct ChoiceState {
  int64_t index = 0;  // prompt * n + sample, as vLLM numbers choices
  std::unique_ptr<text::DecodeStream> decode;
  std::string text;               // generated text (a stop token's own text left out)
  size_t sent = 0;                // bytes of `text` already streamed
  std::optional<size_t> stop_at;  // where a stop string cut the text
  std::optional<std::string> stop_string;
  bool stopped_by_id = false;  // the last token is a stop id / eos
  int64_t offset = 0;          // text_offset of the next streamed token
};

struct PromptState {
  std::vector<ChoiceState> choices;
  uint64_t service_id = 0;
  serving::CompletionResult result;
  bool done = false;
};

struct RequestState {
  // What the driver-thread callbacks use: they never touch the Routes object, which may be
  // going away while the service's destructor finishes the last requests.
  std::shared_ptr<const text::Tokenizer> tokenizer;
  serving::CompletionService* service = nullptr;
  Params p;
  std::string id;
  int64_t created = 0;
  std::shared_ptr<http::ReplyStream> stream;
  std::vector<PromptState> prompts;
  std::set<int64_t> stop_set;  // the ids that end a sequence (request's + eos)
  size_t holdback = 0;         // bytes a streamed text keeps back while a stop string may start
  std::mutex mu;               // guards `remaining`, `failed`, `submitted`
  size_t remaining = 0;
  bool failed = false;
  std::vector<uint64_t> submitted;
};

class Routes {
 public:
  Routes(std::shared_ptr<serving::CompletionService> service, CompletionRoutesOptions options)
      : service_(std::move(service)), options_(std::move(options)) {}

  absl::StatusOr<http::Reply> Completions(const http::Call& call);
  absl::StatusOr<http::Reply> Models(const http::Call& call);
  json StatsJson() const;

 private:
  absl::StatusOr<Params> Parse(const json& body) const;
  absl::Status ParsePrompt(const json& prompt, Params* p) const;

  std::shared_ptr<serving::CompletionService> service_;
  CompletionRoutesOptions options_;
};

absl::Status Routes::ParsePrompt(const json& prompt, Params* p) const {
  auto encode = [&](const std::string& s) -> absl::Status {
    if (options_.tokenizer == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("text prompts need the base's tokenizer: no tokenizer.json at ",
                       options_.tokenizer_path, " (send token ids instead)"));
    }
    LORADB_ASSIGN_OR_RETURN(std::vector<int32_t> ids, options_.tokenizer->Encode(s));
    p->prompts.emplace_back(ids.begin(), ids.end());
    p->prompt_texts.push_back(s);
    return absl::OkStatus();
  };
  auto ids = [&](const json& list) -> absl::Status {
    std::vector<int64_t> out;
    for (const json& v : list) {
      if (v.is_number_unsigned()) {
        const uint64_t u = v.get<uint64_t>();
        if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
          return Invalid(absl::StrCat("prompt token id ", u, " is out of range"));
        }
        out.push_back(static_cast<int64_t>(u));
      } else if (v.is_number_integer()) {
        out.push_back(v.get<int64_t>());
      } else {
        return Invalid(
            "'prompt' must be a string, a list of strings, a list of token ids or a "
            "list of lists of token ids");
      }
    }
    p->prompts.push_back(std::move(out));
    p->prompt_texts.emplace_back();
    return absl::OkStatus();
  };
  if (prompt.is_string()) return encode(prompt.get<std::string>());
  if (!prompt.is_array() || prompt.empty()) {
    return Invalid("'prompt' must be a non-empty string or list");
  }
  if (prompt[0].is_string()) {
    for (const json& s : prompt) {
      if (!s.is_string()) return Invalid("'prompt': a list of strings must hold only strings");
      LORADB_RETURN_IF_ERROR(encode(s.get<std::string>()));
    }
    return absl::OkStatus();
  }
  if (prompt[0].is_array()) {
    for (const json& list : prompt) {
      if (!list.is_array()) return Invalid("'prompt': a list of lists must hold only lists");
      LORADB_RETURN_IF_ERROR(ids(list));
    }
    return absl::OkStatus();
  }
  return ids(prompt);
}

absl::StatusOr<Params> Routes::Parse(const json& body) const {
  Params p;
  LORADB_ASSIGN_OR_RETURN(std::optional<std::string> model, http::GetString(body, "model", false));
  p.model = model.value_or("");
  auto prompt = body.find("prompt");
  if (prompt == body.end() || prompt->is_null()) return Invalid("missing field 'prompt'");
  LORADB_RETURN_IF_ERROR(ParsePrompt(*prompt, &p));
  if (options_.tokenizer != nullptr && p.prompt_texts.size() == p.prompts.size()) {
    for (size_t i = 0; i < p.prompts.size(); ++i) {
      if (!p.prompt_texts[i].empty() || p.prompts[i].empty()) continue;
      std::vector<int32_t> ids;
      bool known = true;
      for (int64_t id : p.prompts[i]) {
        known = known && id >= 0 && id < options_.tokenizer->vocab_size();
        ids.push_back(static_cast<int32_t>(id));
      }
      if (!known) continue;  // Submit names the bad id
      absl::StatusOr<std::string> t = options_.tokenizer->Decode(ids, false);
      if (t.ok()) p.prompt_texts[i] = *t;
    }
  }
  if (body.contains("max_tokens")) {
    LORADB_ASSIGN_OR_RETURN(p.max_tokens, GetInt(body, "max_tokens"));
  }
  LORADB_ASSIGN_OR_RETURN(std::optional<double> temperature, GetNumber(body, "temperature"));
  p.temperature = temperature.value_or(1.0);
  if (p.temperature < 0) return Invalid("'temperature' must be >= 0");
  LORADB_ASSIGN_OR_RETURN(std::optional<double> top_p, GetNumber(body, "top_p"));
  p.top_p = top_p.value_or(1.0);
  if (!(p.top_p > 0 && p.top_p <= 1)) return Invalid("'top_p' must be in (0, 1]");
  LORADB_ASSIGN_OR_RETURN(std::optional<int64_t> top_k, GetInt(body, "top_k"));
  p.top_k = top_k.value_or(0);
  if (p.top_k == -1) p.top_k = 0;  // vLLM's "all tokens"
  if (p.top_k < 0) return Invalid("'top_k' must be -1, 0 (all tokens) or positive");
  LORADB_ASSIGN_OR_RETURN(std::optional<int64_t> seed, GetInt(body, "seed"));
  if (seed.has_value()) {
    p.seed = static_cast<uint64_t>(*seed);
  } else {
    // No seed: a fresh one, as vLLM samples without one.
    std::random_device rd;
    p.seed = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  }
  auto stop = body.find("stop");
  if (stop != body.end() && !stop->is_null()) {
    const json list = stop->is_array() ? *stop : json::array({*stop});
    for (const json& s : list) {
      if (s.is_string()) {
        if (s.get<std::string>().empty()) return Invalid("'stop' strings must not be empty");
        p.stop.push_back(s.get<std::string>());
      } else if (s.is_number_integer()) {
        p.stop_ids.push_back(s.get<int64_t>());
      } else {
        return Invalid("'stop' must be a string, or a list of strings or token ids");
      }
    }
    if (!p.stop.empty() && options_.tokenizer == nullptr) {
      return Invalid(absl::StrCat("stop strings need the base's tokenizer: no tokenizer.json at ",
                                  options_.tokenizer_path));
    }
  }
  auto stop_ids = body.find("stop_token_ids");
  if (stop_ids != body.end() && !stop_ids->is_null()) {
    if (!stop_ids->is_array()) return Invalid("'stop_token_ids' must be a list of token ids");
    for (const json& s : *stop_ids) {
      if (!s.is_number_integer()) return Invalid("'stop_token_ids' must be a list of token ids");
      p.stop_ids.push_back(s.get<int64_t>());
    }
  }
  LORADB_ASSIGN_OR_RETURN(std::optional<int64_t> n, GetInt(body, "n"));
  p.n = n.value_or(1);
  if (p.n < 1) return Invalid("'n' must be >= 1");
  LORADB_ASSIGN_OR_RETURN(std::optional<int64_t> logprobs, GetInt(body, "logprobs"));
  p.logprobs = logprobs.value_or(-1);
  if (logprobs.has_value() && p.logprobs < 0) return Invalid("'logprobs' must be >= 0");
  LORADB_ASSIGN_OR_RETURN(p.echo, GetFlag(body, "echo", false));
  LORADB_ASSIGN_OR_RETURN(p.stream, GetFlag(body, "stream", false));
  auto so = body.find("stream_options");
  if (so != body.end() && !so->is_null()) {
    if (!so->is_object()) return Invalid("'stream_options' must be an object");
    for (const auto& [k, v] : so->items()) {
      if (k != "include_usage" && k != "continuous_usage_stats") {
        return Invalid(absl::StrCat("unknown field 'stream_options.", k, "'"));
      }
    }
    LORADB_ASSIGN_OR_RETURN(p.include_usage, GetFlag(*so, "include_usage", false));
    LORADB_ASSIGN_OR_RETURN(bool continuous, GetFlag(*so, "continuous_usage_stats", false));
    if (continuous) return Invalid("'stream_options.continuous_usage_stats' is not supported");
    if (!p.stream) return Invalid("'stream_options' needs 'stream': true");
  }
  LORADB_ASSIGN_OR_RETURN(p.ignore_eos, GetFlag(body, "ignore_eos", false));
  LORADB_ASSIGN_OR_RETURN(p.return_token_ids, GetFlag(body, "return_token_ids", false));
  LORADB_ASSIGN_OR_RETURN(p.tokens_as_ids, GetFlag(body, "return_tokens_as_token_ids", false));
  if (options_.tokenizer == nullptr) p.tokens_as_ids = true;  // no strings to give
  LORADB_ASSIGN_OR_RETURN(p.skip_special, GetFlag(body, "skip_special_tokens", true));
  LORADB_ASSIGN_OR_RETURN(p.include_stop_str, GetFlag(body, "include_stop_str_in_output", false));
  LORADB_RETURN_IF_ERROR(NeutralOnly(body, p.n));
  if (p.stream && p.echo && p.logprobs >= 0) {
    return Invalid("'echo' with 'logprobs' is not supported when streaming");
  }
  return p;
}

// A token as logprobs name it: its text, or "token_id:N".
std::string TokenString(const RequestState& r, int64_t id) {
  if (r.p.tokens_as_ids || r.tokenizer == nullptr || id < 0 || id >= r.tokenizer->vocab_size()) {
    return absl::StrCat("token_id:", id);
  }
  const int32_t one[1] = {static_cast<int32_t>(id)};
  absl::StatusOr<std::string> s = r.tokenizer->Decode(one, false);
  return s.ok() ? *s : absl::StrCat("token_id:", id);
}

json TopLogprobs(const RequestState& r, const serving::TokenLogprob& lp) {
  json top = json::object();
  for (const auto& [tok, value] : lp.top) {
    const std::string key = TokenString(r, tok);
    if (!top.contains(key)) top[key] = value;
  }
  return top;
}

json Chunk(const RequestState& r, json choices) {
  return {{"id", r.id},
          {"object", "text_completion"},
          {"created", r.created},
          {"model", r.p.model},
          {"choices", std::move(choices)}};
}

void SendEvent(const RequestState& r, const json& event) {
  r.stream->Send(
      absl::StrCat("data: ", event.dump(-1, ' ', false, json::error_handler_t::replace), "\n\n"));
}

// Driver thread: one generated token of choice e.index of prompt `prompt`.
void OnToken(const std::shared_ptr<RequestState>& r, size_t prompt, const serving::TokenEvent& e) {
  const Params& p = r->p;
  ChoiceState& c = r->prompts[prompt].choices[static_cast<size_t>(e.index)];
  const size_t before = c.text.size();
  if (r->stop_set.count(e.token) != 0) {
    c.stopped_by_id = true;  // its text is left out, as vLLM does
  } else if (c.decode != nullptr && e.token >= 0 && e.token < r->tokenizer->vocab_size() &&
             r->tokenizer->IdToToken(static_cast<int32_t>(e.token)).has_value()) {
    absl::StatusOr<std::optional<std::string>> piece =
        c.decode->Step(static_cast<int32_t>(e.token));
    if (piece.ok() && piece->has_value()) c.text += **piece;
  }
  if (!c.stop_at.has_value() && !p.stop.empty()) {
    // Search only where a stop string could newly end.
    const size_t from = before > r->holdback ? before - r->holdback : 0;
    size_t best = std::string::npos;
    for (const std::string& s : p.stop) {
      const size_t at = c.text.find(s, from);
      if (at != std::string::npos && at < best) {
        best = at;
        c.stop_string = s;
      }
    }
    if (best != std::string::npos) {
      c.stop_at = p.include_stop_str ? best + c.stop_string->size() : best;
    }
  }
  if (!p.stream) return;
  // Streamed: this token's event carries the text it completes, less what a stop string may
  // still claim.
  size_t visible =
      c.stop_at.value_or(c.text.size() > r->holdback ? c.text.size() - r->holdback : size_t{0});
  visible = std::max(CharBoundary(c.text, visible), c.sent);
  json choice = {{"index", c.index},
                 {"text", c.text.substr(c.sent, visible - c.sent)},
                 {"logprobs", nullptr},
                 {"finish_reason", nullptr},
                 {"stop_reason", nullptr}};
  c.sent = visible;
  if (p.return_token_ids) choice["token_ids"] = json::array({e.token});
  if (e.logprobs != nullptr) {
    const std::string tok = TokenString(*r, e.token);
    choice["logprobs"] = {{"tokens", {tok}},
                          {"token_logprobs", {e.logprobs->logprob}},
                          {"top_logprobs", json::array({TopLogprobs(*r, *e.logprobs)})},
                          {"text_offset", {c.offset}}};
    c.offset += CodePoints(tok);
  }
  SendEvent(*r, Chunk(*r, json::array({std::move(choice)})));
}

// A finished choice's text: its tokens decoded as one sequence (what the tokenizers package's
// decode gives, so bytes that never formed a character show as U+FFFD, unlike the streamed
// deltas), a stop token's own text left out, cut at the stop string that ended it.
std::string FinalText(const RequestState& r, const ChoiceState& c,
                      const std::vector<int64_t>& tokens) {
  if (r.tokenizer == nullptr) return std::string();
  std::vector<int32_t> ids;
  const size_t n = c.stopped_by_id && !tokens.empty() ? tokens.size() - 1 : tokens.size();
  for (size_t k = 0; k < n; ++k) {
    if (tokens[k] >= 0 && tokens[k] < r.tokenizer->vocab_size() &&
        r.tokenizer->IdToToken(static_cast<int32_t>(tokens[k])).has_value()) {
      ids.push_back(static_cast<int32_t>(tokens[k]));
    }
  }
  absl::StatusOr<std::string> text = r.tokenizer->Decode(ids, r.p.skip_special);
  std::string out = text.ok() ? *std::move(text) : c.text;
  if (c.stop_string.has_value()) {
    const size_t at = out.find(*c.stop_string);
    if (at != std::string::npos) {
      out.resize(r.p.include_stop_str ? at + c.stop_string->size() : at);
    }
  }
  return out;
}

// The finish_reason and stop_reason of a finished choice.
std::pair<json, json> FinishOf(const ChoiceState& c, const serving::Choice& done) {
  if (done.finish == serving::FinishReason::kCancelled) return {"abort", nullptr};
  if (c.stop_string.has_value()) return {"stop", *c.stop_string};
  if (done.finish == serving::FinishReason::kStop) {
    if (c.stopped_by_id && !done.tokens.empty()) return {"stop", done.tokens.back()};
    return {"stop", nullptr};
  }
  return {"length", nullptr};
}

// The non-streamed reply, once every prompt has finished.
json FinalBody(const RequestState& r) {
  const Params& p = r.p;
  json choices = json::array();
  serving::Usage usage;
  uint64_t revision = 0;
  for (size_t i = 0; i < r.prompts.size(); ++i) {
    const PromptState& ps = r.prompts[i];
    revision = ps.result.revision;
    usage.prompt_tokens += ps.result.usage.prompt_tokens;
    usage.completion_tokens += ps.result.usage.completion_tokens;
    for (size_t j = 0; j < ps.choices.size(); ++j) {
      const ChoiceState& c = ps.choices[j];
      const serving::Choice& done = ps.result.choices[j];
      const std::string generated = FinalText(r, c, done.tokens);
      auto [finish, stop_reason] = FinishOf(c, done);
      json choice = {{"index", c.index},
                     {"text", p.echo ? p.prompt_texts[i] + generated : generated},
                     {"logprobs", nullptr},
                     {"finish_reason", finish},
                     {"stop_reason", stop_reason}};
      if (p.return_token_ids) {
        choice["token_ids"] = done.tokens;
        choice["prompt_token_ids"] = p.prompts[i];
      }
      if (p.logprobs >= 0) {
        json tokens = json::array(), token_logprobs = json::array(), top = json::array(),
             offsets = json::array();
        int64_t offset = 0;
        auto add = [&](int64_t id, json lp, json top_entry) {
          const std::string tok = TokenString(r, id);
          tokens.push_back(tok);
          token_logprobs.push_back(std::move(lp));
          top.push_back(std::move(top_entry));
          offsets.push_back(offset);
          offset += CodePoints(tok);
        };
        if (p.echo) {
          for (size_t k = 0; k < p.prompts[i].size(); ++k) {
            const auto& lp =
                k < ps.result.prompt_logprobs.size() ? ps.result.prompt_logprobs[k] : std::nullopt;
            if (lp.has_value()) {
              add(p.prompts[i][k], lp->logprob, TopLogprobs(r, *lp));
            } else {
              add(p.prompts[i][k], nullptr, nullptr);
            }
          }
        }
        for (const serving::TokenLogprob& lp : done.logprobs) {
          add(lp.token, lp.logprob, TopLogprobs(r, lp));
        }
        choice["logprobs"] = {{"tokens", tokens},
                              {"token_logprobs", token_logprobs},
                              {"top_logprobs", top},
                              {"text_offset", offsets}};
      }
      choices.push_back(std::move(choice));
    }
  }
  usage.total_tokens = usage.prompt_tokens + usage.completion_tokens;
  json body = Chunk(r, std::move(choices));
  body["usage"] = {{"prompt_tokens", usage.prompt_tokens},
                   {"completion_tokens", usage.completion_tokens},
                   {"total_tokens", usage.total_tokens}};
  body["system_fingerprint"] = nullptr;
  if (r.prompts.size() == 1) body["revision"] = revision;
  return body;
}

// Driver thread: prompt `prompt` has finished (all its choices).
void OnDone(const std::shared_ptr<RequestState>& r, size_t prompt,
            serving::CompletionResult result) {
  PromptState& ps = r->prompts[prompt];
  const absl::Status status = result.status;
  ps.result = std::move(result);
  ps.done = true;
  bool last = false, first_failure = false, failed = false;
  {
    std::lock_guard<std::mutex> lock(r->mu);
    last = --r->remaining == 0;
    if (!status.ok() && !r->failed) {
      r->failed = true;
      first_failure = true;
    }
    failed = r->failed;
  }
  if (first_failure) {
    // The request fails as a whole: its other prompts stop too, the client gets the error.
    std::vector<uint64_t> ids;
    {
      std::lock_guard<std::mutex> lock(r->mu);
      ids = r->submitted;
    }
    for (uint64_t id : ids) r->service->Cancel(id).IgnoreError();
    if (r->p.stream) {
      http::Reply e = http::ErrorReply(status);
      r->stream->Send(absl::StrCat("data: ", e.body, "\n\ndata: [DONE]\n\n"));
      r->stream->End();
    } else {
      r->stream->Answer(http::ErrorReply(status));
    }
    return;
  }
  if (failed) return;  // the error is the reply
  if (r->p.stream) {
    // Each choice's last event: what text was held back, and why it ended.
    json choices = json::array();
    for (size_t j = 0; j < ps.choices.size(); ++j) {
      ChoiceState& c = ps.choices[j];
      // What the streamed deltas have not said yet of the final text.
      const std::string full = FinalText(*r, c, ps.result.choices[j].tokens);
      std::string rest;
      if (full.size() > c.sent && full.compare(0, c.sent, c.text, 0, c.sent) == 0) {
        rest = full.substr(c.sent);
      }
      c.sent = std::max(c.sent, full.size());
      auto [finish, stop_reason] = FinishOf(c, ps.result.choices[j]);
      choices.push_back({{"index", c.index},
                         {"text", rest},
                         {"logprobs", nullptr},
                         {"finish_reason", finish},
                         {"stop_reason", stop_reason}});
    }
    json event = Chunk(*r, std::move(choices));
    event["revision"] = ps.result.revision;
    SendEvent(*r, event);
  }
  if (!last) return;
  if (!r->p.stream) {
    r->stream->Answer(http::Reply::Json(FinalBody(*r)));
    return;
  }
  if (r->p.include_usage) {
    serving::Usage u;
    for (const PromptState& each : r->prompts) {
      u.prompt_tokens += each.result.usage.prompt_tokens;
      u.completion_tokens += each.result.usage.completion_tokens;
    }
    json event = Chunk(*r, json::array());
    event["usage"] = {{"prompt_tokens", u.prompt_tokens},
                      {"completion_tokens", u.completion_tokens},
                      {"total_tokens", u.prompt_tokens + u.completion_tokens}};
    SendEvent(*r, event);
  }
  r->stream->Send("data: [DONE]\n\n");
  r->stream->End();
}

absl::StatusOr<http::Reply> Routes::Completions(const http::Call& call) {
  LORADB_ASSIGN_OR_RETURN(json body, http::ParseJsonObject(call, kFields));
  LORADB_ASSIGN_OR_RETURN(Params params, Parse(body));
  auto r = std::make_shared<RequestState>();
  r->tokenizer = options_.tokenizer;
  r->service = service_.get();
  r->p = std::move(params);
  const Params& p = r->p;
  if (p.model.empty()) r->p.model = service_->base_name();
  std::random_device rd;
  r->id = absl::StrFormat("cmpl-%08x%08x%08x%08x", rd(), rd(), rd(), rd());
  r->created = static_cast<int64_t>(std::time(nullptr));
  r->stream = p.stream ? http::ReplyStream::Streamed() : http::ReplyStream::Deferred();
  r->stop_set.insert(p.stop_ids.begin(), p.stop_ids.end());
  if (!p.ignore_eos) {
    r->stop_set.insert(options_.eos_token_ids.begin(), options_.eos_token_ids.end());
  }
  for (const std::string& s : p.stop) r->holdback = std::max(r->holdback, s.size() - 1);
  r->prompts.resize(p.prompts.size());
  r->remaining = p.prompts.size();
  for (size_t i = 0; i < p.prompts.size(); ++i) {
    PromptState& ps = r->prompts[i];
    ps.choices.resize(static_cast<size_t>(p.n));
    for (int64_t j = 0; j < p.n; ++j) {
      ChoiceState& c = ps.choices[static_cast<size_t>(j)];
      c.index = static_cast<int64_t>(i) * p.n + j;
      if (options_.tokenizer != nullptr) {
        c.decode = std::make_unique<text::DecodeStream>(*options_.tokenizer, p.skip_special);
      }
    }
  }
  if (p.stream && p.echo) {
    json choices = json::array();
    for (size_t i = 0; i < r->prompts.size(); ++i) {
      for (const ChoiceState& c : r->prompts[i].choices) {
        choices.push_back({{"index", c.index},
                           {"text", p.prompt_texts[i]},
                           {"logprobs", nullptr},
                           {"finish_reason", nullptr},
                           {"stop_reason", nullptr}});
      }
    }
    SendEvent(*r, Chunk(*r, std::move(choices)));
  }
  std::vector<serving::CompletionRequest> batch;
  for (size_t i = 0; i < p.prompts.size(); ++i) {
    serving::CompletionRequest& req = batch.emplace_back();
    req.model = p.model == service_->base_name() ? "" : p.model;
    req.prompt = p.prompts[i];
    if (p.max_tokens.has_value()) {
      req.max_tokens = *p.max_tokens;
    } else {
      req.max_tokens = service_->max_context() - static_cast<int64_t>(req.prompt.size());
    }
    req.temperature = p.temperature;
    req.top_p = p.top_p;
    req.top_k = p.top_k;
    req.seed = p.seed;
    req.stop_token_ids.assign(r->stop_set.begin(), r->stop_set.end());
    req.n = p.n;
    req.logprobs = p.logprobs;
    req.echo = p.echo && p.logprobs >= 0;
    req.on_token = [r, i](const serving::TokenEvent& e) { OnToken(r, i, e); };
    req.stop_check = [r, i](int64_t index, const std::vector<int64_t>&) {
      return r->prompts[i].choices[static_cast<size_t>(index)].stop_at.has_value();
    };
    req.on_done = [r, i](serving::CompletionResult res) { OnDone(r, i, std::move(res)); };
  }
  // All prompts at once: when one is refused nothing is queued and no callback runs (the error,
  // naming the prompt, is the reply), and the decoder prefills them in one step.
  absl::StatusOr<std::vector<uint64_t>> ids = service_->SubmitBatch(std::move(batch));
  if (!ids.ok()) return ids.status();
  {
    std::lock_guard<std::mutex> lock(r->mu);
    r->submitted = *std::move(ids);
  }
  // The client leaving cancels every prompt's sequences within a decoder step.
  // Weak references: the stream (held by the request) must not keep the request or the service
  // alive.
  r->stream->OnCancel([svc = std::weak_ptr<serving::CompletionService>(service_),
                       weak = std::weak_ptr<RequestState>(r)] {
    std::shared_ptr<serving::CompletionService> service = svc.lock();
    std::shared_ptr<RequestState> state = weak.lock();
    if (service == nullptr || state == nullptr) return;  // finished meanwhile
    std::vector<uint64_t> ids;
    {
      std::lock_guard<std::mutex> lock(state->mu);
      ids = state->submitted;
    }
    for (uint64_t id : ids) service->Cancel(id).IgnoreError();
  });
  http::Reply reply;
  reply.stream = r->stream;
  if (p.stream) {
    reply.content_type = "text/event-stream; charset=utf-8";
  }
  return reply;
}

absl::StatusOr<http::Reply> Routes::Models(const http::Call&) {
  LORADB_ASSIGN_OR_RETURN(std::vector<serving::ModelEntry> models, service_->ListModels());
  json data = json::array();
  for (const serving::ModelEntry& m : models) {
    data.push_back({{"id", m.id},
                    {"object", "model"},
                    {"created", m.created_us / 1000000},
                    {"owned_by", "loradb"},
                    {"root", m.policy.empty() ? m.id : service_->base_name()},
                    {"parent", m.policy.empty() ? json(nullptr) : json(service_->base_name())},
                    {"max_model_len", service_->max_context()},
                    {"revision", m.revision}});
  }
  return http::Reply::Json({{"object", "list"}, {"data", data}});
}

json Routes::StatsJson() const {
  const serving::ServiceStats s = service_->stats();
  return {{"submitted", s.submitted},
          {"rejected", s.rejected},
          {"outstanding_sequences", s.outstanding_sequences},
          {"steps", s.steps},
          {"prefill_tokens", s.prefill_tokens},
          {"decode_tokens", s.decode_tokens},
          {"deferrals", s.deferrals},
          {"finished", s.finished},
          {"failed", s.failed},
          {"queued", s.queued},
          {"running", s.running},
          {"kv_sequences", s.kv_sequences},
          {"kv_bytes", s.kv_bytes},
          {"leased_adapters", s.leased_adapters}};
}

json ErrorSchema() {
  return {
      {"type", "object"},
      {"required", {"error"}},
      {"properties",
       {{"error",
         {{"type", "object"},
          {"properties", {{"code", {{"type", "string"}}}, {"message", {{"type", "string"}}}}}}}}}};
}

}  // namespace

absl::Status AddCompletionRoutes(std::shared_ptr<serving::CompletionService> service,
                                 CompletionRoutesOptions options, http::Server* server) {
  if (service == nullptr) return absl::InvalidArgumentError("AddCompletionRoutes: no service");
  auto routes = std::make_shared<Routes>(std::move(service), std::move(options));
  http::Router* router = server->router();
  json completion_schema = {{"type", "object"}};
  http::Route completions = http::MakeRoute(
      "POST", "/v1/completions",
      [routes](const http::Call& call) { return routes->Completions(call); },
      {{"summary",
        "OpenAI-compatible completion on the continuous-batching decoder (docs/openai-api.md)"},
       {"tags", {"openai"}},
       {"requestBody",
        {{"required", true},
         {"content",
          {{"application/json",
            {{"schema",
              {{"type", "object"},
               {"required", {"prompt"}},
               {"properties",
                {{"model", {{"type", "string"}}},
                 {"prompt", json::object()},
                 {"max_tokens", {{"type", {"integer", "null"}}}},
                 {"stream", {{"type", "boolean"}}}}}}}}}}}}},
       {"responses",
        {{"200",
          {{"description", "the completion, or server-sent events when stream is true"},
           {"content",
            {{"application/json", {{"schema", completion_schema}}},
             {"text/event-stream", {{"schema", {{"type", "string"}}}}}}}}},
         {"400", http::ResponseSpec("invalid request", ErrorSchema())},
         {"404", http::ResponseSpec("unknown model", ErrorSchema())},
         {"429", http::ResponseSpec("queue full; see Retry-After", ErrorSchema())}}}});
  completions.auth = http::Route::Auth::kBearerIfToken;
  LORADB_RETURN_IF_ERROR(router->Add(std::move(completions)));
  http::Route models = http::MakeRoute(
      "GET", "/v1/models", [routes](const http::Call& call) { return routes->Models(call); },
      http::Operation("Servable models: the base and every policy alias (OpenAI list shape)",
                      "openai", {{"200", http::ResponseSpec("the models", {{"type", "object"}})}}));
  models.auth = http::Route::Auth::kBearerIfToken;
  LORADB_RETURN_IF_ERROR(router->Add(std::move(models)));
  http::Route stats = http::MakeRoute(
      "GET", "/v1/serving/stats",
      [routes](const http::Call&) -> absl::StatusOr<http::Reply> {
        return http::Reply::Json(routes->StatsJson());
      },
      http::Operation("The serving decoder's counters (running and queued sequences, KV cache, "
                      "leases, steps)",
                      "openai",
                      {{"200", http::ResponseSpec("the counters", {{"type", "object"}})}}));
  stats.auth = http::Route::Auth::kBearerIfToken;
  LORADB_RETURN_IF_ERROR(router->Add(std::move(stats)));
  server->AddMetricsSource([routes](std::string* out) {
    const json s = routes->StatsJson();
    for (const auto& [k, v] : s.items()) {
      absl::StrAppend(out, "# TYPE loradb_serving_", k, " gauge\nloradb_serving_", k, " ",
                      v.get<int64_t>(), "\n");
    }
  });
  return absl::OkStatus();
}

namespace {

// The eos ids a config file names (an int or a list of ints under eos_token_id); none when the
// file or the key is absent.
absl::Status ReadEosIds(const std::filesystem::path& file, std::vector<int64_t>* out) {
  std::error_code ec;
  if (!std::filesystem::exists(file, ec)) return absl::OkStatus();
  std::ifstream in(file, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", file.string()));
  LORADB_ASSIGN_OR_RETURN(json j, ParseJson(text.str(), file.string()));
  if (!j.is_object())
    return absl::InvalidArgumentError(absl::StrCat(file.string(), ": not an object"));
  auto eos = j.find("eos_token_id");
  if (eos == j.end() || eos->is_null()) return absl::OkStatus();
  const json list = eos->is_array() ? *eos : json::array({*eos});
  for (const json& id : list) {
    if (!id.is_number_integer()) {
      return absl::InvalidArgumentError(
          absl::StrCat(file.string(), ": eos_token_id must be an integer or a list of integers"));
    }
    const int64_t v = id.get<int64_t>();
    if (std::find(out->begin(), out->end(), v) == out->end()) out->push_back(v);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::shared_ptr<serving::CompletionService>> AttachModel(
    serving::ServiceOptions options, std::shared_ptr<Store> store, http::Server* server) {
  const std::filesystem::path dir(options.model_dir);
  CompletionRoutesOptions routes;
  routes.tokenizer_path = (dir / "tokenizer.json").string();
  std::error_code ec;
  if (std::filesystem::exists(routes.tokenizer_path, ec)) {
    LORADB_ASSIGN_OR_RETURN(std::unique_ptr<text::Tokenizer> tok,
                            text::Tokenizer::Load(routes.tokenizer_path));
    routes.tokenizer = std::move(tok);
  }
  LORADB_RETURN_IF_ERROR(ReadEosIds(dir / "config.json", &routes.eos_token_ids));
  LORADB_RETURN_IF_ERROR(ReadEosIds(dir / "generation_config.json", &routes.eos_token_ids));
  LORADB_ASSIGN_OR_RETURN(std::unique_ptr<serving::CompletionService> svc,
                          serving::CompletionService::Create(std::move(options), store.get()));
  // The service reads the store until it is destroyed: it holds the store until then.
  std::shared_ptr<serving::CompletionService> service(
      svc.release(), [store](serving::CompletionService* s) { delete s; });
  LORADB_RETURN_IF_ERROR(AddCompletionRoutes(service, std::move(routes), server));
  return service;
}

}  // namespace loradb::openai
