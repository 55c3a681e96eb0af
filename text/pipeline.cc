#include "text/pipeline.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "storage/util/status_macros.h"
#include "text/utf8.h"

namespace loradb::text {
namespace {

constexpr absl::string_view kReplacementChar = "\xEF\xBF\xBD";

// The (range, is_match) list tokenizers' Pattern::find_matches gives: the matches and the gaps
// between them, covering `text`; one non-match entry for empty text.
absl::Status MatchesAndGaps(const Pattern& pattern, absl::string_view text, bool invert,
                            std::vector<std::pair<std::pair<size_t, size_t>, bool>>* out) {
  out->clear();
  if (text.empty()) {
    out->push_back({{0, 0}, invert});
    return absl::OkStatus();
  }
  std::vector<std::pair<size_t, size_t>> matches;
  LORADB_RETURN_IF_ERROR(pattern.FindAll(text, &matches));
  size_t prev = 0;
  for (const auto& [b, e] : matches) {
    if (prev != b) out->push_back({{prev, b}, invert});
    out->push_back({{b, e}, !invert});
    prev = e;
  }
  if (prev != text.size()) out->push_back({{prev, text.size()}, invert});
  return absl::OkStatus();
}

}  // namespace

Pattern Pattern::Literal(std::string literal) {
  Pattern p;
  p.literal_ = std::move(literal);
  return p;
}

absl::StatusOr<Pattern> Pattern::Regex(absl::string_view oniguruma) {
  LORADB_ASSIGN_OR_RETURN(std::string pcre2, TranslateOnigurumaPattern(oniguruma));
  LORADB_ASSIGN_OR_RETURN(std::unique_ptr<SplitRegex> re, SplitRegex::Compile(pcre2));
  Pattern p;
  p.regex_ = std::move(re);
  return p;
}

absl::Status Pattern::FindAll(absl::string_view text,
                              std::vector<std::pair<size_t, size_t>>* matches) const {
  if (regex_ != nullptr) return regex_->FindAll(text, matches);
  if (literal_.empty()) return absl::OkStatus();
  size_t at = 0;
  while ((at = text.find(literal_, at)) != absl::string_view::npos) {
    matches->emplace_back(at, at + literal_.size());
    at += literal_.size();
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> Pattern::ReplaceAll(absl::string_view text,
                                                absl::string_view content) const {
  std::vector<std::pair<size_t, size_t>> matches;
  LORADB_RETURN_IF_ERROR(FindAll(text, &matches));
  if (matches.empty()) return std::string(text);
  std::string out;
  out.reserve(text.size() + matches.size() * content.size());
  size_t at = 0;
  for (const auto& [b, e] : matches) {
    out.append(text.data() + at, b - at);
    out.append(content.data(), content.size());
    at = e;
  }
  out.append(text.data() + at, text.size() - at);
  return out;
}

absl::Status Normalize(const std::vector<NormalizerStep>& steps, std::string* text) {
  for (const NormalizerStep& step : steps) {
    switch (step.kind) {
      case NormalizerStep::kNfc: {
        LORADB_ASSIGN_OR_RETURN(*text, Nfc(*text));
        break;
      }
      case NormalizerStep::kPrepend:
        if (!text->empty()) text->insert(0, step.content);
        break;
      case NormalizerStep::kReplace: {
        LORADB_ASSIGN_OR_RETURN(*text, step.pattern.ReplaceAll(*text, step.content));
        break;
      }
    }
  }
  return absl::OkStatus();
}

absl::Status SplitPieces(const PreTokenizerStep& step, absl::string_view text,
                         std::vector<Piece>* pieces) {
  std::vector<Piece> out;
  if (step.behavior == PreTokenizerStep::kIsolated) {
    // Matches and the gaps between them, inverted or not, are all pieces.
    std::vector<std::pair<size_t, size_t>> matches;
    for (const Piece& piece : *pieces) {
      matches.clear();
      LORADB_RETURN_IF_ERROR(
          step.pattern.FindAll(text.substr(piece.begin, piece.end - piece.begin), &matches));
      size_t at = piece.begin;
      for (const auto& [mb, me] : matches) {
        if (piece.begin + mb > at)
          out.push_back({at, piece.begin + mb, piece.first && at == piece.begin});
        out.push_back({piece.begin + mb, piece.begin + me, piece.first && mb == 0});
        at = piece.begin + me;
      }
      if (piece.end > at) out.push_back({at, piece.end, piece.first && at == piece.begin});
    }
    pieces->swap(out);
    return absl::OkStatus();
  }
  std::vector<std::pair<std::pair<size_t, size_t>, bool>> found;
  std::vector<std::pair<size_t, size_t>> ranges;  // kept pieces, relative to the piece
  for (const Piece& piece : *pieces) {
    LORADB_RETURN_IF_ERROR(MatchesAndGaps(
        step.pattern, text.substr(piece.begin, piece.end - piece.begin), step.invert, &found));
    ranges.clear();
    switch (step.behavior) {
      case PreTokenizerStep::kIsolated:  // handled above
        break;
      case PreTokenizerStep::kRemoved:
        for (const auto& [r, m] : found) {
          if (!m) ranges.push_back(r);
        }
        break;
      case PreTokenizerStep::kMergedWithPrevious: {
        bool previous_match = false;
        for (const auto& [r, m] : found) {
          if (m && !previous_match && !ranges.empty()) {
            ranges.back().second = r.second;
          } else {
            ranges.push_back(r);
          }
          previous_match = m;
        }
        break;
      }
      case PreTokenizerStep::kMergedWithNext: {
        bool previous_match = false;
        for (auto it = found.rbegin(); it != found.rend(); ++it) {
          const auto& [r, m] = *it;
          if (m && !previous_match && !ranges.empty()) {
            ranges.back().first = r.first;
          } else {
            ranges.push_back(r);
          }
          previous_match = m;
        }
        std::reverse(ranges.begin(), ranges.end());
        break;
      }
      case PreTokenizerStep::kContiguous: {
        bool previous_match = false;
        for (const auto& [r, m] : found) {
          if (m == previous_match && !ranges.empty()) {
            ranges.back().second = r.second;
          } else {
            ranges.push_back(r);
          }
          previous_match = m;
        }
        break;
      }
    }
    for (const auto& [b, e] : ranges) {
      if (e > b) out.push_back({piece.begin + b, piece.begin + e, piece.first && b == 0});
    }
  }
  pieces->swap(out);
  return absl::OkStatus();
}

namespace {

absl::Status Metaspace(const PreTokenizerStep& step, std::string* text,
                       std::vector<Piece>* pieces) {
  std::string rewritten;
  rewritten.reserve(text->size() + pieces->size() * step.replacement.size());
  std::vector<Piece> out;
  for (const Piece& piece : *pieces) {
    const absl::string_view in(text->data() + piece.begin, piece.end - piece.begin);
    const size_t begin = rewritten.size();
    const bool starts_with_replacement =
        (!in.empty() && in[0] == ' ') ||
        absl::string_view(in).substr(0, step.replacement.size()) == step.replacement;
    const bool prepend =
        !starts_with_replacement && (step.prepend == PreTokenizerStep::kAlways ||
                                     (step.prepend == PreTokenizerStep::kFirst && piece.first));
    if (prepend) rewritten += step.replacement;
    for (char c : in) {
      if (c == ' ') {
        rewritten += step.replacement;
      } else {
        rewritten.push_back(c);
      }
    }
    const size_t end = rewritten.size();
    if (!step.split) {
      if (end > begin) out.push_back({begin, end, piece.first});
      continue;
    }
    // Split before each replacement character (tokenizers' MergedWithNext on it).
    size_t at = begin;
    size_t next;
    while ((next = rewritten.find(step.replacement, at + 1)) != std::string::npos && next < end) {
      out.push_back({at, next, piece.first && at == begin});
      at = next;
    }
    if (end > at) out.push_back({at, end, piece.first && at == begin});
  }
  text->swap(rewritten);
  pieces->swap(out);
  return absl::OkStatus();
}

}  // namespace

absl::Status PreTokenize(const PreTokenizerStep& step, std::string* text,
                         std::vector<Piece>* pieces) {
  if (step.kind == PreTokenizerStep::kSplit) return SplitPieces(step, *text, pieces);
  return Metaspace(step, text, pieces);
}

namespace {

// The byte a "<0xXX>" token stands for (as Rust's u8::from_str_radix(.., 16) reads the two
// characters, which allows a leading '+'), or -1.
int ByteFallbackByte(absl::string_view token) {
  if (token.size() != 6 || token.substr(0, 3) != "<0x" || token[5] != '>') return -1;
  const auto digit = [](char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  if (token[3] == '+') return digit(token[4]);
  const int hi = digit(token[3]), lo = digit(token[4]);
  return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

void FlushBytes(std::string* bytes, size_t count, std::vector<std::string>* out) {
  if (count == 0) return;
  if (ValidateUtf8(*bytes).ok()) {
    out->push_back(std::move(*bytes));
  } else {
    for (size_t i = 0; i < count; ++i) out->emplace_back(kReplacementChar);
  }
  bytes->clear();
}

// Splits well-formed UTF-8 `s` into its characters.
std::vector<absl::string_view> Chars(absl::string_view s) {
  std::vector<absl::string_view> chars;
  size_t pos = 0;
  while (pos < s.size()) {
    const size_t start = pos;
    NextCodePoint(s, &pos);
    chars.push_back(s.substr(start, pos - start));
  }
  return chars;
}

}  // namespace

absl::StatusOr<std::string> DecodeChain(const std::vector<DecoderStep>& steps,
                                        std::vector<std::string> tokens) {
  std::vector<std::string> next;
  for (const DecoderStep& step : steps) {
    next.clear();
    switch (step.kind) {
      case DecoderStep::kByteLevel: {
        std::string bytes;
        for (const std::string& token : tokens) AppendByteLevelBytes(token, &bytes);
        std::string text;
        AppendUtf8Lossy(bytes, &text);
        next.push_back(std::move(text));
        break;
      }
      case DecoderStep::kReplace:
        for (const std::string& token : tokens) {
          LORADB_ASSIGN_OR_RETURN(std::string replaced,
                                  step.pattern.ReplaceAll(token, step.content));
          next.push_back(std::move(replaced));
        }
        break;
      case DecoderStep::kByteFallback: {
        std::string bytes;
        size_t count = 0;
        for (std::string& token : tokens) {
          const int byte = ByteFallbackByte(token);
          if (byte >= 0) {
            bytes.push_back(static_cast<char>(byte));
            ++count;
            continue;
          }
          FlushBytes(&bytes, count, &next);
          count = 0;
          next.push_back(std::move(token));
        }
        FlushBytes(&bytes, count, &next);
        break;
      }
      case DecoderStep::kFuse: {
        std::string all;
        for (const std::string& token : tokens) all += token;
        next.push_back(std::move(all));
        break;
      }
      case DecoderStep::kStrip:
        for (const std::string& token : tokens) {
          const std::vector<absl::string_view> chars = Chars(token);
          size_t start_cut = 0;
          for (size_t i = 0; i < step.start && i < chars.size() && chars[i] == step.content; ++i) {
            start_cut = i + 1;
          }
          size_t stop_cut = chars.size();
          for (size_t i = 0; i < step.stop && i < chars.size(); ++i) {
            const size_t index = chars.size() - i - 1;
            if (chars[index] != step.content) break;
            stop_cut = index;
          }
          std::string stripped;
          for (size_t i = start_cut; i < stop_cut; ++i) {
            stripped.append(chars[i].data(), chars[i].size());
          }
          next.push_back(std::move(stripped));
        }
        break;
      case DecoderStep::kMetaspace:
        for (size_t i = 0; i < tokens.size(); ++i) {
          const bool drop = i == 0 && step.metaspace_prepend;
          std::string out;
          for (absl::string_view c : Chars(tokens[i])) {
            if (c == step.content) {
              if (!drop) out.push_back(' ');
            } else {
              out.append(c.data(), c.size());
            }
          }
          next.push_back(std::move(out));
        }
        break;
    }
    tokens.swap(next);
  }
  std::string text;
  for (const std::string& token : tokens) text += token;
  return text;
}

}  // namespace loradb::text
