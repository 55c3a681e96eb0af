#include "text/tokenizer.h"

#include <simdjson.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string_view>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "storage/util/status_macros.h"
#include "text/utf8.h"

namespace loradb::text {
namespace {

// GPT-2's split, which the ByteLevel pre-tokenizer applies when its use_regex is true.
constexpr absl::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

using Element = simdjson::dom::element;
using Object = simdjson::dom::object;

std::string Str(std::string_view s) { return std::string(s); }

}  // namespace

// Reads a parsed tokenizer.json into a Tokenizer, refusing what it does not implement. Every
// error names the file (`origin`) and the JSON path of the offending value.
class Tokenizer::Loader {
 public:
  Loader(Tokenizer* tok, absl::string_view origin) : tok_(tok), origin_(origin) {}

  absl::Status Load(absl::string_view json) {
    simdjson::dom::parser parser;
    Element root;
    if (auto err = parser.parse(json.data(), json.size()).get(root)) {
      return Error("", absl::StrCat("not valid JSON (", simdjson::error_message(err), ")"));
    }
    Object top;
    LORADB_RETURN_IF_ERROR(AsObject(root, "", &top));
    LORADB_RETURN_IF_ERROR(
        OnlyKeys(top, "",
                 {"version", "truncation", "padding", "added_tokens", "normalizer", "pre_tokenizer",
                  "post_processor", "decoder", "model"}));
    for (const char* key : {"truncation", "padding"}) {
      Element e;
      if (!top[key].get(e) && !e.is_null()) {
        return Error(key,
                     "is set; loradb encodes without truncation or padding, so a tokenizer "
                     "that applies them is not supported");
      }
    }
    Element model;
    if (top["model"].get(model)) return Error("model", "missing");
    LORADB_RETURN_IF_ERROR(LoadModel(model));
    Element e;
    if (!top["normalizer"].get(e)) LORADB_RETURN_IF_ERROR(LoadNormalizer(e, "normalizer"));
    if (top["pre_tokenizer"].get(e) || e.is_null()) {
      return Error("pre_tokenizer", "missing; loradb needs a ByteLevel pre-tokenizer");
    }
    bool byte_level = false;
    LORADB_RETURN_IF_ERROR(LoadPreTokenizer(e, "pre_tokenizer", /*last=*/true, &byte_level));
    if (!top["post_processor"].get(e)) LORADB_RETURN_IF_ERROR(LoadPostProcessor(e));
    if (top["decoder"].get(e) || e.is_null()) {
      return Error("decoder", "missing; loradb decodes with a ByteLevel decoder");
    }
    LORADB_RETURN_IF_ERROR(LoadDecoder(e));
    if (!top["added_tokens"].get(e) && !e.is_null()) LORADB_RETURN_IF_ERROR(LoadAddedTokens(e));
    BuildDecodeTables();
    return absl::OkStatus();
  }

 private:
  absl::Status Error(absl::string_view path, absl::string_view what) const {
    return absl::InvalidArgumentError(
        absl::StrCat(origin_, path.empty() ? "" : ": ", path, ": ", what));
  }
  absl::Status Unsupported(absl::string_view path, absl::string_view what) const {
    return Error(path, absl::StrCat(what, " is not supported by loradb's tokenizer"));
  }

