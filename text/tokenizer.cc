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
    if (!top["pre_tokenizer"].get(e) && !e.is_null()) {
      LORADB_RETURN_IF_ERROR(LoadPreTokenizer(e, "pre_tokenizer", /*last=*/true));
    }
    if (!top["post_processor"].get(e)) {
      LORADB_RETURN_IF_ERROR(LoadPostProcessor(e, "post_processor"));
    }
    if (top["decoder"].get(e) || e.is_null()) {
      return Error(
          "decoder",
          "missing (tokenizers would join the tokens with spaces); loradb needs a decoder");
    }
    LORADB_RETURN_IF_ERROR(LoadDecoder(e, "decoder"));
    if (!top["added_tokens"].get(e) && !e.is_null()) LORADB_RETURN_IF_ERROR(LoadAddedTokens(e));
    BuildDecodeTables();
    for (const auto* side : {&tok_->template_.before, &tok_->template_.after}) {
      for (int32_t id : *side) {
        if (id >= tok_->vocab_size() || !tok_->id_present_[id]) {
          return Error("post_processor",
                       absl::StrCat("the template adds id ", id, ", which names no token"));
        }
      }
    }
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

  // A {"String": s} / {"Regex": r} pattern at `o[key]`.
  absl::StatusOr<Pattern> LoadPattern(Object o, const std::string& path, const char* key) const {
    const std::string at = absl::StrCat(path, ".", key);
    Object pattern;
    if (o[key].get_object().get(pattern)) {
      return Error(at, "expected {\"Regex\": ...} or {\"String\": ...}");
    }
    std::string_view text;
    if (!pattern["Regex"].get_string().get(text)) {
      auto re = Pattern::Regex(absl::string_view(text.data(), text.size()));
      if (!re.ok()) return Error(at, re.status().message());
      return *std::move(re);
    }
    if (!pattern["String"].get_string().get(text)) return Pattern::Literal(Str(text));
    return Error(at, "expected {\"Regex\": ...} or {\"String\": ...}");
  }
  absl::StatusOr<std::string> RequiredString(Object o, const std::string& path,
                                             const char* key) const {
    std::string_view s;
    if (o[key].get_string().get(s)) return Error(absl::StrCat(path, ".", key), "missing string");
    return Str(s);
  }
  // A string holding exactly one character (tokenizers' `char` fields).
  absl::StatusOr<std::string> OneChar(Object o, const std::string& path, const char* key) const {
    LORADB_ASSIGN_OR_RETURN(std::string s, RequiredString(o, path, key));
    size_t pos = 0;
    if (s.empty() || !ValidateUtf8(s).ok() || (NextCodePoint(s, &pos), pos != s.size())) {
      return Error(absl::StrCat(path, ".", key), "expected a string of one character");
    }
    return s;
  }
  absl::StatusOr<size_t> Count(Object o, const std::string& path, const char* key) const {
    uint64_t v = 0;
    if (o[key].get_uint64().get(v) || v > (1u << 20)) {
      return Error(absl::StrCat(path, ".", key), "expected a non-negative integer");
    }
    return static_cast<size_t>(v);
  }
  // Reads `o[list_key]`, an array of steps, calling `load(item, item_path, is_last)` on each.
  absl::Status ForEachStep(
      Object o, const std::string& path, const char* list_key,
      const std::function<absl::Status(Element, const std::string&, bool)>& load) const {
    simdjson::dom::array list;
    if (o[list_key].get_array().get(list)) {
      return Error(absl::StrCat(path, ".", list_key), "expected an array");
    }
    const size_t n = list.size();
    size_t i = 0;
    for (Element item : list) {
      LORADB_RETURN_IF_ERROR(
          load(item, absl::StrCat(path, ".", list_key, "[", i, "]"), i + 1 == n));
      ++i;
    }
    return absl::OkStatus();
  }

  absl::Status LoadNormalizer(Element e, const std::string& path) {
    if (e.is_null()) return absl::OkStatus();
    Object o;
    LORADB_RETURN_IF_ERROR(AsObject(e, path, &o));
    LORADB_ASSIGN_OR_RETURN(std::string type, Type(o, path));
    if (type == "NFC") {
      LORADB_RETURN_IF_ERROR(OnlyKeys(o, path, {"type"}));
      tok_->normalizer_.push_back({NormalizerStep::kNfc, "", Pattern::Literal("")});
      return absl::OkStatus();
    }
    if (type == "Prepend") {
      LORADB_RETURN_IF_ERROR(OnlyKeys(o, path, {"type", "prepend"}));
      LORADB_ASSIGN_OR_RETURN(std::string prepend, RequiredString(o, path, "prepend"));
      tok_->normalizer_.push_back({NormalizerStep::kPrepend, prepend, Pattern::Literal("")});
      return absl::OkStatus();
    }
    if (type == "Replace") {
      LORADB_RETURN_IF_ERROR(OnlyKeys(o, path, {"type", "pattern", "content"}));
      LORADB_ASSIGN_OR_RETURN(Pattern pattern, LoadPattern(o, path, "pattern"));
      LORADB_ASSIGN_OR_RETURN(std::string content, RequiredString(o, path, "content"));
      tok_->normalizer_.push_back({NormalizerStep::kReplace, content, std::move(pattern)});
      return absl::OkStatus();
    }
    if (type == "Sequence") {
      LORADB_RETURN_IF_ERROR(OnlyKeys(o, path, {"type", "normalizers"}));
      return ForEachStep(o, path, "normalizers", [&](Element item, const std::string& p, bool) {
        return LoadNormalizer(item, p);
      });
    }
    return Unsupported(path, absl::StrCat("normalizer type \"", type, "\""));
  }

  // Reads a pre-tokenizer; `last` is true for the step that ends the chain (the only place a
  // ByteLevel step may be).
  absl::Status LoadPreTokenizer(Element e, const std::string& path, bool last) {
    Object o;
    LORADB_RETURN_IF_ERROR(AsObject(e, path, &o));
    LORADB_ASSIGN_OR_RETURN(std::string type, Type(o, path));
    if (type == "Sequence") {
      LORADB_RETURN_IF_ERROR(OnlyKeys(o, path, {"type", "pretokenizers"}));
      return ForEachStep(o, path, "pretokenizers",
                         [&](Element item, const std::string& p, bool is_last) {
                           return LoadPreTokenizer(item, p, last && is_last);
                         });
    }
    if (type == "Split") {
      LORADB_RETURN_IF_ERROR(OnlyKeys(o, path, {"type", "pattern", "behavior", "invert"}));
      PreTokenizerStep step;
      step.kind = PreTokenizerStep::kSplit;
      LORADB_ASSIGN_OR_RETURN(std::string behavior, RequiredString(o, path, "behavior"));
      static const std::pair<const char*, PreTokenizerStep::Behavior> kBehaviors[] = {
          {"Isolated", PreTokenizerStep::kIsolated},
          {"Removed", PreTokenizerStep::kRemoved},
          {"MergedWithPrevious", PreTokenizerStep::kMergedWithPrevious},
          {"MergedWithNext", PreTokenizerStep::kMergedWithNext},
          {"Contiguous", PreTokenizerStep::kContiguous}};
      bool known = false;
      for (const auto& [name, value] : kBehaviors) {
        if (behavior == name) {
          step.behavior = value;
          known = true;
        }
      }
      if (!known) {
        return Unsupported(path + ".behavior", absl::StrCat("Split behavior \"", behavior, "\""));
      }
      LORADB_ASSIGN_OR_RETURN(step.invert, Bool(o, path, "invert", std::nullopt));
      LORADB_ASSIGN_OR_RETURN(step.pattern, LoadPattern(o, path, "pattern"));
      tok_->pre_steps_.push_back(std::move(step));
      return absl::OkStatus();
    }
    if (type == "Metaspace") {
      LORADB_RETURN_IF_ERROR(OnlyKeys(
          o, path,
          {"type", "replacement", "prepend_scheme", "split", "add_prefix_space", "str_rep"}));
      PreTokenizerStep step;
      step.kind = PreTokenizerStep::kMetaspace;
      LORADB_RETURN_IF_ERROR(LoadMetaspace(o, path, &step.replacement, &step.prepend));
      LORADB_ASSIGN_OR_RETURN(step.split, Bool(o, path, "split", true));
      tok_->pre_steps_.push_back(std::move(step));
      tok_->pre_tokenizer_rewrites_ = true;
      return absl::OkStatus();
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
        PreTokenizerStep step;
        step.kind = PreTokenizerStep::kSplit;
        auto re = Pattern::Regex(kGpt2Pattern);
        if (!re.ok()) return re.status();
        step.pattern = *std::move(re);
        tok_->pre_steps_.push_back(std::move(step));
      }
      tok_->byte_level_ = true;
      return absl::OkStatus();
    }
    return Unsupported(path, absl::StrCat("pre-tokenizer type \"", type, "\""));
  }

  // Metaspace's replacement and prepend scheme, as tokenizers reads them (prepend_scheme
  // defaults to "always"; the older add_prefix_space: false means "never").
  absl::Status LoadMetaspace(Object o, const std::string& path, std::string* replacement,
                             PreTokenizerStep::Prepend* prepend) const {
    LORADB_ASSIGN_OR_RETURN(*replacement, OneChar(o, path, "replacement"));
    LORADB_ASSIGN_OR_RETURN(std::optional<std::string> scheme,
                            OptString(o, path, "prepend_scheme"));
    *prepend = PreTokenizerStep::kAlways;
    if (scheme == "first") {
      *prepend = PreTokenizerStep::kFirst;
    } else if (scheme == "never") {
      *prepend = PreTokenizerStep::kNever;
    } else if (scheme.has_value() && *scheme != "always") {
      return Unsupported(path + ".prepend_scheme",
                         absl::StrCat("prepend_scheme \"", *scheme, "\""));
    }
    LORADB_ASSIGN_OR_RETURN(bool add_prefix_space, Bool(o, path, "add_prefix_space", true));
    if (!add_prefix_space) *prepend = PreTokenizerStep::kNever;
    return absl::OkStatus();
  }

  absl::Status LoadPostProcessor(Element e, const std::string& path) {
    if (e.is_null()) return absl::OkStatus();
    Object o;
    LORADB_RETURN_IF_ERROR(AsObject(e, path, &o));
    LORADB_ASSIGN_OR_RETURN(std::string type, Type(o, path));
    if (type == "ByteLevel") {
      return OnlyKeys(o, path, {"type", "add_prefix_space", "trim_offsets", "use_regex"});
    }
    if (type == "Sequence") {
      LORADB_RETURN_IF_ERROR(OnlyKeys(o, path, {"type", "processors"}));
      return ForEachStep(o, path, "processors", [&](Element item, const std::string& p, bool) {
        return LoadPostProcessor(item, p);
      });
    }
    if (type == "TemplateProcessing") return LoadTemplate(o, path);
    return Unsupported(path, absl::StrCat("post-processor type \"", type, "\""));
  }

  // TemplateProcessing: the `single` template's special tokens become ids around the sequence;
  // `pair` is read for validity only (loradb encodes single sequences).
  absl::Status LoadTemplate(Object o, const std::string& path) {
    LORADB_RETURN_IF_ERROR(OnlyKeys(o, path, {"type", "single", "pair", "special_tokens"}));
    Object specials;
    if (o["special_tokens"].get_object().get(specials)) {
      return Error(path + ".special_tokens", "expected an object");
    }
    absl::flat_hash_map<std::string, std::vector<int32_t>> ids_of;
    for (auto field : specials) {
      const std::string at = absl::StrCat(path, ".special_tokens[\"", Str(field.key), "\"]");
      Object token;
      LORADB_RETURN_IF_ERROR(AsObject(field.value, at, &token));
      LORADB_RETURN_IF_ERROR(OnlyKeys(token, at, {"id", "ids", "tokens"}));
      simdjson::dom::array ids;
      if (token["ids"].get_array().get(ids)) return Error(at + ".ids", "expected an array");
      std::vector<int32_t>& out = ids_of[Str(field.key)];
      for (Element id : ids) {
        LORADB_ASSIGN_OR_RETURN(int32_t v, Id(id, at + ".ids"));
        out.push_back(v);
      }
    }
    const auto read = [&](const char* key, bool single, Template* t) -> absl::Status {
      const std::string at = absl::StrCat(path, ".", key);
      simdjson::dom::array items;
      if (o[key].get_array().get(items)) return Error(at, "expected an array");
      int sequences = 0;
      for (Element item : items) {
        Object piece, inner;
        LORADB_RETURN_IF_ERROR(AsObject(item, at, &piece));
        std::string_view name;
        if (!piece["SpecialToken"].get_object().get(inner)) {
          if (inner["id"].get_string().get(name)) return Error(at, "SpecialToken without an id");
          auto it = ids_of.find(Str(name));
          if (it == ids_of.end()) {
            return Error(
                at, absl::StrCat("special token \"", Str(name), "\" is not in special_tokens"));
          }
          std::vector<int32_t>& side = sequences == 0 ? t->before : t->after;
          side.insert(side.end(), it->second.begin(), it->second.end());
        } else if (!piece["Sequence"].get_object().get(inner)) {
          if (inner["id"].get_string().get(name) || (name != "A" && name != "B")) {
            return Error(at, "a Sequence whose id is not \"A\" or \"B\"");
          }
          if (single && name != "A") return Unsupported(at, "a single template with sequence B");
          ++sequences;
        } else {
          return Error(at, "expected {\"SpecialToken\": ...} or {\"Sequence\": ...}");
        }
      }
      if (single && sequences != 1) {
        return Unsupported(at, "a single template without exactly one sequence A");
      }
      return absl::OkStatus();
    };
    Template single, pair;
    LORADB_RETURN_IF_ERROR(read("single", true, &single));
    LORADB_RETURN_IF_ERROR(read("pair", false, &pair));
    // In a Sequence of processors, a later template wraps what the earlier ones made.
    single.before.insert(single.before.end(), tok_->template_.before.begin(),
                         tok_->template_.before.end());
    single.after.insert(single.after.begin(), tok_->template_.after.begin(),
                        tok_->template_.after.end());
    tok_->template_ = std::move(single);
    return absl::OkStatus();
  }

  absl::Status LoadDecoder(Element e, const std::string& path) {
    Object o;
    LORADB_RETURN_IF_ERROR(AsObject(e, path, &o));
    LORADB_ASSIGN_OR_RETURN(std::string type, Type(o, path));
    DecoderStep step;
    if (type == "Sequence") {
      LORADB_RETURN_IF_ERROR(OnlyKeys(o, path, {"type", "decoders"}));
      return ForEachStep(o, path, "decoders", [&](Element item, const std::string& p, bool) {
        return LoadDecoder(item, p);
      });
    } else if (type == "ByteLevel") {
      // The ByteLevel decoder maps characters back to bytes; its flags do not change that.
      LORADB_RETURN_IF_ERROR(
          OnlyKeys(o, path, {"type", "add_prefix_space", "trim_offsets", "use_regex"}));
      step.kind = DecoderStep::kByteLevel;
    } else if (type == "Replace") {
      LORADB_RETURN_IF_ERROR(OnlyKeys(o, path, {"type", "pattern", "content"}));
      step.kind = DecoderStep::kReplace;
      LORADB_ASSIGN_OR_RETURN(step.pattern, LoadPattern(o, path, "pattern"));
      LORADB_ASSIGN_OR_RETURN(step.content, RequiredString(o, path, "content"));
    } else if (type == "ByteFallback") {
      LORADB_RETURN_IF_ERROR(OnlyKeys(o, path, {"type"}));
      step.kind = DecoderStep::kByteFallback;
    } else if (type == "Fuse") {
      LORADB_RETURN_IF_ERROR(OnlyKeys(o, path, {"type"}));
    } else if (type == "Strip") {
      LORADB_RETURN_IF_ERROR(OnlyKeys(o, path, {"type", "content", "start", "stop"}));
      step.kind = DecoderStep::kStrip;
      LORADB_ASSIGN_OR_RETURN(step.content, OneChar(o, path, "content"));
      LORADB_ASSIGN_OR_RETURN(step.start, Count(o, path, "start"));
      LORADB_ASSIGN_OR_RETURN(step.stop, Count(o, path, "stop"));
    } else if (type == "Metaspace") {
      LORADB_RETURN_IF_ERROR(OnlyKeys(
          o, path,
          {"type", "replacement", "prepend_scheme", "split", "add_prefix_space", "str_rep"}));
      step.kind = DecoderStep::kMetaspace;
      PreTokenizerStep::Prepend prepend;
      LORADB_RETURN_IF_ERROR(LoadMetaspace(o, path, &step.content, &prepend));
      step.metaspace_prepend = prepend != PreTokenizerStep::kNever;
    } else {
      return Unsupported(path, absl::StrCat("decoder type \"", type, "\""));
    }
    tok_->decoder_.push_back(std::move(step));
    return absl::OkStatus();
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
    LORADB_ASSIGN_OR_RETURN(tok_->byte_fallback_, Bool(o, "model", "byte_fallback", false));
    const bool byte_fallback = tok_->byte_fallback_;
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

    tok_->byte_fallback_id_.fill(-1);
    for (int b = 0; b < 256; ++b) {
      auto f = tok_->vocab_.find(absl::StrFormat("<0x%02X>", b));
      if (f != tok_->vocab_.end()) tok_->byte_fallback_id_[b] = f->second;
    }
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
          const int32_t f = tok_->byte_fallback_id_[static_cast<uint8_t>(c)];
          if (f < 0) break;
          ids.push_back(f);
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
      if (t.normalized) {
        // tokenizers matches a normalized token by its content run through the normalizer.
        std::string key = t.content;
        LORADB_RETURN_IF_ERROR(Normalize(tok_->normalizer_, &key));
        if (!key.empty()) tok_->trie_[1].Insert(key, token_index);
      } else {
        tok_->trie_[0].Insert(t.content, token_index);
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
    // With a ByteLevel decoder alone, each id's bytes are computed once.
    tok_->byte_level_decoder_only_ =
        tok_->decoder_.size() == 1 && tok_->decoder_[0].kind == DecoderStep::kByteLevel;
    if (tok_->byte_level_decoder_only_) {
      for (int32_t id = 0; id < size; ++id) {
        AppendByteLevelBytes(tok_->id_token_[id], &tok_->id_bytes_[id]);
      }
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

absl::StatusOr<std::vector<int32_t>> Tokenizer::Encode(absl::string_view text,
                                                       bool add_special_tokens) const {
  LORADB_RETURN_IF_ERROR(ValidateUtf8(text));
  std::vector<int32_t> ids;
  if (add_special_tokens) ids = template_.before;
  std::vector<Segment> raw, normalized_segments;
  SplitAddedTokens(text, /*normalized_set=*/false, &raw);
  std::string normalized;
  for (const Segment& seg : raw) {
    if (seg.added_id >= 0) {
      ids.push_back(seg.added_id);
      continue;
    }
    absl::string_view piece = text.substr(seg.begin, seg.end - seg.begin);
    if (!normalizer_.empty()) {
      normalized.assign(piece.data(), piece.size());
      LORADB_RETURN_IF_ERROR(Normalize(normalizer_, &normalized));
      piece = normalized;
    }
    normalized_segments.clear();
    SplitAddedTokens(piece, /*normalized_set=*/true, &normalized_segments);
    for (const Segment& sub : normalized_segments) {
      if (sub.added_id >= 0) {
        ids.push_back(sub.added_id);
      } else {
        LORADB_RETURN_IF_ERROR(EncodeNormalized(piece.substr(sub.begin, sub.end - sub.begin),
                                                seg.begin == 0 && sub.begin == 0, &ids));
      }
    }
  }
  if (add_special_tokens) ids.insert(ids.end(), template_.after.begin(), template_.after.end());
  return ids;
}

absl::Status Tokenizer::EncodeNormalized(absl::string_view text, bool first,
                                         std::vector<int32_t>* ids) const {
  std::vector<Piece> pieces{{0, text.size(), first}};
  if (!pre_tokenizer_rewrites_) {
    // Split steps only: they cut `text` in place.
    for (const PreTokenizerStep& step : pre_steps_) {
      LORADB_RETURN_IF_ERROR(SplitPieces(step, text, &pieces));
    }
    for (const Piece& p : pieces) EncodePiece(text.substr(p.begin, p.end - p.begin), ids);
    return absl::OkStatus();
  }
  std::string work(text);
  for (const PreTokenizerStep& step : pre_steps_) {
    LORADB_RETURN_IF_ERROR(PreTokenize(step, &work, &pieces));
  }
  const absl::string_view view = work;
  for (const Piece& p : pieces) EncodePiece(view.substr(p.begin, p.end - p.begin), ids);
  return absl::OkStatus();
}

void Tokenizer::ByteLevelSymbols(absl::string_view piece, std::vector<int32_t>* word) const {
  // As tokenizers' BPE builds a word: each byte-level character's id; else its byte-fallback ids
  // (which do not flush a pending unknown); else the unknown token (runs fused when fuse_unk);
  // else nothing.
  bool pending_unk = false;
  for (char c : piece) {
    const auto b = static_cast<uint8_t>(c);
    if (byte_in_vocab_[b]) {
      if (pending_unk) word->push_back(*unk_id_);
      pending_unk = false;
      word->push_back(byte_symbols_[b][0]);
    } else if (!byte_symbols_[b].empty()) {
      word->insert(word->end(), byte_symbols_[b].begin(), byte_symbols_[b].end());
    } else if (unk_id_.has_value()) {
      if (pending_unk && !fuse_unk_) word->push_back(*unk_id_);
      pending_unk = true;
    }
  }
  if (pending_unk) word->push_back(*unk_id_);
}

void Tokenizer::CharSymbols(absl::string_view piece, std::vector<int32_t>* word) const {
  // The same over characters: the character's id; else one "<0xXX>" id per UTF-8 byte when all
  // exist; else the unknown token.
  bool pending_unk = false;
  size_t pos = 0;
  while (pos < piece.size()) {
    const size_t start = pos;
    NextCodePoint(piece, &pos);
    const absl::string_view ch = piece.substr(start, pos - start);
    if (auto it = vocab_.find(ch); it != vocab_.end()) {
      if (pending_unk) word->push_back(*unk_id_);
      pending_unk = false;
      word->push_back(it->second);
      continue;
    }
    if (byte_fallback_) {
      bool all = true;
      for (char c : ch) all = all && byte_fallback_id_[static_cast<uint8_t>(c)] >= 0;
      if (all) {
        for (char c : ch) word->push_back(byte_fallback_id_[static_cast<uint8_t>(c)]);
        continue;
      }
    }
    if (unk_id_.has_value()) {
      if (pending_unk && !fuse_unk_) word->push_back(*unk_id_);
      pending_unk = true;
    }
  }
  if (pending_unk) word->push_back(*unk_id_);
}

void Tokenizer::EncodePiece(absl::string_view piece, std::vector<int32_t>* ids) const {
  if (ignore_merges_) {
    // A piece that is a whole vocabulary entry is that entry, merges or not.
    std::string mapped;
    if (byte_level_) {
      const ByteLevelAlphabet& alphabet = ByteLevel();
      for (char c : piece) mapped += alphabet.encoded[static_cast<uint8_t>(c)];
    }
    if (auto it = vocab_.find(byte_level_ ? absl::string_view(mapped) : piece);
        it != vocab_.end()) {
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
  std::vector<int32_t> word;
  word.reserve(piece.size());
  if (byte_level_) {
    ByteLevelSymbols(piece, &word);
  } else {
    CharSymbols(piece, &word);
  }
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
  for (int32_t id : ids) {
    if (id < 0 || id >= vocab_size() || !id_present_[id]) {
      return absl::InvalidArgumentError(
          absl::StrCat("token id ", id, " is not in the vocabulary (", vocab_size(), " ids)"));
    }
  }
  if (byte_level_decoder_only_) {
    std::string bytes;
    for (int32_t id : ids) {
      if (!(skip_special_tokens && id_special_[id])) bytes += id_bytes_[id];
    }
    std::string text;
    text.reserve(bytes.size());
    AppendUtf8Lossy(bytes, &text);
    return text;
  }
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int32_t id : ids) {
    if (!(skip_special_tokens && id_special_[id])) tokens.push_back(id_token_[id]);
  }
  return DecodeChain(decoder_, std::move(tokens));
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
    // tokenizers' DecodeStream fails the same way ("Invalid prefix encountered"): e.g. byte
    // fallback tokens that decode alone but turn into U+FFFDs with the bytes after them.
    return absl::FailedPreconditionError(absl::StrCat(
        "decode stream: invalid prefix: the text decoded so far no longer starts with \"", prefix_,
        "\" after token id ", id));
  }
  std::string new_text = text.substr(prefix_.size());
  const size_t new_prefix_index = ids_.size() - prefix_index_;
  ids_.erase(ids_.begin(), ids_.begin() + static_cast<std::ptrdiff_t>(prefix_index_));
  LORADB_ASSIGN_OR_RETURN(prefix_, tokenizer_.Decode(ids_, skip_special_));
  prefix_index_ = new_prefix_index;
  return std::optional<std::string>(std::move(new_text));
}

}  // namespace loradb::text
