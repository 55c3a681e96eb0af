// Tells which tensor format a path holds, so tools can accept any of them.
#ifndef LORADB_STORAGE_FORMATS_DETECT_H_
#define LORADB_STORAGE_FORMATS_DETECT_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace loradb {

enum class TensorFormat {
  kSafetensors,   // one .safetensors file
  kShardedIndex,  // a model.safetensors.index.json (shards beside it)
  kPeftDir,       // a directory with adapter_config.json + adapter_model.safetensors
  kBlob,          // a loradb packed blob
};

// "safetensors", "sharded", "peft", "blob".
absl::string_view TensorFormatName(TensorFormat format);

// Looks at `path` without parsing it fully: a directory with adapter_config.json is PEFT; a file
// starting with the blob magic is a blob; a *.json file, or one starting with '{' whose first 8
// bytes are no plausible safetensors header length, is a sharded index; any other regular file
// is taken for safetensors (its reader then judges it). NotFound for a missing path;
// InvalidArgument for a directory without adapter_config.json or a non-regular file.
[[nodiscard]] absl::StatusOr<TensorFormat> DetectTensorFormat(const std::string& path);

}  // namespace loradb

#endif  // LORADB_STORAGE_FORMATS_DETECT_H_
