// Big-endian fixed-width integer keys: memcmp order of the encoded bytes is numeric order, so
// the stock LMDB comparator (and the mdb_* tools) scan catalog keys in id order.
#ifndef LORADB_STORAGE_CATALOG_KEY_ENCODING_H_
#define LORADB_STORAGE_CATALOG_KEY_ENCODING_H_

#include <cstdint>

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

}  // namespace loradb::catalog_keys

#endif  // LORADB_STORAGE_CATALOG_KEY_ENCODING_H_
