#include "compute/model/cpu_block_cache.h"

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <map>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace loradb::model {

namespace {

// Cached sizes are rounded up to this, so that sizes a few bytes apart share blocks.
constexpr size_t kGranule = size_t{64} << 10;

// Every block the cache hands out is its own context (data == context) and is freed through
// Delete, the allocator's raw deleter, as LibTorch's raw_allocate / raw_deallocate require; the
// blocks of cached sizes are told from the rest by the table of live ones.
class BlockCache {
 public:
  // `upstream` must have a raw deleter (LibTorch's default CPU allocator has).
  explicit BlockCache(c10::Allocator* upstream)
      : upstream_(upstream), upstream_delete_(upstream->raw_deleter()) {}

  c10::DataPtr Allocate(size_t n) {
    if (n < kCpuBlockCacheMinBytes) return Wrap(upstream_->raw_allocate(n));
    const size_t bytes = (n + kGranule - 1) / kGranule * kGranule;
    {
      absl::MutexLock lock(&mu_);
      // The most recently freed block of the same rounded size (the likeliest to be in the CPU's
      // caches still): a step asks for the sizes the step before it freed.
      const auto [first, end] = free_.equal_range(bytes);
      if (first != end) {
        const auto it = std::prev(end);
        void* block = it->second.block;
        free_.erase(it);
        cached_ -= bytes;
        ++hits_;
        live_[block] = bytes;
        return Wrap(block);
      }
      ++misses_;
    }
    void* block = upstream_->raw_allocate(bytes);  // outside the lock
    absl::MutexLock lock(&mu_);
    live_[block] = bytes;
    return Wrap(block);
  }

  // Takes back a block: kept when it is of a cached size and fits under the limit (the least
  // recently freed blocks leave to make room), else freed upstream.
  void Free(void* block) {
    std::vector<void*> to_free;
    {
      absl::MutexLock lock(&mu_);
      const auto it = live_.find(block);
      if (it == live_.end()) {
        to_free.push_back(block);
      } else {
        const size_t bytes = it->second;
        live_.erase(it);
        if (bytes > limit_) {
          to_free.push_back(block);
        } else {
          while (cached_ + bytes > limit_) {
            auto oldest = free_.begin();
            for (auto c = free_.begin(); c != free_.end(); ++c) {
              if (c->second.freed_at < oldest->second.freed_at) oldest = c;
            }
            cached_ -= oldest->first;
            to_free.push_back(oldest->second.block);
            free_.erase(oldest);
          }
          cached_ += bytes;
          free_.emplace(bytes, Cached{block, ++frees_});
        }
      }
    }
    for (void* b : to_free) upstream_delete_(b);
  }

  void SetLimit(uint64_t limit, bool exact) {
    absl::MutexLock lock(&mu_);
    limit_ = exact ? limit : std::max(limit_, limit);
  }

  void Trim() {
    std::multimap<size_t, Cached> drop;
    {
      absl::MutexLock lock(&mu_);
      drop.swap(free_);
      cached_ = 0;
    }
    for (const auto& [bytes, c] : drop) upstream_delete_(c.block);
  }

  // The allocator's raw deleter: every block it hands out comes back here.
  static void Delete(void* block);

  CpuBlockCacheStats Stats() {
    absl::MutexLock lock(&mu_);
    CpuBlockCacheStats s;
    s.limit_bytes = limit_;
    s.cached_bytes = cached_;
    s.hits = hits_;
    s.misses = misses_;
    return s;
  }

 private:
  // A freed block and when it was freed (a counter), for evicting the least recently freed.
  struct Cached {
    void* block;
    uint64_t freed_at;
  };

  static c10::DataPtr Wrap(void* block) {
    return c10::DataPtr(block, block, &Delete, c10::Device(c10::DeviceType::CPU));
  }

  c10::Allocator* const upstream_;
  const c10::DeleterFnPtr upstream_delete_;
  absl::Mutex mu_;
  std::map<void*, size_t> live_ ABSL_GUARDED_BY(mu_);        // handed out, of cached sizes
  std::multimap<size_t, Cached> free_ ABSL_GUARDED_BY(mu_);  // by size
  uint64_t cached_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t limit_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t hits_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t misses_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t frees_ ABSL_GUARDED_BY(mu_) = 0;
};

// The process's cache, set once before LibTorch's allocator becomes it and never freed: blocks
// return to it whenever their tensors die, static destruction included.
std::atomic<BlockCache*> the_cache{nullptr};

BlockCache* Cache() { return the_cache.load(std::memory_order_acquire); }

void BlockCache::Delete(void* block) { Cache()->Free(block); }

// c10::Allocator::allocate is const in older LibTorch releases and not in newer ones; the
// adapter below overrides whichever this LibTorch declares.
constexpr bool kConstAllocate = std::is_same_v<decltype(&c10::Allocator::allocate),
                                               c10::DataPtr (c10::Allocator::*)(size_t) const>;

template <typename Base, bool kConst>
class CacheAllocator;

template <typename Base>
class CacheAllocator<Base, false> : public Base {
 public:
  c10::DataPtr allocate(size_t n) override { return Cache()->Allocate(n); }
  c10::DeleterFnPtr raw_deleter() const override { return &BlockCache::Delete; }
  // Pure virtual in releases that have Allocator::clone; unused otherwise.
  void copy_data(void* dest, const void* src, size_t count) const { std::memcpy(dest, src, count); }
};

template <typename Base>
class CacheAllocator<Base, true> : public Base {
 public:
  c10::DataPtr allocate(size_t n) const override { return Cache()->Allocate(n); }
  c10::DeleterFnPtr raw_deleter() const override { return &BlockCache::Delete; }
};

// The allocator installed over LibTorch's (null before the first EnableCpuBlockCache that
// installed one).
ABSL_CONST_INIT absl::Mutex install_mu(absl::kConstInit);
c10::Allocator* installed ABSL_GUARDED_BY(install_mu) = nullptr;

// LORADB_NO_CPU_BLOCK_CACHE set (to anything but "" or "0") keeps LibTorch's own allocator.
bool CacheTurnedOff() {
  const char* v = std::getenv("LORADB_NO_CPU_BLOCK_CACHE");
  return v != nullptr && v[0] != '\0' && std::strcmp(v, "0") != 0;
}

}  // namespace

uint64_t DefaultCpuBlockCacheBytes() {
  constexpr uint64_t kMost = uint64_t{4} << 30;
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page <= 0) return kMost;
  return std::min(kMost, static_cast<uint64_t>(pages) * static_cast<uint64_t>(page) / 8);
}