  absl::Status AsObject(Element e, absl::string_view path, Object* out) const {
    if (e.get_object().get(*out)) return Error(path, "expected a JSON object");
    return absl::OkStatus();
  }
  absl::Status OnlyKeys(Object o, absl::string_view path,
                        std::initializer_list<std::string_view> allowed) const {
    for (auto field : o) {
      if (std::find(allowed.begin(), allowed.end(), field.key) == allowed.end()) {
        return Error(path, absl::StrCat("unknown key \"", Str(field.key),
                                        "\" (not read by loradb, so refused)"));
      }
    }
    return absl::OkStatus();
  }
  absl::StatusOr<std::string> Type(Object o, absl::string_view path) const {
    std::string_view type;
    if (o["type"].get_string().get(type)) return Error(path, "missing string \"type\"");
    return Str(type);
  }
  // A boolean field; `fallback` when absent (tokenizers' own default for that field).
  absl::StatusOr<bool> Bool(Object o, absl::string_view path, const char* key,
                            std::optional<bool> fallback) const {
    Element e;
    if (o[key].get(e)) {
      if (fallback.has_value()) return *fallback;
      return Error(absl::StrCat(path, ".", key), "missing");
    }
    bool v = false;
    if (e.get_bool().get(v)) return Error(absl::StrCat(path, ".", key), "expected true or false");
    return v;
  }
  // A string-or-null field: nullopt when absent or null.
  absl::StatusOr<std::optional<std::string>> OptString(Object o, absl::string_view path,
                                                       const char* key) const {
    Element e;
    if (o[key].get(e) || e.is_null()) return std::optional<std::string>();
    std::string_view s;
    if (e.get_string().get(s)) return Error(absl::StrCat(path, ".", key), "expected a string");
    return std::optional<std::string>(Str(s));
  }
  absl::StatusOr<int32_t> Id(Element e, absl::string_view path) const {
    uint64_t v = 0;
    if (e.get_uint64().get(v) || v > static_cast<uint64_t>(INT32_MAX - 1)) {
      return Error(path, "expected a token id (an integer from 0 to 2147483646)");
    }
    return static_cast<int32_t>(v);
  }

  absl::Status LoadNormalizer(Element e, const std::string& path) {
    if (e.is_null()) return absl::OkStatus();
    Object o;
    LORADB_RETURN_IF_ERROR(AsObject(e, path, &o));
    LORADB_ASSIGN_OR_RETURN(std::string type, Type(o, path));
    if (type == "NFC") {
      LORADB_RETURN_IF_ERROR(OnlyKeys(o, path, {"type"}));
      tok_->nfc_ = true;
      return absl::OkStatus();
    }
    if (type == "Sequence") {
      LORADB_RETURN_IF_ERROR(OnlyKeys(o, path, {"type", "normalizers"}));
      simdjson::dom::array list;
      if (o["normalizers"].get_array().get(list)) {
        return Error(path + ".normalizers", "expected an array");
      }
      size_t i = 0;
      for (Element item : list) {
        LORADB_RETURN_IF_ERROR(LoadNormalizer(item, absl::StrCat(path, ".normalizers[", i++, "]")));
      }
      return absl::OkStatus();
    }
    return Unsupported(path, absl::StrCat("normalizer type \"", type, "\""));
  }

