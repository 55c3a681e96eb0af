#include "storage/tiers/adapter_files.h"

#include <cstdio>

#include "absl/strings/str_cat.h"
#include "storage/formats/blob.h"
#include "storage/formats/safetensors.h"
#include "storage/util/file_util.h"
#include "storage/util/status_macros.h"

namespace loradb::tiers {

absl::StatusOr<std::shared_ptr<const CachedAdapter>> LoadAdapterFile(
    Loader& loader, const std::string& path, AdapterFileKind kind,
    const std::optional<Hash128>& content_hash) {
  std::string tensors_path = path;
  std::string config;
  if (kind == AdapterFileKind::kPeftDir) {
    LORADB_ASSIGN_OR_RETURN(config, ReadFileToString(path + "/adapter_config.json"));
    tensors_path = path + "/adapter_model.safetensors";
  }
  LORADB_ASSIGN_OR_RETURN(std::shared_ptr<HostBuffer> buf,
                          loader.ReadFile(tensors_path, content_hash));
  std::shared_ptr<const void> backing(buf, buf.get());
  const bool verify = !content_hash.has_value();  // the whole-file hash covers every byte
  absl::StatusOr<TensorSet> set =
      kind == AdapterFileKind::kBlob         ? ParseBlob(buf->bytes(), backing, verify)
      : kind == AdapterFileKind::kBlobStored ? ParseBlobStored(buf->bytes(), backing, verify)
                                             : safetensors::Parse(buf->bytes(), backing);
  if (!set.ok()) {
    if (set.status().code() == absl::StatusCode::kDataLoss) {
      std::fprintf(stderr, "loradb: corrupt blob %s: %s\n", tensors_path.c_str(),
                   std::string(set.status().message()).c_str());
    }
    return absl::Status(set.status().code(),
                        absl::StrCat(tensors_path, ": ", set.status().message()));
  }
  auto adapter = std::make_shared<CachedAdapter>();
  adapter->tensors = *std::move(set);
  if (kind == AdapterFileKind::kPeftDir) {
    adapter->tensors.metadata()["peft.adapter_config"] = std::move(config);
  }
  adapter->bytes = buf->capacity();
  return adapter;
}

}  // namespace loradb::tiers
