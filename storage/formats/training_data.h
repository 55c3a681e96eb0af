// Training data files for `loradb train --data FILE.jsonl`: one JSON object per line, each an
// SFT sequence, a DPO preference pair or a GRPO prompt (docs/trainer.md shows every form). The
// whole file is read and validated before anything trains: every malformed line is reported with
// its line number (the first `max_errors` of them, and how many more), and a file that fails
// validation yields no data at all.
//
// Line forms (a token field is either an array of integer ids or a string, which is tokenized
// with the base's tokenizer):
//   {"tokens": [ids], "weights": [w]}         SFT; weights one per token, weights[0] == 0 (the
//                                             first token is never predicted); without weights
//                                             every token after the first weighs 1
//   {"prompt": P, "completion": C}            SFT; C's tokens weigh 1, P's 0
//   {"text": "..."}                           SFT; every token after the first weighs 1
//   {"messages": [{"role", "content"}, ...]}  SFT; ChatML (<|im_start|>role\n...<|im_end|>\n);
//                                             assistant contents and their <|im_end|> weigh 1
//   {"prompt": P, "chosen": C, "rejected": R} DPO; the pair shares the prompt
//   {"prompt": P, ...any other fields}        GRPO prompt; the line is passed to the reward
//                                             program as written
// A file holds one kind (SFT, DPO or GRPO). Blank lines are skipped. Nothing here uses LibTorch.
#ifndef LORADB_STORAGE_FORMATS_TRAINING_DATA_H_
#define LORADB_STORAGE_FORMATS_TRAINING_DATA_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace loradb::dataset {

enum class Kind { kSft, kDpo, kGrpo };
// "SFT", "DPO", "GRPO".
const char* KindName(Kind kind);

struct Example {
  int64_t line = 0;  // 1-based line number in the file
  Kind kind = Kind::kSft;
  // SFT: the sequence and one weight per token (weights[0] == 0; weights[i] scales the loss of
  // predicting tokens[i] from tokens[0..i-1]).
  std::vector<int64_t> tokens;
  std::vector<float> weights;
  // DPO: the shared prompt and the two completions. GRPO: the prompt.
  std::vector<int64_t> prompt, chosen, rejected;
  // GRPO: the line as written (a JSON object), for the reward program.
  std::string source;
};

struct Dataset {
  Kind kind = Kind::kSft;
  std::vector<Example> examples;
  int64_t tokens = 0;      // tokens of every sequence (DPO: prompt + chosen + rejected)
  int64_t text_lines = 0;  // lines with at least one field tokenized from text
};

// Text -> token ids with the base's tokenizer.
using TokenizeFn = std::function<absl::StatusOr<std::vector<int64_t>>(const std::string&)>;

struct ParseOptions {
  int64_t vocab_size = 0;  // ids must be in [0, vocab_size)
  // Null when the base has no tokenizer: a text field is then refused with
  // `no_tokenizer_reason` (e.g. "/models/b/tokenizer.json does not exist").
  TokenizeFn tokenize;
  std::string no_tokenizer_reason;
  // Non-empty when "messages" lines cannot be rendered (the tokenizer lacks ChatML's special
  // tokens): the reason, given for each such line.
  std::string no_chat_reason;
  size_t max_errors = 20;  // line errors listed in the error message; the rest are counted
};

// Parses and validates `text` (the file's content; `name` names it in errors). InvalidArgument
// "NAME: K of N lines failed validation (nothing was trained):\n  line 3: ...\n  ..." listing
// the first max_errors failing lines in order, one error each; InvalidArgument for a file with
// no examples.
[[nodiscard]] absl::StatusOr<Dataset> ParseTrainingData(absl::string_view text,
                                                        absl::string_view name,
                                                        const ParseOptions& options);

// Reads `path` and parses it. NotFound when it cannot be opened.
[[nodiscard]] absl::StatusOr<Dataset> ReadTrainingData(const std::string& path,
                                                       const ParseOptions& options);

}  // namespace loradb::dataset

#endif  // LORADB_STORAGE_FORMATS_TRAINING_DATA_H_