  // Reads a pre-tokenizer; `last` is true for the step that must end the chain (where the
  // ByteLevel step belongs). Sets *byte_level once the ByteLevel step was read.
  absl::Status LoadPreTokenizer(Element e, const std::string& path, bool last, bool* byte_level) {
    Object o;
    LORADB_RETURN_IF_ERROR(AsObject(e, path, &o));
    LORADB_ASSIGN_OR_RETURN(std::string type, Type(o, path));
    if (*byte_level) {
      return Unsupported(
          path, absl::StrCat("a pre-tokenizer step (", type, ") after the ByteLevel step"));
    }
    if (type == "Sequence") {
      LORADB_RETURN_IF_ERROR(OnlyKeys(o, path, {"type", "pretokenizers"}));
      simdjson::dom::array list;
      if (o["pretokenizers"].get_array().get(list)) {
        return Error(path + ".pretokenizers", "expected an array");
      }
      const size_t n = list.size();
      size_t i = 0;
      for (Element item : list) {
        LORADB_RETURN_IF_ERROR(LoadPreTokenizer(item, absl::StrCat(path, ".pretokenizers[", i, "]"),
                                                last && i + 1 == n, byte_level));
        ++i;
      }
      if (last && !*byte_level) {
        return Unsupported(path, "a pre-tokenizer without a final ByteLevel step");
      }
      return absl::OkStatus();
    }
    if (type == "Split") {
      LORADB_RETURN_IF_ERROR(OnlyKeys(o, path, {"type", "pattern", "behavior", "invert"}));
      std::string_view behavior;
      if (o["behavior"].get_string().get(behavior)) {
        return Error(path + ".behavior", "missing string");
      }
      if (behavior != "Isolated") {
        return Unsupported(path + ".behavior", absl::StrCat("Split behavior \"", Str(behavior),
                                                            "\" (only Isolated is)"));
      }
      LORADB_ASSIGN_OR_RETURN(bool invert, Bool(o, path, "invert", std::nullopt));
      if (invert) return Unsupported(path + ".invert", "invert: true");
      Object pattern;
      if (o["pattern"].get_object().get(pattern)) {
        return Error(path + ".pattern", "expected {\"Regex\": ...} or {\"String\": ...}");
      }
      std::string_view text;
      std::string pcre2;
      if (!pattern["Regex"].get_string().get(text)) {
        auto translated = TranslateOnigurumaPattern(absl::string_view(text.data(), text.size()));
        if (!translated.ok()) return Error(path + ".pattern", translated.status().message());
        pcre2 = *std::move(translated);
      } else if (!pattern["String"].get_string().get(text)) {
        pcre2 = QuoteLiteral(absl::string_view(text.data(), text.size()));
      } else {
        return Error(path + ".pattern", "expected {\"Regex\": ...} or {\"String\": ...}");
      }
      return AddSplit(pcre2, path + ".pattern");
    }
    if (type == "ByteLevel") {
      LORADB_RETURN_IF_ERROR(
          OnlyKeys(o, path, {"type", "add_prefix_space", "trim_offsets", "use_regex"}));
      if (!last) return Unsupported(path, "a ByteLevel step before the last pre-tokenizer step");
      LORADB_ASSIGN_OR_RETURN(bool prefix, Bool(o, path, "add_prefix_space", std::nullopt));
      if (prefix) return Unsupported(path + ".add_prefix_space", "add_prefix_space: true");
      // trim_offsets only changes offsets, which loradb does not report.
      LORADB_ASSIGN_OR_RETURN(bool use_regex, Bool(o, path, "use_regex", true));
      if (use_regex) {
        auto translated = TranslateOnigurumaPattern(kGpt2Pattern);
        if (!translated.ok()) return translated.status();
        LORADB_RETURN_IF_ERROR(AddSplit(*translated, path));
      }
      *byte_level = true;
      return absl::OkStatus();
    }
    return Unsupported(path, absl::StrCat("pre-tokenizer type \"", type, "\""));
  }

  absl::Status AddSplit(const std::string& pcre2, const std::string& path) {
    auto re = SplitRegex::Compile(pcre2);
    if (!re.ok()) return Error(path, re.status().message());
    tok_->splits_.push_back(*std::move(re));
    return absl::OkStatus();
  }

  absl::Status LoadPostProcessor(Element e) {
    if (e.is_null()) return absl::OkStatus();
    Object o;
    LORADB_RETURN_IF_ERROR(AsObject(e, "post_processor", &o));
    LORADB_ASSIGN_OR_RETURN(std::string type, Type(o, "post_processor"));
    if (type != "ByteLevel") {
      return Unsupported("post_processor",
                         absl::StrCat("post-processor type \"", type,
                                      "\" (it may add tokens; only ByteLevel, which adds none, is "
                                      "supported)"));
    }
    return OnlyKeys(o, "post_processor", {"type", "add_prefix_space", "trim_offsets", "use_regex"});
  }

  absl::Status LoadDecoder(Element e) {
    Object o;
    LORADB_RETURN_IF_ERROR(AsObject(e, "decoder", &o));
    LORADB_ASSIGN_OR_RETURN(std::string type, Type(o, "decoder"));
    if (type != "ByteLevel") {
      return Unsupported("decoder", absl::StrCat("decoder type \"", type, "\""));
    }
    // The ByteLevel decoder maps characters back to bytes; its flags do not change that.
    return OnlyKeys(o, "decoder", {"type", "add_prefix_space", "trim_offsets", "use_regex"});
  }

