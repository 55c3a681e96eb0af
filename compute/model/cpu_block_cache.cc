#include "compute/model/cpu_block_cache.h"

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace loradb::model {

namespace {

// Cached sizes are rounded up to this, so that sizes a few bytes apart share blocks.
constexpr size_t kGranule = size_t{64} << 10;

class BlockCache {
 public:
  explicit BlockCache(c10::Allocator* upstream) : upstream_(upstream) {}

  c10::DataPtr Allocate(size_t n) {
    if (n < kCpuBlockCacheMinBytes) return upstream_->allocate(n);
    const size_t bytes = (n + kGranule - 1) / kGranule * kGranule;
    c10::DataPtr block;
    {
      absl::MutexLock lock(&mu_);
      // The most recently freed block of the same rounded size (the likeliest to be in the CPU's
      // caches still): a step asks for the sizes the step before it freed.
      const auto [first, end] = free_.equal_range(bytes);
      if (first != end) {
        const auto it = std::prev(end);
        block = std::move(it->second.block);
        free_.erase(it);
        cached_ -= bytes;
        ++hits_;
      } else {
        ++misses_;
      }
    }
    if (!block) block = upstream_->allocate(bytes);
    auto* held = new Held{std::move(block), bytes, this};
    void* data = held->block.get();
    return c10::DataPtr(data, held, &Return, c10::Device(c10::DeviceType::CPU));
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
  }  // the dropped blocks go upstream here, outside the lock

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
  // A block handed out: the upstream allocation, its size, and where it returns.
  struct Held {
    c10::DataPtr block;
    size_t bytes;
    BlockCache* cache;
  };
  // A freed block and when it was freed (a counter), for evicting the least recently freed.
  struct Cached {
    c10::DataPtr block;
    uint64_t freed_at;
  };

  static void Return(void* ctx) {
    std::unique_ptr<Held> held(static_cast<Held*>(ctx));
    BlockCache* cache = held->cache;
    std::vector<c10::DataPtr> evicted;
    {
      absl::MutexLock lock(&cache->mu_);
      if (held->bytes <= cache->limit_) {
        // Room for the block: the least recently freed blocks leave first.
        while (cache->cached_ + held->bytes > cache->limit_) {
          auto oldest = cache->free_.begin();
          for (auto it = cache->free_.begin(); it != cache->free_.end(); ++it) {
            if (it->second.freed_at < oldest->second.freed_at) oldest = it;
          }
          cache->cached_ -= oldest->first;
          evicted.push_back(std::move(oldest->second.block));
          cache->free_.erase(oldest);
        }
        cache->cached_ += held->bytes;
        cache->free_.emplace(held->bytes, Cached{std::move(held->block), ++cache->frees_});
      }
    }
    // Here, outside the lock, the evicted blocks (and the returned one, when it was not kept) go
    // back upstream.
  }

  c10::Allocator* const upstream_;
  absl::Mutex mu_;
  std::multimap<size_t, Cached> free_ ABSL_GUARDED_BY(mu_);  // by size
  uint64_t cached_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t limit_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t hits_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t misses_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t frees_ ABSL_GUARDED_BY(mu_) = 0;
};

// c10::Allocator::allocate is const in older LibTorch releases and not in newer ones; the
// adapter below overrides whichever this LibTorch declares.
constexpr bool kConstAllocate = std::is_same_v<decltype(&c10::Allocator::allocate),
                                               c10::DataPtr (c10::Allocator::*)(size_t) const>;

template <typename Base, bool kConst>
class CacheAllocator;

template <typename Base>
class CacheAllocator<Base, false> : public Base {
 public:
  explicit CacheAllocator(BlockCache* cache) : cache_(cache) {}
  c10::DataPtr allocate(size_t n) override { return cache_->Allocate(n); }
  // Pure virtual in releases that have Allocator::clone; unused otherwise.
  void copy_data(void* dest, const void* src, size_t count) const { std::memcpy(dest, src, count); }

 private:
  BlockCache* const cache_;
};

template <typename Base>
class CacheAllocator<Base, true> : public Base {
 public:
  explicit CacheAllocator(BlockCache* cache) : cache_(cache) {}
  c10::DataPtr allocate(size_t n) const override { return cache_->Allocate(n); }

 private:
  BlockCache* const cache_;
};

struct Installed {
  BlockCache* cache = nullptr;
  c10::Allocator* allocator = nullptr;
};

ABSL_CONST_INIT absl::Mutex install_mu(absl::kConstInit);
Installed installed ABSL_GUARDED_BY(install_mu);

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
  if (installed.cache == nullptr) {
    // Both live for the rest of the process: blocks handed out return to the cache whenever
    // their tensors die, static destruction included.
    installed.cache = new BlockCache(c10::GetCPUAllocator());
    installed.allocator = new CacheAllocator<c10::Allocator, kConstAllocate>(installed.cache);
    c10::SetCPUAllocator(installed.allocator, /*priority=*/1);
  }
  installed.cache->SetLimit(limit_bytes, /*exact=*/false);
  return c10::GetCPUAllocator() == installed.allocator;
}

void TrimCpuBlockCache() {
  BlockCache* cache;
  {
    absl::MutexLock lock(&install_mu);
    cache = installed.cache;
  }
  if (cache != nullptr) cache->Trim();
}

CpuBlockCacheStats GetCpuBlockCacheStats() {
  Installed now;
  {
    absl::MutexLock lock(&install_mu);
    now = installed;
  }
  if (now.cache == nullptr) return {};
  CpuBlockCacheStats s = now.cache->Stats();
  s.installed = c10::GetCPUAllocator() == now.allocator;
  return s;
}

void SetCpuBlockCacheLimitForTesting(uint64_t limit_bytes) {
  absl::MutexLock lock(&install_mu);
  if (installed.cache != nullptr) installed.cache->SetLimit(limit_bytes, /*exact=*/true);
}

}  // namespace loradb::model
