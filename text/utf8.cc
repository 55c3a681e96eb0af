#include "text/utf8.h"

#include <utf8proc.h>

#include <cstdlib>
#include <memory>

#include "absl/strings/str_cat.h"

namespace loradb::text {
namespace {

// Length of the well-formed sequence at s[pos] (1..4), or 0 when none starts there; *prefix is
// set to the length of its maximal ill-formed subpart (>= 1) in that case.
size_t SequenceLength(absl::string_view s, size_t pos, size_t* prefix) {
  const auto b = [&](size_t i) { return static_cast<uint8_t>(s[pos + i]); };
  const size_t left = s.size() - pos;
  const uint8_t lead = b(0);
  *prefix = 1;
  if (lead < 0x80) return 1;
  size_t need = 0;
  uint8_t lo = 0x80, hi = 0xBF;
  if (lead >= 0xC2 && lead <= 0xDF) {
    need = 2;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    need = 3;
    if (lead == 0xE0) lo = 0xA0;
    if (lead == 0xED) hi = 0x9F;
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    need = 4;
    if (lead == 0xF0) lo = 0x90;
    if (lead == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  for (size_t i = 1; i < need; ++i) {
    if (i >= left) return 0;
    const uint8_t c = b(i);
    const uint8_t l = i == 1 ? lo : 0x80, h = i == 1 ? hi : 0xBF;
    if (c < l || c > h) return 0;
    *prefix = i + 1;
  }
  return need;
}

}  // namespace

absl::Status ValidateUtf8(absl::string_view s) {
  size_t pos = 0;
  while (pos < s.size()) {
    if (static_cast<uint8_t>(s[pos]) < 0x80) {
      ++pos;
      continue;
    }
    size_t prefix = 0;
    const size_t n = SequenceLength(s, pos, &prefix);
    if (n == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("text is not valid UTF-8 (bad byte sequence at byte offset ", pos, ")"));
    }
    pos += n;
  }
  return absl::OkStatus();
}

void AppendUtf8Lossy(absl::string_view bytes, std::string* out) {
  size_t pos = 0;
  while (pos < bytes.size()) {
    size_t prefix = 0;
    const size_t n = SequenceLength(bytes, pos, &prefix);
    if (n == 0) {
      out->append("\xEF\xBF\xBD");
      pos += prefix;
    } else {
      out->append(bytes.data() + pos, n);
      pos += n;
    }
  }
}

void AppendCodePoint(char32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

char32_t NextCodePoint(absl::string_view s, size_t* pos) {
  const auto b = [&](size_t i) { return static_cast<char32_t>(static_cast<uint8_t>(s[*pos + i])); };
  const char32_t lead = b(0);
  char32_t cp;
  size_t n;
  if (lead < 0x80) {
    cp = lead;
    n = 1;
  } else if (lead < 0xE0) {
    cp = ((lead & 0x1F) << 6) | (b(1) & 0x3F);
    n = 2;
  } else if (lead < 0xF0) {
    cp = ((lead & 0x0F) << 12) | ((b(1) & 0x3F) << 6) | (b(2) & 0x3F);
    n = 3;
  } else {
    cp = ((lead & 0x07) << 18) | ((b(1) & 0x3F) << 12) | ((b(2) & 0x3F) << 6) | (b(3) & 0x3F);
    n = 4;
  }
  *pos += n;
  return cp;
}

bool IsWhiteSpace(char32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
         cp == 0x205F || cp == 0x3000;
}

absl::StatusOr<std::string> Nfc(absl::string_view s) {
  bool ascii = true;
  for (char c : s) ascii = ascii && static_cast<uint8_t>(c) < 0x80;
  if (ascii) return std::string(s);  // ASCII text is its own NFC.
  utf8proc_uint8_t* mapped = nullptr;
  const utf8proc_ssize_t n = utf8proc_map(
      reinterpret_cast<const utf8proc_uint8_t*>(s.data()), static_cast<utf8proc_ssize_t>(s.size()),
      &mapped, static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  if (n < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("NFC normalization failed: ", utf8proc_errmsg(n)));
  }
  std::unique_ptr<utf8proc_uint8_t, decltype(&std::free)> holder(mapped, &std::free);
  return std::string(reinterpret_cast<const char*>(mapped), static_cast<size_t>(n));
}

ByteLevelAlphabet::ByteLevelAlphabet() {
  byte_of.fill(-1);
  char32_t next = 0x100;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    code_point[b] = printable ? static_cast<char32_t>(b) : next++;
    byte_of[code_point[b]] = static_cast<int16_t>(b);
    AppendCodePoint(code_point[b], &encoded[b]);
  }
}

const ByteLevelAlphabet& ByteLevel() {
  static const ByteLevelAlphabet* const kAlphabet = new ByteLevelAlphabet();
  return *kAlphabet;
}

void AppendByteLevelBytes(absl::string_view token, std::string* out) {
  const ByteLevelAlphabet& alphabet = ByteLevel();
  const size_t mark = out->size();
  size_t pos = 0;
  while (pos < token.size()) {
    const char32_t cp = NextCodePoint(token, &pos);
    if (cp >= alphabet.byte_of.size() || alphabet.byte_of[cp] < 0) {
      out->resize(mark);
      out->append(token.data(), token.size());
      return;
    }
    out->push_back(static_cast<char>(alphabet.byte_of[cp]));
  }
}

}  // namespace loradb::text