  absl::Status LoadModel(Element e) {
    Object o;
    LORADB_RETURN_IF_ERROR(AsObject(e, "model", &o));
    LORADB_ASSIGN_OR_RETURN(std::string type, Type(o, "model"));
    if (type != "BPE") return Unsupported("model", absl::StrCat("model type \"", type, "\""));
    LORADB_RETURN_IF_ERROR(
        OnlyKeys(o, "model",
                 {"type", "dropout", "unk_token", "continuing_subword_prefix", "end_of_word_suffix",
                  "fuse_unk", "byte_fallback", "ignore_merges", "vocab", "merges"}));
    Element dropout;
    if (!o["dropout"].get(dropout) && !dropout.is_null()) {
      double d = 0;
      if (dropout.get_double().get(d) || d != 0) {
        return Unsupported("model.dropout", "BPE dropout (it makes encoding random)");
      }
    }
    for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
      LORADB_ASSIGN_OR_RETURN(std::optional<std::string> v, OptString(o, "model", key));
      if (v.has_value() && !v->empty()) {
        return Unsupported(absl::StrCat("model.", key), absl::StrCat("a non-empty ", key));
      }
    }
    LORADB_ASSIGN_OR_RETURN(tok_->fuse_unk_, Bool(o, "model", "fuse_unk", false));
    LORADB_ASSIGN_OR_RETURN(bool byte_fallback, Bool(o, "model", "byte_fallback", false));
    LORADB_ASSIGN_OR_RETURN(tok_->ignore_merges_, Bool(o, "model", "ignore_merges", false));

    Object vocab;
    if (o["vocab"].get_object().get(vocab)) return Error("model.vocab", "expected an object");
    absl::flat_hash_map<int32_t, std::string> seen;
    for (auto field : vocab) {
      LORADB_ASSIGN_OR_RETURN(
          int32_t id, Id(field.value, absl::StrCat("model.vocab[\"", Str(field.key), "\"]")));
      auto [it, inserted] = seen.emplace(id, Str(field.key));
      if (!inserted) {
        return Error("model.vocab", absl::StrCat("id ", id, " is given to both \"", it->second,
                                                 "\" and \"", Str(field.key), "\""));
      }
      tok_->vocab_[Str(field.key)] = id;
    }
    model_vocab_size_ = tok_->vocab_.size();

    LORADB_ASSIGN_OR_RETURN(std::optional<std::string> unk, OptString(o, "model", "unk_token"));
    if (unk.has_value()) {
      auto it = tok_->vocab_.find(*unk);
      if (it == tok_->vocab_.end()) {
        return Error("model.unk_token", absl::StrCat("\"", *unk, "\" is not in the vocabulary"));
      }
      tok_->unk_id_ = it->second;
    }

    LORADB_RETURN_IF_ERROR(LoadMerges(o));

    const ByteLevelAlphabet& alphabet = ByteLevel();
    tok_->byte_symbols_.assign(256, {});
    tok_->byte_in_vocab_.assign(256, false);
    for (int b = 0; b < 256; ++b) {
      const std::string& ch = alphabet.encoded[b];
      if (auto it = tok_->vocab_.find(ch); it != tok_->vocab_.end()) {
        tok_->byte_symbols_[b] = {it->second};
        tok_->byte_in_vocab_[b] = true;
      } else if (byte_fallback) {
        std::vector<int32_t> ids;
        for (char c : ch) {
          auto f = tok_->vocab_.find(absl::StrFormat("<0x%02X>", static_cast<uint8_t>(c)));
          if (f == tok_->vocab_.end()) break;
          ids.push_back(f->second);
        }
        if (ids.size() == ch.size()) tok_->byte_symbols_[b] = std::move(ids);
      }
    }
    return absl::OkStatus();
  }

