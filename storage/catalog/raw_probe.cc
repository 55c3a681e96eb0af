#include "storage/catalog/raw_probe.h"

#include <lmdb.h>

#include "storage/catalog/lmdb_txn.h"

namespace loradb {

absl::StatusOr<std::unique_ptr<RawRevisionProbe>> RawRevisionProbe::Create(
    std::shared_ptr<const Catalog> catalog) {
  std::unique_ptr<RawRevisionProbe> p(new RawRevisionProbe(std::move(catalog)));
  const int rc = mdb_txn_begin(p->catalog_->env_, nullptr, MDB_RDONLY, &p->txn_);
  if (rc != 0) return catalog_lmdb::LmdbError(rc, "begin read (raw probe)");
  mdb_txn_reset(p->txn_);
  return p;
}

RawRevisionProbe::~RawRevisionProbe() {
  if (txn_ != nullptr) mdb_txn_abort(txn_);
}

absl::StatusOr<size_t> RawRevisionProbe::ValueSize(uint64_t id) {
  int rc = mdb_txn_renew(txn_);
  if (rc != 0) return catalog_lmdb::LmdbError(rc, "renew read (raw probe)");
  catalog_lmdb::U64Key key(id);
  MDB_val k = key.val(), v;
  rc = mdb_get(txn_, catalog_->dbi_->revisions, &k, &v);
  mdb_txn_reset(txn_);
  if (rc != 0) return catalog_lmdb::LmdbError(rc, "get revision (raw probe)");
  return v.mv_size;
}

}  // namespace loradb
