// Adapter blob files as the Store writes and reads them (internal to storage/store): encoding a
// set of tensors into blob bytes with their xxh3-128 content address, and reading a blob back
// with its size and checksum verified.
#ifndef LORADB_STORAGE_STORE_ADAPTER_BLOB_H_
#define LORADB_STORAGE_STORE_ADAPTER_BLOB_H_

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "storage/catalog/records.h"
#include "storage/formats/tensor.h"

namespace loradb {

struct EncodedBlob {
  std::string bytes;
  Hash128 hash;  // xxh3-128 of `bytes`
  Layout layout = Layout::kPlain;
};

// Encodes `tensors` (+ string `metadata`) as blob bytes. `pack` asks for the packed MoE layout.
[[nodiscard]] absl::StatusOr<EncodedBlob> EncodeAdapterBlob(
    const std::vector<TensorView>& tensors, const std::map<std::string, std::string>& metadata,
    bool pack);

// Maps the blob at `path` and returns its tensors (views into the map, which the set keeps
// alive). DataLoss when its size or xxh3-128 disagree with `expect`.
[[nodiscard]] absl::StatusOr<TensorSet> ReadAdapterBlob(const std::string& path,
                                                        const BlobRef& expect);

}  // namespace loradb

#endif  // LORADB_STORAGE_STORE_ADAPTER_BLOB_H_
