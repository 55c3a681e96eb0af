#include "storage/tiers/cpu_cache.h"

#include <algorithm>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace loradb::tiers {
namespace {

constexpr char kRetryAfterPayload[] = "type.loradb.dev/retry_after_ms";

}  // namespace

std::optional<absl::Duration> RetryAfterHint(const absl::Status& status) {
  if (status.code() != absl::StatusCode::kResourceExhausted) return std::nullopt;
  auto payload = status.GetPayload(kRetryAfterPayload);
  if (!payload.has_value()) return std::nullopt;
  int64_t ms = 0;
  if (!absl::SimpleAtoi(std::string(*payload), &ms)) return std::nullopt;
  return absl::Milliseconds(ms);
}

CpuLease& CpuLease::operator=(CpuLease&& other) noexcept {
  if (this != &other) {
    Release();
    cache_ = other.cache_;
    revision_ = other.revision_;
    data_ = std::move(other.data_);
    other.cache_ = nullptr;
  }
  return *this;
}

void CpuLease::Release() {
  if (cache_ == nullptr) return;
  CpuCache* cache = cache_;
  cache_ = nullptr;
  data_.reset();
  cache->Release(revision_);
}

CpuCache::CpuCache(CpuCacheOptions options, AdapterLoadFn load)
    : options_(std::move(options)), load_(std::move(load)), pool_account_(options_.budget_bytes) {
  MutexLock lock(&mu_);
  policy_ = MakeEvictionPolicy(options_.policy, options_.budget_bytes, options_.expected_entries);
}

absl::StatusOr<std::unique_ptr<CpuCache>> CpuCache::Create(CpuCacheOptions options,
                                                           AdapterLoadFn load) {
  if (options.budget_bytes == 0) return absl::InvalidArgumentError("cpu cache budget is zero");
  if (options.max_inflight_loads == 0) {
    return absl::InvalidArgumentError("cpu cache max_inflight_loads is zero");
  }
  if (!load) return absl::InvalidArgumentError("cpu cache needs a load function");
  std::unique_ptr<CpuCache> cache(new CpuCache(std::move(options), std::move(load)));
  for (unsigned i = 0; i < cache->options_.max_inflight_loads; ++i) {
    cache->workers_.emplace_back([c = cache.get()] { c->WorkerLoop(); });
  }
  return cache;
}

CpuCache::~CpuCache() {
  {
    MutexLock lock(&mu_);
    stop_ = true;
    for (const auto& [prio, seq, rev] : queue_) {
      auto it = loads_.find(rev);
      if (it == loads_.end()) continue;
      it->second->done = true;
      it->second->status = absl::CancelledError("cpu cache is shutting down");
      loads_.erase(it);
    }
    queue_.clear();
  }
  for (auto& t : workers_) t.join();
}

std::optional<absl::Status> CpuCache::NegativeLookup(uint64_t revision) {
  auto it = negative_.find(revision);
  if (it == negative_.end()) return std::nullopt;
  if (Now() >= it->second.expires) {
    negative_.erase(it);
    return std::nullopt;
  }
  stats_.negative_hits++;
  return it->second.status;
}

absl::StatusOr<std::shared_ptr<CpuCache::Load>> CpuCache::StartLoad(uint64_t revision,
                                                                    LoadPriority priority) {
  uint64_t pending = loads_.size();
  uint64_t bound = uint64_t{options_.max_inflight_loads} + options_.max_queued_loads;
  if (pending >= bound) {
    stats_.rejections++;
    // Expected wait: the queue ahead of us drains max_inflight_loads at a time, each load
    // taking about the mean load latency seen so far (100 ms before the first one).
    absl::Duration per_load =
        stats_.load_latency.count() > 0 ? stats_.load_latency.mean() : absl::Milliseconds(100);
    uint64_t rounds = (pending - running_) / options_.max_inflight_loads + 1;
    int64_t hint_ms = std::max<int64_t>(1, absl::ToInt64Milliseconds(per_load * rounds));
    absl::Status st = absl::ResourceExhaustedError(
        absl::StrCat("cpu cache: ", pending, " adapter loads pending (", running_,
                     " running, bound ", bound, "); retry after ", hint_ms, " ms"));
    st.SetPayload(kRetryAfterPayload, absl::Cord(absl::StrCat(hint_ms)));
    return st;
  }
  auto load = std::make_shared<Load>();
  load->revision = revision;
  load->priority = priority;
  load->seq = next_seq_++;
  loads_[revision] = load;
  queue_.insert({static_cast<int>(priority), load->seq, revision});
  return load;
}

