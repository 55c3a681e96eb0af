// Catalog::DataBytes and Catalog::Space: how big the catalog is and where its pages go.
#include <lmdb.h>

#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "storage/catalog/catalog.h"
#include "storage/catalog/lmdb_txn.h"
#include "storage/util/status_macros.h"

namespace loradb {

using catalog_lmdb::Cursor;
using catalog_lmdb::LmdbError;

absl::StatusOr<uint64_t> Catalog::DataBytes() const {
  MDB_envinfo info;
  MDB_stat st;
  int rc = mdb_env_info(env_, &info);
  if (rc != 0) return LmdbError(rc, "env info");
  rc = mdb_env_stat(env_, &st);
  if (rc != 0) return LmdbError(rc, "env stat");
  return static_cast<uint64_t>(info.me_last_pgno + 1) * st.ms_psize;
}

absl::StatusOr<CatalogSpace> Catalog::Space() const {
  CatalogSpace out;
  LORADB_RETURN_IF_ERROR(View([&](MDB_txn* txn) -> absl::Status {
    MDB_envinfo info;
    int rc = mdb_env_info(env_, &info);
    if (rc != 0) return LmdbError(rc, "env info");
    out.used_pages = static_cast<uint64_t>(info.me_last_pgno) + 1;
    auto stat_of = [&](MDB_dbi dbi, const char* name, bool count_bytes,
                       CatalogDbSpace* db) -> absl::Status {
      MDB_stat st;
      const int r = mdb_stat(txn, dbi, &st);
      if (r != 0) return LmdbError(r, absl::StrCat("stat ", name));
      out.page_size = st.ms_psize;
      db->name = name;
      db->entries = st.ms_entries;
      db->depth = st.ms_depth;
      db->branch_pages = st.ms_branch_pages;
      db->leaf_pages = st.ms_leaf_pages;
      db->overflow_pages = st.ms_overflow_pages;
      if (!count_bytes) return absl::OkStatus();
      Cursor c(txn, dbi);
      LORADB_RETURN_IF_ERROR(c.status());
      MDB_val k, v;
      for (int g = c.Get(&k, &v, MDB_FIRST); g != MDB_NOTFOUND; g = c.Get(&k, &v, MDB_NEXT)) {
        if (g != 0) return LmdbError(g, absl::StrCat("scan ", name));
        db->key_value_bytes += k.mv_size + v.mv_size;
      }
      return absl::OkStatus();
    };
    // dbi 1 is LMDB's main database (the table of named databases), dbi 0 its free list.
    LORADB_RETURN_IF_ERROR(stat_of(1, "(main)", false, &out.main));
    uint64_t accounted = out.meta_pages + out.main.pages();
    for (const catalog_lmdb::NamedDb& named : catalog_lmdb::kNamedDbs) {
      CatalogDbSpace db;
      LORADB_RETURN_IF_ERROR(stat_of(dbi_.get()->*named.dbi, named.name, true, &db));
      accounted += db.pages();
      out.dbs.push_back(std::move(db));
    }
    CatalogDbSpace free_db;
    LORADB_RETURN_IF_ERROR(stat_of(0, "(free)", false, &free_db));
    out.freelist_pages = free_db.pages();
    // Each free-list record is an array of page numbers whose first element is the count.
    Cursor c(txn, 0);
    LORADB_RETURN_IF_ERROR(c.status());
    MDB_val k, v;
    for (int g = c.Get(&k, &v, MDB_FIRST); g != MDB_NOTFOUND; g = c.Get(&k, &v, MDB_NEXT)) {
      if (g != 0) return LmdbError(g, "scan free list");
      if (v.mv_size < sizeof(size_t)) return absl::DataLossError("catalog: short free-list record");
      size_t count = 0;
      std::memcpy(&count, v.mv_data, sizeof(count));
      out.free_pages += count;
    }
    accounted += out.freelist_pages + out.free_pages;
    out.unaccounted_pages = out.used_pages > accounted ? out.used_pages - accounted : 0;
    return absl::OkStatus();
  }));
  return out;
}

}  // namespace loradb
