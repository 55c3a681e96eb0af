// LMDB plumbing shared by the catalog's source files (catalog.cc, catalog_integrity.cc,
// catalog_space.cc, revision_view.cc): the named-database handles, error mapping, a cursor and
// the key/value helpers. Internal to storage/catalog; nothing outside it includes this header.
#ifndef LORADB_STORAGE_CATALOG_LMDB_TXN_H_
#define LORADB_STORAGE_CATALOG_LMDB_TXN_H_

#include <lmdb.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "storage/catalog/catalog.h"
#include "storage/catalog/key_encoding.h"
#include "storage/catalog/records.h"

namespace loradb {

// The handles of the named databases, opened once in Catalog::Init.
struct Catalog::Dbis {
  MDB_dbi meta = 0;
  MDB_dbi bases = 0;
  MDB_dbi policies = 0;
  MDB_dbi policy_by_id = 0;
  MDB_dbi revisions = 0;
  MDB_dbi policy_revisions = 0;
  MDB_dbi alias_log = 0;  // also the aliases' values: the `to` of each alias's last entry (v7)
  MDB_dbi checkpoints = 0;
  MDB_dbi policy_checkpoints = 0;
  MDB_dbi blobs = 0;
  MDB_dbi revisions_by_blob = 0;  // schema v2
};

// A pooled read transaction. Its epoch advances each time the transaction ends (reset or
// abort); a view remembers the epoch it was made in, so a view used after its transaction is
// recognised. Slots live as long as their Catalog.
struct CatalogReadSlot {
  MDB_txn* txn = nullptr;
  std::atomic<uint64_t> epoch{0};
  // A cursor on alias_log kept across the slot's transactions (LMDB lets read-only cursors be
  // renewed), so alias lookups in views allocate nothing: opened on first use, renewed when
  // `alias_log_epoch` is not the slot's epoch, closed with the Catalog. Only the thread holding
  // the slot touches it.
  mutable MDB_cursor* alias_log = nullptr;
  mutable uint64_t alias_log_epoch = 0;
};

// Aligned copies of values LMDB returned at addresses FlatBuffers cannot read in place (LMDB
// aligns values to 2 bytes only; the catalog's own fixed-width-key databases hold 8-aligned
// values in practice, so this is the rare path). The copies live as long as this object.
class CatalogAlignedCopies {
 public:
  // `b` itself when it is 8-byte aligned, else an aligned copy.
  std::span<const uint8_t> Align(std::span<const uint8_t> b);

