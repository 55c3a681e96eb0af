// safetensors, the interchange format (https://github.com/huggingface/safetensors): an 8-byte
// little-endian header length N, N bytes of UTF-8 JSON (tensor name -> {dtype, shape,
// data_offsets}, plus an optional "__metadata__" string->string map), then the data section.
//
// The reader is spec-exact: it rejects everything the reference reader rejects (short files,
// header length > 100,000,000 or past the end, non-UTF-8 or malformed JSON, offsets that are
// not contiguous from 0, byte lengths that do not match shape x dtype size, shape overflow,
// data sections not covered exactly) and also duplicate names. Every error is
// InvalidArgument with a message naming the problem. The writer produces the bytes the
// reference writer produces (tensors sorted by dtype, largest first, then by name; header padded
// with spaces to a multiple of 8).
#ifndef LORADB_STORAGE_FORMATS_SAFETENSORS_H_
#define LORADB_STORAGE_FORMATS_SAFETENSORS_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "storage/formats/tensor.h"

namespace loradb::safetensors {

// The reference reader's limit on the JSON header.
inline constexpr uint64_t kMaxHeaderBytes = 100'000'000;

// Parses safetensors bytes. The views point into `bytes`; the returned set holds `backing`,
// which must keep `bytes` alive. Tensors are listed in data-offset order.
[[nodiscard]] absl::StatusOr<TensorSet> Parse(std::span<const std::byte> bytes,
                                              std::shared_ptr<const void> backing);

// Memory-maps `path` and parses it; the views point into the map (zero-copy), which lives as
// long as the set. Errors name the path.
[[nodiscard]] absl::StatusOr<TensorSet> ReadFile(const std::string& path);

// Reads a Hugging Face sharded checkpoint: `index_json_path` is a model.safetensors.index.json
// ({"metadata": {...}, "weight_map": {tensor: shard file}}); shard files are resolved next to
// it. Returns one set over all shards (in weight-map order, shards kept mapped). The index's
// metadata becomes the set's metadata (non-string values as their JSON text). Fails when a
// listed tensor is missing from its shard, a shard holds a tensor the index does not list for
// it, or a name repeats.
[[nodiscard]] absl::StatusOr<TensorSet> ReadSharded(const std::string& index_json_path);

// Serializes `tensors` (+ `metadata`, omitted when empty) exactly as the reference writer
// would. InvalidArgument on duplicate names, the reserved name "__metadata__", or a
// view whose nbytes disagrees with its shape and dtype.
[[nodiscard]] absl::StatusOr<std::string> Serialize(
    const std::vector<TensorView>& tensors, const std::map<std::string, std::string>& metadata);

// Serialize + crash-safe write (temp file, fsync, rename, directory fsync). On error `path` is
// left as it was.
[[nodiscard]] absl::Status WriteFile(const std::string& path,
                                     const std::vector<TensorView>& tensors,
                                     const std::map<std::string, std::string>& metadata);

// Appends `s` to `out` as a JSON string literal the way serde_json writes it (quotes, backslash
// and control characters escaped; everything else, UTF-8 included, verbatim).
void AppendJsonString(absl::string_view s, std::string* out);

}  // namespace loradb::safetensors

#endif  // LORADB_STORAGE_FORMATS_SAFETENSORS_H_