  absl::Status LoadMerges(Object o) {
    simdjson::dom::array merges;
    if (o["merges"].get_array().get(merges)) return Error("model.merges", "expected an array");
    int32_t rank = 0;
    bool strings = false, pairs = false;
    size_t index = 0;
    for (Element item : merges) {
      const std::string path = absl::StrCat("model.merges[", index++, "]");
      std::string left, right;
      std::string_view s;
      simdjson::dom::array pair;
      if (!item.get_string().get(s)) {
        strings = true;
        if (s.substr(0, 8) == "#version") continue;  // tokenizers skips these header lines
        const size_t space = s.find(' ');
        if (space == std::string_view::npos || s.find(' ', space + 1) != std::string_view::npos) {
          return Error(path,
                       absl::StrCat("\"", Str(s), "\" is not two tokens separated by a space"));
        }
        left = Str(s.substr(0, space));
        right = Str(s.substr(space + 1));
      } else if (!item.get_array().get(pair)) {
        pairs = true;
        std::string_view a, b;
        if (pair.size() != 2 || pair.at(0).get_string().get(a) || pair.at(1).get_string().get(b)) {
          return Error(path, "expected a pair of two token strings");
        }
        left = Str(a);
        right = Str(b);
      } else {
        return Error(path, "expected \"a b\" or [\"a\", \"b\"]");
      }
      if (strings && pairs) {
        return Error("model.merges", "mixes \"a b\" strings and [\"a\", \"b\"] pairs");
      }
      int32_t ids[3];
      const std::string* parts[3] = {&left, &right, nullptr};
      const std::string merged = left + right;
      parts[2] = &merged;
      for (int k = 0; k < 3; ++k) {
        auto it = tok_->vocab_.find(*parts[k]);
        if (it == tok_->vocab_.end()) {
          return Error(path, absl::StrCat("token \"", *parts[k], "\" is not in the vocabulary"));
        }
        ids[k] = it->second;
      }
      tok_->merges_.Set(ids[0], ids[1], rank++, ids[2]);
    }
    return absl::OkStatus();
  }

  absl::Status LoadAddedTokens(Element e) {
    simdjson::dom::array list;
    if (e.get_array().get(list)) return Error("added_tokens", "expected an array");
    size_t index = 0;
    int32_t max_added = -1;
    for (Element item : list) {
      const std::string path = absl::StrCat("added_tokens[", index++, "]");
      Object o;
      LORADB_RETURN_IF_ERROR(AsObject(item, path, &o));
      LORADB_RETURN_IF_ERROR(OnlyKeys(
          o, path, {"id", "content", "single_word", "lstrip", "rstrip", "normalized", "special"}));
      AddedToken t;
      Element id;
      if (o["id"].get(id)) return Error(path + ".id", "missing");
      LORADB_ASSIGN_OR_RETURN(t.id, Id(id, path + ".id"));
      std::string_view content;
      if (o["content"].get_string().get(content)) return Error(path + ".content", "missing string");
      t.content = Str(content);
      if (t.content.empty()) return Error(path + ".content", "empty");
      if (!ValidateUtf8(t.content).ok()) return Error(path + ".content", "not valid UTF-8");
      LORADB_ASSIGN_OR_RETURN(bool single_word, Bool(o, path, "single_word", std::nullopt));
      if (single_word) return Unsupported(path + ".single_word", "single_word: true");
      LORADB_ASSIGN_OR_RETURN(t.lstrip, Bool(o, path, "lstrip", std::nullopt));
      LORADB_ASSIGN_OR_RETURN(t.rstrip, Bool(o, path, "rstrip", std::nullopt));
      LORADB_ASSIGN_OR_RETURN(t.normalized, Bool(o, path, "normalized", std::nullopt));
      LORADB_ASSIGN_OR_RETURN(t.special, Bool(o, path, "special", std::nullopt));
      if (tok_->added_by_content_.contains(t.content)) {
        return Error(path, absl::StrCat("\"", t.content, "\" is listed twice"));
      }
      // tokenizers re-derives each added token's id (its vocabulary id, else the next free id
      // past the vocabulary) and only warns when the file says otherwise; refuse such a file.
      int32_t derived;
      if (auto it = tok_->vocab_.find(t.content); it != tok_->vocab_.end()) {
        derived = it->second;
      } else if (max_added < 0) {
        derived = static_cast<int32_t>(model_vocab_size_);
      } else {
        derived = (static_cast<size_t>(max_added) >= model_vocab_size_ || model_vocab_size_ == 0)
                      ? max_added + 1
                      : static_cast<int32_t>(model_vocab_size_);
      }
      if (derived != t.id) {
        return Error(path, absl::StrCat("\"", t.content, "\" has id ", t.id,
                                        " but tokenizers would give it id ", derived));
      }
      max_added = std::max(max_added, t.id);
      const int32_t token_index = static_cast<int32_t>(tok_->added_.size());
      tok_->added_by_content_[t.content] = t.id;
      if (t.normalized && tok_->nfc_) {
        LORADB_ASSIGN_OR_RETURN(std::string key, Nfc(t.content));
        tok_->trie_[1].Insert(key, token_index);
      } else {
        tok_->trie_[t.normalized ? 1 : 0].Insert(t.content, token_index);
      }
      tok_->added_.push_back(std::move(t));
    }
    return absl::OkStatus();
  }

