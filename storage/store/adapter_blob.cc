#include "storage/store/adapter_blob.h"

#include <memory>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "storage/formats/safetensors.h"
#include "storage/util/file_util.h"
#include "storage/util/hash.h"
#include "storage/util/status_macros.h"

namespace loradb {

// Until the packed blob format lands, adapter blobs are safetensors files (spec-exact, so any
// safetensors reader opens them) tagged with "loradb.blob" metadata; the content address is the
// xxh3-128 of the whole file.
absl::StatusOr<EncodedBlob> EncodeAdapterBlob(const std::vector<TensorView>& tensors,
                                              const std::map<std::string, std::string>& metadata,
                                              bool pack) {
  if (pack) {
    return absl::UnimplementedError(
        "the packed MoE layout needs the packed blob format (storage/formats/blob.h), which "
        "this build does not have yet; import without --pack");
  }
  std::map<std::string, std::string> md = metadata;
  md.insert_or_assign(std::string("loradb.blob"), std::string(1, '1'));
  EncodedBlob out;
  LORADB_ASSIGN_OR_RETURN(out.bytes, safetensors::Serialize(tensors, md));
  out.hash = Xxh3_128(out.bytes.data(), out.bytes.size());
  out.layout = Layout::kPlain;
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
  return safetensors::Parse(shared->bytes(), shared);
}

}  // namespace loradb
