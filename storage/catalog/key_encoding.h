// Big-endian fixed-width integer keys: memcmp order of the encoded bytes is numeric order, so
// the stock LMDB comparator (and the mdb_* tools) scan catalog keys in id order.
#ifndef LORADB_STORAGE_CATALOG_KEY_ENCODING_H_
#define LORADB_STORAGE_CATALOG_KEY_ENCODING_H_

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace loradb::catalog_keys {

// Writes `v` to p[0..7], most significant byte first.
inline void PutBE64(uint8_t* p, uint64_t v) {
  for (int i = 7; i >= 0; --i) {
    p[i] = static_cast<uint8_t>(v & 0xff);
    v >>= 8;
  }
}

// Reads 8 big-endian bytes at `data`.
inline uint64_t GetBE64(const void* data) {
  const auto* p = static_cast<const uint8_t*>(data);
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v = (v << 8) | p[i];
  return v;
}

// The `policies` key of a policy name (schema v5): the name's length in one byte, then the
// name. memcmp order is length first, then bytes, so names that count up ("tenant9/support",
// "tenant10/support", ...) sort in the order they are usually created and each new one lands at
// the end of the tree, where LMDB fills pages instead of splitting them in half. Names are at
// most 128 bytes (ValidatePolicyName); the longest key is kMaxPolicyNameKey bytes.
inline constexpr size_t kMaxPolicyNameKey = 1 + 255;

// Writes the key of the `size`-byte name at `name` (size <= 255) to `out` (kMaxPolicyNameKey
// bytes); returns the key's size.
inline size_t PutPolicyNameKey(const char* name, size_t size, uint8_t* out) {
  out[0] = static_cast<uint8_t>(size);
  std::memcpy(out + 1, name, size);
  return 1 + size;
}

// The name inside a `policies` key of `size` bytes at `key`; false when the length byte does not
// match the key's size.
inline bool GetPolicyNameKey(const void* key, size_t size, const char** name, size_t* name_size) {
  const auto* p = static_cast<const uint8_t*>(key);
  if (size < 1 || p[0] != size - 1) return false;
  *name = reinterpret_cast<const char*>(p + 1);
  *name_size = size - 1;
  return true;
}

// `alias_log` keys: policy id (8 bytes, big-endian) ++ alias length (1 byte) ++ alias ++ entry
// number (8 bytes, big-endian). Whether the `size`-byte key at `key` has that shape: its length
// byte matches its size.
inline bool IsAliasLogKey(const void* key, size_t size) {
  const auto* p = static_cast<const uint8_t*>(key);
  return size >= 9 && size == 9u + p[8] + 8u;
}

}  // namespace loradb::catalog_keys

#endif  // LORADB_STORAGE_CATALOG_KEY_ENCODING_H_
