#include "storage/util/hash.h"

#include <xxhash.h>

#include "absl/strings/str_format.h"

namespace loradb {

uint64_t Xxh3_64(const void* data, size_t len) { return XXH3_64bits(data, len); }

std::string Hash128::Hex() const { return absl::StrFormat("%016x%016x", high, low); }

absl::StatusOr<Hash128> ParseHash128(absl::string_view hex) {
  if (hex.size() != 32) {
    return absl::InvalidArgumentError("a 128-bit hash is 32 hex digits");
  }
  Hash128 h;
  for (size_t i = 0; i < 32; ++i) {
    char c = hex[i];
    uint64_t v;
    if (c >= '0' && c <= '9') {
      v = static_cast<uint64_t>(c - '0');
    } else if (c >= 'a' && c <= 'f') {
      v = static_cast<uint64_t>(c - 'a' + 10);
    } else {
      return absl::InvalidArgumentError("a 128-bit hash is lowercase hex");
    }
    uint64_t& half = i < 16 ? h.high : h.low;
    half = (half << 4) | v;
  }
  return h;
}

Hash128 Xxh3_128(const void* data, size_t len) {
  XXH128_hash_t h = XXH3_128bits(data, len);
  return Hash128{h.high64, h.low64};
}

Xxh3_128Stream::Xxh3_128Stream() : state_(XXH3_createState()) {
  XXH3_128bits_reset(static_cast<XXH3_state_t*>(state_));
}
Xxh3_128Stream::~Xxh3_128Stream() { XXH3_freeState(static_cast<XXH3_state_t*>(state_)); }
void Xxh3_128Stream::Update(const void* data, size_t len) {
  XXH3_128bits_update(static_cast<XXH3_state_t*>(state_), data, len);
}
Hash128 Xxh3_128Stream::Digest() const {
  XXH128_hash_t h = XXH3_128bits_digest(static_cast<XXH3_state_t*>(state_));
  return Hash128{h.high64, h.low64};
}

}  // namespace loradb
