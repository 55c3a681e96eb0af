#include "storage/formats/training_data.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "storage/util/file_util.h"
#include "storage/util/json.h"
#include "storage/util/status_macros.h"

namespace loradb::dataset {
namespace {

using Json = nlohmann::json;

// The chat roles a "messages" line may use; only assistant turns are trained.
const std::set<std::string>& ChatRoles() {
  static const auto* roles = new std::set<std::string>{"system", "user", "assistant", "tool"};
  return *roles;
}

class LineParser {
 public:
  LineParser(const ParseOptions& options, Example* out) : o_(options), out_(out) {}

  // Fills the example from `obj` (a parsed line). On error the message says what is wrong.
  absl::Status Parse(const Json& obj) {
    if (!obj.is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat("expected a JSON object, found ", obj.type_name()));
    }
    if (obj.contains("chosen") || obj.contains("rejected")) {
      out_->kind = Kind::kDpo;
      LORADB_RETURN_IF_ERROR(OnlyKeys(obj, {"prompt", "chosen", "rejected"}, "a DPO line"));
      LORADB_ASSIGN_OR_RETURN(out_->prompt, Required(obj, "prompt", "a DPO line"));
      LORADB_ASSIGN_OR_RETURN(out_->chosen, Required(obj, "chosen", "a DPO line"));
      LORADB_ASSIGN_OR_RETURN(out_->rejected, Required(obj, "rejected", "a DPO line"));
      return absl::OkStatus();
    }
    if (obj.contains("tokens")) {
      out_->kind = Kind::kSft;
      LORADB_RETURN_IF_ERROR(OnlyKeys(obj, {"tokens", "weights"}, "an SFT line with 'tokens'"));
      LORADB_ASSIGN_OR_RETURN(out_->tokens, Tokens(obj.at("tokens"), "tokens"));
      if (obj.contains("weights")) {
        LORADB_ASSIGN_OR_RETURN(out_->weights, Weights(obj.at("weights"), out_->tokens.size()));
      } else {
        out_->weights.assign(out_->tokens.size(), 1.0f);
        if (!out_->weights.empty()) out_->weights[0] = 0.0f;
      }
      return CheckSequence("tokens");
    }
    if (obj.contains("text")) {
      out_->kind = Kind::kSft;
      LORADB_RETURN_IF_ERROR(OnlyKeys(obj, {"text"}, "an SFT line with 'text'"));
      if (!obj.at("text").is_string()) {
        return absl::InvalidArgumentError(
            absl::StrCat("'text' must be a string, found ", obj.at("text").type_name()));
      }
      LORADB_ASSIGN_OR_RETURN(out_->tokens, Tokens(obj.at("text"), "text"));
      out_->weights.assign(out_->tokens.size(), 1.0f);
      if (!out_->weights.empty()) out_->weights[0] = 0.0f;
      return CheckSequence("text");
    }
    if (obj.contains("messages")) {
      out_->kind = Kind::kSft;
      LORADB_RETURN_IF_ERROR(OnlyKeys(obj, {"messages"}, "an SFT line with 'messages'"));
      LORADB_RETURN_IF_ERROR(Messages(obj.at("messages")));
      return CheckSequence("messages");
    }
    if (obj.contains("completion")) {
      out_->kind = Kind::kSft;
      LORADB_RETURN_IF_ERROR(
          OnlyKeys(obj, {"prompt", "completion"}, "an SFT line with 'completion'"));
      LORADB_ASSIGN_OR_RETURN(std::vector<int64_t> prompt,
                              Required(obj, "prompt", "an SFT line with 'completion'"));
      LORADB_ASSIGN_OR_RETURN(std::vector<int64_t> completion,
                              Required(obj, "completion", "an SFT line with 'completion'"));
      out_->tokens = prompt;
      out_->tokens.insert(out_->tokens.end(), completion.begin(), completion.end());
      out_->weights.assign(prompt.size(), 0.0f);
      out_->weights.resize(out_->tokens.size(), 1.0f);
      return CheckSequence("completion");
    }
    if (obj.contains("prompt")) {
      out_->kind = Kind::kGrpo;
      LORADB_ASSIGN_OR_RETURN(out_->prompt, Required(obj, "prompt", "a GRPO prompt line"));
      return absl::OkStatus();
    }
    return absl::InvalidArgumentError(
        "no training fields (an SFT line has 'tokens', 'text', 'messages' or 'prompt' + "
        "'completion'; a DPO line 'prompt' + 'chosen' + 'rejected'; a GRPO line 'prompt')");
  }

