// Content hashes used across the store: xxh3-64 for tensors and headers, xxh3-128 for blob
// content addresses and base weight fingerprints.
#ifndef LORADB_STORAGE_UTIL_HASH_H_
#define LORADB_STORAGE_UTIL_HASH_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace loradb {

uint64_t Xxh3_64(const void* data, size_t len);

// A 128-bit digest; `Hex()` is 32 lowercase hex digits, high half first.
struct Hash128 {
  uint64_t high = 0;
  uint64_t low = 0;
  std::string Hex() const;
  bool operator==(const Hash128&) const = default;
};
[[nodiscard]] absl::StatusOr<Hash128> ParseHash128(absl::string_view hex);

Hash128 Xxh3_128(const void* data, size_t len);

// Streaming xxh3-128 over several buffers.
class Xxh3_128Stream {
 public:
  Xxh3_128Stream();
  ~Xxh3_128Stream();
  Xxh3_128Stream(const Xxh3_128Stream&) = delete;
  Xxh3_128Stream& operator=(const Xxh3_128Stream&) = delete;
  void Update(const void* data, size_t len);
  Hash128 Digest() const;

 private:
  void* state_;
};

}  // namespace loradb

#endif  // LORADB_STORAGE_UTIL_HASH_H_
