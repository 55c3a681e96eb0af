// The steps of a tokenizer.json pipeline other than the model, each with the semantics of the
// Hugging Face `tokenizers` component of the same name: normalizers (NFC, Prepend, Replace),
// pre-tokenizers (Split with each delimiter behavior, Metaspace), decoders (ByteLevel, Replace,
// ByteFallback, Fuse, Strip, Metaspace) and the TemplateProcessing post-processor. Tokenizer
// (text/tokenizer.h) reads them from the file and runs them in tokenizers' order.
#ifndef LORADB_TEXT_PIPELINE_H_
#define LORADB_TEXT_PIPELINE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "text/split_regex.h"

namespace loradb::text {

// tokenizer.json's {"String": s} or {"Regex": r} pattern. A string matches itself literally; a
// regex is an Oniguruma pattern, translated for PCRE2 (text/split_regex.h).
class Pattern {
 public:
  static Pattern Literal(std::string literal);
  [[nodiscard]] static absl::StatusOr<Pattern> Regex(absl::string_view oniguruma);

  // Appends the [begin, end) byte ranges of the successive non-overlapping, non-empty matches in
  // `text` (well-formed UTF-8). An empty literal matches nowhere.
  [[nodiscard]] absl::Status FindAll(absl::string_view text,
                                     std::vector<std::pair<size_t, size_t>>* matches) const;

  // `text` with every match replaced by `content`.
  [[nodiscard]] absl::StatusOr<std::string> ReplaceAll(absl::string_view text,
                                                       absl::string_view content) const;

 private:
  std::string literal_;
  std::shared_ptr<const SplitRegex> regex_;  // null for a literal
};

// One normalizer step, applied to a whole segment of text between added tokens.
struct NormalizerStep {
  enum Kind { kNfc, kPrepend, kReplace } kind;
  std::string content;  // kPrepend: the prefix; kReplace: the replacement
  Pattern pattern;      // kReplace
};

// Runs `steps` over `text` in order (Prepend adds its prefix to non-empty text only).
[[nodiscard]] absl::Status Normalize(const std::vector<NormalizerStep>& steps, std::string* text);

// The pieces a pre-tokenizer produces: byte ranges of a working string, each remembering whether
// it starts where the encoded text started (what Metaspace's prepend_scheme "first" asks).
struct Piece {
  size_t begin, end;
  bool first;
};

// One pre-tokenizer step other than the final ByteLevel one.
struct PreTokenizerStep {
  enum Kind { kSplit, kMetaspace };
  Kind kind = kSplit;
  // kSplit: tokenizers' SplitDelimiterBehavior and `invert`.
  enum Behavior { kIsolated, kRemoved, kMergedWithPrevious, kMergedWithNext, kContiguous };
  Pattern pattern;
  Behavior behavior = kIsolated;
  bool invert = false;
  // kMetaspace: the replacement character (UTF-8), prepend scheme, and whether to split before
  // each replacement character.
  std::string replacement;
  enum Prepend { kAlways, kFirst, kNever } prepend = kAlways;
  bool split = true;
};

// Applies `step` to `pieces` of `*text`; a step that rewrites text (Metaspace) rebuilds `*text`.
// Empty pieces are dropped, as tokenizers drops them.
[[nodiscard]] absl::Status PreTokenize(const PreTokenizerStep& step, std::string* text,
                                       std::vector<Piece>* pieces);

// PreTokenize for a kSplit step, which leaves the text as it is.
[[nodiscard]] absl::Status SplitPieces(const PreTokenizerStep& step, absl::string_view text,
                                       std::vector<Piece>* pieces);

// One decoder step; a decoder is a chain of them over the list of token strings.
struct DecoderStep {
  enum Kind { kByteLevel, kReplace, kByteFallback, kFuse, kStrip, kMetaspace };
  Kind kind = kFuse;
  Pattern pattern;                // kReplace
  std::string content;            // kReplace: the replacement; kStrip: the character stripped;
                                  // kMetaspace: the replacement character
  size_t start = 0, stop = 0;     // kStrip
  bool metaspace_prepend = true;  // kMetaspace: prepend_scheme is not "never"
};

// Runs `steps` over `tokens` (the token strings of the ids decoded) and returns their
// concatenation, as tokenizers' decoder chain does.
[[nodiscard]] absl::StatusOr<std::string> DecodeChain(const std::vector<DecoderStep>& steps,
                                                      std::vector<std::string> tokens);

// Token ids a TemplateProcessing post-processor adds around one sequence ("single"): `before`
// then the sequence then `after`.
struct Template {
  std::vector<int32_t> before, after;
};

}  // namespace loradb::text

#endif  // LORADB_TEXT_PIPELINE_H_
