// Offline store maintenance: compaction (retention, dropping deleted revisions, collecting
// unreferenced blob files, rebuilding the catalog compactly), schema migration, and deep
// verification. docs/operations.md is the operator's guide.
//
// Compaction and migration take the store lock exclusively (storage/util/store_lock.h), so they
// fail while any writer or server has the store open, and no Catalog or Store of the same
// directory may be open in the calling process. Both rebuild the catalog by an ordered scan into
// a fresh LMDB environment (MDB_APPEND), verify it, make it durable and install it with one
// rename of `catalog/data.mdb` (the generation swap); the replaced file is kept as
// `catalog/prev.mdb` (with every blob it needs) until the next successful run or
// `drop_previous`. A crash at any moment leaves the old or the new generation, never a mix.
#ifndef LORADB_STORAGE_MAINTENANCE_MAINTENANCE_H_
#define LORADB_STORAGE_MAINTENANCE_MAINTENANCE_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace loradb {

class Store;

// Reports progress of a long phase: `done` of `total` units (total 0: unknown).
using MaintenanceProgress =
    std::function<void(absl::string_view phase, uint64_t done, uint64_t total)>;

// Which live revisions compaction may drop. Deleted revisions are always dropped (their ids are
// never reused: the highest id stays as a tombstone record).
struct RetentionOptions {
  // Keep the newest `keep_last` live revisions of every policy; 0 keeps every live revision.
  uint64_t keep_last = 0;
  // Older live revisions survive when an alias points at them now, when an alias log entry
  // within this window (microseconds before now) points at them (as from or to), or when a
  // checkpoint references their blob. An alias's window starts at its first entry, in entry
  // order, whose time is inside it, and holds every later entry. Negative: the whole alias
  // history protects.
  int64_t alias_history_window_us = -1;
};

struct CompactOptions {
  std::string blob_root;  // default `<store>/blobs`
  RetentionOptions retention;
  // Delete `catalog/prev.mdb` and the blob files only it needed.
  bool drop_previous = false;
  // Delete blob files no generation references (orphans of crashed publishes, blobs of dropped
  // revisions). Turn off when other catalogs share the blob root.
  bool collect_blob_files = true;
  // Plan only: report what would be dropped, change nothing.
  bool dry_run = false;
  MaintenanceProgress progress;
  int64_t now_us = 0;  // 0: the current time (retention windows are measured from it)
};

struct CompactReport {
  bool dry_run = false;
  uint64_t catalog_bytes_before = 0;  // size of catalog/data.mdb
  uint64_t catalog_bytes_after = 0;   // 0 for a dry run
  uint64_t revisions_before = 0;      // records, live and deleted
  uint64_t revisions_kept = 0;
  uint64_t live_revisions_kept = 0;
  uint64_t dropped_deleted = 0;    // deleted revisions whose records went away
  uint64_t dropped_retention = 0;  // live revisions dropped by retention
  uint64_t blob_records_before = 0;
  uint64_t blob_records_kept = 0;
  uint64_t blob_files_deleted = 0;
  uint64_t blob_bytes_deleted = 0;
  uint64_t blob_files_kept_for_previous = 0;  // unreferenced now, needed by prev.mdb
  std::string previous_generation;            // path of prev.mdb, empty when none is kept
  double seconds = 0;
  // Phases of `seconds`: plan + rebuild (incl. fsync), verification of the new generation,
  // swap + blob collection.
  double rebuild_seconds = 0;
  double verify_seconds = 0;
  double swap_seconds = 0;
};

// Compacts the store in `dir`. FailedPrecondition for a store of another schema version (run
// MigrateStore first) or when the rebuilt catalog fails verification (nothing changed);
// Unavailable while the store is in use.
[[nodiscard]] absl::StatusOr<CompactReport> CompactStore(const std::string& dir,
                                                         const CompactOptions& options);

// Blob-layout rewrite applied by MigrateStore to live revisions (same ids, same tensors through
// the API, new blobs): kPack rewrites plain-layout revisions whose MoE expert tensors can be
// stacked into the packed layout; kUnpack rewrites packed revisions back to plain.
enum class Repack : uint8_t { kNone = 0, kPack = 1, kUnpack = 2 };

