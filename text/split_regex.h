// The pre-tokenizer's regular expression. tokenizer.json patterns are written for Oniguruma (what
// Hugging Face tokenizers compiles them with); this compiles them with PCRE2 in UTF mode after
// rewriting the escapes whose meaning differs between the two engines:
//   \s, \S   -> explicit sets of the Unicode White_Space code points (Oniguruma's meaning; PCRE2's
//               own Unicode \s also matches U+180E);
//   \d, \D   -> \p{Nd}, \P{Nd};
// and refusing the constructs whose meanings differ and that no supported tokenizer uses (\w, \W,
// \b, \B, \h, \H, \v, \V, \R, \X, POSIX classes, ^ and $ outside a class, \S inside a class).
// \p{..}, lookahead, (?i:..) and alternation keep their meaning (leftmost-first, backtracking in
// both engines).
#ifndef LORADB_TEXT_SPLIT_REGEX_H_
#define LORADB_TEXT_SPLIT_REGEX_H_

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace loradb::text {

// Returns the PCRE2 form of Oniguruma pattern `pattern`, or InvalidArgument naming the construct
// it refuses.
[[nodiscard]] absl::StatusOr<std::string> TranslateOnigurumaPattern(absl::string_view pattern);

// Quotes `literal` so that PCRE2 matches it verbatim.
std::string QuoteLiteral(absl::string_view literal);

// A compiled PCRE2 pattern (JIT-compiled where PCRE2 supports it). Thread-safe: each call uses its
// own match data.
class SplitRegex {
 public:
  // Compiles PCRE2 pattern `pcre2_pattern` in UTF mode; InvalidArgument with PCRE2's message and
  // offset when it does not compile.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<SplitRegex>> Compile(
      const std::string& pcre2_pattern);
  ~SplitRegex();
  SplitRegex(const SplitRegex&) = delete;
  SplitRegex& operator=(const SplitRegex&) = delete;

  // Appends to `matches` the [begin, end) byte ranges of the successive non-overlapping,
  // non-empty matches in `text` (well-formed UTF-8), scanning left to right; an empty match
  // advances the scan by one character. Internal if PCRE2 gives up (resource limits).
  [[nodiscard]] absl::Status FindAll(absl::string_view text,
                                     std::vector<std::pair<size_t, size_t>>* matches) const;

 private:
  explicit SplitRegex(void* code) : code_(code) {}
  void* code_;  // pcre2_code_8*
};

}  // namespace loradb::text

#endif  // LORADB_TEXT_SPLIT_REGEX_H_
