// The catalog: one LMDB environment per store directory holding FlatBuffers records for bases,
// policies, revisions, aliases (an append-only log of moves; the last one is the value),
// checkpoints and blobs. docs/format-catalog.md
// lists its databases and key encodings. Thread-safe: many reader threads, one writer at a time
// (LMDB's writer lock); another process may read while this one writes.
#ifndef LORADB_STORAGE_CATALOG_CATALOG_H_
#define LORADB_STORAGE_CATALOG_CATALOG_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "storage/catalog/records.h"
#include "storage/util/mutex.h"

struct MDB_env;
struct MDB_txn;

namespace loradb {

struct CatalogOptions {
  // Create the environment when `dir` holds none (otherwise NotFound).
  bool create_if_missing = true;
  // Initial map size; the map doubles on MDB_MAP_FULL.
  uint64_t initial_map_bytes = uint64_t{1} << 30;
  // MDB_NOSYNC: commits are not fsynced (benchmarks and tests of speed only; not crash-safe).
  bool no_sync = false;
  // MDB_RDONLY: every write fails (FailedPrecondition); never creates a catalog. For replicas
  // (storage/replication) and inspection.
  bool read_only = false;
  // MDB_NOLOCK: no lock file and no reader table. Only for an environment no process will ever
  // write again (an immutable replica generation); requires read_only.
  bool no_lock = false;
  // The wall clock for the times records carry (created_us, alias log time_us), in unix
  // microseconds; read inside the write transaction that stores them. Empty: the system clock.
  // Nothing orders by these times (the alias log's order is its entry numbers), so a clock that
  // steps backwards gives odd times, never an inconsistent store; tests inject one to show it.
  std::function<int64_t()> clock;
};

// What a new revision is made of; the catalog assigns id, seq, base, created time and state.
struct NewRevision {
  uint64_t policy_id = 0;
  uint64_t parent = 0;
  RevisionSource source;
  LoraSettings lora;
  std::string dtype;
  Layout layout = Layout::kPlain;
  BlobRef blob;
  std::map<std::string, float> evals;
  // When policy_id is 0: create the policy `create_policy` on base `create_policy_base` in the
  // same transaction (AlreadyExists if another publisher created it first).
  std::string create_policy;
  std::string create_policy_base;
  // When set, this alias is moved to the new revision in the same transaction.
  std::string alias;
  std::string alias_reason = "publish";
};

// What a new checkpoint is made of; the catalog assigns id and created time.
struct NewCheckpoint {
  uint64_t policy_id = 0;
  uint64_t step = 0;
  uint64_t parent = 0;
  BlobRef master;
  BlobRef optimizer;
  BlobRef gradients;
  std::string scheduler_name;
  int64_t scheduler_position = 0;
  std::string rng_state;
  BlobRef rollout;
};

// One page of a listing; `next_after` is the cursor for the next page (nullopt: no more).
template <typename T>
struct Page {
  std::vector<T> items;
  std::optional<uint64_t> next_after;
};

// What CheckIntegrity found: `problems` is empty for a consistent catalog.
struct CatalogIntegrity {
  std::vector<std::string> problems;
  std::vector<BlobRecord> blobs;  // every blob record, with its (verified) refcount
  uint64_t policies = 0;
  uint64_t revisions = 0;
  uint64_t live_revisions = 0;
  uint64_t aliases = 0;
  uint64_t checkpoints = 0;
};

// Pages of one named database (mdb_stat).
struct CatalogDbSpace {
  std::string name;
  uint64_t entries = 0;
  uint64_t depth = 0;
  uint64_t branch_pages = 0;
  uint64_t leaf_pages = 0;
  uint64_t overflow_pages = 0;
  uint64_t key_value_bytes = 0;  // sum of key + value sizes (0 when not counted)
  uint64_t pages() const { return branch_pages + leaf_pages + overflow_pages; }
};

// How the used part of the map (DataBytes = used_pages x page_size) divides: the two meta pages,
// the main database (the table of named databases), each named database, the free list's own
// pages and the free pages it lists (reusable), and pages none of these account for: the
// nested trees of MDB_DUPSORT databases whose duplicates outgrew their node (mdb_stat counts
// those in the nested tree's own record, not in the database's).
struct CatalogSpace {
  uint64_t page_size = 0;
  uint64_t used_pages = 0;
  uint64_t meta_pages = 2;
  CatalogDbSpace main;
  std::vector<CatalogDbSpace> dbs;
  uint64_t freelist_pages = 0;
  uint64_t free_pages = 0;
  uint64_t unaccounted_pages = 0;
};

// ---- zero-copy reads
//
// Catalog::Read hands its callback a CatalogReader: one read transaction (a consistent snapshot)
// whose lookups return views. A view is a record verified once and read where LMDB keeps it, with
// no copy and no allocation, and like LMDB's MDB_val it is valid only while its transaction is:
// inside the callback that received the reader. Every accessor checks that and aborts the process
// with a message when the transaction has ended (by then a later commit may have reused the page).
// To keep a record, take the owning copy (ToRecord) inside the callback.

struct CatalogReadSlot;   // a pooled read transaction (catalog.cc)
struct CatalogViewScope;  // the transaction a view was made in (lmdb_txn.h)

// A verified revision record inside a read transaction. Default-constructed: empty (no accessor
// may be called).
class RevisionView {
 public:
  RevisionView() = default;

