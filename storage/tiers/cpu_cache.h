// The CPU tier: a byte-budgeted cache of whole adapter revisions (host buffers + tensor views),
// keyed by revision id, filled by a pluggable loader function.
//
// - Leases (CpuLease, RAII) pin entries: a leased entry is never evicted or freed. The cache
//   exceeds its budget only by leased bytes, and reports by how much.
// - Single flight: concurrent misses for one revision share one load; every waiter gets the
//   result or the same error.
// - Bounded cold loads: at most `max_inflight_loads` loads run (one loader thread each), at
//   most `max_queued_loads` more wait; past that Acquire/Prefetch return ResourceExhausted at
//   once, with a retry-after hint (RetryAfterHint). Queued loads run by priority (decode before
//   prefetch), then in arrival order.
// - A failed load is remembered for `negative_ttl`: requests in that window get the same error
//   without a new load.
// - The host-buffer pool's free buffers count against the budget (HostBufferPoolAccount): after
//   every cache operation, resident + pooled <= budget (with other caches open, the pool holds at
//   most their unused budgets together); the pool gives way before any entry is evicted.
#ifndef LORADB_STORAGE_TIERS_CPU_CACHE_H_
#define LORADB_STORAGE_TIERS_CPU_CACHE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "storage/formats/tensor.h"
#include "storage/tiers/eviction.h"
#include "storage/tiers/host_buffer.h"
#include "storage/tiers/latency_histogram.h"
#include "storage/util/mutex.h"

namespace loradb::tiers {

// Lower value runs first.
enum class LoadPriority : int { kDecode = 0, kPrefetch = 1 };

// One loaded adapter revision: its tensors (whose backing owns the host buffer) and the bytes
// it is charged against the budget.
struct CachedAdapter {
  TensorSet tensors;
  uint64_t bytes = 0;
};

// Loads revision `revision`; runs on a cache loader thread, never under the cache's lock.
using AdapterLoadFn =
    std::function<absl::StatusOr<std::shared_ptr<const CachedAdapter>>(uint64_t revision)>;

struct CpuCacheOptions {
  uint64_t budget_bytes = uint64_t{8} << 30;
  EvictionPolicyKind policy = EvictionPolicyKind::kWTinyLfu;
  // Sizes the frequency sketch of W-TinyLFU (roughly the entries the budget holds).
  uint64_t expected_entries = 1024;
  unsigned max_inflight_loads = 8;
  unsigned max_queued_loads = 64;
  // How long a failed load is remembered (zero: not at all).
  absl::Duration negative_ttl = absl::Seconds(2);
  // Time source for the negative cache (tests inject one); default absl::Now.
  std::function<absl::Time()> clock;
};

struct CpuCacheStats {
  uint64_t hits = 0;            // Acquire found the entry resident
  uint64_t misses = 0;          // Acquire did not (joined or started a load, or was rejected)
  uint64_t loads = 0;           // loads that succeeded
  uint64_t load_failures = 0;   // loads that failed
  uint64_t joined_waiters = 0;  // requests that joined a load already pending
  uint64_t rejections = 0;      // ResourceExhausted answers (load bound reached)
  uint64_t negative_hits = 0;   // requests answered from the negative cache
  uint64_t prefetches = 0;      // loads started by Prefetch
  uint64_t evictions = 0;       // entries dropped (policy or Evict)
  uint64_t bytes_in = 0;        // bytes inserted by loads
  uint64_t bytes_out = 0;       // bytes dropped by evictions
  uint64_t resident_bytes = 0;  // bytes of resident entries
  uint64_t resident_entries = 0;
  uint64_t leased_bytes = 0;            // bytes of entries with at least one lease
  uint64_t over_budget_bytes = 0;       // resident - budget when positive (all leased)
  uint64_t peak_over_budget_bytes = 0;  // the most it has been
  // Free host buffers the process-wide pool holds now (host_buffer.h), counted against the
  // budget with the resident bytes; and what the pool may hold at most now.
  uint64_t pooled_bytes = 0;
  uint64_t pool_cap_bytes = 0;
  uint64_t inflight_loads = 0;  // loads running now
  uint64_t queued_loads = 0;    // loads waiting for a loader thread
  LatencyHistogram load_latency;
};

// If `status` is a rejection from the cache, the suggested wait before retrying.
std::optional<absl::Duration> RetryAfterHint(const absl::Status& status);

class CpuCache;

// A pin on one resident revision. Move-only; releases on destruction. The cache must outlive
// its leases.
class CpuLease {
 public:
  CpuLease() = default;
  CpuLease(CpuLease&& other) noexcept { *this = std::move(other); }
  CpuLease& operator=(CpuLease&& other) noexcept;
  CpuLease(const CpuLease&) = delete;
  CpuLease& operator=(const CpuLease&) = delete;
  ~CpuLease() { Release(); }

  explicit operator bool() const { return cache_ != nullptr; }
  uint64_t revision() const { return revision_; }
  const CachedAdapter& adapter() const { return *data_; }
  const TensorSet& tensors() const { return data_->tensors; }
  // Drops the pin now (idempotent).
  void Release();

