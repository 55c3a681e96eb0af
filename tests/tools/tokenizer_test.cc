// text/tokenizer.h on a hand-built byte-level BPE tokenizer.json: merge order, added and special
// tokens, decoding of cut UTF-8, streaming decode, bad input, and the load-time refusals of what
// the tokenizer does not implement. Agreement with Hugging Face tokenizers on trained tokenizers
// is tests/python/tokenizer_oracle.py.
#include "text/tokenizer.h"

#include <gtest/gtest.h>

#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "tests/test_util.h"
#include "text/pipeline.h"
#include "text/utf8.h"

namespace loradb::text {
namespace {

using Json = nlohmann::json;
using ::loradb::testing::TempDir;

constexpr char kQwenPattern[] =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// Byte-level character of byte `b`, as a string.
std::string Char(uint8_t b) { return ByteLevel().encoded[b]; }

// Ids 0..255: the byte alphabet in byte order; then the merges "a b" (256), "ab c" (257),
// "Ġ a" (258); added tokens <|end|> (special, 259) and <mark> (not special, 260).
Json MiniTokenizer() {
  Json vocab = Json::object();
  for (int b = 0; b < 256; ++b) vocab[Char(static_cast<uint8_t>(b))] = b;
  vocab["ab"] = 256;
  vocab["abc"] = 257;
  vocab[Char(' ') + "a"] = 258;
  Json merges = Json::array(
      {Json::array({"a", "b"}), Json::array({"ab", "c"}), Json::array({Char(' '), "a"})});
  const auto added = [](int id, const char* content, bool special) {
    return Json{{"id", id},        {"content", content},  {"single_word", false}, {"lstrip", false},
                {"rstrip", false}, {"normalized", false}, {"special", special}};
  };
  return Json{
      {"version", "1.0"},
      {"truncation", nullptr},
      {"padding", nullptr},
      {"added_tokens", Json::array({added(259, "<|end|>", true), added(260, "<mark>", false)})},
      {"normalizer", {{"type", "NFC"}}},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers", Json::array({Json{{"type", "Split"},
                                            {"pattern", {{"Regex", kQwenPattern}}},
                                            {"behavior", "Isolated"},
                                            {"invert", false}},
                                       Json{{"type", "ByteLevel"},
                                            {"add_prefix_space", false},
                                            {"trim_offsets", false},
                                            {"use_regex", false}}})}}},
      {"post_processor",
       {{"type", "ByteLevel"},
        {"add_prefix_space", false},
        {"trim_offsets", false},
        {"use_regex", false}}},
      {"decoder",
       {{"type", "ByteLevel"},
        {"add_prefix_space", false},
        {"trim_offsets", false},
        {"use_regex", false}}},
      {"model",
       {{"type", "BPE"},
        {"dropout", nullptr},
        {"unk_token", nullptr},
        {"continuing_subword_prefix", ""},
        {"end_of_word_suffix", ""},
        {"fuse_unk", false},
        {"byte_fallback", false},
        {"ignore_merges", false},
        {"vocab", vocab},
        {"merges", merges}}}};
}

// A TemplateProcessing post-processor: `before`, then $A, then `after` (special token names, each
// its id in MiniTokenizer's vocabulary).
Json Template(const std::vector<std::string>& before, const std::vector<std::string>& after) {
  const std::map<std::string, int> ids = {{"<|end|>", 259}, {"<mark>", 260}, {"<|nope|>", 0}};
  Json single = Json::array(), specials = Json::object();
  const auto add = [&](const std::string& name) {
    single.push_back({{"SpecialToken", {{"id", name}, {"type_id", 0}}}});
    if (name != "<|nope|>") {
      specials[name] = {{"id", name}, {"ids", {ids.at(name)}}, {"tokens", {name}}};
    }
  };
  for (const std::string& name : before) add(name);
  single.push_back({{"Sequence", {{"id", "A"}, {"type_id", 0}}}});
  for (const std::string& name : after) add(name);
  return Json{{"type", "TemplateProcessing"},
              {"single", single},
              {"pair", single},
              {"special_tokens", specials}};
}