 private:
  std::vector<std::unique_ptr<uint64_t[]>> copies_;
};

// Where views made inside one transaction belong: the transaction and the database handles (a
// revision view reads its policy's record there for a base it leaves to the policy), the slot
// they check (null in the catalog's own write transactions, whose views never leave the function
// that made them), its epoch at the start of the transaction, and the copies of misaligned
// values. A view keeps a pointer to its scope, so the scope must outlive its views.
struct CatalogViewScope {
  CatalogViewScope(MDB_txn* t, const Catalog::Dbis* d) : txn(t), dbi(d) {}
  CatalogViewScope(const CatalogViewScope&) = delete;
  CatalogViewScope& operator=(const CatalogViewScope&) = delete;
  MDB_txn* txn;
  const Catalog::Dbis* dbi;
  const CatalogReadSlot* slot = nullptr;
  uint64_t epoch = 0;
  CatalogAlignedCopies copies;
};

struct CatalogReader::State {
  State(MDB_txn* t, const Catalog::Dbis* d) : txn(t), dbi(d), scope(t, d) {}
  MDB_txn* txn;
  const Catalog::Dbis* dbi;
  CatalogViewScope scope;
};

// Builds views and readers (their constructors are private) and reads a view's table.
struct CatalogViewAccess {
  static RevisionView MakeRevision(const void* table, uint8_t layout, uint64_t id,
                                   CatalogViewScope& s) {
    return RevisionView(table, layout, id, &s, s.slot, s.epoch);
  }
  static PolicyView MakePolicy(const void* table, uint64_t id, const CatalogViewScope& s) {
    return PolicyView(table, id, s.slot, s.epoch);
  }
  static CatalogViewScope* ScopeOf(const RevisionView& v) { return v.scope_; }
  static CatalogReader MakeReader(CatalogReader::State* state) { return CatalogReader(state); }
  static CatalogReader::State& StateOf(const CatalogReader& r) { return *r.state_; }
};

namespace catalog_lmdb {

using catalog_keys::GetBE64;
using catalog_keys::PutBE64;

// One named database: its name in the file, its handle in Dbis and its mdb_dbi_open flags.
struct NamedDb {
  const char* name;
  MDB_dbi Catalog::Dbis::*dbi;
  unsigned flags;
};
// Every named database, in the order docs/format-catalog.md lists them.
extern const std::array<NamedDb, 11> kNamedDbs;

// An LMDB return code as a status naming `what` (NotFound, AlreadyExists, ResourceExhausted for
// a full map or reader table, DataLoss for corruption, ...). MDB_MAP_FULL also raises this
// thread's map-full flag (below), so the write loop can grow the map and retry.
absl::Status LmdbError(int rc, absl::string_view what);
// The map-full flag of this thread: cleared before a write transaction runs, read after it.
void ClearMapFull();
bool MapFull();

// RAII cursor.
class Cursor {
 public:
  Cursor(MDB_txn* txn, MDB_dbi dbi) { rc_ = mdb_cursor_open(txn, dbi, &c_); }
  ~Cursor() {
    if (c_ != nullptr) mdb_cursor_close(c_);
  }
  Cursor(const Cursor&) = delete;
  Cursor& operator=(const Cursor&) = delete;
  absl::Status status() const {
    return rc_ == 0 ? absl::OkStatus() : LmdbError(rc_, "cursor open");
  }
  // Returns 0, MDB_NOTFOUND, or an error code.
  int Get(MDB_val* k, MDB_val* v, MDB_cursor_op op) { return mdb_cursor_get(c_, k, v, op); }
  MDB_cursor* get() { return c_; }