  uint64_t id() const;
  uint64_t policy_id() const;
  uint64_t seq() const;
  // The record's base, or its policy's (read in the same transaction) when the record leaves it
  // to the policy (schema v7); empty when that policy record cannot be read.
  absl::string_view base() const;
  uint64_t parent() const;
  SourceKind source_kind() const;
  uint64_t source_checkpoint_id() const;  // 0 for imports
  int32_t lora_r() const;
  float lora_alpha() const;
  absl::string_view dtype() const;
  Layout layout() const;
  BlobRef blob() const;
  int64_t created_us() const;
  RevisionState state() const;
  bool live() const { return state() == RevisionState::kLive; }
  // The owning record (every field, evals included).
  RevisionRecord ToRecord() const;

 private:
  friend struct CatalogViewAccess;
  RevisionView(const void* table, uint8_t layout, uint64_t id, CatalogViewScope* scope,
               const CatalogReadSlot* slot, uint64_t epoch)
      : table_(table), layout_(layout), id_(id), scope_(scope), slot_(slot), epoch_(epoch) {}
  // The table; aborts with a message when the view is empty or its transaction has ended.
  const void* checked_table() const;

  const void* table_ = nullptr;  // the verified fb::RevisionV3, fb::RevisionV2 or fb::Revision
  uint8_t layout_ = 0;           // 3, 2 or 1: which of them (3: record layouts 3 and 4)
  uint64_t id_ = 0;              // the key (layouts 2-4 do not store it)
  // Where the view was made (read only after the slot check: it lives as long as the transaction).
  CatalogViewScope* scope_ = nullptr;
  const CatalogReadSlot* slot_ = nullptr;  // null inside the catalog's own write transactions
  uint64_t epoch_ = 0;                     // the slot's epoch when the view was made
};

// A verified policy record inside a read transaction (same rules as RevisionView). The stored
// next_seq is a lower bound (kCatalogSchemaVersion), so the view does not offer it.
class PolicyView {
 public:
  PolicyView() = default;

  uint64_t id() const;
  absl::string_view name() const;
  absl::string_view base() const;
  bool archived() const;
  int64_t created_us() const;

 private:
  friend struct CatalogViewAccess;
  PolicyView(const void* table, uint64_t id, const CatalogReadSlot* slot, uint64_t epoch)
      : table_(table), id_(id), slot_(slot), epoch_(epoch) {}
  const void* checked_table() const;

  const void* table_ = nullptr;  // the verified fb::Policy
  uint64_t id_ = 0;              // the key (v7 records do not store it)
  const CatalogReadSlot* slot_ = nullptr;
  uint64_t epoch_ = 0;
};

// One read transaction, handed to Catalog::Read's callback. Lookups return views valid until
// the callback returns. Errors as the owning lookups of Catalog: NotFound, InvalidArgument for a
// bad name, DataLoss for a record that fails verification.
class CatalogReader {
 public:
  CatalogReader(const CatalogReader&) = delete;
  CatalogReader& operator=(const CatalogReader&) = delete;

