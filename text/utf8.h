// UTF-8 helpers the tokenizer needs: validation, lossy decoding of arbitrary bytes, NFC, the
// White_Space property, and GPT-2's byte <-> printable-character map used by byte-level BPE.
#ifndef LORADB_TEXT_UTF8_H_
#define LORADB_TEXT_UTF8_H_

#include <array>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace loradb::text {

// OK when `s` is well-formed UTF-8 (no overlongs, surrogates or code points past U+10FFFF);
// otherwise InvalidArgument naming the byte offset of the first bad sequence.
[[nodiscard]] absl::Status ValidateUtf8(absl::string_view s);

// Appends `bytes` to `out` as UTF-8, replacing each maximal ill-formed subpart with U+FFFD (the
// Unicode "substitution of maximal subparts" practice, which Rust's String::from_utf8_lossy and
// Python's errors="replace" follow).
void AppendUtf8Lossy(absl::string_view bytes, std::string* out);

// Appends code point `cp` (<= U+10FFFF, not a surrogate) to `out` as UTF-8.
void AppendCodePoint(char32_t cp, std::string* out);

// Decodes the code point starting at s[*pos] of well-formed UTF-8 `s` and advances *pos past it.
char32_t NextCodePoint(absl::string_view s, size_t* pos);

// Unicode White_Space (what Rust's and Oniguruma's Unicode `\s` match).
bool IsWhiteSpace(char32_t cp);

// Canonical composition (NFC) of well-formed UTF-8 `s`, through utf8proc.
[[nodiscard]] absl::StatusOr<std::string> Nfc(absl::string_view s);

// GPT-2's reversible map from each byte to a printable code point: bytes '!'..'~', 0xA1..0xAC
// and 0xAE..0xFF map to themselves; the other 68 map, in byte order, to U+0100 upwards.
struct ByteLevelAlphabet {
  ByteLevelAlphabet();
  // The UTF-8 encoding of the code point byte `b` maps to.
  std::array<std::string, 256> encoded;
  // The code point each byte maps to.
  std::array<char32_t, 256> code_point;
  // Inverse: the byte a code point below 0x200 stands for, or -1 when it is not in the image.
  std::array<int16_t, 0x200> byte_of;
};
const ByteLevelAlphabet& ByteLevel();

// Appends to `out` the bytes that token string `token` stands for under tokenizers' ByteLevel
// decoder: each character's byte when all of them are in GPT-2's alphabet, else the token's own
// UTF-8 (e.g. an added token in another script).
void AppendByteLevelBytes(absl::string_view token, std::string* out);

}  // namespace loradb::text

#endif  // LORADB_TEXT_UTF8_H_
