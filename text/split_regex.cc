#include "text/split_regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <memory>

#include "absl/strings/str_cat.h"

namespace loradb::text {
namespace {

// Unicode White_Space, as the inside of a character class.
constexpr absl::string_view kWhiteSpaceSet =
    "\\t\\n\\x{0B}\\f\\r\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}"
    "\\x{202F}\\x{205F}\\x{3000}";

absl::Status Refuse(absl::string_view pattern, size_t pos, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("pre-tokenizer regex: ", what, " at offset ", pos,
                                                 " of \"", pattern,
                                                 "\" is not supported (its meaning differs between "
                                                 "Oniguruma and PCRE2)"));
}

// Copies a braced argument ("{...}") starting at pattern[*i] to `out`, advancing *i past it.
absl::Status CopyBraced(absl::string_view pattern, size_t* i, std::string* out) {
  const size_t close = pattern.find('}', *i);
  if (close == absl::string_view::npos) {
    return absl::InvalidArgumentError(absl::StrCat(
        "pre-tokenizer regex: unterminated '{' at offset ", *i, " of \"", pattern, "\""));
  }
  absl::StrAppend(out, pattern.substr(*i, close + 1 - *i));
  *i = close + 1;
  return absl::OkStatus();
}

std::string Pcre2Message(int code) {
  PCRE2_UCHAR buffer[256];
  if (pcre2_get_error_message(code, buffer, sizeof(buffer)) < 0) return absl::StrCat(code);
  return std::string(reinterpret_cast<const char*>(buffer));
}

}  // namespace

absl::StatusOr<std::string> TranslateOnigurumaPattern(absl::string_view pattern) {
  std::string out;
  bool in_class = false;
  size_t i = 0;
  while (i < pattern.size()) {
    const char c = pattern[i];
    if (c == '\\') {
      if (i + 1 >= pattern.size()) {
        return absl::InvalidArgumentError(
            absl::StrCat("pre-tokenizer regex: trailing '\\' in \"", pattern, "\""));
      }
      const char e = pattern[i + 1];
      const size_t at = i;
      i += 2;
      switch (e) {
        case 's':
          absl::StrAppend(&out, in_class ? "" : "[", kWhiteSpaceSet, in_class ? "" : "]");
          break;
        case 'S':
          if (in_class) return Refuse(pattern, at, "\\S inside a character class");
          absl::StrAppend(&out, "[^", kWhiteSpaceSet, "]");
          break;
        case 'd':
          out.append("\\p{Nd}");
          break;
        case 'D':
          out.append("\\P{Nd}");
          break;
        case 'p':
        case 'P':
        case 'x':
          out.push_back('\\');
          out.push_back(e);
          if (i < pattern.size() && pattern[i] == '{') {
            absl::Status s = CopyBraced(pattern, &i, &out);
            if (!s.ok()) return s;
          }
          break;
        case 'u': {
          // Oniguruma's \uHHHH; PCRE2 spells it \x{HHHH}.
          if (i + 4 > pattern.size()) return Refuse(pattern, at, "a short \\u escape");
          absl::StrAppend(&out, "\\x{", pattern.substr(i, 4), "}");
          i += 4;
          break;
        }
        case 'w':
        case 'W':
        case 'b':
        case 'B':
        case 'h':
        case 'H':
        case 'v':
        case 'V':
        case 'R':
        case 'X':
        case 'K':
        case 'G':
          return Refuse(pattern, at, absl::StrCat("\\", std::string(1, e)));
        default:
          out.push_back('\\');
          out.push_back(e);
          break;
      }
      continue;
    }
    if (in_class) {
      if (c == '[') return Refuse(pattern, i, "a nested class or POSIX class");
      if (c == '&' && i + 1 < pattern.size() && pattern[i + 1] == '&') {
        return Refuse(pattern, i, "class intersection &&");
      }
      if (c == ']') in_class = false;
      out.push_back(c);
      ++i;
      continue;
    }
    if (c == '[') {
      in_class = true;
      out.push_back(c);
      ++i;
      if (i < pattern.size() && pattern[i] == '^') out.push_back(pattern[i++]);
      if (i < pattern.size() && pattern[i] == ']') out.push_back(pattern[i++]);  // literal ']'
      continue;
    }
    if (c == '^' || c == '$') return Refuse(pattern, i, std::string("an anchor ") + c);
    if (c == '(' && i + 1 < pattern.size() && pattern[i + 1] == '?') {
      // Inline options: Oniguruma's (?m) is PCRE2's (?s), and (?x) changes parsing; only (?i) and
      // its negation are passed through.
      size_t j = i + 2;
      while (j < pattern.size() &&
             (pattern[j] == 'i' || pattern[j] == 'm' || pattern[j] == 'x' || pattern[j] == '-')) {
        if (pattern[j] != 'i' && pattern[j] != '-') {
          return Refuse(pattern, j, std::string("inline option ") + pattern[j]);
        }
        ++j;
      }
    }
    out.push_back(c);
    ++i;
  }
  if (in_class) {
    return absl::InvalidArgumentError(
        absl::StrCat("pre-tokenizer regex: unterminated character class in \"", pattern, "\""));
  }
  return out;
}