std::unique_ptr<Tokenizer> Load(const Json& j) {
  auto tok = Tokenizer::FromJson(j.dump(), "mini/tokenizer.json");
  EXPECT_TRUE(tok.ok()) << tok.status();
  return tok.ok() ? *std::move(tok) : nullptr;
}

std::vector<int32_t> Bytes(absl::string_view s) {
  std::vector<int32_t> ids;
  for (char c : s) ids.push_back(static_cast<uint8_t>(c));
  return ids;
}

TEST(TokenizerTest, MergesApplyByRankLeftmostFirst) {
  auto tok = Load(MiniTokenizer());
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(tok->vocab_size(), 261);
  // "abcab" is one pre-token: a b c a b -> ab c ab (rank 0 at both places) -> abc ab.
  EXPECT_EQ(*tok->Encode("abcab"), (std::vector<int32_t>{257, 256}));
  // "aab": the (a, b) merge is at the second a.
  EXPECT_EQ(*tok->Encode("aab"), (std::vector<int32_t>{'a', 256}));
  // " a b": pre-tokens " a" and " b"; only the first has a merge.
  // " a b": pre-tokens " a" and " b"; only the first has a merge (Ġ is byte 0x20's id).
  EXPECT_EQ(*tok->Encode(" a b"), (std::vector<int32_t>{258, ' ', 'b'}));
  EXPECT_TRUE(tok->Encode("")->empty());
}

TEST(TokenizerTest, AddedTokensMatchBeforePreTokenizer) {
  auto tok = Load(MiniTokenizer());
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(*tok->Encode("ab<|end|>ab<mark>"), (std::vector<int32_t>{256, 259, 256, 260}));
  // A cut special token is plain text.
  EXPECT_EQ(*tok->Encode("<|end|"), Bytes("<|end|"));
  EXPECT_EQ(tok->TokenToId("<|end|>"), 259);
  EXPECT_EQ(tok->IdToToken(256), "ab");
  EXPECT_TRUE(tok->IsSpecial(259));
  EXPECT_FALSE(tok->IsSpecial(260));
  EXPECT_EQ(*tok->Decode({256, 259, 256, 260}, /*skip_special_tokens=*/true), "abab<mark>");
  EXPECT_EQ(*tok->Decode({256, 259, 256, 260}, /*skip_special_tokens=*/false), "ab<|end|>ab<mark>");
}

TEST(TokenizerTest, NfcBeforeBpe) {
  auto tok = Load(MiniTokenizer());
  ASSERT_NE(tok, nullptr);
  // e + combining acute composes to U+00E9 (C3 A9) before the byte-level step.
  EXPECT_EQ(*tok->Encode("e\xCC\x81"), Bytes("\xC3\xA9"));
}

TEST(TokenizerTest, CutUtf8DecodesToReplacementAndStreamsWhole) {
  auto tok = Load(MiniTokenizer());
  ASSERT_NE(tok, nullptr);
  const std::vector<int32_t> ids = *tok->Encode(
      "\xC3\xA9"
      "ab");  // é ab: two byte ids + ab
  ASSERT_EQ(ids, (std::vector<int32_t>{0xC3, 0xA9, 256}));
  EXPECT_EQ(*tok->Decode({0xC3}, true), "\xEF\xBF\xBD");
  EXPECT_EQ(*tok->Decode({0xA9, 256}, true),
            "\xEF\xBF\xBD"
            "ab");
  DecodeStream stream(*tok, true);
  EXPECT_EQ(*stream.Step(0xC3), std::nullopt);
  EXPECT_EQ(*stream.Step(0xA9), "\xC3\xA9");
  EXPECT_EQ(*stream.Step(256), "ab");
}

