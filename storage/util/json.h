// The one way loradb parses JSON it did not write itself (HTTP bodies, config.json,
// adapter_config.json, module tables, sharded-checkpoint indexes, replica manifests, C API
// arguments): a nesting-depth limit checked before the parser runs, so no input can drive a
// recursion (nlohmann's dump(), copy and comparison all recurse over nesting), and errors as
// absl::Status instead of exceptions.
#ifndef LORADB_STORAGE_UTIL_JSON_H_
#define LORADB_STORAGE_UTIL_JSON_H_

#include <cstddef>
#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace loradb {

// The deepest nesting of arrays and objects any JSON input may have: serde_json's default
// recursion limit (the safetensors reference reader's), far above real inputs (a config.json or
// a request body nests 2 to 4 levels).
inline constexpr int kMaxJsonDepth = 128;

// InvalidArgument "`what` nests arrays and objects deeper than `max_depth` levels" when `text`
// does. One pass over the bytes with a counter (no recursion, no allocation); exact for every
// text a JSON parser accepts (brackets inside strings do not count).
[[nodiscard]] absl::Status CheckJsonDepth(absl::string_view text, absl::string_view what,
                                          int max_depth = kMaxJsonDepth);

// Parses `text` (one JSON value, RFC 8259, UTF-8) after CheckJsonDepth. InvalidArgument
// "`what` is not valid JSON (...)" naming the byte where parsing failed, or CheckJsonDepth's
// error. `Json` is nlohmann::json or nlohmann::ordered_json.
template <typename Json = nlohmann::json>
[[nodiscard]] absl::StatusOr<Json> ParseJson(absl::string_view text, absl::string_view what,
                                             int max_depth = kMaxJsonDepth) {
  if (absl::Status s = CheckJsonDepth(text, what, max_depth); !s.ok()) return s;
  try {
    return Json::parse(text.begin(), text.end());
  } catch (const typename Json::parse_error& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " is not valid JSON (syntax error at byte ", e.byte, ")"));
  } catch (const typename Json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(what, " is not valid JSON (", e.what(), ")"));
  }
}

}  // namespace loradb

#endif  // LORADB_STORAGE_UTIL_JSON_H_
