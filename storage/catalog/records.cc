#include "storage/catalog/records.h"

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace loradb {

const ModuleShape* BaseRecord::FindModule(absl::string_view name) const {
  auto it = std::lower_bound(
      modules.begin(), modules.end(), name,
      [](const ModuleShape& m, absl::string_view n) { return absl::string_view(m.name) < n; });
  if (it == modules.end() || it->name != name) return nullptr;
  return &*it;
}

absl::string_view LayoutName(Layout layout) {
  return layout == Layout::kPacked ? "packed" : "plain";
}

absl::string_view RevisionStateName(RevisionState state) {
  return state == RevisionState::kDeleted ? "deleted" : "live";
}

absl::string_view BlobKindName(BlobKind kind) {
  switch (kind) {
    case BlobKind::kAdapter:
      return "adapter";
    case BlobKind::kCheckpoint:
      return "checkpoint";
    case BlobKind::kOpaque:
      return "opaque";
  }
  return "unknown";
}

namespace {

absl::Status ValidateName(absl::string_view what, absl::string_view name, size_t max_len,
                          absl::string_view extra_chars, bool first_may_be_digit) {
  if (name.empty() || name.size() > max_len) {
    return absl::InvalidArgumentError(absl::StrCat(what, " name '", name, "' must be 1-", max_len,
                                                   " characters long (it is ", name.size(), ")"));
  }
  const char first = name[0];
  if (!(absl::ascii_isalpha(first) || (first_may_be_digit && absl::ascii_isdigit(first)))) {
    return absl::InvalidArgumentError(absl::StrCat(what, " name '", name,
                                                   "' must start with a letter",
                                                   first_may_be_digit ? " or digit" : ""));
  }
  for (char c : name) {
    if (absl::ascii_isalnum(c) || extra_chars.find(c) != absl::string_view::npos) continue;
    return absl::InvalidArgumentError(
        absl::StrCat(what, " name '", name, "' has a character outside letters, digits and '",
                     extra_chars, "'"));
  }
  return absl::OkStatus();
}

// Names with '/' read as paths (in URLs, in directory listings): every '/'-separated segment
// must be non-empty and start with a letter or digit, which rules out empty segments ("a//b",
// "x/", "/x") and the "." / ".." segments a path would resolve.
absl::Status ValidatePathName(absl::string_view what, absl::string_view name) {
  if (absl::Status st = ValidateName(what, name, 128, "_.-/", true); !st.ok()) return st;
  for (absl::string_view segment : absl::StrSplit(name, '/')) {
    if (segment.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, " name '", name, "' has an empty segment ('/' at the end or '//')"));
    }
    if (!absl::ascii_isalnum(segment[0])) {
      return absl::InvalidArgumentError(absl::StrCat(what, " name '", name, "': segment '", segment,
                                                     "' must start with a letter or digit"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidatePolicyName(absl::string_view name) { return ValidatePathName("policy", name); }

absl::Status ValidateBaseName(absl::string_view name) { return ValidatePathName("base", name); }

absl::Status ValidateAliasName(absl::string_view name) {
  return ValidateName("alias", name, 64, "_.-", false);
}

absl::Status ValidateSettableAlias(absl::string_view name) {
  if (name == "latest") {
    return absl::InvalidArgumentError(
        "alias 'latest' is reserved: it always names the policy's newest live revision");
  }
  return ValidateAliasName(name);
}

bool ParseCanonicalId(absl::string_view text, uint64_t* id) {
  if (text.empty() || text.size() > 20 || (text.size() > 1 && text[0] == '0')) return false;
  for (char c : text) {
    if (!absl::ascii_isdigit(c)) return false;
  }
  return absl::SimpleAtoi(text, id);  // false past UINT64_MAX
}

std::string BlobRelPath(const Hash128& hash) {
  const std::string hex = hash.Hex();
  return absl::StrCat(hex.substr(0, 2), "/", hex.substr(2, 2), "/", hex, ".blob");
}

}  // namespace loradb