bool EnableCpuBlockCache(uint64_t limit_bytes) {
  if (limit_bytes == 0 || CacheTurnedOff()) return GetCpuBlockCacheStats().installed;
  absl::MutexLock lock(&install_mu);
  if (installed == nullptr) {
    c10::Allocator* upstream = c10::GetCPUAllocator();
    if (upstream->raw_deleter() == nullptr) return false;  // its blocks cannot be freed raw
    // Both live for the rest of the process.
    the_cache.store(new BlockCache(upstream), std::memory_order_release);
    installed = new CacheAllocator<c10::Allocator, kConstAllocate>();
    c10::SetCPUAllocator(installed, /*priority=*/1);
  }
  Cache()->SetLimit(limit_bytes, /*exact=*/false);
  return c10::GetCPUAllocator() == installed;
}

void TrimCpuBlockCache() {
  if (BlockCache* cache = Cache()) cache->Trim();
}

CpuBlockCacheStats GetCpuBlockCacheStats() {
  BlockCache* cache = Cache();
  if (cache == nullptr) return {};
  CpuBlockCacheStats s = cache->Stats();
  absl::MutexLock lock(&install_mu);
  s.installed = c10::GetCPUAllocator() == installed;
  return s;
}

void SetCpuBlockCacheLimitForTesting(uint64_t limit_bytes) {
  if (BlockCache* cache = Cache()) cache->SetLimit(limit_bytes, /*exact=*/true);
}

}  // namespace loradb::model
