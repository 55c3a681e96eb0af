// Recycling of large host buffers (those HostBuffer::Allocate maps: 4 MiB and up).
//
// Every fresh mapping costs a page fault and a kernel-zeroed page per 4 KiB before the first
// byte is read into it; for a 63 MiB adapter that costs about as much CPU as reading it, and a
// cold burst of N adapters pays it N times while the disk waits (BENCHMARKS.md,
// tiers/cold-burst). With a pool limit set, a released large buffer is kept (up to the limit, in
// bytes) and handed to the next Allocate of the same capacity instead of being unmapped, so a
// stream of loads and evictions of same-shaped adapters stops paying for fresh pages, and
// `ReserveHostBuffers` can fault buffers in ahead of a burst. A reused buffer holds the bytes
// of its previous use (it is not zeroed again). Process-wide; off (limit 0) by default.
// Thread-safe.
#ifndef LORADB_STORAGE_TIERS_HOST_BUFFER_POOL_H_
#define LORADB_STORAGE_TIERS_HOST_BUFFER_POOL_H_

#include <cstdint>

#include "absl/status/status.h"

namespace loradb::tiers {

struct HostBufferPoolStats {
  uint64_t limit_bytes = 0;   // most bytes kept for reuse
  uint64_t pooled_bytes = 0;  // bytes kept now (capacity of the idle buffers)
  uint64_t pooled_buffers = 0;
  uint64_t reused = 0;  // large allocations served from the pool
  uint64_t fresh = 0;   // large allocations that mapped new memory while the limit was > 0
};

// Sets how many bytes of released large buffers are kept; idle buffers beyond it are unmapped
// now (0 unmaps them all and turns recycling off).
void SetHostBufferPoolLimit(uint64_t bytes);

// Makes sure at least `count` idle buffers that fit `size` bytes each are pooled, mapping and
// populating the missing ones, and raises the limit if it is lower than that needs.
// InvalidArgument for a zero count or a size below the mapping threshold (4 MiB: smaller
// buffers are never pooled); ResourceExhausted when memory runs out (what was mapped stays
// pooled).
[[nodiscard]] absl::Status ReserveHostBuffers(uint64_t size, uint64_t count, bool pin);

HostBufferPoolStats GetHostBufferPoolStats();

}  // namespace loradb::tiers

#endif  // LORADB_STORAGE_TIERS_HOST_BUFFER_POOL_H_