TEST(TokenizerTest, BadInputIsRefused) {
  auto tok = Load(MiniTokenizer());
  ASSERT_NE(tok, nullptr);
  auto bad = tok->Encode("ok \xC3(");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("UTF-8"), absl::string_view::npos) << bad.status();
  EXPECT_FALSE(tok->Encode("\xED\xA0\x80").ok());  // a surrogate
  auto unknown = tok->Decode({1, 261}, true);
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.status().message().find("261"), absl::string_view::npos) << unknown.status();
  EXPECT_FALSE(tok->Decode({-1}, true).ok());
}

TEST(TokenizerTest, LongRunsOfOneCharacter) {
  auto tok = Load(MiniTokenizer());
  ASSERT_NE(tok, nullptr);
  const size_t n = 200000;
  // One pre-token of n letters: (a, b) merges n/2 times, leaving n/2 "ab".
  std::string ab;
  for (size_t i = 0; i < n / 2; ++i) ab += "ab";
  EXPECT_EQ(tok->Encode(ab)->size(), n / 2);
  EXPECT_EQ(tok->Encode(std::string(n, 'a'))->size(), n);
  // Spaces then a letter: "\s+(?!\S)" takes n-1 spaces, then " a" merges.
  auto spaces = tok->Encode(std::string(n, ' ') + "a");
  ASSERT_TRUE(spaces.ok()) << spaces.status();
  EXPECT_EQ(spaces->size(), n);
  EXPECT_EQ(spaces->back(), 258);
  EXPECT_EQ(tok->Encode(std::string(n, '\n'))->size(), n);
  EXPECT_EQ(tok->Encode(std::string(n, '1'))->size(), n);
}

// A SentencePiece-style tokenizer in the legacy Llama 2 layout: <unk> <s> </s> (0..2), the byte
// tokens <0x00>..<0xFF> (3..258), then "▁" (259), "a", "b", "▁a", "ab", "▁ab" (260..264) and "é"
// (265); normalizer Prepend("▁") + Replace(" ", "▁"), no pre-tokenizer, a template adding <s>,
// decoder Replace + ByteFallback + Fuse + Strip.
constexpr char kSpace[] = "\xE2\x96\x81";  // U+2581, SentencePiece's word boundary

