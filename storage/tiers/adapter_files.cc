#include "storage/tiers/adapter_files.h"

#include "absl/strings/str_cat.h"
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
  absl::StatusOr<TensorSet> set =
      safetensors::Parse(buf->bytes(), std::shared_ptr<const void>(buf, buf.get()));
  if (!set.ok()) {
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
