#include "storage/util/json.h"

namespace loradb {

absl::Status CheckJsonDepth(absl::string_view text, absl::string_view what, int max_depth) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;  // the escaped character, whatever it is, cannot end the string
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    switch (c) {
      case '"':
        in_string = true;
        break;
      case '[':
      case '{':
        if (++depth > max_depth) {
          return absl::InvalidArgumentError(
              absl::StrCat(what, " nests arrays and objects deeper than ", max_depth, " levels"));
        }
        break;
      case ']':
      case '}':
        --depth;
        break;
      default:
        break;
    }
  }
  return absl::OkStatus();
}

}  // namespace loradb
