// A raw LMDB point read on a catalog's own environment, for benchmarks that put the catalog's
// lookups side by side with LMDB itself: what an LMDB user writes by hand (renew a read
// transaction, mdb_get, reset), nothing verified or decoded.
#ifndef LORADB_STORAGE_CATALOG_RAW_PROBE_H_
#define LORADB_STORAGE_CATALOG_RAW_PROBE_H_

#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "storage/catalog/catalog.h"

struct MDB_txn;

namespace loradb {

class RawRevisionProbe {
 public:
  // Holds `catalog` open. Errors: LMDB's, when no read transaction can begin.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<RawRevisionProbe>> Create(
      std::shared_ptr<const Catalog> catalog);
  ~RawRevisionProbe();
  RawRevisionProbe(const RawRevisionProbe&) = delete;
  RawRevisionProbe& operator=(const RawRevisionProbe&) = delete;

  // The byte size of revision `id`'s stored value; NotFound when there is none. Not thread-safe
  // (one transaction per probe).
  [[nodiscard]] absl::StatusOr<size_t> ValueSize(uint64_t id);

 private:
  explicit RawRevisionProbe(std::shared_ptr<const Catalog> catalog)
      : catalog_(std::move(catalog)) {}
  std::shared_ptr<const Catalog> catalog_;
  MDB_txn* txn_ = nullptr;
};

}  // namespace loradb

#endif  // LORADB_STORAGE_CATALOG_RAW_PROBE_H_
