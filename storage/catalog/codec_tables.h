// The FlatBuffers side of the catalog codec: verifying a record in place and turning a verified
// table into an owning record. Internal to storage/catalog (codec.cc, record_view.cc); other
// code reads records through codec.h or the views of catalog.h.
#ifndef LORADB_STORAGE_CATALOG_CODEC_TABLES_H_
#define LORADB_STORAGE_CATALOG_CODEC_TABLES_H_

#include <flatbuffers/flatbuffers.h>

#include <cstdint>
#include <span>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "schema/catalog_generated.h"
#include "storage/catalog/records.h"

namespace loradb::catalog_codec {

namespace fb = ::loradb::catalog::fb;

// The newest record layout version this build reads (revision records: below).
inline constexpr uint16_t kRecordLayoutVersion = 1;
// The revision record layout this build writes and the newest it reads: 4 (the RevisionV3 table
// with version 4, catalog schema v7: the base left to the policy when it is the policy's).
// Layouts 3 (RevisionV3, v6), 2 (RevisionV2, v4-v5) and 1 (Revision, v1-v3) are still read, from
// stores not yet migrated.
inline constexpr uint16_t kRevisionLayoutVersion = 4;

// Verifies `b` as a T in place and checks its layout version against `newest`. `b.data()` must
// be 8-byte aligned (FlatBuffers reads scalars where they lie; a misaligned load is undefined
// behaviour). DataLoss for bytes that fail verification; FailedPrecondition for a newer layout.
template <typename T>
absl::StatusOr<const T*> VerifyTable(std::span<const uint8_t> b, const char* what,
                                     uint16_t newest = kRecordLayoutVersion) {
  flatbuffers::Verifier v(b.data(), b.size());
  if (!v.VerifyBuffer<T>(nullptr)) {
    return absl::DataLossError(absl::StrCat("catalog: corrupt ", what, " record (", b.size(),
                                            " bytes fail FlatBuffers verification)"));
  }
  const T* root = flatbuffers::GetRoot<T>(b.data());
  if (root->version() > newest) {
    return absl::FailedPreconditionError(
        absl::StrCat("catalog: ", what, " record has layout version ", root->version(),
                     ", newer than this build understands (", newest, "); upgrade loradb"));
  }
  return root;
}

// Builds `r`'s record (layout 4; `r.id` is the key, not stored; `r.base` left out when it equals
// `policy_base`) in `b`, cleared first: the bytes are b.GetBufferPointer() and b.GetSize(), as
// EncodeRevision returns them, without a copy.
void BuildRevision(flatbuffers::FlatBufferBuilder& b, const RevisionRecord& r,
                   absl::string_view policy_base);

// A verified revision record: exactly one of `v1`, `v2` and `v3` (layouts 1, 2, and 3 or 4: the
// RevisionV3 table, told apart by its version) is set.
struct RevisionTables {
  const fb::Revision* v1 = nullptr;
  const fb::RevisionV2* v2 = nullptr;
  const fb::RevisionV3* v3 = nullptr;
};
// Verifies `b` (8-byte aligned) as a revision record of any layout. Errors as VerifyTable;
// DataLoss also for a layout-2 or -3 record without its fixed fields, and for a layout-3 record
// whose dtype code or target-module bits this build does not know or that stores a field both
// ways.
absl::StatusOr<RevisionTables> VerifyRevision(std::span<const uint8_t> b);

// A layout-3 or -4 record's dtype: the name its code stands for, else the `dtype` string.
absl::string_view RevisionDtype(const fb::RevisionV3& t);

// True for a layout-4 record that leaves its base to its policy (no `base` field).
inline bool BaseFromPolicy(const RevisionTables& t) {
  return t.v3 != nullptr && t.v3->version() >= 4 && t.v3->base() == nullptr;
}

// Owning records from verified tables. `id` is the revision's key (layouts 2-4 do not store it;
// layout 1 records carry their own). Where BaseFromPolicy holds, `base` is left empty for the
// caller to fill in from the policy record.
RevisionRecord RevisionFromTables(const RevisionTables& t, uint64_t id);
// `id` is the record's key (v7 records do not store it).
PolicyRecord PolicyFromTable(const fb::Policy& t, uint64_t id);
BlobRef BlobRefFromTable(const fb::BlobRef* r);

}  // namespace loradb::catalog_codec

#endif  // LORADB_STORAGE_CATALOG_CODEC_TABLES_H_