  void BuildDecodeTables() {
    int32_t size = 0;
    for (const auto& [token, id] : tok_->vocab_) size = std::max(size, id + 1);
    for (const AddedToken& t : tok_->added_) size = std::max(size, t.id + 1);
    tok_->id_token_.assign(size, "");
    tok_->id_present_.assign(size, false);
    tok_->id_special_.assign(size, false);
    tok_->id_bytes_.assign(size, "");
    for (const auto& [token, id] : tok_->vocab_) {
      tok_->id_token_[id] = token;
      tok_->id_present_[id] = true;
    }
    for (const AddedToken& t : tok_->added_) {
      tok_->id_token_[t.id] = t.content;
      tok_->id_present_[t.id] = true;
    }
    // Special-ness follows the token string, as in tokenizers (a vocabulary entry spelled like a
    // special token is skipped too).
    absl::flat_hash_set<std::string> special;
    for (const AddedToken& t : tok_->added_) {
      if (t.special) special.insert(t.content);
    }
    for (int32_t id = 0; id < size; ++id) {
      tok_->id_special_[id] = tok_->id_present_[id] && special.contains(tok_->id_token_[id]);
    }
    // ByteLevel decoder: a token whose every character is in the byte alphabet stands for those
    // bytes; any other token stands for its own UTF-8 text.
    const ByteLevelAlphabet& alphabet = ByteLevel();
    for (int32_t id = 0; id < size; ++id) {
      const std::string& token = tok_->id_token_[id];
      std::string bytes;
      bool mapped = true;
      size_t pos = 0;
      while (pos < token.size()) {
        const char32_t cp = NextCodePoint(token, &pos);
        if (cp >= alphabet.byte_of.size() || alphabet.byte_of[cp] < 0) {
          mapped = false;
          break;
        }
        bytes.push_back(static_cast<char>(alphabet.byte_of[cp]));
      }
      tok_->id_bytes_[id] = mapped ? std::move(bytes) : token;
    }
  }

  Tokenizer* tok_;
  std::string origin_;
  size_t model_vocab_size_ = 0;
};

void Tokenizer::Trie::Insert(absl::string_view key, int32_t token_index) {
  int32_t node = 0;
  for (char c : key) {
    const uint64_t edge = (static_cast<uint64_t>(node) << 8) | static_cast<uint8_t>(c);
    auto it = edges.find(edge);
    if (it == edges.end()) {
      const int32_t child = static_cast<int32_t>(terminal.size());
      terminal.push_back(-1);
      edges.emplace(edge, child);
      node = child;
    } else {
      node = it->second;
    }
  }
  terminal[node] = token_index;
}

Tokenizer::Tokenizer() = default;
Tokenizer::~Tokenizer() = default;

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::Load(const std::string& path) {
  std::error_code ec;
  std::string file = path;
  if (std::filesystem::is_directory(path, ec))
    file = (std::filesystem::path(path) / "tokenizer.json").string();
  std::ifstream in(file, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(absl::StrCat(file, ": cannot open (no tokenizer.json there?)"));
  }
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) return absl::DataLossError(absl::StrCat(file, ": read error"));
  return FromJson(text.str(), file);
}

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromJson(absl::string_view json,
                                                               absl::string_view origin) {
  std::unique_ptr<Tokenizer> tok(new Tokenizer());
  Loader loader(tok.get(), origin);
  LORADB_RETURN_IF_ERROR(loader.Load(json));
  return tok;
}

std::optional<int32_t> Tokenizer::TokenToId(absl::string_view token) const {
  if (auto it = added_by_content_.find(token); it != added_by_content_.end()) return it->second;
  if (auto it = vocab_.find(token); it != vocab_.end()) return it->second;
  return std::nullopt;
}

std::optional<std::string> Tokenizer::IdToToken(int32_t id) const {
  if (id < 0 || id >= vocab_size() || !id_present_[id]) return std::nullopt;
  return id_token_[id];
}

bool Tokenizer::IsSpecial(int32_t id) const {
  return id >= 0 && id < vocab_size() && id_special_[id];
}

