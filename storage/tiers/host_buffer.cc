#include "storage/tiers/host_buffer.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "storage/tiers/host_buffer_pool.h"
#include "storage/tiers/sync.h"

#if defined(LORADB_HAVE_CUDA)
#include <cuda_runtime_api.h>
#endif

namespace loradb::tiers {

bool CudaDeviceAvailable() {
#if defined(LORADB_HAVE_CUDA)
  static const bool available = [] {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess) {
      (void)cudaGetLastError();  // clear the sticky "no device" error
      return false;
    }
    return count > 0;
  }();
  return available;
#else
  return false;
#endif
}

namespace {

// Buffers from this size up are mapped directly and populated up front (MADV_POPULATE_WRITE):
// a cold burst otherwise spends much of its time in one page fault per 4 KiB of adapter.
constexpr uint64_t kMapThreshold = uint64_t{4} << 20;
constexpr uint64_t kHugePage = uint64_t{2} << 20;

// LORADB_HOST_HUGEPAGES=1 adds MADV_HUGEPAGE. Off by default: in the cold-burst bench (64 x
// 63 MiB) huge pages doubled the total time and stretched p95 from 6 s to 12.6 s (direct
// compaction stalls under memory pressure), though a single load got faster.
bool HugePagesWanted() {
  static const bool wanted = [] {
    const char* v = std::getenv("LORADB_HOST_HUGEPAGES");
    return v != nullptr && std::string(v) == "1";
  }();
  return wanted;
}

// Idle mapped buffers by (capacity, pinned), kept for reuse (host_buffer_pool.h).
struct IdleMapping {
  void* data;
};
class Pool {
 public:
  // An idle mapping of exactly `capacity` bytes and pinned state `pinned`, or nullptr.
  void* Take(uint64_t capacity, bool pinned) {
    MutexLock lock(&mu_);
    auto it = idle_.find({capacity, pinned});
    if (it == idle_.end()) {
      if (limit_ > 0) ++stats_.fresh;
      return nullptr;
    }
    void* p = it->second.data;
    idle_.erase(it);
    stats_.pooled_bytes -= capacity;
    --stats_.pooled_buffers;
    ++stats_.reused;
    return p;
  }
  // Keeps the mapping if the limit allows; false: the caller unmaps it.
  bool Keep(void* data, uint64_t capacity, bool pinned) {
    MutexLock lock(&mu_);
    if (stats_.pooled_bytes + capacity > limit_) return false;
    idle_.insert({{capacity, pinned}, IdleMapping{data}});
    stats_.pooled_bytes += capacity;
    ++stats_.pooled_buffers;
    return true;
  }
  // Sets the limit and returns the idle mappings beyond it for the caller to unmap.
  std::multimap<std::pair<uint64_t, bool>, IdleMapping> SetLimit(uint64_t bytes) {
    MutexLock lock(&mu_);
    limit_ = bytes;
    std::multimap<std::pair<uint64_t, bool>, IdleMapping> drop;
    while (stats_.pooled_bytes > limit_) {
      auto it = std::prev(idle_.end());  // largest first
      stats_.pooled_bytes -= it->first.first;
      --stats_.pooled_buffers;
      drop.insert(*it);
      idle_.erase(it);
    }
    return drop;
  }
  void RaiseLimitTo(uint64_t bytes) {
    MutexLock lock(&mu_);
    limit_ = std::max(limit_, bytes);
  }
  HostBufferPoolStats stats() {
    MutexLock lock(&mu_);
    HostBufferPoolStats s = stats_;
    s.limit_bytes = limit_;
    return s;
  }

