// text/tokenizer.h on a hand-built byte-level BPE tokenizer.json: merge order, added and special
// tokens, decoding of cut UTF-8, streaming decode, bad input, and the load-time refusals of what
// the tokenizer does not implement. Agreement with Hugging Face tokenizers on trained tokenizers
// is tests/python/tokenizer_oracle.py.
#include "text/tokenizer.h"

#include <gtest/gtest.h>

#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tests/test_util.h"
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
         j["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", "_"}};
       },
       "Metaspace"},
      {"no byte level", [](Json& j) { j["pre_tokenizer"]["pretokenizers"].erase(1); }, "ByteLevel"},
      {"split behavior",
       [](Json& j) { j["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "Removed"; }, "Removed"},
      {"split invert", [](Json& j) { j["pre_tokenizer"]["pretokenizers"][0]["invert"] = true; },
       "invert"},
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
         j["post_processor"] = {{"type", "TemplateProcessing"}};
       },
       "TemplateProcessing"},
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