void Tokenizer::SplitAddedTokens(absl::string_view text, bool normalized_set,
                                 std::vector<Segment>* out) const {
  const Trie& trie = trie_[normalized_set ? 1 : 0];
  size_t start_offset = 0;
  size_t pos = 0;
  while (pos < text.size()) {
    // Longest added token starting at `pos`.
    int32_t node = 0, best = -1;
    size_t best_len = 0;
    for (size_t i = pos; i < text.size(); ++i) {
      auto it = trie.edges.find((static_cast<uint64_t>(node) << 8) | static_cast<uint8_t>(text[i]));
      if (it == trie.edges.end()) break;
      node = it->second;
      if (trie.terminal[node] >= 0) {
        best = trie.terminal[node];
        best_len = i + 1 - pos;
      }
    }
    if (best < 0) {
      ++pos;
      continue;
    }
    const AddedToken& token = added_[best];
    size_t start = pos, stop = pos + best_len;
    pos = stop;
    if (token.lstrip) {
      // Take in the whitespace run just before the token (not text an earlier match took).
      size_t s = start;
      while (s > start_offset) {
        size_t b = s - 1;
        while (b > 0 && (static_cast<uint8_t>(text[b]) & 0xC0) == 0x80) --b;
        size_t p = b;
        if (!IsWhiteSpace(NextCodePoint(text, &p))) break;
        s = b;
      }
      start = s;
    }
    if (token.rstrip) {
      size_t p = stop;
      while (p < text.size()) {
        size_t q = p;
        if (!IsWhiteSpace(NextCodePoint(text, &q))) break;
        p = q;
      }
      stop = p;
    }
    if (start_offset < start) out->push_back({start_offset, start, -1});
    out->push_back({start, stop, token.id});
    start_offset = stop;
  }
  if (start_offset < text.size()) out->push_back({start_offset, text.size(), -1});
}

absl::StatusOr<std::vector<int32_t>> Tokenizer::Encode(absl::string_view text) const {
  LORADB_RETURN_IF_ERROR(ValidateUtf8(text));
  std::vector<int32_t> ids;
  std::vector<Segment> raw, normalized_segments;
  SplitAddedTokens(text, /*normalized_set=*/false, &raw);
  for (const Segment& seg : raw) {
    if (seg.added_id >= 0) {
      ids.push_back(seg.added_id);
      continue;
    }
    std::string normalized;
    absl::string_view piece = text.substr(seg.begin, seg.end - seg.begin);
    if (nfc_) {
      LORADB_ASSIGN_OR_RETURN(normalized, Nfc(piece));
      piece = normalized;
    }
    normalized_segments.clear();
    SplitAddedTokens(piece, /*normalized_set=*/true, &normalized_segments);
    for (const Segment& sub : normalized_segments) {
      if (sub.added_id >= 0) {
        ids.push_back(sub.added_id);
      } else {
        LORADB_RETURN_IF_ERROR(
            EncodeNormalized(piece.substr(sub.begin, sub.end - sub.begin), &ids));
      }
    }
  }
  return ids;
}

absl::Status Tokenizer::EncodeNormalized(absl::string_view text, std::vector<int32_t>* ids) const {
  // Each Split step (behavior Isolated) cuts every current piece into its matches and the gaps
  // between them.
  std::vector<std::pair<size_t, size_t>> pieces{{0, text.size()}}, next, matches;
  for (const auto& split : splits_) {
    next.clear();
    for (const auto& [begin, end] : pieces) {
      matches.clear();
      LORADB_RETURN_IF_ERROR(split->FindAll(text.substr(begin, end - begin), &matches));
      size_t at = 0;
      for (const auto& [mb, me] : matches) {
        if (mb > at) next.emplace_back(begin + at, begin + mb);
        next.emplace_back(begin + mb, begin + me);
        at = me;
      }
      if (begin + at < end) next.emplace_back(begin + at, end);
    }
    pieces.swap(next);
  }
  for (const auto& [begin, end] : pieces) {
    if (end > begin) EncodePiece(text.substr(begin, end - begin), ids);
  }
  return absl::OkStatus();
}