void CpuCache::RaisePriority(Load& load, LoadPriority priority) {
  if (load.running || static_cast<int>(priority) >= static_cast<int>(load.priority)) return;
  queue_.erase({static_cast<int>(load.priority), load.seq, load.revision});
  load.priority = priority;
  queue_.insert({static_cast<int>(priority), load.seq, load.revision});
}

absl::StatusOr<CpuLease> CpuCache::Acquire(uint64_t revision, LoadPriority priority,
                                           std::optional<absl::Duration> timeout) {
  MutexLock lock(&mu_);
  policy_->RecordAccess(revision);
  if (auto it = entries_.find(revision); it != entries_.end()) {
    stats_.hits++;
    policy_->Touch(revision);
    if (it->second.leases++ == 0) stats_.leased_bytes += it->second.bytes;
    return CpuLease(this, revision, it->second.data);
  }
  if (auto neg = NegativeLookup(revision)) return *neg;
  stats_.misses++;
  std::shared_ptr<Load> load;
  if (auto it = loads_.find(revision); it != loads_.end()) {
    load = it->second;
    stats_.joined_waiters++;
    RaisePriority(*load, priority);
  } else {
    auto started = StartLoad(revision, priority);
    if (!started.ok()) return started.status();
    load = *std::move(started);
  }
  load->waiters++;
  auto done = [&load]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return load->done; };
  if (timeout.has_value()) {
    mu_.AwaitWithTimeout(done, *timeout);
  } else {
    mu_.Await(done);
  }
  if (!load->done) {
    load->waiters--;
    return absl::DeadlineExceededError(absl::StrCat("revision ", revision, " still loading after ",
                                                    absl::FormatDuration(*timeout)));
  }
  if (!load->status.ok()) return load->status;
  // The load pre-charged one lease per waiter, so the entry cannot have gone away.
  auto it = entries_.find(revision);
  return CpuLease(this, revision, it->second.data);
}

absl::Status CpuCache::Prefetch(uint64_t revision, LoadPriority priority) {
  MutexLock lock(&mu_);
  if (entries_.contains(revision)) return absl::OkStatus();
  if (auto it = loads_.find(revision); it != loads_.end()) {
    RaisePriority(*it->second, priority);
    return absl::OkStatus();
  }
  if (auto neg = NegativeLookup(revision)) return *neg;
  auto started = StartLoad(revision, priority);
  if (!started.ok()) return started.status();
  stats_.prefetches++;
  return absl::OkStatus();
}

void CpuCache::WorkerLoop() {
  while (true) {
    std::shared_ptr<Load> load;
    {
      MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || !queue_.empty(); };
      mu_.Await(ready);
      if (stop_) return;
      auto [prio, seq, rev] = *queue_.begin();
      queue_.erase(queue_.begin());
      load = loads_.at(rev);
      load->running = true;
      running_++;
    }
    absl::Time start = absl::Now();
    absl::StatusOr<std::shared_ptr<const CachedAdapter>> result = load_(load->revision);
    absl::Duration took = absl::Now() - start;
    if (result.ok() && *result == nullptr) {
      result = absl::InternalError("adapter load function returned null");
    }
    std::vector<std::shared_ptr<const CachedAdapter>> garbage;
    ReleasedHostBuffers released;
    {
      MutexLock lock(&mu_);
      running_--;
      loads_.erase(load->revision);
      stats_.load_latency.Record(took);
      if (result.ok()) {
        // Moved, not copied: once the waiters wake, the entry holds the only reference, so an
        // eviction frees (or pools) the buffer at once rather than when this thread loops.
        Entry e;
        e.data = *std::move(result);
        e.bytes = e.data->bytes;
        e.leases = load->waiters;
        entries_[load->revision] = e;
        policy_->Insert(load->revision, e.bytes);
        stats_.loads++;
        stats_.bytes_in += e.bytes;
        stats_.resident_bytes += e.bytes;
        stats_.resident_entries++;
        if (e.leases > 0) stats_.leased_bytes += e.bytes;
        EvictOverBudget(&garbage, &released);
      } else {
        load->status = result.status();
        stats_.load_failures++;
        if (options_.negative_ttl > absl::ZeroDuration()) {
          negative_[load->revision] = {result.status(), Now() + options_.negative_ttl};
        }
      }
      load->done = true;
    }
  }
}