std::string QuoteLiteral(absl::string_view literal) {
  std::string out;
  for (char c : literal) {
    if (c == '\\') {
      out.append("\\\\");
    } else if (absl::string_view("^$.|?*+()[]{}").find(c) != absl::string_view::npos) {
      out.push_back('\\');
      out.push_back(c);
    } else {
      out.push_back(c);
    }
  }
  return out;
}

absl::StatusOr<std::unique_ptr<SplitRegex>> SplitRegex::Compile(const std::string& pcre2_pattern) {
  int error = 0;
  PCRE2_SIZE offset = 0;
  pcre2_code* code =
      pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pcre2_pattern.data()), pcre2_pattern.size(),
                    PCRE2_UTF | PCRE2_NEVER_BACKSLASH_C, &error, &offset, nullptr);
  if (code == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("pre-tokenizer regex does not compile: ", Pcre2Message(error), " at offset ",
                     offset, " of \"", pcre2_pattern, "\""));
  }
  // JIT is an optimization: where PCRE2 cannot JIT this pattern, the interpreter matches it.
  (void)pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
  return std::unique_ptr<SplitRegex>(new SplitRegex(code));
}

SplitRegex::~SplitRegex() { pcre2_code_free(static_cast<pcre2_code*>(code_)); }

absl::Status SplitRegex::FindAll(absl::string_view text,
                                 std::vector<std::pair<size_t, size_t>>* matches) const {
  auto* code = static_cast<pcre2_code*>(code_);
  std::unique_ptr<pcre2_match_data, decltype(&pcre2_match_data_free)> data(
      pcre2_match_data_create_from_pattern(code, nullptr), &pcre2_match_data_free);
  if (data == nullptr) return absl::ResourceExhaustedError("pre-tokenizer regex: out of memory");
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t start = 0;
  while (start <= text.size()) {
    const int rc =
        pcre2_match(code, subject, text.size(), start, PCRE2_NO_UTF_CHECK, data.get(), nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      return absl::InternalError(absl::StrCat("pre-tokenizer regex gave up at byte ", start,
                                              " of a ", text.size(),
                                              "-byte text: ", Pcre2Message(rc)));
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(data.get());
    if (ov[1] > ov[0]) {
      matches->emplace_back(ov[0], ov[1]);
      start = ov[1];
      continue;
    }
    // Empty match: step over one character.
    if (ov[0] >= text.size()) break;
    start = ov[0] + 1;
    while (start < text.size() && (static_cast<uint8_t>(text[start]) & 0xC0) == 0x80) ++start;
  }
  return absl::OkStatus();
}

}  // namespace loradb::text
