// Loading one adapter file from the storage tier into a CPU-cache entry: the piece a CpuCache
// load function (e.g. the Store's "revision id -> blob path") calls. Reads go through the
// Loader (io_uring or pread, O_DIRECT, content hash), tensors are views into the loaded buffer.
#ifndef LORADB_STORAGE_TIERS_ADAPTER_FILES_H_
#define LORADB_STORAGE_TIERS_ADAPTER_FILES_H_

#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "storage/tiers/cpu_cache.h"
#include "storage/tiers/loader.h"
#include "storage/util/hash.h"

namespace loradb::tiers {

enum class AdapterFileKind {
  kSafetensors,  // one .safetensors file
  kPeftDir,      // a PEFT directory: adapter_config.json + adapter_model.safetensors
  kBlob,         // a loradb packed blob, every original tensor name as a view
  kBlobStored,   // a loradb packed blob as stored: MoE expert groups as one 3-D tensor each
};

// Reads and parses the adapter at `path`. `content_hash` (xxh3-128 of the whole file) is
// verified when given; a blob read without it has every stored tensor's xxh3-64 checked. The entry
// is charged the loaded buffer's capacity. For a PEFT directory the raw adapter_config.json text is
// kept in the metadata under "peft.adapter_config" (with the file's own __metadata__). Errors name
// the path: NotFound, DataLoss (hash mismatch), InvalidArgument (malformed file).
[[nodiscard]] absl::StatusOr<std::shared_ptr<const CachedAdapter>> LoadAdapterFile(
    Loader& loader, const std::string& path, AdapterFileKind kind,
    const std::optional<Hash128>& content_hash = std::nullopt);

}  // namespace loradb::tiers

#endif  // LORADB_STORAGE_TIERS_ADAPTER_FILES_H_
