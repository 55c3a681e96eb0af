// The catalog's records as plain C++ values: bases, policies, revisions, alias log entries,
// checkpoints and blobs (DESIGN.md section 2). schema/catalog.fbs is their on-disk form;
// docs/format-catalog.md describes both.
#ifndef LORADB_STORAGE_CATALOG_RECORDS_H_
#define LORADB_STORAGE_CATALOG_RECORDS_H_

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "storage/formats/model_config.h"
#include "storage/util/hash.h"

namespace loradb {

// The catalog layout version this build writes and the newest it reads. v2 added the
// `revisions_by_blob` index; v3 made a policy record's `next_seq` a lower bound: a publish no
// longer rewrites the policy record, and the next seq is the larger of the record's and one past
// the highest seq in the policy's revision index (a v2 binary would reuse seqs, hence the bump).
// v4 stores revision records in layout 2 (schema/catalog.fbs RevisionV2: the fixed-size fields in
// one struct, the id left to the key), about 25% smaller and verified with fewer checks. v5 keys
// the `policies` name index by the name's length and then the name (catalog_keys::
// PutPolicyNameKey): names that count up are appended instead of splitting pages in half, and
// writes alias log entries with the catalog's own reasons as one byte (AliasLogEntry.reason_kind).
// v6 stores revision records in layout 3 (RevisionV3: the usual dtypes and target-module lists
// as a code and bits of the fixed struct), about 30% smaller again. v7 drops the `aliases`
// database (an alias's value is the `to` of its last `alias_log` entry, which every move writes),
// writes revision records in layout 4 (the base left to the policy when it is the policy's) and
// policy records without their id (the key). storage/maintenance migrates older stores forward.
inline constexpr uint32_t kCatalogSchemaVersion = 7;

struct Architecture {
  std::string family;  // HF model_type ("qwen3", "qwen3_moe") or "custom"
  int64_t hidden_size = 0;
  int64_t num_layers = 0;
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t intermediate_size = 0;
  int64_t num_experts = 0;
  int64_t vocab_size = 0;
};

// A base deployment. `modules` is kept sorted by name (the catalog sorts it on write).
struct BaseRecord {
  std::string name;
  Architecture arch;
  std::vector<ModuleShape> modules;
  std::string weights_fingerprint;  // xxh3-128 hex, empty when not given
  std::string config_json;          // the config.json it was registered from, may be empty
  int64_t created_us = 0;

  // The module called `name`, or nullptr (binary search; `modules` must be sorted).
  const ModuleShape* FindModule(absl::string_view name) const;
};

struct PolicyRecord {
  uint64_t id = 0;
  std::string name;
  std::string base;
  std::map<std::string, std::string> labels;
  int64_t created_us = 0;
  bool archived = false;
  // The seq the next published revision gets. The catalog returns the resolved value; on disk
  // (schema v3) it is a lower bound, see kCatalogSchemaVersion.
  uint64_t next_seq = 1;
};

// A rank_pattern / alpha_pattern entry: `r` 0 and `has_alpha` false mean "not overridden".
struct ModuleLora {
  std::string pattern;
  int32_t r = 0;
  float alpha = 0;
  bool has_alpha = false;
  bool operator==(const ModuleLora&) const = default;
};

// The LoRA hyper-parameters of a revision (PEFT's adapter_config.json essentials).
struct LoraSettings {
  int32_t r = 0;
  float alpha = 0;
  bool use_rslora = false;
  std::vector<ModuleLora> modules;
  std::vector<std::string> target_modules;
  bool operator==(const LoraSettings&) const = default;
};

enum class SourceKind : uint8_t { kImported = 0, kTrained = 1 };

struct RevisionSource {
  SourceKind kind = SourceKind::kImported;
  uint64_t checkpoint_id = 0;  // trained
  uint64_t step = 0;           // trained
  std::string origin;          // imported
  std::string content_hash;    // imported
};

enum class Layout : uint8_t { kPlain = 0, kPacked = 1 };
enum class RevisionState : uint8_t { kLive = 0, kDeleted = 1 };
absl::string_view LayoutName(Layout layout);
absl::string_view RevisionStateName(RevisionState state);

// A reference to a blob: its content address, size and tensor count. All zero: no blob.
struct BlobRef {
  Hash128 hash;
  uint64_t bytes = 0;
  uint32_t tensors = 0;
  bool empty() const { return bytes == 0 && hash == Hash128{}; }
};

struct RevisionRecord {
  uint64_t id = 0;
  uint64_t policy_id = 0;
  uint64_t seq = 0;
  std::string base;
  uint64_t parent = 0;  // 0: none
  RevisionSource source;
  LoraSettings lora;
  std::string dtype;
  Layout layout = Layout::kPlain;
  BlobRef blob;
  int64_t created_us = 0;
  RevisionState state = RevisionState::kLive;
  std::map<std::string, float> evals;
};

struct AliasLogEntry {
  std::string alias;
  // The entry's number in the alias's log (its key in `alias_log`): 1, 2, ... in the order the
  // moves committed. The order of the log; time_us is informational (wall clock, may step back).
  uint64_t seq = 0;
  int64_t time_us = 0;
  uint64_t from_revision = 0;  // 0: the alias did not exist before
  uint64_t to_revision = 0;
  std::string reason;
};

struct AliasEntry {
  std::string alias;
  uint64_t revision = 0;
};

struct CheckpointRecord {
  uint64_t id = 0;
  uint64_t policy_id = 0;
  uint64_t step = 0;
  uint64_t parent = 0;
  BlobRef master;
  BlobRef optimizer;
  BlobRef gradients;
  std::string scheduler_name;
  int64_t scheduler_position = 0;
  std::string rng_state;  // opaque bytes
  BlobRef rollout;
  int64_t created_us = 0;
};

enum class BlobKind : uint8_t { kAdapter = 0, kCheckpoint = 1, kOpaque = 2 };
absl::string_view BlobKindName(BlobKind kind);

struct BlobRecord {
  Hash128 hash;
  std::string relpath;  // relative to the blob root
  uint64_t bytes = 0;
  uint64_t refcount = 0;
  BlobKind kind = BlobKind::kAdapter;
};

// Policy names: 1-128 characters of letters, digits, `_ . - /`, where every '/'-separated
// segment is non-empty and starts with a letter or digit (so no leading, trailing or doubled
// '/', no "." or ".." segment). The one check every surface (Store, C API, HTTP, CLI) reaches
// through the catalog, for creation and lookup alike. InvalidArgument naming the rule broken.
[[nodiscard]] absl::Status ValidatePolicyName(absl::string_view name);
// Alias names: 1-64 characters of letters, digits, `_ . -`, starting with a letter.
[[nodiscard]] absl::Status ValidateAliasName(absl::string_view name);
// An alias that can be set: a valid name other than the virtual `latest`.
[[nodiscard]] absl::Status ValidateSettableAlias(absl::string_view name);
// Base names follow the policy-name rules.
[[nodiscard]] absl::Status ValidateBaseName(absl::string_view name);

// Parses a revision id or seq written in canonical decimal: 1-20 digits, no sign, spaces or
// leading zero ("0" itself is canonical), within u64. False for anything else (" 2", "01", "+2").
[[nodiscard]] bool ParseCanonicalId(absl::string_view text, uint64_t* id);

// The relative path of a blob with content address `hash`: "ab/cd/<32 hex>.blob".
std::string BlobRelPath(const Hash128& hash);

}  // namespace loradb

#endif  // LORADB_STORAGE_CATALOG_RECORDS_H_