  [[nodiscard]] absl::StatusOr<RevisionView> Revision(uint64_t id) const;
  [[nodiscard]] absl::StatusOr<RevisionView> RevisionBySeq(uint64_t policy_id, uint64_t seq) const;
  // As Catalog::GetRevisionByAlias (`latest` is the live revision with the highest seq).
  [[nodiscard]] absl::StatusOr<RevisionView> RevisionByAlias(uint64_t policy_id,
                                                             const std::string& alias) const;
  // The id of the policy called `name` (one lookup; no record is read).
  [[nodiscard]] absl::StatusOr<uint64_t> PolicyId(const std::string& name) const;
  [[nodiscard]] absl::StatusOr<PolicyView> Policy(const std::string& name) const;
  [[nodiscard]] absl::StatusOr<PolicyView> PolicyById(uint64_t id) const;

 private:
  friend class Catalog;
  friend struct CatalogViewAccess;
  struct State;
  explicit CatalogReader(State* state) : state_(state) {}
  State* state_;
};

class Catalog {
 public:
  // Opens (or creates) the environment in `dir` (created if missing). A second Open of the same
  // directory in this process, while the first handle lives, returns that same handle. Checks
  // stale reader slots. FailedPrecondition for a store written by a newer schema version or a
  // handle inherited across fork().
  [[nodiscard]] static absl::StatusOr<std::shared_ptr<Catalog>> Open(
      const std::string& dir, const CatalogOptions& options = {});

  // OK when `dir` is a directory or does not exist; InvalidArgument ("not a store directory")
  // when something else (a regular file, a device) is there. Open and Store::Open check it first.
  [[nodiscard]] static absl::Status CheckStoreDirectory(const std::string& dir);

  ~Catalog();
  // The named-database handles (defined in storage/catalog/lmdb_txn.h, internal).
  struct Dbis;
  Catalog(const Catalog&) = delete;
  Catalog& operator=(const Catalog&) = delete;

  const std::string& dir() const { return dir_; }
  // 32 hex digits chosen at creation.
  const std::string& store_id() const { return store_id_; }
  uint32_t schema_version() const { return kCatalogSchemaVersion; }

  // ---- bases
  // AlreadyExists if the name is taken; InvalidArgument for a bad name or an empty or duplicate
  // module table.
  [[nodiscard]] absl::Status PutBase(BaseRecord base);
  [[nodiscard]] absl::StatusOr<BaseRecord> GetBase(const std::string& name) const;
  [[nodiscard]] absl::StatusOr<std::vector<BaseRecord>> ListBases() const;

  // ---- policies
  // NotFound if `base` is not registered; AlreadyExists if the name is taken.
  [[nodiscard]] absl::StatusOr<PolicyRecord> CreatePolicy(
      const std::string& name, const std::string& base,
      const std::map<std::string, std::string>& labels = {});
  [[nodiscard]] absl::StatusOr<PolicyRecord> GetPolicy(const std::string& name) const;
  [[nodiscard]] absl::StatusOr<PolicyRecord> GetPolicyById(uint64_t id) const;
  [[nodiscard]] absl::StatusOr<std::vector<PolicyRecord>> ListPolicies() const;
  // Archived policies accept no new revisions or alias moves; reads still work.
  [[nodiscard]] absl::Status SetPolicyArchived(const std::string& name, bool archived);