 private:
  MDB_cursor* c_ = nullptr;
  int rc_ = 0;
};

// A u64 key (8 big-endian bytes).
struct U64Key {
  explicit U64Key(uint64_t v) { PutBE64(b.data(), v); }
  MDB_val val() { return {8, b.data()}; }
  std::array<uint8_t, 8> b;
};

// (a, b) as 16 big-endian bytes: the DUPFIXED value of the policy -> revisions/checkpoints
// indexes, and the blob hash key.
struct U128Key {
  U128Key(uint64_t a, uint64_t c) {
    PutBE64(b.data(), a);
    PutBE64(b.data() + 8, c);
  }
  MDB_val val() { return {16, b.data()}; }
  std::array<uint8_t, 16> b;
};

// A policy name's `policies` key (catalog_keys::PutPolicyNameKey), on the stack. `name` must be
// a valid policy name (at most 128 bytes).
struct PolicyNameKey {
  explicit PolicyNameKey(absl::string_view name)
      : size(catalog_keys::PutPolicyNameKey(name.data(), name.size(), b.data())) {}
  MDB_val val() { return {size, b.data()}; }
  std::array<uint8_t, catalog_keys::kMaxPolicyNameKey> b;
  size_t size;
};

inline MDB_val StrVal(const std::string& s) { return {s.size(), const_cast<char*>(s.data())}; }

inline std::span<const uint8_t> ValBytes(const MDB_val& v) {
  return {static_cast<const uint8_t*>(v.mv_data), v.mv_size};
}

// mdb_get: OK with `*v` set, NotFound, or another error.
absl::Status Get(MDB_txn* txn, MDB_dbi dbi, MDB_val k, MDB_val* v, absl::string_view what);

// The highest seq in the policy's revision index (live or deleted), or 0 when it has none.
absl::StatusOr<uint64_t> TxnLastSeq(MDB_txn* txn, const Catalog::Dbis& d, uint64_t policy_id);

// Schema v3: the record's next_seq is a lower bound (written at creation and by rebuilds; a
// publish does not rewrite the policy record); the seq the next publish gets is the larger of it
// and one past the highest seq in the policy's revision index.
absl::Status ResolveNextSeq(MDB_txn* txn, const Catalog::Dbis& d, PolicyRecord* p);

// ---- view lookups inside a transaction (catalog_reader.cc); errors as CatalogReader's.

// Verifies `bytes` (the revisions value under key `key_id`) and views it in `scope`.
absl::StatusOr<RevisionView> ViewRevisionBytes(std::span<const uint8_t> bytes, uint64_t key_id,
                                               CatalogViewScope& scope);
absl::StatusOr<RevisionView> TxnRevisionView(MDB_txn* txn, const Catalog::Dbis& d, uint64_t id,
                                             CatalogViewScope& scope);
absl::StatusOr<RevisionView> TxnRevisionViewBySeq(MDB_txn* txn, const Catalog::Dbis& d,
                                                  uint64_t policy_id, uint64_t seq,
                                                  CatalogViewScope& scope);
absl::StatusOr<RevisionView> TxnRevisionViewByAlias(MDB_txn* txn, const Catalog::Dbis& d,
                                                    uint64_t policy_id, const std::string& alias,
                                                    CatalogViewScope& scope);
absl::StatusOr<PolicyView> TxnPolicyViewById(MDB_txn* txn, const Catalog::Dbis& d, uint64_t id,
                                             CatalogViewScope& scope);
// The policy id under `name` in `policies`; InvalidArgument for an invalid name.
absl::StatusOr<uint64_t> TxnPolicyIdByName(MDB_txn* txn, const Catalog::Dbis& d,
                                           const std::string& name);

// ---- aliases: the alias_log database holds every move of an alias; its value is the `to` of its
// last entry (schema v7, which has no `aliases` database).

// An alias_log key on the stack: policy id (u64 BE) ++ alias length (u8) ++ alias, then the entry
// number (u64 BE) after that prefix. `alias` must be at most 255 bytes (alias names are at most
// 64: ValidateAliasName).
struct AliasLogKey {
  static constexpr size_t kMax = 8 + 1 + 255 + 8;
  AliasLogKey(uint64_t policy_id, absl::string_view alias);
  // The key without its entry number: every entry of the alias starts with it.
  MDB_val prefix() { return {prefix_size, b.data()}; }
  // The key of entry `n`.
  MDB_val entry(uint64_t n) {
    PutBE64(b.data() + prefix_size, n);
    return {prefix_size + 8, b.data()};
  }
  std::array<uint8_t, kMax> b;
  size_t prefix_size;
};

// Whether `k` is an entry key of the alias whose prefix is `prefix`.
inline bool IsEntryOf(const MDB_val& k, const MDB_val& prefix) {
  return k.mv_size == prefix.mv_size + 8 &&
         std::memcmp(k.mv_data, prefix.mv_data, prefix.mv_size) == 0;
}

// Positions `c` (a cursor on alias_log) at the last entry of the alias of `key` with one
// positioning (MDB_SET_RANGE past its last possible entry, then one step back). Returns 0 with
// `*k`, `*v` set, MDB_NOTFOUND when the alias has no entry, or another LMDB code.
int SeekLastAliasLogEntry(MDB_cursor* c, AliasLogKey& key, MDB_val* k, MDB_val* v);

// The `to` of an alias log entry value, read in place (through an aligned copy on the stack when
// the value is misaligned; the heap only for values over 256 bytes). DataLoss when the value
// fails verification.
absl::StatusOr<uint64_t> AliasLogEntryTo(const MDB_val& v);

// The revision an alias points at (its last log entry's `to`); NotFound when it has no entry.
// Reads through `c`, a cursor on alias_log in the transaction.
absl::StatusOr<uint64_t> GetAlias(MDB_cursor* c, uint64_t policy_id, absl::string_view alias);
// The same with a cursor of its own.
absl::StatusOr<uint64_t> TxnGetAlias(MDB_txn* txn, const Catalog::Dbis& d, uint64_t policy_id,
                                     absl::string_view alias);

// Calls `fn(alias, revision)` for every alias of `policy_id` in key order (alias length, then
// bytes), one cursor positioning per alias. Stops at fn's first error and returns it.
absl::Status TxnForEachAlias(MDB_txn* txn, const Catalog::Dbis& d, uint64_t policy_id,
                             absl::FunctionRef<absl::Status(absl::string_view, uint64_t)> fn);

}  // namespace catalog_lmdb
}  // namespace loradb

#endif  // LORADB_STORAGE_CATALOG_LMDB_TXN_H_
