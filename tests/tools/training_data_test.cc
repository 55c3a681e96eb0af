// storage/formats/training_data.h: every line form (token ids, text, chat, DPO pairs, GRPO
// prompts) parsed to the sequences and weights the trainer gets, text tokenized with a real
// tokenizer.json (tests/testdata/tokenizer/mini_tokenizer.json), and validation: each failing line
// reported by number, the list bounded, one kind per file, text refused without a tokenizer.
#include "storage/formats/training_data.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "tests/test_util.h"
#include "text/tokenizer.h"

namespace loradb::dataset {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

ParseOptions Ids(int64_t vocab = 1024) {
  ParseOptions o;
  o.vocab_size = vocab;
  o.no_tokenizer_reason = "/m/tokenizer.json does not exist";
  return o;
}

// The message of a parse that must fail.
std::string ErrorOf(const std::string& text, const ParseOptions& o = Ids()) {
  absl::StatusOr<Dataset> d = ParseTrainingData(text, "data.jsonl", o);
  EXPECT_FALSE(d.ok()) << text;
  return d.ok() ? "" : std::string(d.status().message());
}

const text::Tokenizer& Mini() {
  static const std::unique_ptr<text::Tokenizer> tok = [] {
    auto t = text::Tokenizer::Load(testing::TestData("tokenizer/mini_tokenizer.json"));
    EXPECT_TRUE(t.ok()) << t.status();
    return std::move(t).value();
  }();
  return *tok;
}

ParseOptions WithTokenizer() {
  ParseOptions o = Ids();
  o.tokenize = [](const std::string& t) -> absl::StatusOr<std::vector<int64_t>> {
    auto ids = Mini().Encode(t);
    if (!ids.ok()) return ids.status();
    return std::vector<int64_t>(ids->begin(), ids->end());
  };
  return o;
}

std::vector<int64_t> Encode(const std::string& t) {
  auto ids = Mini().Encode(t);
  EXPECT_TRUE(ids.ok()) << ids.status();
  return std::vector<int64_t>(ids->begin(), ids->end());
}

TEST(TrainingData, TokenIdLines) {
  absl::StatusOr<Dataset> d = ParseTrainingData(
      "{\"tokens\": [1, 5, 7, 9], \"weights\": [0, 0, 1, 0.5]}\n"
      "\n"
      "{\"tokens\": [3, 4, 5]}\r\n"
      "{\"prompt\": [1, 2], \"completion\": [8, 9]}\n",
      "data.jsonl", Ids());
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->kind, Kind::kSft);
  ASSERT_EQ(d->examples.size(), 3u);
  EXPECT_EQ(d->examples[0].line, 1);
  EXPECT_EQ(d->examples[0].tokens, (std::vector<int64_t>{1, 5, 7, 9}));
  EXPECT_EQ(d->examples[0].weights, (std::vector<float>{0, 0, 1, 0.5f}));
  EXPECT_EQ(d->examples[1].line, 3);  // the blank line 2 is skipped
  EXPECT_EQ(d->examples[1].weights, (std::vector<float>{0, 1, 1}));
  EXPECT_EQ(d->examples[2].tokens, (std::vector<int64_t>{1, 2, 8, 9}));
  EXPECT_EQ(d->examples[2].weights, (std::vector<float>{0, 0, 1, 1}));
  EXPECT_EQ(d->tokens, 11);
  EXPECT_EQ(d->text_lines, 0);
}