  // ---- revisions
  // Publishes one revision in one transaction: assigns the next global id and the policy's next
  // seq, takes a reference on its blob (creating the blob record with `blob_relpath`), moves
  // `alias` if set. NotFound for an unknown policy; FailedPrecondition if it is archived.
  [[nodiscard]] absl::StatusOr<RevisionRecord> Publish(const NewRevision& rev,
                                                       const std::string& blob_relpath);
  // Publishes many revisions in one transaction (all or none), in order.
  [[nodiscard]] absl::StatusOr<std::vector<uint64_t>> PublishBatch(
      std::span<const NewRevision> revs, std::span<const std::string> blob_relpaths);
  [[nodiscard]] absl::StatusOr<RevisionRecord> GetRevision(uint64_t id) const;
  [[nodiscard]] absl::StatusOr<RevisionRecord> GetRevisionBySeq(uint64_t policy_id,
                                                                uint64_t seq) const;
  // Resolves `alias` on the policy; the virtual alias `latest` is the live revision with the
  // highest seq. NotFound when the alias is not set.
  [[nodiscard]] absl::StatusOr<RevisionRecord> GetRevisionByAlias(uint64_t policy_id,
                                                                  const std::string& alias) const;
  // A policy's revisions in seq order, seq > `after_seq`, at most `limit` (0: no limit).
  // Deleted revisions are skipped unless `include_deleted`.
  [[nodiscard]] absl::StatusOr<Page<RevisionRecord>> ListPolicyRevisions(
      uint64_t policy_id, uint64_t after_seq, size_t limit, bool include_deleted = false) const;
  // All revisions in id order, id > `after_id`, at most `limit` (0: no limit).
  [[nodiscard]] absl::StatusOr<Page<RevisionRecord>> ListRevisions(
      uint64_t after_id, size_t limit, bool include_deleted = false) const;
  // Runs `fn` in one short read transaction (a pooled one, renewed) with a reader whose lookups
  // return zero-copy views (above). Returns fn's status, or the error of beginning the
  // transaction. `fn` must not write to the catalog (a write would wait for a map resize this
  // transaction blocks) and should not wait on I/O: the snapshot pins pages until it returns.
  [[nodiscard]] absl::Status Read(absl::FunctionRef<absl::Status(const CatalogReader&)> fn) const;
  // Calls `fn` for every revision record in id order inside one read transaction, without
  // decoding into RevisionRecord (for scans). `fn` gets the id and the raw FlatBuffers bytes.
  [[nodiscard]] absl::Status ScanRevisionsRaw(
      const std::function<void(uint64_t id, std::span<const uint8_t> record)>& fn) const;
  // Counts a policy's revision index entries (live and deleted) touching only its own pages.
  [[nodiscard]] absl::StatusOr<uint64_t> CountPolicyRevisions(uint64_t policy_id) const;
  // Marks the revision deleted and drops its blob reference. FailedPrecondition while an alias
  // points at it; NotFound if absent; deleting a deleted revision is FailedPrecondition.
  [[nodiscard]] absl::Status DeleteRevision(uint64_t id);
  // Records an eval score on a revision (revisions are immutable except for evals and state).
  [[nodiscard]] absl::Status SetEvalScore(uint64_t id, const std::string& name, float value);

  // ---- aliases
  // Moves (or creates) `alias` to `revision` (a live revision of the same policy) and appends a
  // log entry numbered one past the alias's last, with the time read inside the same write
  // transaction: entry numbers are the commit order of the moves. Moving it to where it already
  // points is a no-op returning OK (nothing logged).
  [[nodiscard]] absl::Status SetAlias(uint64_t policy_id, const std::string& alias,
                                      uint64_t revision, const std::string& reason = "set");
  // Moves `alias` back to the value it had before its last move (logged with reason
  // "rollback"). FailedPrecondition when there is no earlier value or it is no longer live.
  // Returns the revision the alias now points at.
  [[nodiscard]] absl::StatusOr<uint64_t> Rollback(uint64_t policy_id, const std::string& alias);
  // The policy's aliases in name order, each with the `to` of its last log entry (one cursor
  // positioning per alias).
  [[nodiscard]] absl::StatusOr<std::vector<AliasEntry>> ListAliases(uint64_t policy_id) const;
  // The alias's log in commit order (entry numbers 1, 2, ...).
  [[nodiscard]] absl::StatusOr<std::vector<AliasLogEntry>> AliasLog(uint64_t policy_id,
                                                                    const std::string& alias) const;

  // ---- checkpoints
  // Takes a reference on every non-empty blob (records created with their BlobRelPath).
  [[nodiscard]] absl::StatusOr<CheckpointRecord> PutCheckpoint(const NewCheckpoint& ckpt);
  [[nodiscard]] absl::StatusOr<CheckpointRecord> GetCheckpoint(uint64_t id) const;
  // A policy's checkpoints ordered by (step, id).
  [[nodiscard]] absl::StatusOr<std::vector<CheckpointRecord>> ListCheckpoints(
      uint64_t policy_id) const;

  // ---- blobs
  [[nodiscard]] absl::StatusOr<BlobRecord> GetBlob(const Hash128& hash) const;
  [[nodiscard]] absl::StatusOr<std::vector<BlobRecord>> ListBlobs() const;

