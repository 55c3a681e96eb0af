#include "storage/store/adapter_blob.h"

#include <memory>

#include "absl/strings/str_cat.h"
#include "storage/formats/blob.h"
#include "storage/util/file_util.h"
#include "storage/util/hash.h"
#include "storage/util/status_macros.h"

namespace loradb {

// Adapter blobs are packed blob files (storage/formats/blob.h, docs/format-blob.md); the
// content address is the xxh3-128 of the whole file.
absl::StatusOr<EncodedBlob> EncodeAdapterBlob(const std::vector<TensorView>& tensors,
                                              const std::map<std::string, std::string>& metadata,
                                              bool pack) {
  BlobOptions options;
  options.pack_moe = pack;
  EncodedBlob out;
  LORADB_ASSIGN_OR_RETURN(out.bytes, SerializeBlob(tensors, metadata, options));
  out.hash = Xxh3_128(out.bytes.data(), out.bytes.size());
  out.layout = pack && !PlanMoePacking(tensors).empty() ? Layout::kPacked : Layout::kPlain;
  return out;
}

absl::StatusOr<TensorSet> ReadAdapterBlob(const std::string& path, const BlobRef& expect) {
  LORADB_ASSIGN_OR_RETURN(MappedFile map, MappedFile::Open(path));
  if (map.size() != expect.bytes) {
    return absl::DataLossError(absl::StrCat("blob ", path, " has ", map.size(),
                                            " bytes, the catalog records ", expect.bytes));
  }
  if (!(Xxh3_128(map.data(), map.size()) == expect.hash)) {
    return absl::DataLossError(absl::StrCat("blob ", path, " does not match its xxh3-128 ",
                                            expect.hash.Hex(), " (corrupt)"));
  }
  auto shared = std::make_shared<MappedFile>(std::move(map));
  // The whole-file hash above covers every byte; per-tensor checksums would add nothing.
  return ParseBlob(shared->bytes(), shared, /*verify_checksums=*/false);
}

}  // namespace loradb
