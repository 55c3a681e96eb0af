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
#include "schema/catalog_generated.h"
#include "storage/catalog/records.h"

namespace loradb::catalog_codec {

namespace fb = ::loradb::catalog::fb;

// The newest record layout version this build reads.
inline constexpr uint16_t kRecordLayoutVersion = 1;

// Verifies `b` as a T in place and checks its layout version. `b.data()` must be 8-byte aligned
// (FlatBuffers reads scalars where they lie; a misaligned load is undefined behaviour).
// DataLoss for bytes that fail verification; FailedPrecondition for a newer layout version.
template <typename T>
absl::StatusOr<const T*> VerifyTable(std::span<const uint8_t> b, const char* what) {
  flatbuffers::Verifier v(b.data(), b.size());
  if (!v.VerifyBuffer<T>(nullptr)) {
    return absl::DataLossError(absl::StrCat("catalog: corrupt ", what, " record (", b.size(),
                                            " bytes fail FlatBuffers verification)"));
  }
  const T* root = flatbuffers::GetRoot<T>(b.data());
  if (root->version() > kRecordLayoutVersion) {
    return absl::FailedPreconditionError(absl::StrCat(
        "catalog: ", what, " record has layout version ", root->version(),
        ", newer than this build understands (", kRecordLayoutVersion, "); upgrade loradb"));
  }
  return root;
}

// Builds `r`'s record in `b` (cleared first): the bytes are b.GetBufferPointer() and
// b.GetSize(), as EncodeRevision returns them, without a copy.
void BuildRevision(flatbuffers::FlatBufferBuilder& b, const RevisionRecord& r);

// Owning records from verified tables.
RevisionRecord RevisionFromTable(const fb::Revision& t);
PolicyRecord PolicyFromTable(const fb::Policy& t);
BlobRef BlobRefFromTable(const fb::BlobRef* r);

}  // namespace loradb::catalog_codec

#endif  // LORADB_STORAGE_CATALOG_CODEC_TABLES_H_
