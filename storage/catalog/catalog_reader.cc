// CatalogReader and the view lookups of one transaction: verify a record once, view it in place.
#include <lmdb.h>

#include <array>
#include <cstring>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "storage/catalog/catalog.h"
#include "storage/catalog/codec_tables.h"
#include "storage/catalog/lmdb_txn.h"
#include "storage/util/status_macros.h"

namespace loradb {

namespace codec = catalog_codec;

std::span<const uint8_t> CatalogAlignedCopies::Align(std::span<const uint8_t> b) {
  if (reinterpret_cast<uintptr_t>(b.data()) % alignof(uint64_t) == 0) return b;
  copies_.push_back(std::make_unique<uint64_t[]>((b.size() + 7) / 8));
  std::memcpy(copies_.back().get(), b.data(), b.size());
  return {reinterpret_cast<const uint8_t*>(copies_.back().get()), b.size()};
}

namespace catalog_lmdb {
namespace {

constexpr absl::string_view kVirtualLatest = "latest";

uint64_t IndexEntryId(const MDB_val& v) {
  return GetBE64(static_cast<const uint8_t*>(v.mv_data) + 8);
}

}  // namespace

AliasLogKey::AliasLogKey(uint64_t policy_id, absl::string_view alias)
    : prefix_size(9 + alias.size()) {
  PutBE64(b.data(), policy_id);
  b[8] = static_cast<uint8_t>(alias.size());
  std::memcpy(b.data() + 9, alias.data(), alias.size());
}

int SeekLastAliasLogEntry(MDB_cursor* c, AliasLogKey& key, MDB_val* k, MDB_val* v) {
  // The first key past every entry of the alias (entry numbers are below 2^64 - 1), then one
  // back; past the end of the database, the last key.
  *k = key.entry(UINT64_MAX);
  int rc = mdb_cursor_get(c, k, v, MDB_SET_RANGE);
  if (rc == 0) {
    rc = mdb_cursor_get(c, k, v, MDB_PREV);
  } else if (rc == MDB_NOTFOUND) {
    rc = mdb_cursor_get(c, k, v, MDB_LAST);
  }
  if (rc != 0) return rc;
  // The entry before may belong to another alias, or another policy: only the prefix tells.
  return IsEntryOf(*k, key.prefix()) ? 0 : MDB_NOTFOUND;
}

absl::StatusOr<uint64_t> AliasLogEntryTo(const MDB_val& v) {
  // Alias log keys have any length, so values sit at any even address; FlatBuffers reads in
  // place only from an aligned one.
  alignas(8) std::array<uint8_t, 256> stack;
  std::unique_ptr<uint64_t[]> heap;
  std::span<const uint8_t> bytes = ValBytes(v);
  if (reinterpret_cast<uintptr_t>(v.mv_data) % alignof(uint64_t) != 0) {
    uint8_t* to = stack.data();
    if (v.mv_size > stack.size()) {
      heap = std::make_unique<uint64_t[]>((v.mv_size + 7) / 8);
      to = reinterpret_cast<uint8_t*>(heap.get());
    }
    std::memcpy(to, v.mv_data, v.mv_size);
    bytes = {to, v.mv_size};
  }
  LORADB_ASSIGN_OR_RETURN(const codec::fb::AliasLogEntry* e,
                          codec::VerifyTable<codec::fb::AliasLogEntry>(bytes, "alias log"));
  return e->to_revision();
}

absl::StatusOr<RevisionView> ViewRevisionBytes(std::span<const uint8_t> bytes, uint64_t key_id,
                                               CatalogViewScope& scope) {
  LORADB_ASSIGN_OR_RETURN(const codec::RevisionTables t,
                          codec::VerifyRevision(scope.copies.Align(bytes)));
  if (t.v3 != nullptr) return CatalogViewAccess::MakeRevision(t.v3, 3, key_id, scope);
  if (t.v2 != nullptr) return CatalogViewAccess::MakeRevision(t.v2, 2, key_id, scope);
  return CatalogViewAccess::MakeRevision(t.v1, 1, t.v1->id(), scope);
}

absl::StatusOr<RevisionView> TxnRevisionView(MDB_txn* txn, const Catalog::Dbis& d, uint64_t id,
                                             CatalogViewScope& scope) {
  U64Key k(id);
  MDB_val key = k.val(), v;
  // mdb_get's code is checked directly: no status is built on the (hot) found path.
  const int rc = mdb_get(txn, d.revisions, &key, &v);
  if (rc == MDB_NOTFOUND) return absl::NotFoundError(absl::StrCat("no revision with id ", id));
  if (rc != 0) return LmdbError(rc, "revision");
  return ViewRevisionBytes(ValBytes(v), id, scope);
}

absl::StatusOr<RevisionView> TxnRevisionViewBySeq(MDB_txn* txn, const Catalog::Dbis& d,
                                                  uint64_t policy_id, uint64_t seq,
                                                  CatalogViewScope& scope) {
  Cursor c(txn, d.policy_revisions);
  LORADB_RETURN_IF_ERROR(c.status());
  U64Key pk(policy_id);
  U128Key probe(seq, 0);
  MDB_val k = pk.val(), v = probe.val();
  int rc = c.Get(&k, &v, MDB_GET_BOTH_RANGE);
  if (rc == MDB_NOTFOUND || (rc == 0 && (v.mv_size != 16 || GetBE64(v.mv_data) != seq))) {
    return absl::NotFoundError(
        absl::StrCat("policy id ", policy_id, " has no revision with seq ", seq));
  }
  if (rc != 0) return LmdbError(rc, "policy revision index");
  return TxnRevisionView(txn, d, IndexEntryId(v), scope);
}

absl::StatusOr<uint64_t> TxnGetAlias(MDB_txn* txn, const Catalog::Dbis& d, uint64_t policy_id,
                                     absl::string_view alias) {
  Cursor c(txn, d.alias_log);
  LORADB_RETURN_IF_ERROR(c.status());
  return GetAlias(c.get(), policy_id, alias);
}

absl::StatusOr<uint64_t> GetAlias(MDB_cursor* c, uint64_t policy_id, absl::string_view alias) {
  AliasLogKey key(policy_id, alias);
  MDB_val k, v;
  const int rc = SeekLastAliasLogEntry(c, key, &k, &v);
  if (rc == MDB_NOTFOUND) {
    return absl::NotFoundError(absl::StrCat("alias '", alias, "' is not set"));
  }
  if (rc != 0) return LmdbError(rc, "alias log");
  return AliasLogEntryTo(v);
}

absl::Status TxnForEachAlias(MDB_txn* txn, const Catalog::Dbis& d, uint64_t policy_id,
                             absl::FunctionRef<absl::Status(absl::string_view, uint64_t)> fn) {
  Cursor c(txn, d.alias_log);
  LORADB_RETURN_IF_ERROR(c.status());
  U64Key pk(policy_id);
  MDB_val k = pk.val(), v;
  int rc = c.Get(&k, &v, MDB_SET_RANGE);
  while (rc == 0 && k.mv_size >= 8 && GetBE64(k.mv_data) == policy_id) {
    // The first entry of the next alias: its length byte gives its prefix; skip to its last entry.
    const auto* p = static_cast<const uint8_t*>(k.mv_data);
    if (!catalog_keys::IsAliasLogKey(k.mv_data, k.mv_size)) {
      return absl::DataLossError(absl::StrCat("catalog: alias log key of ", k.mv_size,
                                              " bytes under policy id ", policy_id,
                                              " does not hold its alias's length"));
    }
    AliasLogKey key(policy_id, absl::string_view(reinterpret_cast<const char*>(p + 9), p[8]));
    rc = SeekLastAliasLogEntry(c.get(), key, &k, &v);
    if (rc != 0) break;
    LORADB_ASSIGN_OR_RETURN(const uint64_t to, AliasLogEntryTo(v));
    LORADB_RETURN_IF_ERROR(
        fn(absl::string_view(reinterpret_cast<const char*>(key.b.data()) + 9, key.prefix_size - 9),
           to));
    rc = c.Get(&k, &v, MDB_NEXT);
  }
  if (rc != 0 && rc != MDB_NOTFOUND) return LmdbError(rc, "alias log");
  return absl::OkStatus();
}

absl::StatusOr<RevisionView> TxnRevisionViewByAlias(MDB_txn* txn, const Catalog::Dbis& d,
                                                    uint64_t policy_id, const std::string& alias,
                                                    CatalogViewScope& scope) {
  LORADB_RETURN_IF_ERROR(ValidateAliasName(alias));
  if (alias != kVirtualLatest) {
    uint64_t id = 0;
    if (const CatalogReadSlot* slot = scope.slot) {
      // The slot's own cursor, bound to this transaction once per transaction: no allocation.
      int rc = 0;
      if (slot->alias_log == nullptr) {
        rc = mdb_cursor_open(txn, d.alias_log, &slot->alias_log);
      } else if (slot->alias_log_epoch != scope.epoch) {
        rc = mdb_cursor_renew(txn, slot->alias_log);
      }
      if (rc != 0) return LmdbError(rc, "alias log cursor");
      slot->alias_log_epoch = scope.epoch;
      LORADB_ASSIGN_OR_RETURN(id, GetAlias(slot->alias_log, policy_id, alias));
    } else {
      LORADB_ASSIGN_OR_RETURN(id, TxnGetAlias(txn, d, policy_id, alias));
    }
    return TxnRevisionView(txn, d, id, scope);
  }
  // `latest`: walk the policy's index from its highest seq down to the first live revision.
  Cursor c(txn, d.policy_revisions);
  LORADB_RETURN_IF_ERROR(c.status());
  U64Key pk(policy_id);
  MDB_val k = pk.val(), v;
  int rc = c.Get(&k, &v, MDB_SET);
  if (rc == 0) rc = c.Get(&k, &v, MDB_LAST_DUP);
  while (rc == 0) {
    LORADB_ASSIGN_OR_RETURN(RevisionView r, TxnRevisionView(txn, d, IndexEntryId(v), scope));
    if (r.live()) return r;
    rc = c.Get(&k, &v, MDB_PREV_DUP);
  }
  if (rc != MDB_NOTFOUND) return LmdbError(rc, "policy revision index");
  return absl::NotFoundError(
      absl::StrCat("policy id ", policy_id, " has no live revision (alias 'latest')"));
}

absl::StatusOr<PolicyView> TxnPolicyViewById(MDB_txn* txn, const Catalog::Dbis& d, uint64_t id,
                                             CatalogViewScope& scope) {
  U64Key k(id);
  MDB_val v;
  absl::Status st = Get(txn, d.policy_by_id, k.val(), &v, "policy");
  if (absl::IsNotFound(st)) return absl::NotFoundError(absl::StrCat("no policy with id ", id));
  LORADB_RETURN_IF_ERROR(st);
  LORADB_ASSIGN_OR_RETURN(
      const codec::fb::Policy* table,
      codec::VerifyTable<codec::fb::Policy>(scope.copies.Align(ValBytes(v)), "policy"));
  return CatalogViewAccess::MakePolicy(table, id, scope);
}

absl::StatusOr<uint64_t> TxnPolicyIdByName(MDB_txn* txn, const Catalog::Dbis& d,
                                           const std::string& name) {
  // A name no policy can have is refused before it reaches LMDB (an empty key is an LMDB error).
  LORADB_RETURN_IF_ERROR(ValidatePolicyName(name));
  MDB_val v;
  PolicyNameKey key(name);
  absl::Status st = Get(txn, d.policies, key.val(), &v, "policy");
  if (absl::IsNotFound(st)) {
    return absl::NotFoundError(absl::StrCat("no policy named '", name, "'"));
  }
  LORADB_RETURN_IF_ERROR(st);
  if (v.mv_size != 8) return absl::DataLossError("catalog: policy name entry is not 8 bytes");
  return GetBE64(v.mv_data);
}

}  // namespace catalog_lmdb

// ---- CatalogReader

absl::StatusOr<RevisionView> CatalogReader::Revision(uint64_t id) const {
  return catalog_lmdb::TxnRevisionView(state_->txn, *state_->dbi, id, state_->scope);
}

absl::StatusOr<RevisionView> CatalogReader::RevisionBySeq(uint64_t policy_id, uint64_t seq) const {
  return catalog_lmdb::TxnRevisionViewBySeq(state_->txn, *state_->dbi, policy_id, seq,
                                            state_->scope);
}

absl::StatusOr<RevisionView> CatalogReader::RevisionByAlias(uint64_t policy_id,
                                                            const std::string& alias) const {
  return catalog_lmdb::TxnRevisionViewByAlias(state_->txn, *state_->dbi, policy_id, alias,
                                              state_->scope);
}

absl::StatusOr<uint64_t> CatalogReader::PolicyId(const std::string& name) const {
  return catalog_lmdb::TxnPolicyIdByName(state_->txn, *state_->dbi, name);
}

absl::StatusOr<PolicyView> CatalogReader::Policy(const std::string& name) const {
  LORADB_ASSIGN_OR_RETURN(const uint64_t id, PolicyId(name));
  return PolicyById(id);
}

absl::StatusOr<PolicyView> CatalogReader::PolicyById(uint64_t id) const {
  return catalog_lmdb::TxnPolicyViewById(state_->txn, *state_->dbi, id, state_->scope);
}

}  // namespace loradb
