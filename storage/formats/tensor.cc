#include "storage/formats/tensor.h"

#include <array>
#include <limits>

#include "absl/hash/hash.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace loradb {
namespace {

struct DTypeInfo {
  DType dtype;
  absl::string_view name;
  size_t size;
};

constexpr std::array<DTypeInfo, 15> kDTypes = {{
    {DType::kBool, "BOOL", 1},
    {DType::kU8, "U8", 1},
    {DType::kI8, "I8", 1},
    {DType::kI16, "I16", 2},
    {DType::kU16, "U16", 2},
    {DType::kI32, "I32", 4},
    {DType::kU32, "U32", 4},
    {DType::kI64, "I64", 8},
    {DType::kU64, "U64", 8},
    {DType::kF16, "F16", 2},
    {DType::kBF16, "BF16", 2},
    {DType::kF32, "F32", 4},
    {DType::kF64, "F64", 8},
    {DType::kF8E4M3, "F8_E4M3", 1},
    {DType::kF8E5M2, "F8_E5M2", 1},
}};

}  // namespace

size_t DTypeSize(DType dtype) { return kDTypes[static_cast<size_t>(dtype)].size; }

absl::string_view DTypeName(DType dtype) { return kDTypes[static_cast<size_t>(dtype)].name; }

absl::StatusOr<DType> ParseDType(absl::string_view name) {
  for (const auto& info : kDTypes) {
    if (info.name == name) return info.dtype;
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown dtype \"", name, "\""));
}

absl::StatusOr<uint64_t> CheckedNumBytes(const std::vector<int64_t>& shape, DType dtype) {
  uint64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0)
      return absl::InvalidArgumentError(absl::StrCat("negative dimension in ", ShapeString(shape)));
    uint64_t ud = static_cast<uint64_t>(d);
    if (ud != 0 && n > std::numeric_limits<uint64_t>::max() / ud) {
      return absl::InvalidArgumentError(absl::StrCat("shape ", ShapeString(shape), " overflows"));
    }
    n *= ud;
  }
  uint64_t size = DTypeSize(dtype);
  if (n > std::numeric_limits<uint64_t>::max() / size ||
      n * size > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    return absl::InvalidArgumentError(absl::StrCat("shape ", ShapeString(shape), " overflows"));
  }
  return n * size;
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

namespace {

uint64_t NameHash(absl::string_view name) { return absl::Hash<absl::string_view>{}(name); }

}  // namespace

void TensorSet::Reserve(size_t n) {
  tensors_.reserve(n);
  hashes_.reserve(n);
  if (n * 2 > table_.size()) GrowIndex(n * 2);
}

size_t TensorSet::Slot(uint64_t hash, absl::string_view name) const {
  const size_t mask = table_.size() - 1;
  for (size_t i = static_cast<size_t>(hash) & mask;; i = (i + 1) & mask) {
    uint32_t e = table_[i];
    if (e == 0) return i;
    if (hashes_[e - 1] == hash && tensors_[e - 1].name == name) return i;
  }
}

void TensorSet::GrowIndex(size_t min_capacity) {
  size_t capacity = 16;
  while (capacity < min_capacity) capacity *= 2;
  table_.assign(capacity, 0);
  const size_t mask = capacity - 1;
  for (size_t p = 0; p < hashes_.size(); ++p) {
    size_t i = static_cast<size_t>(hashes_[p]) & mask;
    while (table_[i] != 0) i = (i + 1) & mask;
    table_[i] = static_cast<uint32_t>(p + 1);
  }
}

absl::Status TensorSet::Add(TensorView view) {
  if (tensors_.size() >= std::numeric_limits<uint32_t>::max() - 1) {
    return absl::ResourceExhaustedError("tensor set is full");
  }
  // Keep the table at most half full.
  if ((tensors_.size() + 1) * 2 > table_.size()) GrowIndex((tensors_.size() + 1) * 2);
  const uint64_t hash = NameHash(view.name);
  const size_t slot = Slot(hash, view.name);
  if (table_[slot] != 0) {
    return absl::AlreadyExistsError(absl::StrCat("duplicate tensor name \"", view.name, "\""));
  }
  tensors_.push_back(std::move(view));
  hashes_.push_back(hash);
  table_[slot] = static_cast<uint32_t>(tensors_.size());
  return absl::OkStatus();
}

const TensorView* TensorSet::Find(absl::string_view name) const {
  if (table_.empty()) return nullptr;
  uint32_t e = table_[Slot(NameHash(name), name)];
  return e == 0 ? nullptr : &tensors_[e - 1];
}

uint64_t TensorSet::total_bytes() const {
  uint64_t total = 0;
  for (const auto& t : tensors_) total += t.nbytes;
  return total;
}

}  // namespace loradb
