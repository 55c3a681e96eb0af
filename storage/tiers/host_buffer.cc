#include "storage/tiers/host_buffer.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "storage/util/mutex.h"
#include "storage/util/status_macros.h"

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

// Free mapped buffers kept for reuse, oldest first.
class BufferPool {
 public:
  struct Free {
    std::byte* data;
    uint64_t capacity;
    bool pinned;
  };

  static BufferPool& Get() {
    static BufferPool* pool = new BufferPool();  // never destroyed: buffers may die at exit
    return *pool;
  }

  // A pooled buffer with capacity in [need, need + need / 8] and the given pinning, if any.
  std::optional<Free> Take(uint64_t need, bool pinned) {
    MutexLock lock(&mu_);
    size_t best = free_.size();
    for (size_t i = 0; i < free_.size(); ++i) {
      const Free& f = free_[i];
      if (f.pinned != pinned || f.capacity < need || f.capacity > need + need / 8) continue;
      if (best == free_.size() || f.capacity < free_[best].capacity) best = i;
    }
    if (best == free_.size()) return std::nullopt;
    Free f = free_[best];
    free_.erase(free_.begin() + static_cast<std::ptrdiff_t>(best));
    bytes_ -= f.capacity;
    ++reused_;
    lent_.insert(f.data);
    return f;
  }

  // Marks a freshly mapped buffer as one AllocateForOverwrite handed out: only those come back.
  void Lend(const std::byte* data) {
    MutexLock lock(&mu_);
    lent_.insert(data);
  }

  // Keeps `f` if it fits under the cap (dropping older buffers to make room); returns what
  // the caller must release.
  std::vector<Free> Put(Free f) {
    MutexLock lock(&mu_);
    std::vector<Free> release;
    // Buffers from Allocate were never lent: a caller that never reads through the loader must
    // not have its freed buffers parked here.
    if (lent_.erase(f.data) == 0 || f.capacity > CapLocked()) {
      release.push_back(f);
      return release;
    }
    free_.push_back(f);
    bytes_ += f.capacity;
    TrimLocked(&release);
    return release;
  }

  std::vector<Free> SetLimit(uint64_t limit) {
    MutexLock lock(&mu_);
    limit_ = limit;
    std::vector<Free> release;
    TrimLocked(&release);
    return release;
  }

  uint64_t AddAccount(uint64_t budget) {
    MutexLock lock(&mu_);
    const uint64_t id = next_account_++;
    accounts_[id] = {budget, 0};
    return id;
  }

  // Sets an account's charge (or removes it with `remove`) and trims to the new cap.
  std::vector<Free> Charge(uint64_t id, uint64_t charged, bool remove) {
    MutexLock lock(&mu_);
    if (remove) {
      accounts_.erase(id);
    } else if (auto it = accounts_.find(id); it != accounts_.end()) {
      it->second.charged = charged;
    }
    std::vector<Free> release;
    TrimLocked(&release);
    return release;
  }

  void CountAllocated() {
    MutexLock lock(&mu_);
    ++allocated_;
  }

  HostBufferPoolStats Stats() {
    MutexLock lock(&mu_);
    return {reused_, allocated_, free_.size(), bytes_, limit_, CapLocked(), accounts_.size()};
  }

 private:
  BufferPool() {
    const char* v = std::getenv("LORADB_HOST_BUFFER_POOL_BYTES");
    uint64_t limit = 0;
    limit_ = v != nullptr && absl::SimpleAtoi(v, &limit) ? limit : kDefaultLimit;
  }
  static constexpr uint64_t kDefaultLimit = uint64_t{1} << 30;

  struct Account {
    uint64_t budget = 0;
    uint64_t charged = 0;
  };

  // The bytes the pool may hold now: the limit, and while accounts exist no more than their
  // unused budgets together.
  uint64_t CapLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (accounts_.empty()) return limit_;
    uint64_t room = 0;
    for (const auto& [id, a] : accounts_) {
      if (a.charged < a.budget) room += a.budget - a.charged;
    }
    return std::min(limit_, room);
  }

  // Drops the oldest free buffers until the pool is within its cap.
  void TrimLocked(std::vector<Free>* release) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const uint64_t cap = CapLocked();
    size_t drop = 0;
    while (bytes_ > cap && drop < free_.size()) {
      release->push_back(free_[drop]);
      bytes_ -= free_[drop].capacity;
      ++drop;
    }
    free_.erase(free_.begin(), free_.begin() + static_cast<std::ptrdiff_t>(drop));
  }

  Mutex mu_;
  std::vector<Free> free_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<const std::byte*> lent_ ABSL_GUARDED_BY(mu_);  // live, from the pool path
  uint64_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t limit_ ABSL_GUARDED_BY(mu_) = kDefaultLimit;
  uint64_t reused_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t allocated_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<uint64_t, Account> accounts_ ABSL_GUARDED_BY(mu_);
  uint64_t next_account_ ABSL_GUARDED_BY(mu_) = 1;
};

