#include "storage/catalog/lmdb_txn.h"

#include <algorithm>
#include <cerrno>

#include "absl/strings/str_cat.h"
#include "storage/util/file_util.h"
#include "storage/util/status_macros.h"

namespace loradb::catalog_lmdb {
namespace {

// Set when LMDB reports MDB_MAP_FULL, so Catalog::Update can grow the map and retry.
thread_local bool tl_map_full = false;

}  // namespace

const std::array<NamedDb, 11> kNamedDbs = {{
    {"meta", &Catalog::Dbis::meta, 0},
    {"bases", &Catalog::Dbis::bases, 0},
    {"policies", &Catalog::Dbis::policies, 0},
    {"policy_by_id", &Catalog::Dbis::policy_by_id, 0},
    {"revisions", &Catalog::Dbis::revisions, 0},
    {"policy_revisions", &Catalog::Dbis::policy_revisions, MDB_DUPSORT | MDB_DUPFIXED},
    {"alias_log", &Catalog::Dbis::alias_log, 0},
    {"checkpoints", &Catalog::Dbis::checkpoints, 0},
    {"policy_checkpoints", &Catalog::Dbis::policy_checkpoints, MDB_DUPSORT | MDB_DUPFIXED},
    {"blobs", &Catalog::Dbis::blobs, 0},
    {"revisions_by_blob", &Catalog::Dbis::revisions_by_blob, MDB_DUPSORT | MDB_DUPFIXED},
}};

void ClearMapFull() { tl_map_full = false; }
bool MapFull() { return tl_map_full; }

absl::Status LmdbError(int rc, absl::string_view what) {
  if (rc == MDB_MAP_FULL) tl_map_full = true;
  const std::string msg = absl::StrCat("catalog: ", what, ": ", mdb_strerror(rc));
  switch (rc) {
    case MDB_NOTFOUND:
      return absl::NotFoundError(msg);
    case MDB_KEYEXIST:
      return absl::AlreadyExistsError(msg);
    case MDB_MAP_FULL:
    case MDB_READERS_FULL:
    case MDB_TXN_FULL:
    case ENOSPC:
      return absl::ResourceExhaustedError(msg);
    case MDB_CORRUPTED:
    case MDB_PAGE_NOTFOUND:
      return absl::DataLossError(msg);
    case MDB_VERSION_MISMATCH:
    case MDB_INVALID:
      return absl::FailedPreconditionError(msg);
    default:
      if (rc > 0) return ErrnoToStatus(rc, absl::StrCat("catalog: ", what));
      return absl::InternalError(msg);
  }
}

absl::Status Get(MDB_txn* txn, MDB_dbi dbi, MDB_val k, MDB_val* v, absl::string_view what) {
  int rc = mdb_get(txn, dbi, &k, v);
  if (rc == 0) return absl::OkStatus();
  return LmdbError(rc, what);
}

absl::StatusOr<uint64_t> TxnLastSeq(MDB_txn* txn, const Catalog::Dbis& d, uint64_t policy_id) {
  Cursor c(txn, d.policy_revisions);
  LORADB_RETURN_IF_ERROR(c.status());
  U64Key pk(policy_id);
  MDB_val k = pk.val(), v;
  int rc = c.Get(&k, &v, MDB_SET_KEY);
  if (rc == MDB_NOTFOUND) return 0;
  if (rc == 0) rc = c.Get(&k, &v, MDB_LAST_DUP);
  if (rc != 0) return LmdbError(rc, "policy revision index");
  if (v.mv_size != 16) return absl::DataLossError("catalog: bad policy revision entry");
  return GetBE64(v.mv_data);
}

absl::Status ResolveNextSeq(MDB_txn* txn, const Catalog::Dbis& d, PolicyRecord* p) {
  LORADB_ASSIGN_OR_RETURN(const uint64_t last, TxnLastSeq(txn, d, p->id));
  p->next_seq = std::max(p->next_seq, last + 1);
  return absl::OkStatus();
}

}  // namespace loradb::catalog_lmdb
