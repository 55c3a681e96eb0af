// Internal to storage/maintenance: the catalog rebuild shared by compaction and migration, the
// raw LMDB layout of every schema version, and the v1 writer that keeps real v1 stores
// reproducible for migration tests and benchmarks.
#ifndef LORADB_STORAGE_MAINTENANCE_REBUILD_H_
#define LORADB_STORAGE_MAINTENANCE_REBUILD_H_

#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "storage/catalog/records.h"
#include "storage/maintenance/maintenance.h"

namespace loradb::maint_internal {

// A live revision whose blob the rebuild replaces (repack / unpack): same id, new blob + layout.
struct RevisionRewrite {
  BlobRef blob;
  Layout layout = Layout::kPlain;
  std::string relpath;
};

// How the rebuild treats the source.
struct RebuildSpec {
  // Revision id -> its new blob (the files are already written and durable).
  std::map<uint64_t, RevisionRewrite> rewrites;
  uint32_t target_version = kCatalogSchemaVersion;
  bool drop_deleted = false;             // compaction: drop deleted revision records
  bool drop_unreferenced_blobs = false;  // compaction: drop blob records nobody references
  bool apply_retention = false;
  RetentionOptions retention;
  int64_t now_us = 0;
  MaintenanceProgress progress;
};

struct RebuildResult {
  uint32_t source_version = 0;
  uint64_t revisions_before = 0;
  uint64_t revisions_kept = 0;
  uint64_t live_revisions_kept = 0;
  uint64_t dropped_deleted = 0;
  uint64_t dropped_retention = 0;
  uint64_t blob_records_before = 0;
  uint64_t blob_records_kept = 0;
  uint64_t index_entries = 0;
  uint64_t policies = 0;
  uint64_t aliases = 0;
  uint64_t checkpoints = 0;
  // Every alias's value (the `to` of its last log entry), by its alias_log key prefix (policy id
  // ++ alias length ++ alias).
  std::map<std::string, uint64_t> alias_values;
  // Relative paths of blobs with references in the rebuilt / the source catalog.
  std::set<std::string> kept_blob_relpaths;
  std::set<std::string> source_blob_relpaths;
};

// Reads the catalog environment in `src_env_dir` (a directory holding data.mdb) and, unless
// `dst_env_dir` is empty (a plan only), writes the rebuilt catalog into the fresh directory
// `dst_env_dir` in key order with MDB_APPEND, committing in batches, then syncs and closes it.
// Fault points "maint.write_batch" (each commit) and "maint.after_build".
[[nodiscard]] absl::StatusOr<RebuildResult> Rebuild(const std::string& src_env_dir,
                                                    const std::string& dst_env_dir,
                                                    const RebuildSpec& spec);

// The schema version in the `meta` database of the environment in `env_dir`.
[[nodiscard]] absl::StatusOr<uint32_t> ReadEnvSchemaVersion(const std::string& env_dir);

// A whole v1 catalog, written exactly as schema version 1 laid it out (eleven named databases,
// no revisions_by_blob). Records use the catalog codec, whose FlatBuffers layouts are the same
// in v1 and v2. Ids, seqs and refcounts are taken as given.
struct V1Catalog {
  std::string store_id = "0123456789abcdef0123456789abcdef";
  int64_t created_us = 1700000000000000;
  std::vector<BaseRecord> bases;
  std::vector<PolicyRecord> policies;
  std::vector<RevisionRecord> revisions;
  // When set, revisions come from here instead (ids 1..generated_revisions, in order), so
  // benchmark-sized stores need no vector of records.
  uint64_t generated_revisions = 0;
  std::function<RevisionRecord(uint64_t id)> generate_revision;
  struct Alias {
    uint64_t policy_id = 0;
    std::string alias;
    uint64_t revision = 0;
  };
  std::vector<Alias> aliases;
  struct LogEntry {
    uint64_t policy_id = 0;
    std::string alias;
    uint64_t number = 0;  // from 1
    AliasLogEntry entry;
  };
  std::vector<LogEntry> alias_log;
  std::vector<CheckpointRecord> checkpoints;
  std::vector<BlobRecord> blobs;
};

// Writes `catalog` as a v1 environment into `<store_dir>/catalog` (created; must not hold one).
[[nodiscard]] absl::Status WriteV1Catalog(const std::string& store_dir, const V1Catalog& catalog,
                                          bool no_sync = false);

}  // namespace loradb::maint_internal

#endif  // LORADB_STORAGE_MAINTENANCE_REBUILD_H_