  bool from_text() const { return from_text_; }

 private:
  static absl::Status OnlyKeys(const Json& obj, std::initializer_list<const char*> allowed,
                               const char* what) {
    for (const auto& [key, value] : obj.items()) {
      bool ok = false;
      for (const char* a : allowed) ok = ok || key == a;
      if (!ok) {
        return absl::InvalidArgumentError(absl::StrCat("unknown field '", key, "' in ", what,
                                                       " (allowed: ", absl::StrJoin(allowed, ", "),
                                                       ")"));
      }
    }
    return absl::OkStatus();
  }

  // The non-empty token field `key` of `obj`.
  absl::StatusOr<std::vector<int64_t>> Required(const Json& obj, const char* key,
                                                const char* what) {
    if (!obj.contains(key)) {
      return absl::InvalidArgumentError(absl::StrCat(what, " needs '", key, "'"));
    }
    LORADB_ASSIGN_OR_RETURN(std::vector<int64_t> ids, Tokens(obj.at(key), key));
    if (ids.empty()) return absl::InvalidArgumentError(absl::StrCat("'", key, "' is empty"));
    return ids;
  }

  absl::StatusOr<std::vector<int64_t>> Tokenize(const std::string& text, const std::string& key) {
    if (!o_.tokenize) {
      return absl::FailedPreconditionError(
          absl::StrCat("'", key, "' is text and the base has no tokenizer (",
                       o_.no_tokenizer_reason, "); give token ids instead"));
    }
    from_text_ = true;
    absl::StatusOr<std::vector<int64_t>> ids = o_.tokenize(text);
    if (!ids.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("'", key, "' cannot be tokenized: ", ids.status().message()));
    }
    for (int64_t id : *ids) {
      if (id < 0 || id >= o_.vocab_size) {
        return absl::InvalidArgumentError(absl::StrCat("'", key, "' tokenizes to id ", id,
                                                       ", outside the base's vocabulary [0, ",
                                                       o_.vocab_size, ")"));
      }
    }
    return ids;
  }

