// `loradb tokenize encode|decode|info TOKENIZER ...`: text <-> token ids with a base's Hugging
// Face tokenizer.json (text/tokenizer.h). TOKENIZER is the file or the base directory holding it.
//   encode TOKENIZER TEXT            prints the ids (--json: {"ids": [...]}); --no-special leaves
//                                    out the tokens the post-processor adds (BOS/EOS), as
//                                    tokenizers' add_special_tokens=False
//   decode TOKENIZER ID...           prints the text (--json: {"text": ...}); --keep-special keeps
//                                    special tokens (tokenizers' skip_special_tokens=False);
//                                    --stream also reports the chunks a streaming decoder emits
//                                    (a failed step ends them with {"error": message})
//   info TOKENIZER                   vocabulary size and added tokens
//   chat MODEL MESSAGES.json         prints the prompt the model's chat template renders
//                                    (text/chat_template.h); --add-generation-prompt, --tools
//                                    FILE, --extra JSON; --jsonl FILE renders one request per line
//                                    ({"messages", "add_generation_prompt", "tools", "extra"}) into
//                                    {"text": ...} or {"error": ...}
// With --jsonl FILE, encode reads one JSON string per line and decode one JSON array of ids per
// line, and each prints one JSON object per line: the batch form the tests and tools use.
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "storage/util/status_macros.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"
#include "tools/loradb/command.h"

