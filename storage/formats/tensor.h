// Tensor vocabulary shared by every format reader/writer, the store, the tiers and compute:
// dtypes (safetensors spelling), non-owning tensor views, and TensorSet, an owning, named
// collection of views over one backing buffer (a memory map, a cache entry, a heap buffer).
#ifndef LORADB_STORAGE_FORMATS_TENSOR_H_
#define LORADB_STORAGE_FORMATS_TENSOR_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace loradb {

// Element types, named as safetensors names them ("F32", "BF16", ...).
enum class DType : uint8_t {
  kBool = 0,
  kU8,
  kI8,
  kI16,
  kU16,
  kI32,
  kU32,
  kI64,
  kU64,
  kF16,
  kBF16,
  kF32,
  kF64,
  kF8E4M3,
  kF8E5M2,
};

// Bytes per element.
size_t DTypeSize(DType dtype);
// The safetensors spelling: "BOOL", "U8", ..., "F8_E4M3", "F8_E5M2".
absl::string_view DTypeName(DType dtype);
// Parses the safetensors spelling; InvalidArgument for anything else.
[[nodiscard]] absl::StatusOr<DType> ParseDType(absl::string_view name);

// Number of elements of `shape`, or InvalidArgument on a negative dimension or on overflow of
// int64 / size_t arithmetic (elements and elements * `dtype` size both checked).
[[nodiscard]] absl::StatusOr<uint64_t> CheckedNumBytes(const std::vector<int64_t>& shape,
                                                       DType dtype);

// "[3, 5, 7]".
std::string ShapeString(const std::vector<int64_t>& shape);

// A view of one tensor's bytes. Does not own `data`; valid while its owner lives.
struct TensorView {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  const std::byte* data = nullptr;
  size_t nbytes = 0;

  std::span<const std::byte> bytes() const { return {data, nbytes}; }
  uint64_t numel() const {
    uint64_t n = 1;
    for (int64_t d : shape) n *= static_cast<uint64_t>(d);
    return n;
  }
};

// Named tensors over one backing buffer, plus string metadata. Views stay valid as long as the
// TensorSet (or any copy of `backing()`) lives. Insertion order is kept; lookup is by name.
// The name index holds positions only (no copy of any name): an Add hashes its name once.
class TensorSet {
 public:
  TensorSet() = default;

  // `backing` keeps the memory behind every view alive (may be null for static data).
  explicit TensorSet(std::shared_ptr<const void> backing) : backing_(std::move(backing)) {}

  // Makes room for `n` tensors in total, so that Adds up to that count do not reallocate the
  // views or grow the name index.
  void Reserve(size_t n);

  // Adds a view; AlreadyExists if the name is taken (the set is then unchanged).
  [[nodiscard]] absl::Status Add(TensorView view);

  const std::vector<TensorView>& tensors() const { return tensors_; }
  size_t size() const { return tensors_.size(); }
  // nullptr if absent.
  const TensorView* Find(absl::string_view name) const;

  std::map<std::string, std::string>& metadata() { return metadata_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

  const std::shared_ptr<const void>& backing() const { return backing_; }
  void set_backing(std::shared_ptr<const void> backing) { backing_ = std::move(backing); }

  // Sum of nbytes over all tensors.
  uint64_t total_bytes() const;

 private:
  // Open addressing, linear probing over a power-of-two table of positions + 1 (0 = empty);
  // hashes_[i] is the hash of tensors_[i].name, kept so growing never hashes a name again.
  // Plain vectors: copies and moves of the set stay consistent without fix-ups.
  size_t Slot(uint64_t hash, absl::string_view name) const;
  void GrowIndex(size_t min_capacity);

  std::shared_ptr<const void> backing_;
  std::vector<TensorView> tensors_;
  std::vector<uint64_t> hashes_;
  std::vector<uint32_t> table_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace loradb

#endif  // LORADB_STORAGE_FORMATS_TENSOR_H_