Json SpmTokenizer() {
  const std::string sp = kSpace;
  Json vocab = {{"<unk>", 0}, {"<s>", 1}, {"</s>", 2}};
  for (int b = 0; b < 256; ++b) vocab[absl::StrFormat("<0x%02X>", b)] = 3 + b;
  int id = 259;
  for (const std::string& t : {sp, std::string("a"), std::string("b"), sp + "a", std::string("ab"),
                               sp + "ab", std::string("\xC3\xA9")}) {
    vocab[t] = id++;
  }
  const auto added = [](int id, const char* content) {
    return Json{{"id", id},        {"content", content},  {"single_word", false}, {"lstrip", false},
                {"rstrip", false}, {"normalized", false}, {"special", true}};
  };
  Json pre = {{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}};
  return Json{
      {"version", "1.0"},
      {"truncation", nullptr},
      {"padding", nullptr},
      {"added_tokens", Json::array({added(0, "<unk>"), added(1, "<s>"), added(2, "</s>")})},
      {"normalizer",
       {{"type", "Sequence"},
        {"normalizers",
         Json::array(
             {Json{{"type", "Prepend"}, {"prepend", sp}},
              Json{{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", sp}}})}}},
      {"pre_tokenizer", nullptr},
      {"post_processor",
       {{"type", "TemplateProcessing"},
        {"single", Json::array({pre, Json{{"Sequence", {{"id", "A"}, {"type_id", 0}}}}})},
        {"pair", Json::array({pre, Json{{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
                              Json{{"Sequence", {{"id", "B"}, {"type_id", 1}}}}})},
        {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", {1}}, {"tokens", {"<s>"}}}}}}}},
      {"decoder",
       {{"type", "Sequence"},
        {"decoders",
         Json::array({Json{{"type", "Replace"}, {"pattern", {{"String", sp}}}, {"content", " "}},
                      Json{{"type", "ByteFallback"}}, Json{{"type", "Fuse"}},
                      Json{{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}})}}},
      {"model",
       {{"type", "BPE"},
        {"dropout", nullptr},
        {"unk_token", "<unk>"},
        {"continuing_subword_prefix", nullptr},
        {"end_of_word_suffix", nullptr},
        {"fuse_unk", true},
        {"byte_fallback", true},
        {"ignore_merges", false},
        {"vocab", vocab},
        {"merges", Json::array({Json::array({sp, "a"}), Json::array({"a", "b"}),
                                Json::array({sp + "a", "b"})})}}}};
}

TEST(TokenizerTest, SentencePieceStyleBpe) {
  auto tok = Load(SpmTokenizer());
  ASSERT_NE(tok, nullptr);
  // "▁ab▁ab" is one piece (no pre-tokenizer): (▁, a) merges first at both places, then (▁a, b).
  EXPECT_EQ(*tok->Encode("ab ab", /*add_special_tokens=*/false), (std::vector<int32_t>{264, 264}));
  EXPECT_EQ(*tok->Encode("ab ab"), (std::vector<int32_t>{1, 264, 264}));
  EXPECT_EQ(tok->special_template().before, std::vector<int32_t>{1});
  EXPECT_TRUE(tok->special_template().after.empty());
  // Characters outside the vocabulary become their UTF-8 bytes' tokens.
  EXPECT_EQ(*tok->Encode("c", false), (std::vector<int32_t>{259, 3 + 'c'}));
  EXPECT_EQ(*tok->Encode("\xC3\xA9", false), (std::vector<int32_t>{259, 265}));
  EXPECT_EQ(*tok->Encode("\xF0\x9F\x98\x80", false),
            (std::vector<int32_t>{259, 3 + 0xF0, 3 + 0x9F, 3 + 0x98, 3 + 0x80}));
  // Prepend applies to each stretch of text between added tokens.
  EXPECT_EQ(*tok->Encode("<s>ab", false), (std::vector<int32_t>{1, 264}));
  EXPECT_EQ(*tok->Encode("", true), std::vector<int32_t>{1});
  EXPECT_TRUE(tok->Encode("", false)->empty());
  // Decoding: ▁ becomes a space, then the first one is stripped.
  EXPECT_EQ(*tok->Decode({1, 264, 264}, /*skip_special_tokens=*/true), "ab ab");
  EXPECT_EQ(*tok->Decode({1, 264, 264}, false), "<s> ab ab");
  // Byte tokens are joined; a run that is not valid UTF-8 becomes one U+FFFD per byte, not per
  // maximal subpart as byte-level decoding does.
  EXPECT_EQ(*tok->Decode({3 + 0xC3, 3 + 0xA9}, true), "\xC3\xA9");
  EXPECT_EQ(*tok->Decode({3 + 0xC3, 260}, true),
            "\xEF\xBF\xBD"
            "a");
  EXPECT_EQ(*tok->Decode({3 + 0xC3, 3 + 'A'}, true), "\xEF\xBF\xBD\xEF\xBF\xBD");
}

TEST(TokenizerTest, UnknownCharactersFuse) {
  Json j = SpmTokenizer();
  j["model"]["byte_fallback"] = false;
  auto fused = Load(j);
  ASSERT_NE(fused, nullptr);
  EXPECT_EQ(*fused->Encode("ccaxx", false), (std::vector<int32_t>{259, 0, 260, 0}));
  j["model"]["fuse_unk"] = false;
  auto unfused = Load(j);
  ASSERT_NE(unfused, nullptr);
  EXPECT_EQ(*unfused->Encode("ccaxx", false), (std::vector<int32_t>{259, 0, 0, 260, 0, 0}));
}

// Split pieces of `text` by `pattern` with `behavior`.
std::vector<std::string> SplitBy(const std::string& text, const std::string& pattern,
                                 PreTokenizerStep::Behavior behavior, bool invert = false) {
  PreTokenizerStep step;
  step.pattern = Pattern::Literal(pattern);
  step.behavior = behavior;
  step.invert = invert;
  std::vector<Piece> pieces{{0, text.size(), true}};
  EXPECT_TRUE(SplitPieces(step, text, &pieces).ok());
  std::vector<std::string> out;
  for (const Piece& p : pieces) out.push_back(text.substr(p.begin, p.end - p.begin));
  return out;
}

TEST(TokenizerTest, SplitBehaviors) {
  using V = std::vector<std::string>;
  EXPECT_EQ(SplitBy("a  b", " ", PreTokenizerStep::kIsolated), (V{"a", " ", " ", "b"}));
  EXPECT_EQ(SplitBy("a  b", " ", PreTokenizerStep::kRemoved), (V{"a", "b"}));
  EXPECT_EQ(SplitBy("a  b", " ", PreTokenizerStep::kMergedWithPrevious), (V{"a ", " ", "b"}));
  EXPECT_EQ(SplitBy("a  b", " ", PreTokenizerStep::kMergedWithNext), (V{"a", " ", " b"}));
  EXPECT_EQ(SplitBy("a  b", " ", PreTokenizerStep::kContiguous), (V{"a", "  ", "b"}));
  EXPECT_EQ(SplitBy(" a", " ", PreTokenizerStep::kMergedWithPrevious), (V{" ", "a"}));
  EXPECT_EQ(SplitBy("a b", " ", PreTokenizerStep::kRemoved, /*invert=*/true), (V{" "}));
}

TEST(TokenizerTest, MetaspacePrependsAndSplits) {
  const std::string sp = kSpace;
  PreTokenizerStep step;
  step.kind = PreTokenizerStep::kMetaspace;
  step.replacement = sp;
  step.prepend = PreTokenizerStep::kFirst;
  for (bool first : {true, false}) {
    std::string text = "a b";
    std::vector<Piece> pieces{{0, text.size(), first}};
    ASSERT_TRUE(PreTokenize(step, &text, &pieces).ok());
    std::vector<std::string> got;
    for (const Piece& p : pieces) got.push_back(text.substr(p.begin, p.end - p.begin));
    EXPECT_EQ(got, (first ? std::vector<std::string>{sp + "a", sp + "b"}
                          : std::vector<std::string>{"a", sp + "b"}));
  }
}

TEST(TokenizerTest, FamilyMiniTokenizersRoundTrip) {
  // The committed mini tokenizers of each family's layout load, fit a 1024-id vocabulary, add
  // their template's BOS, and decode what they encode back to the text.
  const std::string text = "The sky is blue.\nWhat colour is the sun? It is   yellow!";
  for (const char* kind : {"llama3", "mistral", "phi3", "gemma"}) {
    auto tok = Tokenizer::Load(testing::TestData(absl::StrCat("tokenizer/mini_", kind, ".json")));
    ASSERT_TRUE(tok.ok()) << kind << ": " << tok.status();
    EXPECT_LE((*tok)->vocab_size(), 1024) << kind;
    auto with = (*tok)->Encode(text);
    auto without = (*tok)->Encode(text, /*add_special_tokens=*/false);
    ASSERT_TRUE(with.ok() && without.ok()) << kind;
    EXPECT_EQ(with->size(), without->size() + 1) << kind;
    EXPECT_TRUE((*tok)->IsSpecial(with->front())) << kind;
    EXPECT_EQ(*(*tok)->Decode(*with, /*skip_special_tokens=*/true), text) << kind;
  }
}

TEST(TokenizerTest, LoadsFileOrDirectory) {
  TempDir dir;
  { std::ofstream(dir.file("tokenizer.json")) << MiniTokenizer().dump(); }
  auto from_dir = Tokenizer::Load(dir.path());
  ASSERT_TRUE(from_dir.ok()) << from_dir.status();
  auto from_file = Tokenizer::Load(dir.file("tokenizer.json"));
  ASSERT_TRUE(from_file.ok()) << from_file.status();
  EXPECT_EQ(*(*from_dir)->Encode("abc"), *(*from_file)->Encode("abc"));
  TempDir empty;
  auto missing = Tokenizer::Load(empty.path());
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("tokenizer.json"), absl::string_view::npos);
}

// Each case changes the mini tokenizer so that loading must fail with an error naming `expect`.
struct Refusal {
  const char* name;
  std::function<void(Json&)> change;
  const char* expect;
};

TEST(TokenizerTest, RefusesWhatItDoesNotImplement) {
  const std::vector<Refusal> cases = {
      {"model type", [](Json& j) { j["model"]["type"] = "WordPiece"; }, "WordPiece"},
      {"normalizer",
       [](Json& j) {
         j["normalizer"] = {{"type", "Lowercase"}};
       },
       "Lowercase"},
      {"normalizer in sequence",
       [](Json& j) {
         j["normalizer"] = {{"type", "Sequence"},
                            {"normalizers", Json::array({{{"type", "NFC"}}, {{"type", "NFKC"}}})}};
       },
       "NFKC"},
      {"pre-tokenizer",
       [](Json& j) {
         j["pre_tokenizer"] = {{"type", "Whitespace"}};
       },
       "Whitespace"},
      {"byte level not last",
       [](Json& j) {
         auto& steps = j["pre_tokenizer"]["pretokenizers"];
         steps.push_back(steps[0]);
       },
       "ByteLevel step before the last"},
      {"split behavior",
       [](Json& j) { j["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "Sideways"; },
       "Sideways"},
      {"metaspace prepend scheme",
       [](Json& j) {
         j["pre_tokenizer"]["pretokenizers"][0] = {
             {"type", "Metaspace"}, {"replacement", "_"}, {"prepend_scheme", "sometimes"}};
       },
       "sometimes"},
      {"metaspace replacement of two characters",
       [](Json& j) {
         j["pre_tokenizer"]["pretokenizers"][0] = {{"type", "Metaspace"}, {"replacement", "__"}};
       },
       "one character"},
      {"regex \\w",
       [](Json& j) { j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "\\w+|\\s+"; },
       "\\w"},
      {"regex that does not compile",
       [](Json& j) { j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(ab"; },
       "does not compile"},
      {"add_prefix_space",
       [](Json& j) { j["pre_tokenizer"]["pretokenizers"][1]["add_prefix_space"] = true; },
       "add_prefix_space"},
      {"post-processor",
       [](Json& j) {
         j["post_processor"] = {{"type", "BertProcessing"}};
       },
       "BertProcessing"},
      {"template with an unknown special token",
       [](Json& j) { j["post_processor"] = Template({"<|nope|>"}, {}); }, "<|nope|>"},
      {"template adding an id that names no token",
       [](Json& j) {
         j["post_processor"] = Template({"<|end|>"}, {});
         j["post_processor"]["special_tokens"]["<|end|>"]["ids"] = {5000};
       },
       "id 5000"},
      {"template without sequence A",
       [](Json& j) {
         j["post_processor"] = Template({"<|end|>"}, {});
         j["post_processor"]["single"].erase(1);
       },
       "sequence A"},
      {"decoder in sequence",
       [](Json& j) {
         j["decoder"] = {{"type", "Sequence"},
                         {"decoders", Json::array({{{"type", "Fuse"}}, {{"type", "CTC"}}})}};
       },
       "CTC"},
      {"strip of two characters",
       [](Json& j) {
         j["decoder"] = {{"type", "Strip"}, {"content", "ab"}, {"start", 1}, {"stop", 0}};
       },
       "one character"},
      {"decoder",
       [](Json& j) {
         j["decoder"] = {{"type", "WordPiece"}};
       },
       "WordPiece"},
      {"no decoder", [](Json& j) { j["decoder"] = nullptr; }, "decoder"},
      {"truncation",
       [](Json& j) {
         j["truncation"] = {{"max_length", 8}};
       },
       "truncation"},
      {"padding",
       [](Json& j) {
         j["padding"] = {{"pad_id", 0}};
       },
       "padding"},
      {"unknown key", [](Json& j) { j["frobnicate"] = 1; }, "frobnicate"},
      {"unknown model key", [](Json& j) { j["model"]["scores"] = 1; }, "scores"},
      {"dropout", [](Json& j) { j["model"]["dropout"] = 0.1; }, "dropout"},
      {"subword prefix", [](Json& j) { j["model"]["continuing_subword_prefix"] = "##"; },
       "continuing_subword_prefix"},
      {"single_word", [](Json& j) { j["added_tokens"][0]["single_word"] = true; }, "single_word"},
      {"added token id", [](Json& j) { j["added_tokens"][1]["id"] = 300; }, "id 300"},
      {"added token field missing", [](Json& j) { j["added_tokens"][0].erase("special"); },
       "special"},
      {"merge of unknown token",
       [](Json& j) {
         j["model"]["merges"][0] = {"a", "zz"};
       },
       "zz"},
      {"bad merge string", [](Json& j) { j["model"]["merges"] = Json::array({"a b c"}); }, "a b c"},
      {"mixed merge forms", [](Json& j) { j["model"]["merges"][1] = "ab c"; }, "mixes"},
      {"duplicate vocab id", [](Json& j) { j["model"]["vocab"]["zz"] = 5; }, "id 5"},
      {"unk not in vocab", [](Json& j) { j["model"]["unk_token"] = "<unk>"; }, "<unk>"},
      {"vocab not an object", [](Json& j) { j["model"]["vocab"] = Json::array(); }, "vocab"},
      {"no model", [](Json& j) { j.erase("model"); }, "model"},
  };
  for (const Refusal& c : cases) {
    Json j = MiniTokenizer();
    c.change(j);
    auto tok = Tokenizer::FromJson(j.dump(), "mini/tokenizer.json");
    ASSERT_FALSE(tok.ok()) << c.name << ": loaded";
    EXPECT_EQ(tok.status().code(), absl::StatusCode::kInvalidArgument) << c.name;
    EXPECT_NE(tok.status().message().find(c.expect), absl::string_view::npos)
        << c.name << ": " << tok.status();
    EXPECT_NE(tok.status().message().find("mini/tokenizer.json"), absl::string_view::npos)
        << c.name << ": " << tok.status();
  }
}

TEST(TokenizerTest, MalformedJsonIsAClearError) {
  const std::string text = MiniTokenizer().dump();
  for (const std::string& broken :
       {text.substr(0, text.size() / 2), std::string("[]"), std::string(""), text + "}"}) {
    auto tok = Tokenizer::FromJson(broken, "broken.json");
    ASSERT_FALSE(tok.ok()) << broken.substr(0, 40);
    EXPECT_EQ(tok.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(tok.status().message().find("broken.json"), absl::string_view::npos) << tok.status();
  }
}

TEST(TokenizerTest, TranslatesOnigurumaEscapes) {
  // \s becomes the White_Space set (U+180E is not in it, unlike PCRE2's Unicode \s).
  auto re = TranslateOnigurumaPattern("\\s+");
  ASSERT_TRUE(re.ok()) << re.status();
  auto compiled = SplitRegex::Compile(*re);
  ASSERT_TRUE(compiled.ok()) << compiled.status();
  std::vector<std::pair<size_t, size_t>> matches;
  ASSERT_TRUE((*compiled)
                  ->FindAll("a\xE1\xA0\x8E"
                            "b \xE3\x80\x80"
                            "c",
                            &matches)
                  .ok());
  ASSERT_EQ(matches.size(), 1u);
  EXPECT_EQ(matches[0], std::make_pair(size_t{5}, size_t{9}));  // " " + U+3000
  for (const char* refused : {"\\bx", "[[:alpha:]]", "^a", "(?m:a)", "[\\S]", "[a&&b]"}) {
    EXPECT_FALSE(TranslateOnigurumaPattern(refused).ok()) << refused;
  }
}

}  // namespace
}  // namespace loradb::text