namespace loradb::cli {
namespace {

using Json = nlohmann::ordered_json;
using text::Tokenizer;

struct TokenizeArgs {
  std::string tokenizer, text, jsonl;
  std::vector<std::string> ids;
  bool json = false, keep_special = false, stream = false, no_special = false;
  std::string messages, tools, extra;
  bool add_generation_prompt = false;
};

absl::StatusOr<std::vector<int32_t>> ParseIds(const std::vector<std::string>& args) {
  std::vector<int32_t> ids;
  for (const std::string& arg : args) {
    for (absl::string_view part : absl::StrSplit(arg, ',', absl::SkipWhitespace())) {
      int32_t id = 0;
      if (!absl::SimpleAtoi(part, &id)) {
        return absl::InvalidArgumentError(absl::StrCat("\"", part, "\" is not a token id"));
      }
      ids.push_back(id);
    }
  }
  return ids;
}

// Calls `fn(line_number, parsed JSON)` for each non-empty line of `path`.
absl::Status ForEachJsonLine(const std::string& path,
                             const std::function<absl::Status(size_t, const Json&)>& fn) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  std::string line;
  size_t number = 0;
  while (std::getline(in, line)) {
    ++number;
    if (line.empty()) continue;
    Json j = Json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) {
      return absl::InvalidArgumentError(absl::StrCat(path, ":", number, ": not valid JSON"));
    }
    absl::Status s = fn(number, j);
    if (!s.ok()) {
      return absl::Status(s.code(), absl::StrCat(path, ":", number, ": ", s.message()));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<Json> DecodeJson(const Tokenizer& tok, const std::vector<int32_t>& ids,
                                const TokenizeArgs& a) {
  LORADB_ASSIGN_OR_RETURN(std::string text, tok.Decode(ids, !a.keep_special));
  Json out = {{"text", text}};
  if (a.stream) {
    text::DecodeStream stream(tok, !a.keep_special);
    Json chunks = Json::array();
    for (int32_t id : ids) {
      // A step that fails (the text decoded so far no longer starts with what was emitted, as
      // tokenizers' DecodeStream also reports) ends the stream with {"error": ...}.
      absl::StatusOr<std::optional<std::string>> chunk = stream.Step(id);
      if (!chunk.ok()) {
        chunks.push_back(Json{{"error", std::string(chunk.status().message())}});
        break;
      }
      chunks.push_back(chunk->has_value() ? Json(**chunk) : Json(nullptr));
    }
    out["chunks"] = std::move(chunks);
  }
  return out;
}

absl::Status RunEncode(const TokenizeArgs& a) {
  LORADB_ASSIGN_OR_RETURN(std::unique_ptr<Tokenizer> tok, Tokenizer::Load(a.tokenizer));
  if (!a.jsonl.empty()) {
    return ForEachJsonLine(a.jsonl, [&](size_t, const Json& j) -> absl::Status {
      if (!j.is_string()) return absl::InvalidArgumentError("expected a JSON string");
      LORADB_ASSIGN_OR_RETURN(std::vector<int32_t> ids,
                              tok->Encode(j.get<std::string>(), !a.no_special));
      std::cout << Json({{"ids", ids}}).dump() << "\n";
      return absl::OkStatus();
    });
  }
  LORADB_ASSIGN_OR_RETURN(std::vector<int32_t> ids, tok->Encode(a.text, !a.no_special));
  if (a.json) {
    PrintJson({{"ids", ids}});
  } else {
    std::printf("%s\n", absl::StrJoin(ids, " ").c_str());
  }
  return absl::OkStatus();
}

absl::Status RunDecode(const TokenizeArgs& a) {
  LORADB_ASSIGN_OR_RETURN(std::unique_ptr<Tokenizer> tok, Tokenizer::Load(a.tokenizer));
  if (!a.jsonl.empty()) {
    return ForEachJsonLine(a.jsonl, [&](size_t, const Json& j) -> absl::Status {
      std::vector<int32_t> ids;
      if (!j.is_array()) return absl::InvalidArgumentError("expected a JSON array of token ids");
      for (const Json& id : j) {
        if (!id.is_number_integer()) return absl::InvalidArgumentError("expected integer ids");
        ids.push_back(id.get<int32_t>());
      }
      LORADB_ASSIGN_OR_RETURN(Json out, DecodeJson(*tok, ids, a));
      std::cout << out.dump() << "\n";
      return absl::OkStatus();
    });
  }
  LORADB_ASSIGN_OR_RETURN(std::vector<int32_t> ids, ParseIds(a.ids));
  LORADB_ASSIGN_OR_RETURN(Json out, DecodeJson(*tok, ids, a));
  if (a.json) {
    std::cout << out.dump() << "\n";
  } else {
    std::cout << out["text"].get<std::string>() << "\n";
  }
  return absl::OkStatus();
}

absl::Status RunInfo(const TokenizeArgs& a) {
  LORADB_ASSIGN_OR_RETURN(std::unique_ptr<Tokenizer> tok, Tokenizer::Load(a.tokenizer));
  Json added = Json::array();
  for (const text::AddedToken& t : tok->added_tokens()) {
    added.push_back({{"id", t.id}, {"content", t.content}, {"special", t.special}});
  }
  if (a.json) {
    std::cout << Json({{"vocab_size", tok->vocab_size()}, {"added_tokens", added}}).dump() << "\n";
  } else {
    std::printf("vocab_size %d, %zu added tokens\n", tok->vocab_size(), added.size());
    for (const text::AddedToken& t : tok->added_tokens()) {
      std::printf("  %d %s%s\n", t.id, t.content.c_str(), t.special ? " (special)" : "");
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

absl::Status RunChat(const TokenizeArgs& a) {
  LORADB_ASSIGN_OR_RETURN(std::unique_ptr<text::ChatTemplate> chat,
                          text::ChatTemplate::Load(a.tokenizer));
  if (!a.jsonl.empty()) {
    return ForEachJsonLine(a.jsonl, [&](size_t, const Json& j) -> absl::Status {
      if (!j.is_object() || !j.contains("messages")) {
        return absl::InvalidArgumentError("expected {\"messages\": [...], ...}");
      }
      text::ChatTemplate::Request r;
      r.messages_json = j["messages"].dump();
      r.add_generation_prompt = j.value("add_generation_prompt", false);
      if (j.contains("tools")) r.tools_json = j["tools"].dump();
      if (j.contains("documents")) r.documents_json = j["documents"].dump();
      if (j.contains("extra")) r.extra_json = j["extra"].dump();
      absl::StatusOr<std::string> text = chat->Render(r);
      std::cout << (text.ok() ? Json({{"text", *text}})
                              : Json({{"error", std::string(text.status().message())}}))
                       .dump()
                << "\n";
      return absl::OkStatus();
    });
  }
  text::ChatTemplate::Request r;
  LORADB_ASSIGN_OR_RETURN(r.messages_json, ReadAll(a.messages));
  r.add_generation_prompt = a.add_generation_prompt;
  if (!a.tools.empty()) {
    LORADB_ASSIGN_OR_RETURN(r.tools_json, ReadAll(a.tools));
  }
  r.extra_json = a.extra;
  LORADB_ASSIGN_OR_RETURN(std::string text, chat->Render(r));
  if (a.json) {
    std::cout << Json({{"text", text}}).dump() << "\n";
  } else {
    std::cout << text;
  }
  return absl::OkStatus();
}

void SetupTokenize(CLI::App* sub, Invocation* inv) {
  sub->require_subcommand(1);
  auto a = std::make_shared<TokenizeArgs>();
  const auto add_common = [&](CLI::App* cmd) {
    cmd->add_option("TOKENIZER", a->tokenizer, "tokenizer.json, or the base directory holding it")
        ->required();
    AddJsonFlag(cmd, &a->json);
  };
  CLI::App* encode = sub->add_subcommand("encode", "print the token ids of a text");
  add_common(encode);
  encode->add_option("TEXT", a->text, "the text (UTF-8)");
  encode->add_option("--jsonl", a->jsonl, "file of JSON strings, one per line (batch)");
  encode->add_flag("--no-special", a->no_special,
                   "leave out the tokens the post-processor adds (tokenizers' "
                   "add_special_tokens=False)");
  encode->callback([inv, a] { inv->run = [a] { return RunEncode(*a); }; });

  CLI::App* decode = sub->add_subcommand("decode", "print the text of token ids");
  add_common(decode);
  decode->add_option("IDS", a->ids, "token ids (separate or comma-separated)");
  decode->add_option("--jsonl", a->jsonl, "file of JSON arrays of ids, one per line (batch)");
  decode->add_flag("--keep-special", a->keep_special, "keep special tokens in the text");
  decode->add_flag("--stream", a->stream,
                   "also report the chunks incremental (streaming) decoding emits, id by id");
  decode->callback([inv, a] { inv->run = [a] { return RunDecode(*a); }; });

  CLI::App* chat =
      sub->add_subcommand("chat", "print the prompt the model's chat template renders");
  chat->add_option("MODEL", a->tokenizer,
                   "model directory (chat_template.jinja or tokenizer_config.json), "
                   "tokenizer_config.json or a .jinja file")
      ->required();
  chat->add_option("MESSAGES", a->messages, "JSON file: an array of messages");
  chat->add_flag("--add-generation-prompt", a->add_generation_prompt,
                 "end with the header that starts the assistant's turn");
  chat->add_option("--tools", a->tools, "JSON file: an array of tool schemas");
  chat->add_option("--extra", a->extra, "JSON object of more template variables");
  chat->add_option("--jsonl", a->jsonl, "file of requests, one JSON object per line (batch)");
  AddJsonFlag(chat, &a->json);
  chat->callback([inv, a] { inv->run = [a] { return RunChat(*a); }; });

  CLI::App* info = sub->add_subcommand("info", "vocabulary size and added tokens");
  add_common(info);
  info->callback([inv, a] { inv->run = [a] { return RunInfo(*a); }; });
}

}  // namespace

LORADB_REGISTER_COMMAND("tokenize", "text <-> token ids with a base's tokenizer.json",
                        SetupTokenize);

}  // namespace loradb::cli
