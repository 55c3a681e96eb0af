// Test scope for the process-wide host-buffer pool (storage/tiers/host_buffer.h).
#ifndef LORADB_TESTS_STORAGE_HOST_BUFFER_POOL_TEST_UTIL_H_
#define LORADB_TESTS_STORAGE_HOST_BUFFER_POOL_TEST_UTIL_H_

#include <cstdint>

#include "storage/tiers/host_buffer.h"

namespace loradb::testing {

// Empties the process-wide pool and sets `limit` for one test; restores the old limit after.
class HostBufferPoolScope {
 public:
  explicit HostBufferPoolScope(uint64_t limit) : old_(tiers::GetHostBufferPoolStats().limit) {
    tiers::SetHostBufferPoolLimit(0);
    tiers::SetHostBufferPoolLimit(limit);
  }
  ~HostBufferPoolScope() {
    tiers::SetHostBufferPoolLimit(0);
    tiers::SetHostBufferPoolLimit(old_);
  }
  HostBufferPoolScope(const HostBufferPoolScope&) = delete;
  HostBufferPoolScope& operator=(const HostBufferPoolScope&) = delete;

 private:
  uint64_t old_;
};

}  // namespace loradb::testing

#endif  // LORADB_TESTS_STORAGE_HOST_BUFFER_POOL_TEST_UTIL_H_
