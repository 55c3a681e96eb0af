// Page-aligned host buffers for adapter bytes: what the loader reads into (O_DIRECT needs the
// alignment) and what cache entries own. When the CUDA runtime is usable the buffer is pinned
// with cudaHostRegister so device copies can run asynchronously; pinning is best effort and
// reported, never required.
#ifndef LORADB_STORAGE_TIERS_HOST_BUFFER_H_
#define LORADB_STORAGE_TIERS_HOST_BUFFER_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "absl/status/statusor.h"

namespace loradb::tiers {

// Alignment of every HostBuffer and of the sizes they are rounded to.
inline constexpr size_t kHostAlignment = 4096;

// Rounds `n` up to a multiple of `alignment` (a power of two).
inline constexpr uint64_t AlignUp(uint64_t n, uint64_t alignment) {
  return (n + alignment - 1) & ~(alignment - 1);
}

// An owned, page-aligned allocation (large ones mmap'ed and populated at allocation; huge
// pages only with LORADB_HOST_HUGEPAGES=1). Not copyable.
//
// Large (mapped) buffers from AllocateForOverwrite go back to a process-wide pool when
// destroyed, up to a byte limit (SetHostBufferPoolLimit; default 1 GiB or
// LORADB_HOST_BUFFER_POOL_BYTES), and AllocateForOverwrite hands them out again: populating and
// unmapping ~100 MB of fresh pages costs ~9x more CPU than reading an adapter from the page cache
// into them, and pinning (cudaHostRegister) more still. Buffers from Allocate are always fresh.
// While CPU caches are open, pooled bytes also count against their budgets
// (HostBufferPoolAccount): the pool holds at most the caches' unused budget.
class HostBuffer {
 public:
  // Allocates `size` bytes (capacity rounded up to kHostAlignment), never from the pool. With
  // `pin`, tries cudaHostRegister when built with CUDA and a device is present; `pinned()` says
  // whether it worked. ResourceExhausted when the allocation fails.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<HostBuffer>> Allocate(uint64_t size,
                                                                            bool pin);
  // As Allocate, but a large buffer may come from the pool (a pooled buffer of capacity between
  // the need and 1/8 more, pinned as asked): its bytes are unspecified, for callers that write
  // all of [0, size) before anyone reads them (the loader).
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<HostBuffer>> AllocateForOverwrite(
      uint64_t size, bool pin);

  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;
  ~HostBuffer();

  std::byte* data() { return data_; }
  const std::byte* data() const { return data_; }
  // Bytes of payload (what the caller asked for).
  uint64_t size() const { return size_; }
  // Bytes allocated (size rounded up to kHostAlignment, or to 2 MiB for mapped buffers).
  uint64_t capacity() const { return capacity_; }
  bool pinned() const { return pinned_; }
  std::span<const std::byte> bytes() const { return {data_, static_cast<size_t>(size_)}; }

 private:
  HostBuffer(std::byte* data, uint64_t size, uint64_t capacity, bool pinned, bool mapped)
      : data_(data), size_(size), capacity_(capacity), pinned_(pinned), mapped_(mapped) {}

  std::byte* data_;
  uint64_t size_;
  uint64_t capacity_;
  bool pinned_;
  bool mapped_;  // mmap'ed (large buffers) rather than aligned_alloc'ed
};

struct HostBufferPoolStats {
  uint64_t reused = 0;     // AllocateForOverwrite calls served from the pool
  uint64_t allocated = 0;  // large buffers mapped fresh
  uint64_t buffers = 0;    // buffers waiting in the pool now
  uint64_t bytes = 0;      // their capacity
  uint64_t limit = 0;      // the pool's byte limit
  uint64_t cap = 0;        // what it may hold now: the limit, or less while CPU caches are open
                           // (their unused budget; HostBufferPoolAccount)
  uint64_t accounts = 0;   // budgets registered (open CPU caches)
};

// The pool's counters and contents.
HostBufferPoolStats GetHostBufferPoolStats();

// Pooled buffers taken out of the pool to be unmapped; unmaps them when destroyed (so a caller
// can drop its own locks first). Move-only.
class ReleasedHostBuffers {
 public:
  ReleasedHostBuffers() = default;
  ReleasedHostBuffers(ReleasedHostBuffers&&) = default;
  ReleasedHostBuffers& operator=(ReleasedHostBuffers&& other) noexcept;
  ReleasedHostBuffers(const ReleasedHostBuffers&) = delete;
  ReleasedHostBuffers& operator=(const ReleasedHostBuffers&) = delete;
  ~ReleasedHostBuffers() { Unmap(); }

 private:
  friend class HostBufferPoolAccount;
  struct Buffer {
    std::byte* data;
    uint64_t capacity;
    bool pinned;
  };
  void Unmap();
  std::vector<Buffer> buffers_;
};

// A byte budget the pool's free buffers count against (a CPU cache's: CpuCache holds one).
// While accounts exist, the pool keeps at most min(limit, sum over accounts of max(0, budget -
// charged)) bytes, so with one cache, resident + pooled <= budget: a buffer released by an
// eviction is parked only in room the cache does not use, and a load that charges more releases
// the oldest pooled buffers first (the pool gives way; nothing resident is evicted for it).
// Thread-safe; the pool never calls back into the owner, so SetCharged may run under its locks.
class HostBufferPoolAccount {
 public:
  // Registers a budget of `budget_bytes` with nothing charged.
  explicit HostBufferPoolAccount(uint64_t budget_bytes);
  // Unregisters; the pool then trims to what the remaining accounts (or, with none, the
  // limit) allow.
  ~HostBufferPoolAccount();
  HostBufferPoolAccount(const HostBufferPoolAccount&) = delete;
  HostBufferPoolAccount& operator=(const HostBufferPoolAccount&) = delete;

  // Sets the bytes charged against the budget (the cache's resident bytes) and moves pooled
  // buffers beyond the new room into `released` (unmapped when it is destroyed).
  void SetCharged(uint64_t bytes, ReleasedHostBuffers* released);

 private:
  uint64_t id_;
};
// Sets the byte limit of pooled (free) buffers, releasing the oldest ones beyond it; 0 turns
// pooling off and empties the pool.
void SetHostBufferPoolLimit(uint64_t bytes);

// True when the CUDA runtime is compiled in and reports at least one device. Cached after the
// first call; never fails (no GPU -> false).
bool CudaDeviceAvailable();

}  // namespace loradb::tiers

#endif  // LORADB_STORAGE_TIERS_HOST_BUFFER_H_