 private:
  friend class CpuCache;
  CpuLease(CpuCache* cache, uint64_t revision, std::shared_ptr<const CachedAdapter> data)
      : cache_(cache), revision_(revision), data_(std::move(data)) {}

  CpuCache* cache_ = nullptr;
  uint64_t revision_ = 0;
  std::shared_ptr<const CachedAdapter> data_;
};

// Where a revision is in the CPU tier.
struct CpuResidency {
  enum class State { kAbsent, kLoading, kResident } state = State::kAbsent;
  int leases = 0;
  uint64_t bytes = 0;
};

class CpuCache {
 public:
  // InvalidArgument on a zero budget or zero max_inflight_loads. Starts the loader threads.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<CpuCache>> Create(CpuCacheOptions options,
                                                                        AdapterLoadFn load);
  // Cancels queued loads (their waiters get Cancelled), waits for running ones. All leases
  // must have been released.
  ~CpuCache();
  CpuCache(const CpuCache&) = delete;
  CpuCache& operator=(const CpuCache&) = delete;

  // Returns a lease on `revision`, loading it if needed (blocking until the load ends or
  // `timeout` passes: DeadlineExceeded, the load continues). Errors: the load's error (also
  // for every joined waiter, and for later requests within negative_ttl); ResourceExhausted
  // with a retry-after hint when the load bound is reached (returned at once).
  [[nodiscard]] absl::StatusOr<CpuLease> Acquire(
      uint64_t revision, LoadPriority priority = LoadPriority::kDecode,
      std::optional<absl::Duration> timeout = std::nullopt);

  // Starts loading `revision` in the background unless resident or pending (a pending load's
  // priority is raised to `priority` if higher). OK when resident, pending or started; the
  // remembered error within negative_ttl; ResourceExhausted when the load bound is reached.
  [[nodiscard]] absl::Status Prefetch(uint64_t revision,
                                      LoadPriority priority = LoadPriority::kPrefetch);

  // Drops `revision` now. NotFound if not resident; FailedPrecondition if leased or loading.
  [[nodiscard]] absl::Status Evict(uint64_t revision);

  // Forgets a remembered load failure (e.g. after the blob was repaired).
  void ClearNegative(uint64_t revision);

  CpuResidency Find(uint64_t revision) const;
  CpuCacheStats stats() const;
  const CpuCacheOptions& options() const { return options_; }

 private:
  friend class CpuLease;
  struct Entry {
    std::shared_ptr<const CachedAdapter> data;
    uint64_t bytes = 0;
    int leases = 0;
  };
  struct Load {
    uint64_t revision = 0;
    LoadPriority priority = LoadPriority::kDecode;
    uint64_t seq = 0;
    bool running = false;
    bool done = false;
    int waiters = 0;  // Acquire calls waiting; each gets a lease pre-charged on success
    absl::Status status;
  };
  using QueueKey = std::tuple<int, uint64_t, uint64_t>;  // priority, seq, revision

  CpuCache(CpuCacheOptions options, AdapterLoadFn load);
  void WorkerLoop();
  void Release(uint64_t revision);
  absl::Time Now() const { return options_.clock ? options_.clock() : absl::Now(); }
  // Checks the negative cache; returns the remembered error if fresh.
  std::optional<absl::Status> NegativeLookup(uint64_t revision) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Queues a new load, or returns ResourceExhausted when the bound is reached.
  absl::StatusOr<std::shared_ptr<Load>> StartLoad(uint64_t revision, LoadPriority priority)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RaisePriority(Load& load, LoadPriority priority) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Evicts unleased entries until within budget; freed data is moved into `garbage` so it is
  // destroyed after the lock is dropped, as are the pooled buffers moved into `released`.
  void EvictOverBudget(std::vector<std::shared_ptr<const CachedAdapter>>* garbage,
                       ReleasedHostBuffers* released) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RemoveEntry(uint64_t revision, std::vector<std::shared_ptr<const CachedAdapter>>* garbage)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Updates the over-budget gauges and charges the resident bytes to the pool account (before
  // any evicted buffer reaches the pool), which trims the pool into `released`.
  void UpdateOverBudget(ReleasedHostBuffers* released) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const CpuCacheOptions options_;
  const AdapterLoadFn load_;

  mutable Mutex mu_;
  std::unique_ptr<EvictionPolicy> policy_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, Entry> entries_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, std::shared_ptr<Load>> loads_ ABSL_GUARDED_BY(mu_);
  std::set<QueueKey> queue_ ABSL_GUARDED_BY(mu_);
  struct Negative {
    absl::Status status;
    absl::Time expires;
  };
  absl::flat_hash_map<uint64_t, Negative> negative_ ABSL_GUARDED_BY(mu_);
  uint64_t next_seq_ ABSL_GUARDED_BY(mu_) = 0;
  unsigned running_ ABSL_GUARDED_BY(mu_) = 0;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  CpuCacheStats stats_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread> workers_;
  // Declared after entries_ (destroyed first): a closing cache's buffers go to the pool under
  // the other accounts' room, or its limit.
  HostBufferPoolAccount pool_account_;
};

}  // namespace loradb::tiers

#endif  // LORADB_STORAGE_TIERS_CPU_CACHE_H_