void Tokenizer::EncodePiece(absl::string_view piece, std::vector<int32_t>* ids) const {
  const ByteLevelAlphabet& alphabet = ByteLevel();
  if (ignore_merges_) {
    std::string mapped;
    for (char c : piece) mapped += alphabet.encoded[static_cast<uint8_t>(c)];
    if (auto it = vocab_.find(mapped); it != vocab_.end()) {
      ids->push_back(it->second);
      return;
    }
  }
  const bool cacheable = piece.size() <= kMaxCachedPiece;
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_mu_);
    if (auto it = cache_.find(piece); it != cache_.end()) {
      ids->insert(ids->end(), it->second.begin(), it->second.end());
      return;
    }
  }
  // Initial symbols, as tokenizers' BPE builds a word: each byte-level character's id; else its
  // byte-fallback ids (which do not flush a pending unknown); else the unknown token (runs fused
  // when fuse_unk); else nothing.
  std::vector<int32_t> word;
  word.reserve(piece.size());
  bool pending_unk = false;
  for (char c : piece) {
    const auto b = static_cast<uint8_t>(c);
    if (byte_in_vocab_[b]) {
      if (pending_unk) word.push_back(*unk_id_);
      pending_unk = false;
      word.push_back(byte_symbols_[b][0]);
    } else if (!byte_symbols_[b].empty()) {
      word.insert(word.end(), byte_symbols_[b].begin(), byte_symbols_[b].end());
    } else if (unk_id_.has_value()) {
      if (pending_unk && !fuse_unk_) word.push_back(*unk_id_);
      pending_unk = true;
    }
  }
  if (pending_unk) word.push_back(*unk_id_);
  ApplyMerges(merges_, &word);
  ids->insert(ids->end(), word.begin(), word.end());
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_mu_);
    if (cache_.size() >= kMaxCacheEntries) cache_.clear();
    cache_.emplace(std::string(piece), std::move(word));
  }
}

absl::StatusOr<std::string> Tokenizer::Decode(absl::Span<const int32_t> ids,
                                              bool skip_special_tokens) const {
  std::string bytes;
  for (int32_t id : ids) {
    if (id < 0 || id >= vocab_size() || !id_present_[id]) {
      return absl::InvalidArgumentError(
          absl::StrCat("token id ", id, " is not in the vocabulary (", vocab_size(), " ids)"));
    }
    if (skip_special_tokens && id_special_[id]) continue;
    bytes += id_bytes_[id];
  }
  std::string text;
  text.reserve(bytes.size());
  AppendUtf8Lossy(bytes, &text);
  return text;
}

absl::StatusOr<std::optional<std::string>> DecodeStream::Step(int32_t id) {
  static constexpr absl::string_view kReplacement = "\xEF\xBF\xBD";
  const auto ends_with_replacement = [](const std::string& s) {
    return s.size() >= kReplacement.size() &&
           absl::string_view(s).substr(s.size() - kReplacement.size()) == kReplacement;
  };
  if (prefix_.empty() && !ids_.empty()) {
    LORADB_ASSIGN_OR_RETURN(std::string new_prefix, tokenizer_.Decode(ids_, skip_special_));
    if (!ends_with_replacement(new_prefix)) {
      prefix_ = std::move(new_prefix);
      prefix_index_ = ids_.size();
    }
  }
  ids_.push_back(id);
  LORADB_ASSIGN_OR_RETURN(std::string text, tokenizer_.Decode(ids_, skip_special_));
  if (text.size() <= prefix_.size() || ends_with_replacement(text)) {
    return std::optional<std::string>();
  }
  if (absl::string_view(text).substr(0, prefix_.size()) != prefix_) {
    return absl::InternalError("decode stream: the decoded prefix changed");
  }
  std::string new_text = text.substr(prefix_.size());
  const size_t new_prefix_index = ids_.size() - prefix_index_;
  ids_.erase(ids_.begin(), ids_.begin() + static_cast<std::ptrdiff_t>(prefix_index_));
  LORADB_ASSIGN_OR_RETURN(prefix_, tokenizer_.Decode(ids_, skip_special_));
  prefix_index_ = new_prefix_index;
  return std::optional<std::string>(std::move(new_text));
}

}  // namespace loradb::text