  // A token field: an array of ids in the vocabulary, or text.
  absl::StatusOr<std::vector<int64_t>> Tokens(const Json& v, const std::string& key) {
    if (v.is_string()) return Tokenize(v.get<std::string>(), key);
    if (!v.is_array()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "'", key, "' must be an array of token ids or a string, found ", v.type_name()));
    }
    std::vector<int64_t> ids;
    ids.reserve(v.size());
    for (size_t i = 0; i < v.size(); ++i) {
      const Json& e = v[i];
      if (!e.is_number_integer()) {
        return absl::InvalidArgumentError(absl::StrCat("'", key, "'[", i, "] must be an integer ",
                                                       "token id, found ", e.type_name(), " ",
                                                       e.dump()));
      }
      const bool big =
          e.is_number_unsigned() && e.get<uint64_t>() > static_cast<uint64_t>(o_.vocab_size);
      const int64_t id = big ? o_.vocab_size : e.get<int64_t>();
      if (id < 0 || id >= o_.vocab_size) {
        return absl::InvalidArgumentError(absl::StrCat("'", key, "'[", i, "] = ", e.dump(),
                                                       " is outside the base's vocabulary [0, ",
                                                       o_.vocab_size, ")"));
      }
      ids.push_back(id);
    }
    return ids;
  }

  static absl::StatusOr<std::vector<float>> Weights(const Json& v, size_t tokens) {
    if (!v.is_array()) {
      return absl::InvalidArgumentError(
          absl::StrCat("'weights' must be an array of numbers, found ", v.type_name()));
    }
    if (v.size() != tokens) {
      return absl::InvalidArgumentError(absl::StrCat("'weights' has ", v.size(), " entries for ",
                                                     tokens, " tokens (one per token)"));
    }
    std::vector<float> w;
    for (size_t i = 0; i < v.size(); ++i) {
      if (!v[i].is_number()) {
        return absl::InvalidArgumentError(
            absl::StrCat("'weights'[", i, "] must be a number, found ", v[i].type_name()));
      }
      const double x = v[i].get<double>();
      if (!std::isfinite(x) || x < 0 || x > std::numeric_limits<float>::max()) {
        return absl::InvalidArgumentError(
            absl::StrCat("'weights'[", i, "] = ", v[i].dump(), " is not a finite weight >= 0"));
      }
      w.push_back(static_cast<float>(x));
    }
    if (!w.empty() && w[0] != 0) {
      return absl::InvalidArgumentError("'weights'[0] must be 0: nothing predicts the first token");
    }
    return w;
  }

  // ChatML, each segment tokenized on its own: "<|im_start|>ROLE\n" (weight 0), CONTENT +
  // "<|im_end|>" (weight 1 for assistant turns), "\n" (weight 0).
  absl::Status Messages(const Json& v) {
    if (!v.is_array() || v.empty()) {
      return absl::InvalidArgumentError("'messages' must be a non-empty array of messages");
    }
    if (!o_.no_chat_reason.empty() && o_.tokenize) {
      return absl::FailedPreconditionError(
          absl::StrCat("'messages' cannot be rendered: ", o_.no_chat_reason));
    }
    bool trained = false;
    for (size_t i = 0; i < v.size(); ++i) {
      const Json& m = v[i];
      const std::string where = absl::StrCat("'messages'[", i, "]");
      if (!m.is_object() || !m.contains("role") || !m.contains("content") || m.size() != 2) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, " must be an object with exactly 'role' and 'content'"));
      }
      if (!m.at("role").is_string() || !ChatRoles().contains(m.at("role").get<std::string>())) {
        return absl::InvalidArgumentError(absl::StrCat(where, " has role ", m.at("role").dump(),
                                                       " (system, user, assistant or tool)"));
      }
      if (!m.at("content").is_string()) {
        return absl::InvalidArgumentError(absl::StrCat(where, "'s content must be a string, found ",
                                                       m.at("content").type_name()));
      }
      const std::string role = m.at("role").get<std::string>();
      const bool assistant = role == "assistant";
      trained = trained || assistant;
      const std::pair<std::string, float> segments[] = {
          {absl::StrCat("<|im_start|>", role, "\n"), 0.0f},
          {absl::StrCat(m.at("content").get<std::string>(), "<|im_end|>"), assistant ? 1.0f : 0.0f},
          {"\n", 0.0f}};
      for (const auto& [text, weight] : segments) {
        LORADB_ASSIGN_OR_RETURN(std::vector<int64_t> ids, Tokenize(text, "messages"));
        out_->tokens.insert(out_->tokens.end(), ids.begin(), ids.end());
        out_->weights.resize(out_->tokens.size(), weight);
      }
    }
    if (!trained) {
      return absl::InvalidArgumentError("'messages' has no assistant message to train on");
    }
    if (!out_->weights.empty()) out_->weights[0] = 0.0f;
    return absl::OkStatus();
  }

  absl::Status CheckSequence(const char* what) const {
    if (out_->tokens.size() < 2) {
      return absl::InvalidArgumentError(
          absl::StrCat("'", what, "' gives ", out_->tokens.size(),
                       " token(s); a sequence needs at least 2 (a context and a target)"));
    }
    for (size_t i = 1; i < out_->weights.size(); ++i) {
      if (out_->weights[i] != 0) return absl::OkStatus();
    }
    return absl::InvalidArgumentError("no target: every token after the first has weight 0");
  }

  const ParseOptions& o_;
  Example* out_;
  bool from_text_ = false;
};