struct MigrateOptions {
  std::string blob_root;  // default `<store>/blobs`
  Repack repack = Repack::kNone;
  bool dry_run = false;
  bool drop_previous = false;
  MaintenanceProgress progress;
};

struct MigrateReport {
  bool dry_run = false;
  uint32_t from_version = 0;
  uint32_t to_version = 0;
  // What changed (or would change), one line each; empty when the store was current.
  std::vector<std::string> changes;
  uint64_t revisions = 0;
  uint64_t index_entries = 0;        // revisions_by_blob entries built
  uint64_t revisions_rewritten = 0;  // by repack / unpack
  uint64_t blobs_written = 0;        // new blob files for them
  uint64_t rewritten_bytes_before = 0;
  uint64_t rewritten_bytes_after = 0;
  uint64_t catalog_bytes_before = 0;
  uint64_t catalog_bytes_after = 0;
  std::string previous_generation;
  double seconds = 0;
  double rebuild_seconds = 0;  // phases of `seconds`, as in CompactReport
  double verify_seconds = 0;
  double swap_seconds = 0;
};

// Moves the store in `dir` forward to this build's schema version (kCatalogSchemaVersion), and/or
// rewrites blob layouts (`repack`, which needs a current store: migrate first). New blob files
// are written durably before the catalog swap; the old ones stay for the previous generation and
// are collected by a later compaction. A current store without repack is left alone (OK, no
// changes). FailedPrecondition for a store newer than this build, and for a store older than v7
// where an alias's value in `aliases` is not the `to` of its log's last entry (the message names
// the alias; nothing is changed); Unavailable while the store is in use.
[[nodiscard]] absl::StatusOr<MigrateReport> MigrateStore(const std::string& dir,
                                                         const MigrateOptions& options);

// The schema version recorded in the catalog of `dir`, read without the version checks of
// Catalog::Open (so older and newer stores can be inspected). NotFound when there is no catalog.
[[nodiscard]] absl::StatusOr<uint32_t> ReadStoreSchemaVersion(const std::string& dir);

struct StoreVerifyOptions {
  std::string blob_root;  // default `<store>/blobs`
};

struct StoreVerifyReport {
  std::vector<std::string> problems;     // empty: consistent
  std::vector<std::string> reclaimable;  // unreferenced blob files and records (not errors)
  uint64_t reclaimable_bytes = 0;
  uint64_t blobs_checked = 0;
  uint64_t bytes_checked = 0;
  uint64_t policies = 0;
  uint64_t revisions = 0;
  uint64_t live_revisions = 0;
  uint64_t aliases = 0;
  uint64_t alias_log_entries = 0;
  uint64_t checkpoints = 0;
  // References (revision parents, alias log entries) to revision ids below the id high-water
  // mark whose records compaction dropped: allowed, counted.
  uint64_t pruned_references = 0;
  uint32_t schema_version = 0;
  bool ok() const { return problems.empty(); }
};

// Verifies the store in `dir` through the Store (catalog cross-checks, every blob present with
// the recorded size and xxh3-128) plus the maintenance checks: each alias's log entries (whose
// last `to` is the alias's value) are numbered 1, 2, ... (commit order; their wall-clock times
// are not compared) and every entry's `from` is the previous entry's `to`; the v2
// revisions_by_blob index matches the revision records exactly; revision references point at
// existing revisions or at pruned ids. A non-OK status only when the store cannot be opened or
// read at all.
[[nodiscard]] absl::StatusOr<StoreVerifyReport> VerifyStore(const std::string& dir,
                                                            const StoreVerifyOptions& options);
// The same checks over a Store this process already has open (the C API's loradb_verify). Reads
// only: concurrent writers may commit meanwhile (each check reads one consistent snapshot).
[[nodiscard]] absl::StatusOr<StoreVerifyReport> VerifyOpenStore(const Store& store);

}  // namespace loradb

#endif  // LORADB_STORAGE_MAINTENANCE_MAINTENANCE_H_