TEST(TrainingData, DpoAndGrpoLines) {
  absl::StatusOr<Dataset> dpo = ParseTrainingData(
      "{\"prompt\": [1, 2], \"chosen\": [3], \"rejected\": [4, 5]}\n", "d", Ids());
  ASSERT_TRUE(dpo.ok()) << dpo.status();
  EXPECT_EQ(dpo->kind, Kind::kDpo);
  EXPECT_EQ(dpo->examples[0].prompt, (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(dpo->examples[0].chosen, (std::vector<int64_t>{3}));
  EXPECT_EQ(dpo->examples[0].rejected, (std::vector<int64_t>{4, 5}));

  const std::string line = R"({"prompt": [1, 7, 2], "answer": 42, "meta": {"id": "q1"}})";
  absl::StatusOr<Dataset> grpo = ParseTrainingData(line + "\n", "g", Ids());
  ASSERT_TRUE(grpo.ok()) << grpo.status();
  EXPECT_EQ(grpo->kind, Kind::kGrpo);
  EXPECT_EQ(grpo->examples[0].prompt, (std::vector<int64_t>{1, 7, 2}));
  EXPECT_EQ(grpo->examples[0].source, line);  // passed to the reward program as written
}

TEST(TrainingData, TextLinesUseTheTokenizer) {
  absl::StatusOr<Dataset> d = ParseTrainingData(
      "{\"text\": \"The sky is blue.\"}\n"
      "{\"prompt\": \"What colour is the sun?\", \"completion\": \" It is yellow.\"}\n"
      "{\"prompt\": [1, 2], \"completion\": \" red\"}\n",
      "t", WithTokenizer());
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->text_lines, 3);
  EXPECT_EQ(d->examples[0].tokens, Encode("The sky is blue."));
  std::vector<float> w(d->examples[0].tokens.size(), 1.0f);
  w[0] = 0;
  EXPECT_EQ(d->examples[0].weights, w);
  std::vector<int64_t> p = Encode("What colour is the sun?"), c = Encode(" It is yellow.");
  std::vector<int64_t> both = p;
  both.insert(both.end(), c.begin(), c.end());
  EXPECT_EQ(d->examples[1].tokens, both);
  std::vector<float> pw(p.size(), 0.0f);
  pw.resize(both.size(), 1.0f);
  EXPECT_EQ(d->examples[1].weights, pw);
  EXPECT_EQ(d->examples[2].tokens.size(), 2 + Encode(" red").size());
}

TEST(TrainingData, ChatMessagesTrainAssistantTurns) {
  absl::StatusOr<Dataset> d =
      ParseTrainingData(R"({"messages": [{"role": "user", "content": "Name a red thing."},)"
                        R"( {"role": "assistant", "content": "An apple."}]})",
                        "c", WithTokenizer());
  ASSERT_TRUE(d.ok()) << d.status();
  // ChatML, segment by segment: only the assistant's content and its <|im_end|> weigh 1.
  std::vector<int64_t> want;
  std::vector<float> w;
  for (const auto& [text, weight] :
       std::vector<std::pair<std::string, float>>{{"<|im_start|>user\n", 0},
                                                  {"Name a red thing.<|im_end|>", 0},
                                                  {"\n", 0},
                                                  {"<|im_start|>assistant\n", 0},
                                                  {"An apple.<|im_end|>", 1},
                                                  {"\n", 0}}) {
    std::vector<int64_t> ids = Encode(text);
    want.insert(want.end(), ids.begin(), ids.end());
    w.resize(want.size(), weight);
  }
  EXPECT_EQ(d->examples[0].tokens, want);
  EXPECT_EQ(d->examples[0].weights, w);
  EXPECT_EQ(want[0], *Mini().TokenToId("<|im_start|>"));

  ParseOptions no_chat = WithTokenizer();
  no_chat.no_chat_reason = "tok.json has no <|im_start|> / <|im_end|> tokens (ChatML)";
  EXPECT_THAT(ErrorOf(R"({"messages": [{"role": "assistant", "content": "x"}]})", no_chat),
              HasSubstr("line 1: 'messages' cannot be rendered: tok.json has no <|im_start|>"));
  EXPECT_THAT(ErrorOf(R"({"messages": [{"role": "user", "content": "x"}]})", WithTokenizer()),
              HasSubstr("no assistant message"));
  EXPECT_THAT(ErrorOf(R"({"messages": [{"role": "bot", "content": "x"}]})", WithTokenizer()),
              HasSubstr("role \"bot\""));
}

TEST(TrainingData, TextWithoutATokenizerNamesTheMissingFile) {
  const std::string msg = ErrorOf("{\"tokens\": [1, 2]}\n{\"text\": \"hello\"}\n");
  EXPECT_THAT(msg, HasSubstr("1 of 2 lines failed validation (nothing was trained)"));
  EXPECT_THAT(msg, HasSubstr("line 2: 'text' is text and the base has no tokenizer "
                             "(/m/tokenizer.json does not exist)"));
}

TEST(TrainingData, TokenizedIdsOutsideTheBaseVocabularyAreRefused) {
  ParseOptions o = WithTokenizer();
  o.vocab_size = 300;  // smaller than the tokenizer's
  EXPECT_THAT(
      ErrorOf("{\"text\": \"<|im_end|> the sky\"}", o),
      HasSubstr("line 1: 'text' tokenizes to id 365, outside the base's vocabulary [0, 300)"));
}

TEST(TrainingData, EachMalformedLineIsReportedWithItsNumber) {
  const std::string msg = ErrorOf(
      "{\"tokens\": [1, 2, 3]}\n"
      "{\"tokens\": [1, 2, \"3\"]}\n"                // 2: wrong element type
      "{\"tokens\": [1, 2, 3\n"                      // 3: bad JSON
      "{\"tokens\": [1, 2, 1024]}\n"                 // 4: id out of range
      "{\"tokens\": [1, 2], \"weights\": [0, 0]}\n"  // 5: no target
      "{\"tokens\": [1, 2], \"weights\": [0]}\n"     // 6: weights length
      "{\"tokens\": [1, 2], \"weights\": [1, 1]}\n"  // 7: weights[0] != 0
      "{\"tokens\": [1, 2], \"weight\": [0, 1]}\n"   // 8: unknown field
      "[1, 2]\n"                                     // 9: not an object
      "{\"tokens\": \"\"}\n"                         // 10: text without tokenizer
      "{\"tokens\": [1, -2]}\n"                      // 11: negative id
      "{\"tokens\": [5]}\n"                          // 12: one token
      "{\"tokens\": 7}\n"                            // 13: wrong field type
      "{\"foo\": 1}\n");                             // 14: no training field
  EXPECT_THAT(msg, HasSubstr("data.jsonl: 13 of 14 lines failed validation"));
  EXPECT_THAT(msg,
              HasSubstr("line 2: 'tokens'[2] must be an integer token id, found string \"3\""));
  EXPECT_THAT(msg, HasSubstr("line 3: the line is not valid JSON"));
  EXPECT_THAT(msg,
              HasSubstr("line 4: 'tokens'[2] = 1024 is outside the base's vocabulary [0, 1024)"));
  EXPECT_THAT(msg, HasSubstr("line 5: no target: every token after the first has weight 0"));
  EXPECT_THAT(msg, HasSubstr("line 6: 'weights' has 1 entries for 2 tokens"));
  EXPECT_THAT(msg, HasSubstr("line 7: 'weights'[0] must be 0"));
  EXPECT_THAT(msg, HasSubstr("line 8: unknown field 'weight'"));
  EXPECT_THAT(msg, HasSubstr("line 9: expected a JSON object, found array"));
  EXPECT_THAT(msg, HasSubstr("line 10: 'tokens' is text and the base has no tokenizer"));
  EXPECT_THAT(msg, HasSubstr("line 11: 'tokens'[1] = -2 is outside"));
  EXPECT_THAT(msg, HasSubstr("line 12: 'tokens' gives 1 token(s)"));
  EXPECT_THAT(
      msg, HasSubstr("line 13: 'tokens' must be an array of token ids or a string, found number"));
  EXPECT_THAT(msg, HasSubstr("line 14: no training fields"));
  EXPECT_THAT(msg, Not(HasSubstr("line 1:")));
}

TEST(TrainingData, TheErrorListIsBounded) {
  std::string text;
  for (int i = 0; i < 50; ++i) text += "{\"tokens\": [1, 2000]}\n";
  ParseOptions o = Ids();
  o.max_errors = 3;
  const std::string msg = ErrorOf(text, o);
  EXPECT_THAT(msg, HasSubstr("50 of 50 lines failed"));
  EXPECT_THAT(msg, HasSubstr("line 3:"));
  EXPECT_THAT(msg, Not(HasSubstr("line 4:")));
  EXPECT_THAT(msg, HasSubstr("... and 47 more"));
}

TEST(TrainingData, OneKindPerFile) {
  const std::string msg = ErrorOf(
      "{\"tokens\": [1, 2, 3]}\n"
      "{\"prompt\": [1], \"chosen\": [2], \"rejected\": [3]}\n"
      "{\"prompt\": [1, 2]}\n");
  EXPECT_THAT(msg, HasSubstr("line 2: a DPO line (prompt, chosen, rejected), but line 1 is SFT: "
                             "a file holds one kind"));
  EXPECT_THAT(msg, HasSubstr("line 3: a GRPO prompt line (prompt only), but line 1 is SFT"));
}

TEST(TrainingData, DpoFieldsAreChecked) {
  const std::string msg = ErrorOf(
      "{\"prompt\": [1], \"chosen\": [2], \"rejected\": []}\n"
      "{\"prompt\": [1], \"chosen\": [2]}\n"
      "{\"prompt\": [1], \"chosen\": [2], \"rejected\": [3], \"score\": 1}\n"
      "{\"prompt\": [], \"chosen\": [2], \"rejected\": [3]}\n");
  EXPECT_THAT(msg, HasSubstr("line 1: 'rejected' is empty"));
  EXPECT_THAT(msg, HasSubstr("line 2: a DPO line needs 'rejected'"));
  EXPECT_THAT(msg, HasSubstr("line 3: unknown field 'score' in a DPO line"));
  EXPECT_THAT(msg, HasSubstr("line 4: 'prompt' is empty"));
}

TEST(TrainingData, EmptyFilesAndMissingFiles) {
  EXPECT_THAT(ErrorOf("\n\n  \n"), HasSubstr("no examples"));
  absl::StatusOr<Dataset> d = ReadTrainingData("/nonexistent/data.jsonl", Ids());
  ASSERT_FALSE(d.ok());
  EXPECT_THAT(std::string(d.status().message()), HasSubstr("/nonexistent/data.jsonl"));
}

}  // namespace
}  // namespace loradb::dataset