  // Cross-checks every record in one read transaction (no file I/O): policy name <-> id maps,
  // revisions against their policy, base, seq index entry and blob record; index entries
  // against revisions; aliases against live revisions of their policy; checkpoints against
  // their policy; every blob refcount against the references counted from live revisions and
  // checkpoints. A non-OK status only for read errors; inconsistencies go to `problems`.
  [[nodiscard]] absl::StatusOr<CatalogIntegrity> CheckIntegrity() const;

  // Ids of the revisions (live or deleted) whose record references the blob `hash`, in id order
  // (the schema v2 `revisions_by_blob` index; empty when none).
  [[nodiscard]] absl::StatusOr<std::vector<uint64_t>> ListRevisionsByBlob(
      const Hash128& hash) const;

  // Bytes of the LMDB data file (the used part of the map).
  [[nodiscard]] absl::StatusOr<uint64_t> DataBytes() const;
  // Where DataBytes goes: page counts per named database, the free list, and the rest.
  [[nodiscard]] absl::StatusOr<CatalogSpace> Space() const;

  // The id of the last committed write transaction of the environment (any process).
  [[nodiscard]] absl::StatusOr<uint64_t> LastTxnId() const;

  // Writes a consistent, compacted copy of the environment (mdb_env_copy2 with MDB_CP_COMPACT,
  // which takes one read transaction) as `<dest_dir>/data.mdb` and fsyncs it. `dest_dir` must
  // exist and hold no data.mdb. Returns a lower bound of the copied transaction id: every write
  // committed before the call is in the copy.
  [[nodiscard]] absl::StatusOr<uint64_t> CopySnapshot(const std::string& dest_dir) const;

 private:
  friend class RawRevisionProbe;  // reads env_ and the revisions handle (raw_probe.h)
  Catalog(std::string dir, const CatalogOptions& options);
  [[nodiscard]] absl::Status Init();
  // Runs `fn` in a write transaction and commits; on MDB_MAP_FULL aborts, grows the map with no
  // transaction open and runs `fn` again.
  [[nodiscard]] absl::Status Update(const std::function<absl::Status(MDB_txn*)>& fn);
  // Runs `fn` in a short read transaction (a renewed one from the pool).
  [[nodiscard]] absl::Status View(absl::FunctionRef<absl::Status(MDB_txn*)> fn) const;
  // View, also handing `fn` the pool slot of the transaction (views record it).
  [[nodiscard]] absl::Status ViewInSlot(
      absl::FunctionRef<absl::Status(MDB_txn*, const CatalogReadSlot*)> fn) const;
  [[nodiscard]] absl::Status GrowMap(uint64_t at_least) ABSL_LOCKS_EXCLUDED(resize_mu_);
  // options_.clock, or the system clock (unix microseconds).
  int64_t Now() const;
  // A pool slot with a renewed read transaction; nullptr with *rc set when none could begin
  // (MDB_MAP_RESIZED: the caller adopts the new size and retries).
  CatalogReadSlot* AcquireReadSlot(int* rc) const;
  // Ends the slot's transaction (reset), advancing its epoch so its views die with it.
  void ReleaseReadSlot(CatalogReadSlot* slot) const;

  std::string dir_;
  CatalogOptions options_;
  std::string store_id_;
  MDB_env* env_ = nullptr;
  std::unique_ptr<Dbis> dbi_;
  int pid_ = 0;
  // Readers and writers hold it shared for a transaction's life; growing the map holds it
  // exclusively so no transaction of this process is open.
  // loradb::Mutex, not absl::Mutex: visible to ThreadSanitizer (storage/util/mutex.h).
  mutable SharedMutex resize_mu_;
  mutable Mutex pool_mu_;
  // Every slot ever made (they live as long as the Catalog, so a stale view can still read its
  // slot's epoch) and the idle ones.
  mutable std::vector<std::unique_ptr<CatalogReadSlot>> slots_ ABSL_GUARDED_BY(pool_mu_);
  mutable std::vector<CatalogReadSlot*> idle_slots_ ABSL_GUARDED_BY(pool_mu_);
  // One idle slot kept outside the pool: a read that finds it takes it, and gives it back, with
  // one atomic exchange each instead of a lock round trip (the single-reader common case).
  mutable std::atomic<CatalogReadSlot*> hot_slot_{nullptr};
};

}  // namespace loradb

#endif  // LORADB_STORAGE_CATALOG_CATALOG_H_