std::string KindForm(Kind kind) {
  switch (kind) {
    case Kind::kSft:
      return "an SFT line";
    case Kind::kDpo:
      return "a DPO line (prompt, chosen, rejected)";
    case Kind::kGrpo:
      return "a GRPO prompt line (prompt only)";
  }
  return "?";
}

}  // namespace

const char* KindName(Kind kind) {
  switch (kind) {
    case Kind::kSft:
      return "SFT";
    case Kind::kDpo:
      return "DPO";
    case Kind::kGrpo:
      return "GRPO";
  }
  return "?";
}

absl::StatusOr<Dataset> ParseTrainingData(absl::string_view text, absl::string_view name,
                                          const ParseOptions& options) {
  if (options.vocab_size < 1) return absl::InvalidArgumentError("vocab_size must be >= 1");
  Dataset data;
  std::vector<std::string> errors;
  int64_t failed = 0, lines = 0;
  int64_t kind_line = 0;  // the line that fixed the file's kind
  auto fail = [&](int64_t line, absl::string_view message) {
    ++failed;
    if (errors.size() < options.max_errors)
      errors.push_back(absl::StrCat("line ", line, ": ", message));
  };
  int64_t number = 0;
  for (absl::string_view raw : absl::StrSplit(text, '\n')) {
    ++number;
    absl::string_view line = absl::StripAsciiWhitespace(raw);
    if (line.empty()) continue;
    ++lines;
    absl::StatusOr<Json> obj = ParseJson(line, "the line");
    if (!obj.ok()) {
      fail(number, obj.status().message());
      continue;
    }
    Example ex;
    ex.line = number;
    LineParser parser(options, &ex);
    if (absl::Status s = parser.Parse(*obj); !s.ok()) {
      fail(number, s.message());
      continue;
    }
    if (kind_line == 0) {
      kind_line = number;
      data.kind = ex.kind;
    } else if (ex.kind != data.kind) {
      fail(number, absl::StrCat(KindForm(ex.kind), ", but line ", kind_line, " is ",
                                KindName(data.kind), ": a file holds one kind"));
      continue;
    }
    if (ex.kind == Kind::kGrpo) ex.source = std::string(line);
    data.tokens += static_cast<int64_t>(ex.tokens.size() + ex.prompt.size() + ex.chosen.size() +
                                        ex.rejected.size());
    if (parser.from_text()) ++data.text_lines;
    data.examples.push_back(std::move(ex));
  }
  if (failed > 0) {
    std::string msg = absl::StrCat(name, ": ", failed, " of ", lines,
                                   " lines failed validation (nothing was trained):");
    for (const std::string& e : errors) absl::StrAppend(&msg, "\n  ", e);
    if (failed > static_cast<int64_t>(errors.size())) {
      absl::StrAppend(&msg, "\n  ... and ", failed - static_cast<int64_t>(errors.size()), " more");
    }
    return absl::InvalidArgumentError(msg);
  }
  if (data.examples.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": no examples (the file is empty)"));
  }
  return data;
}

absl::StatusOr<Dataset> ReadTrainingData(const std::string& path, const ParseOptions& options) {
  absl::StatusOr<std::string> text = ReadFileToString(path);
  if (!text.ok()) {
    return absl::Status(
        text.status().code(),
        absl::StrCat(path, ": cannot read the training data (", text.status().message(), ")"));
  }
  return ParseTrainingData(*text, path, options);
}

}  // namespace loradb::dataset