void CpuCache::RemoveEntry(uint64_t revision,
                           std::vector<std::shared_ptr<const CachedAdapter>>* garbage) {
  auto it = entries_.find(revision);
  stats_.resident_bytes -= it->second.bytes;
  stats_.resident_entries--;
  stats_.evictions++;
  stats_.bytes_out += it->second.bytes;
  garbage->push_back(std::move(it->second.data));
  entries_.erase(it);
}

void CpuCache::EvictOverBudget(std::vector<std::shared_ptr<const CachedAdapter>>* garbage,
                               ReleasedHostBuffers* released) {
  while (stats_.resident_bytes > options_.budget_bytes) {
    std::optional<uint64_t> victim = policy_->EvictOne([this](uint64_t key) {
      mu_.AssertHeld();
      auto it = entries_.find(key);
      return it != entries_.end() && it->second.leases == 0;
    });
    if (!victim.has_value()) break;  // everything left is leased
    RemoveEntry(*victim, garbage);
  }
  UpdateOverBudget(released);
}

void CpuCache::UpdateOverBudget(ReleasedHostBuffers* released) {
  stats_.over_budget_bytes = stats_.resident_bytes > options_.budget_bytes
                                 ? stats_.resident_bytes - options_.budget_bytes
                                 : 0;
  stats_.peak_over_budget_bytes = std::max(stats_.peak_over_budget_bytes, stats_.over_budget_bytes);
  pool_account_.SetCharged(stats_.resident_bytes, released);
}

void CpuCache::Release(uint64_t revision) {
  std::vector<std::shared_ptr<const CachedAdapter>> garbage;
  ReleasedHostBuffers released;
  MutexLock lock(&mu_);
  auto it = entries_.find(revision);
  if (it == entries_.end() || it->second.leases <= 0) return;  // cannot happen with RAII leases
  if (--it->second.leases == 0) {
    stats_.leased_bytes -= it->second.bytes;
    if (stats_.resident_bytes > options_.budget_bytes) EvictOverBudget(&garbage, &released);
  }
  // `garbage` and `released` are destroyed after the lock is released (declared before `lock`).
}

absl::Status CpuCache::Evict(uint64_t revision) {
  std::vector<std::shared_ptr<const CachedAdapter>> garbage;
  ReleasedHostBuffers released;
  MutexLock lock(&mu_);
  auto it = entries_.find(revision);
  if (it == entries_.end()) {
    if (loads_.contains(revision)) {
      return absl::FailedPreconditionError(absl::StrCat("revision ", revision, " is loading"));
    }
    return absl::NotFoundError(absl::StrCat("revision ", revision, " is not in the cpu cache"));
  }
  if (it->second.leases > 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("revision ", revision, " has ", it->second.leases, " lease(s)"));
  }
  policy_->Erase(revision);
  RemoveEntry(revision, &garbage);
  UpdateOverBudget(&released);
  return absl::OkStatus();
}

void CpuCache::ClearNegative(uint64_t revision) {
  MutexLock lock(&mu_);
  negative_.erase(revision);
}

CpuResidency CpuCache::Find(uint64_t revision) const {
  MutexLock lock(&mu_);
  CpuResidency r;
  if (auto it = entries_.find(revision); it != entries_.end()) {
    r.state = CpuResidency::State::kResident;
    r.leases = it->second.leases;
    r.bytes = it->second.bytes;
  } else if (loads_.contains(revision)) {
    r.state = CpuResidency::State::kLoading;
  }
  return r;
}

CpuCacheStats CpuCache::stats() const {
  MutexLock lock(&mu_);
  CpuCacheStats s = stats_;
  s.inflight_loads = running_;
  s.queued_loads = queue_.size();
  const HostBufferPoolStats pool = GetHostBufferPoolStats();
  s.pooled_bytes = pool.bytes;
  s.pool_cap_bytes = pool.cap;
  return s;
}

}  // namespace loradb::tiers