// Unpins and unmaps a mapped buffer.
void ReleaseMapped(const BufferPool::Free& f) {
#if defined(LORADB_HAVE_CUDA)
  if (f.pinned) (void)cudaHostUnregister(f.data);
#endif
  ::munmap(f.data, f.capacity);
}

bool WantPinned(bool pin) {
#if defined(LORADB_HAVE_CUDA)
  return pin && CudaDeviceAvailable();
#else
  (void)pin;
  return false;
#endif
}

}  // namespace

HostBufferPoolStats GetHostBufferPoolStats() { return BufferPool::Get().Stats(); }

ReleasedHostBuffers& ReleasedHostBuffers::operator=(ReleasedHostBuffers&& other) noexcept {
  if (this != &other) {
    Unmap();
    buffers_ = std::move(other.buffers_);
    other.buffers_.clear();
  }
  return *this;
}

void ReleasedHostBuffers::Unmap() {
  for (const Buffer& b : buffers_) ReleaseMapped({b.data, b.capacity, b.pinned});
  buffers_.clear();
}

HostBufferPoolAccount::HostBufferPoolAccount(uint64_t budget_bytes)
    : id_(BufferPool::Get().AddAccount(budget_bytes)) {
  // Buffers pooled before this budget existed may not fit the room left now.
  for (const auto& f : BufferPool::Get().Charge(id_, 0, /*remove=*/false)) ReleaseMapped(f);
}

HostBufferPoolAccount::~HostBufferPoolAccount() {
  for (const auto& f : BufferPool::Get().Charge(id_, 0, /*remove=*/true)) ReleaseMapped(f);
}

void HostBufferPoolAccount::SetCharged(uint64_t bytes, ReleasedHostBuffers* released) {
  for (const auto& f : BufferPool::Get().Charge(id_, bytes, /*remove=*/false)) {
    released->buffers_.push_back({f.data, f.capacity, f.pinned});
  }
}

void SetHostBufferPoolLimit(uint64_t bytes) {
  for (const auto& f : BufferPool::Get().SetLimit(bytes)) ReleaseMapped(f);
}

absl::StatusOr<std::unique_ptr<HostBuffer>> HostBuffer::AllocateForOverwrite(uint64_t size,
                                                                             bool pin) {
  uint64_t capacity = AlignUp(size == 0 ? 1 : size, kHostAlignment);
  if (capacity >= kMapThreshold) {
    if (auto f = BufferPool::Get().Take(AlignUp(capacity, kHugePage), WantPinned(pin))) {
      return std::unique_ptr<HostBuffer>(new HostBuffer(f->data, size, f->capacity, f->pinned,
                                                        /*mapped=*/true));
    }
  }
  LORADB_ASSIGN_OR_RETURN(std::unique_ptr<HostBuffer> fresh, Allocate(size, pin));
  if (fresh->mapped_) BufferPool::Get().Lend(fresh->data_);
  return fresh;
}

absl::StatusOr<std::unique_ptr<HostBuffer>> HostBuffer::Allocate(uint64_t size, bool pin) {
  uint64_t capacity = AlignUp(size == 0 ? 1 : size, kHostAlignment);
  void* p = nullptr;
  bool mapped = false;
  if (capacity >= kMapThreshold) {
    capacity = AlignUp(capacity, kHugePage);
    void* m = ::mmap(nullptr, capacity, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m != MAP_FAILED) {
      if (HugePagesWanted()) (void)::madvise(m, capacity, MADV_HUGEPAGE);
#if defined(MADV_POPULATE_WRITE)
      (void)::madvise(m, capacity, MADV_POPULATE_WRITE);
#endif
      p = m;
      mapped = true;
      BufferPool::Get().CountAllocated();
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
    for (const auto& f : BufferPool::Get().Put({data_, capacity_, pinned_})) ReleaseMapped(f);
    return;
  }
#if defined(LORADB_HAVE_CUDA)
  if (pinned_) (void)cudaHostUnregister(data_);
#endif
  std::free(data_);
}

}  // namespace loradb::tiers
