// The packed blob: loradb's immutable storage layout for one adapter (or checkpoint) tensor set.
// A fixed 24-byte prefix (magic "LORABLOB", version, flags, header length), a FlatBuffers
// header (schema/blob.fbs: stored tensors with xxh3-64 each, packed groups, metadata), an
// xxh3-64 of everything before it, then the data region with every tensor aligned (64 B, or
// 4 KiB for tensors of 64 KiB and more). docs/format-blob.md is the byte-level description.
//
// MoE packing stacks the per-expert LoRA tensors of one (layer, projection, A|B) into one 3-D
// stored tensor; readers still hand out every original name as a view (zero-copy), and a
// blob -> safetensors export re-creates the original tensors bit for bit.
#ifndef LORADB_STORAGE_FORMATS_BLOB_H_
#define LORADB_STORAGE_FORMATS_BLOB_H_

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
#include "storage/util/hash.h"

namespace loradb {

inline constexpr char kBlobMagic[8] = {'L', 'O', 'R', 'A', 'B', 'L', 'O', 'B'};
inline constexpr uint32_t kBlobVersion = 1;
inline constexpr size_t kBlobPrefixBytes = 24;  // magic, version, flags, header length
inline constexpr uint64_t kBlobMaxHeaderBytes = 1ull << 30;
inline constexpr uint64_t kBlobMinAlign = 64;
inline constexpr uint64_t kBlobLargeAlign = 4096;
inline constexpr uint64_t kBlobLargeTensorBytes = 64 * 1024;

struct BlobOptions {
  // Stack per-expert MoE LoRA tensors into one 3-D tensor per (layer, projection, A|B).
  bool pack_moe = true;
};

// What WriteBlobFile wrote.
struct BlobFileInfo {
  uint64_t bytes = 0;
  Hash128 content_hash;  // xxh3-128 of the whole file
};

// One tensor as stored in the data region.
struct BlobStoredTensor {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  uint64_t offset = 0;  // absolute file offset
  uint64_t length = 0;
  uint64_t xxh3 = 0;
};

// A stored tensor holding several original tensors stacked along `axis`.
struct BlobPackedGroup {
  size_t stored_index = 0;  // into BlobLayout::stored
  uint32_t axis = 0;
  std::vector<std::string> members;  // original names, in stacking order
};

// A validated blob header: everything but the data.
struct BlobLayout {
  uint32_t version = kBlobVersion;
  uint64_t header_end = 0;  // bytes from the file start through the header checksum
  uint64_t file_size = 0;
  std::vector<BlobStoredTensor> stored;
  std::vector<BlobPackedGroup> groups;
  std::map<std::string, std::string> metadata;

  // Number of original tensors (stored tensors outside groups + group members).
  size_t original_count() const;
};

// One planned group of MoE per-expert tensors (exposed for tests and tools).
struct MoePackPlan {
  std::string packed_name;             // e.g. "...layers.3.mlp.experts.gate_proj.lora_A.weight"
  std::vector<size_t> member_indices;  // indices into the input, in expert order 0..E-1
};

// Finds the per-expert tensors `...layers.{L}.mlp.experts.{E}.{gate_proj|up_proj|down_proj}.
// lora_{A|B}.weight` that can be stacked: per (layer, projection, A|B), experts 0..E-1 all
// present (E >= 2), equal dtype and shape, and a packed name not used by any input tensor.
// Groups that do not qualify stay unpacked (lossless either way).
std::vector<MoePackPlan> PlanMoePacking(const std::vector<TensorView>& tensors);

// Serializes `tensors` + `metadata` into blob bytes. Deterministic: the same tensor set (in any
// input order) gives the same bytes. InvalidArgument on empty or duplicate names or a view
// whose nbytes disagrees with its shape and dtype.
[[nodiscard]] absl::StatusOr<std::string> SerializeBlob(
    const std::vector<TensorView>& tensors, const std::map<std::string, std::string>& metadata,
    const BlobOptions& options = {});

// SerializeBlob + crash-safe write of `path` (temp file, fsync, rename, directory fsync).
[[nodiscard]] absl::StatusOr<BlobFileInfo> WriteBlobFile(
    const std::string& path, const std::vector<TensorView>& tensors,
    const std::map<std::string, std::string>& metadata, const BlobOptions& options = {});

// Given at least the first kBlobPrefixBytes of a blob, the number of bytes from the file start
// that ParseBlobLayout needs (prefix + header + header checksum). InvalidArgument on a short
// prefix, bad magic, unknown version or flags, or an oversized header length.
[[nodiscard]] absl::StatusOr<uint64_t> BlobHeaderEnd(std::span<const std::byte> prefix);

// Validates the header in `head` (at least BlobHeaderEnd bytes of a file of `file_size` bytes):
// magic, version, header checksum, FlatBuffers structure, file size, tensor offsets inside the
// data region and aligned, no overlaps, byte lengths matching shapes, well-formed groups with
// unique original names. Does not touch the data. InvalidArgument naming the problem.
[[nodiscard]] absl::StatusOr<BlobLayout> ParseBlobLayout(std::span<const std::byte> head,
                                                         uint64_t file_size);

// Parses a whole blob held in `bytes` (kept alive by `backing`) and returns the ORIGINAL tensors
// (group members included) as zero-copy views, plus the metadata. With `verify_checksums`, every
// stored tensor's xxh3-64 is checked first (DataLoss on a mismatch).
[[nodiscard]] absl::StatusOr<TensorSet> ParseBlob(std::span<const std::byte> bytes,
                                                  std::shared_ptr<const void> backing,
                                                  bool verify_checksums);

// As ParseBlob, but returns the STORED tensors (packed groups as one 3-D tensor under the
// packed name); `layout`, if given, receives the header.
[[nodiscard]] absl::StatusOr<TensorSet> ParseBlobStored(std::span<const std::byte> bytes,
                                                        std::shared_ptr<const void> backing,
                                                        bool verify_checksums,
                                                        BlobLayout* layout = nullptr);

// Memory-maps `path` and parses it as ParseBlob does. Errors name the path.
[[nodiscard]] absl::StatusOr<TensorSet> ReadBlobFile(const std::string& path, bool verify);

}  // namespace loradb

#endif  // LORADB_STORAGE_FORMATS_BLOB_H_