 private:
  Mutex mu_;  // tiers::Mutex: visible to TSan (sync.h)
  uint64_t limit_ ABSL_GUARDED_BY(mu_) = 0;
  HostBufferPoolStats stats_ ABSL_GUARDED_BY(mu_);
  std::multimap<std::pair<uint64_t, bool>, IdleMapping> idle_ ABSL_GUARDED_BY(mu_);
};

Pool& ThePool() {
  static Pool* pool = new Pool;  // never destroyed: buffers may outlive static destruction
  return *pool;
}

void Unmap(void* data, uint64_t capacity, bool pinned) {
#if defined(LORADB_HAVE_CUDA)
  if (pinned) (void)cudaHostUnregister(data);
#else
  (void)pinned;
#endif
  ::munmap(data, capacity);
}

}  // namespace

void SetHostBufferPoolLimit(uint64_t bytes) {
  for (const auto& [key, m] : ThePool().SetLimit(bytes)) Unmap(m.data, key.first, key.second);
}

absl::Status ReserveHostBuffers(uint64_t size, uint64_t count, bool pin) {
  if (count == 0) return absl::InvalidArgumentError("reserve host buffers: count is zero");
  if (AlignUp(size, kHostAlignment) < kMapThreshold) {
    return absl::InvalidArgumentError(absl::StrCat("reserve host buffers: ", size,
                                                   " bytes is below the pooled size (",
                                                   kMapThreshold, " bytes)"));
  }
  const uint64_t capacity = AlignUp(AlignUp(size, kHostAlignment), kHugePage);
  ThePool().RaiseLimitTo(ThePool().stats().pooled_bytes + count * capacity);
  std::vector<std::unique_ptr<HostBuffer>> fresh;
  for (uint64_t i = 0; i < count; ++i) {
    auto buf = HostBuffer::Allocate(size, pin);
    if (!buf.ok()) return buf.status();  // what is held in `fresh` goes back to the pool
    fresh.push_back(*std::move(buf));
  }
  // Holding `count` at once (idle ones reused, the rest mapped), then releasing them all leaves
  // at least `count` idle; the limit has room for them.
  return absl::OkStatus();
}

HostBufferPoolStats GetHostBufferPoolStats() { return ThePool().stats(); }

absl::StatusOr<std::unique_ptr<HostBuffer>> HostBuffer::Allocate(uint64_t size, bool pin) {
  uint64_t capacity = AlignUp(size == 0 ? 1 : size, kHostAlignment);
  void* p = nullptr;
  bool mapped = false;
  if (capacity >= kMapThreshold) {
    capacity = AlignUp(capacity, kHugePage);
    const bool want_pinned = pin && CudaDeviceAvailable();
    if (void* reused = ThePool().Take(capacity, want_pinned)) {
      return std::unique_ptr<HostBuffer>(
          new HostBuffer(static_cast<std::byte*>(reused), size, capacity, want_pinned, true));
    }
    void* m = ::mmap(nullptr, capacity, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m != MAP_FAILED) {
      if (HugePagesWanted()) (void)::madvise(m, capacity, MADV_HUGEPAGE);
#if defined(MADV_POPULATE_WRITE)
      (void)::madvise(m, capacity, MADV_POPULATE_WRITE);
#endif
      p = m;
      mapped = true;
    }
  } else {
    p = std::aligned_alloc(kHostAlignment, capacity);
  }
  if (p == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot allocate a host buffer of ", capacity, " bytes"));
  }
  bool pinned = false;
#if defined(LORADB_HAVE_CUDA)
  if (pin && CudaDeviceAvailable()) {
    pinned = cudaHostRegister(p, capacity, cudaHostRegisterDefault) == cudaSuccess;
    if (!pinned) (void)cudaGetLastError();
  }
#else
  (void)pin;
#endif
  return std::unique_ptr<HostBuffer>(
      new HostBuffer(static_cast<std::byte*>(p), size, capacity, pinned, mapped));
}

HostBuffer::~HostBuffer() {
  if (mapped_) {
    if (!ThePool().Keep(data_, capacity_, pinned_)) Unmap(data_, capacity_, pinned_);
    return;
  }
#if defined(LORADB_HAVE_CUDA)
  if (pinned_) (void)cudaHostUnregister(data_);
#endif
  std::free(data_);
}

}  // namespace loradb::tiers
