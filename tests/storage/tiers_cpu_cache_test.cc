#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "storage/tiers/cpu_cache.h"
#include "storage/util/mutex.h"

namespace loradb::tiers {
namespace {

// An adapter of `bytes` bytes whose one tensor is filled with the low byte of `revision`.
std::shared_ptr<const CachedAdapter> FakeAdapter(uint64_t revision, uint64_t bytes) {
  auto buf = std::make_shared<std::vector<std::byte>>(bytes, std::byte(revision & 0xff));
  auto a = std::make_shared<CachedAdapter>();
  a->tensors = TensorSet(buf);
  TensorView v;
  v.name = "w";
  v.dtype = DType::kU8;
  v.shape = {static_cast<int64_t>(bytes)};
  v.data = buf->data();
  v.nbytes = bytes;
  EXPECT_TRUE(a->tensors.Add(v).ok());
  a->bytes = bytes;
  return a;
}

// Waits (spinning politely) until `pred` holds; tests use it to line threads up, never to time.
template <typename Pred>
void WaitFor(Pred pred) {
  while (!pred()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

// A load function whose loads block until Open(); records the order of loads.
class GatedLoader {
 public:
  explicit GatedLoader(uint64_t bytes = 100) : bytes_(bytes) {}
  AdapterLoadFn fn() {
    return [this](uint64_t rev) -> absl::StatusOr<std::shared_ptr<const CachedAdapter>> {
      {
        MutexLock lock(&mu_);
        order_.push_back(rev);
        mu_.Await([this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return open_; });
      }
      calls_.fetch_add(1);
      if (fail_) return absl::DataLossError("corrupt blob (injected)");
      return FakeAdapter(rev, bytes_);
    };
  }
  void Open() {
    MutexLock lock(&mu_);
    open_ = true;
  }
  std::vector<uint64_t> order() {
    MutexLock lock(&mu_);
    return order_;
  }
  size_t started() {
    MutexLock lock(&mu_);
    return order_.size();
  }
  int calls() const { return calls_.load(); }
  void set_fail(bool f) { fail_ = f; }

 private:
  uint64_t bytes_;
  Mutex mu_;
  bool open_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<uint64_t> order_ ABSL_GUARDED_BY(mu_);
  std::atomic<int> calls_{0};
  std::atomic<bool> fail_{false};
};

AdapterLoadFn Immediate(uint64_t bytes, std::atomic<int>* calls = nullptr) {
  return [bytes, calls](uint64_t rev) -> absl::StatusOr<std::shared_ptr<const CachedAdapter>> {
    if (calls != nullptr) calls->fetch_add(1);
    return FakeAdapter(rev, bytes);
  };
}

TEST(CpuCacheTest, MissLoadsThenHits) {
  std::atomic<int> calls{0};
  auto cache = CpuCache::Create({}, Immediate(100, &calls));
  ASSERT_TRUE(cache.ok());
  {
    auto a = (*cache)->Acquire(7);
    ASSERT_TRUE(a.ok()) << a.status();
    EXPECT_EQ(a->revision(), 7u);
    EXPECT_EQ(a->tensors().Find("w")->data[0], std::byte(7));
    auto b = (*cache)->Acquire(7);
    ASSERT_TRUE(b.ok());
    EXPECT_EQ((*cache)->Find(7).leases, 2);
  }
  EXPECT_EQ((*cache)->Find(7).leases, 0);
  EXPECT_EQ((*cache)->Find(7).state, CpuResidency::State::kResident);
  CpuCacheStats s = (*cache)->stats();
  EXPECT_EQ(s.hits, 1u);
  EXPECT_EQ(s.misses, 1u);
  EXPECT_EQ(s.loads, 1u);
  EXPECT_EQ(s.bytes_in, 100u);
  EXPECT_EQ(s.resident_bytes, 100u);
  EXPECT_EQ(s.leased_bytes, 0u);
  EXPECT_EQ(s.load_latency.count(), 1u);
  EXPECT_EQ(calls.load(), 1);
}

TEST(CpuCacheTest, RejectsBadOptions) {
  CpuCacheOptions o;
  o.budget_bytes = 0;
  EXPECT_EQ(CpuCache::Create(o, Immediate(1)).status().code(), absl::StatusCode::kInvalidArgument);
  o = {};
  o.max_inflight_loads = 0;
  EXPECT_EQ(CpuCache::Create(o, Immediate(1)).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CpuCache::Create({}, nullptr).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(CpuCacheTest, SingleFlightMakesExactlyOneLoad) {
  GatedLoader gate;
  auto cache = CpuCache::Create({}, gate.fn());
  ASSERT_TRUE(cache.ok());
  constexpr int kWaiters = 32;
  std::vector<std::thread> threads;
  std::vector<const std::byte*> seen(kWaiters, nullptr);
  for (int i = 0; i < kWaiters; ++i) {
    threads.emplace_back([&, i] {
      auto lease = (*cache)->Acquire(42);
      ASSERT_TRUE(lease.ok()) << lease.status();
      seen[i] = lease->tensors().Find("w")->data;
    });
  }
  WaitFor([&] { return (*cache)->stats().misses == kWaiters; });
  gate.Open();
  for (auto& t : threads) t.join();
  CpuCacheStats s = (*cache)->stats();
  EXPECT_EQ(gate.calls(), 1);
  EXPECT_EQ(s.loads, 1u);
  EXPECT_EQ(s.joined_waiters, static_cast<uint64_t>(kWaiters - 1));
  for (auto* p : seen) EXPECT_EQ(p, seen[0]);  // everyone got the same bytes
  EXPECT_EQ(s.leased_bytes, 0u);
}

TEST(CpuCacheTest, SingleFlightShareTheSameError) {
  GatedLoader gate;
  gate.set_fail(true);
  auto cache = CpuCache::Create({}, gate.fn());
  ASSERT_TRUE(cache.ok());
  constexpr int kWaiters = 16;
  std::vector<std::thread> threads;
  std::vector<absl::Status> errors(kWaiters);
  for (int i = 0; i < kWaiters; ++i) {
    threads.emplace_back([&, i] { errors[i] = (*cache)->Acquire(5).status(); });
  }
  WaitFor([&] { return (*cache)->stats().misses == kWaiters; });
  gate.Open();
  for (auto& t : threads) t.join();
  for (const auto& e : errors) {
    EXPECT_EQ(e.code(), absl::StatusCode::kDataLoss);
    EXPECT_EQ(e, errors[0]);
  }
  EXPECT_EQ(gate.calls(), 1);
  EXPECT_EQ((*cache)->stats().load_failures, 1u);
  EXPECT_EQ((*cache)->Find(5).state, CpuResidency::State::kAbsent);
}

TEST(CpuCacheTest, BackpressureRejectsImmediatelyWithRetryHint) {
  GatedLoader gate;
  CpuCacheOptions o;
  o.max_inflight_loads = 1;
  o.max_queued_loads = 2;
  auto cache = CpuCache::Create(o, gate.fn());
  ASSERT_TRUE(cache.ok());
  ASSERT_TRUE((*cache)->Prefetch(1).ok());
  ASSERT_TRUE((*cache)->Prefetch(2).ok());
  ASSERT_TRUE((*cache)->Prefetch(3).ok());
  // All three loads are pending behind a closed gate: a fourth distinct load is refused, from
  // this thread, without waiting (the test would hang here otherwise).
  auto rejected = (*cache)->Acquire(4);
  ASSERT_EQ(rejected.status().code(), absl::StatusCode::kResourceExhausted);
  auto hint = RetryAfterHint(rejected.status());
  ASSERT_TRUE(hint.has_value());
  EXPECT_GT(*hint, absl::ZeroDuration());
  EXPECT_EQ((*cache)->Prefetch(5).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_FALSE(RetryAfterHint(absl::InternalError("x")).has_value());
  // Joining a pending load is not a new load: allowed.
  ASSERT_TRUE((*cache)->Prefetch(2).ok());
  EXPECT_EQ((*cache)->stats().rejections, 2u);
  gate.Open();
  WaitFor([&] { return (*cache)->stats().loads == 3; });
  auto later = (*cache)->Acquire(4);
  EXPECT_TRUE(later.ok()) << later.status();
}

TEST(CpuCacheTest, DecodeLoadsRunBeforePrefetches) {
  GatedLoader gate;
  CpuCacheOptions o;
  o.max_inflight_loads = 1;
  auto cache = CpuCache::Create(o, gate.fn());
  ASSERT_TRUE(cache.ok());
  ASSERT_TRUE((*cache)->Prefetch(100).ok());
  WaitFor([&] { return gate.started() == 1; });  // 100 occupies the only loader thread
  ASSERT_TRUE((*cache)->Prefetch(1).ok());
  ASSERT_TRUE((*cache)->Prefetch(2).ok());
  ASSERT_TRUE((*cache)->Prefetch(3).ok());
  std::thread decode([&] { EXPECT_TRUE((*cache)->Acquire(4, LoadPriority::kDecode).ok()); });
  // A decode request joining a queued prefetch raises it too.
  std::thread raise([&] { EXPECT_TRUE((*cache)->Acquire(3, LoadPriority::kDecode).ok()); });
  WaitFor([&] { return (*cache)->stats().misses == 2; });
  gate.Open();
  decode.join();
  raise.join();
  WaitFor([&] { return (*cache)->stats().loads == 5; });
  // 3 (raised to decode, queued before 4) and 4 overtake the prefetches 1 and 2.
  EXPECT_EQ(gate.order(), (std::vector<uint64_t>{100, 3, 4, 1, 2}));
}

TEST(CpuCacheTest, FailedLoadsAreRememberedForTheTtl) {
  std::atomic<int> calls{0};
  absl::Time now = absl::FromUnixSeconds(1000);
  Mutex clock_mu;
  CpuCacheOptions o;
  o.negative_ttl = absl::Seconds(5);
  o.clock = [&] {
    MutexLock lock(&clock_mu);
    return now;
  };
  auto cache =
      CpuCache::Create(o, [&](uint64_t) -> absl::StatusOr<std::shared_ptr<const CachedAdapter>> {
        calls.fetch_add(1);
        return absl::NotFoundError("blob missing");
      });
  ASSERT_TRUE(cache.ok());
  EXPECT_EQ((*cache)->Acquire(9).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ((*cache)->Acquire(9).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ((*cache)->Prefetch(9).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(calls.load(), 1);
  EXPECT_EQ((*cache)->stats().negative_hits, 2u);
  {
    MutexLock lock(&clock_mu);
    now += absl::Seconds(6);
  }
  EXPECT_EQ((*cache)->Acquire(9).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(calls.load(), 2);
  (*cache)->ClearNegative(9);
  EXPECT_EQ((*cache)->Acquire(9).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(calls.load(), 3);
}

TEST(CpuCacheTest, OverBudgetOnlyByLeasedBytes) {
  CpuCacheOptions o;
  o.budget_bytes = 300;
  o.policy = EvictionPolicyKind::kLru;
  auto cache = CpuCache::Create(o, Immediate(100));
  ASSERT_TRUE(cache.ok());
  std::vector<CpuLease> leases;
  for (uint64_t r = 1; r <= 5; ++r) {
    auto l = (*cache)->Acquire(r);
    ASSERT_TRUE(l.ok());
    leases.push_back(*std::move(l));
  }
  CpuCacheStats s = (*cache)->stats();
  EXPECT_EQ(s.resident_bytes, 500u);
  EXPECT_EQ(s.leased_bytes, 500u);
  EXPECT_EQ(s.over_budget_bytes, 200u);
  EXPECT_EQ(s.evictions, 0u);
  leases.clear();
  s = (*cache)->stats();
  EXPECT_EQ(s.resident_bytes, 300u);
  EXPECT_EQ(s.over_budget_bytes, 0u);
  EXPECT_EQ(s.peak_over_budget_bytes, 200u);
  EXPECT_EQ(s.evictions, 2u);
  EXPECT_EQ(s.bytes_out, 200u);
  // LRU: the first two released were the oldest.
  EXPECT_EQ((*cache)->Find(1).state, CpuResidency::State::kAbsent);
  EXPECT_EQ((*cache)->Find(2).state, CpuResidency::State::kAbsent);
  EXPECT_EQ((*cache)->Find(5).state, CpuResidency::State::kResident);
}

TEST(CpuCacheTest, EvictByRevision) {
  auto cache = CpuCache::Create({}, Immediate(10));
  ASSERT_TRUE(cache.ok());
  EXPECT_EQ((*cache)->Evict(1).code(), absl::StatusCode::kNotFound);
  {
    auto l = (*cache)->Acquire(1);
    ASSERT_TRUE(l.ok());
    EXPECT_EQ((*cache)->Evict(1).code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_EQ((*cache)->Find(1).state, CpuResidency::State::kResident);
  }
  EXPECT_TRUE((*cache)->Evict(1).ok());
  EXPECT_EQ((*cache)->Find(1).state, CpuResidency::State::kAbsent);
  EXPECT_EQ((*cache)->stats().resident_bytes, 0u);
}

TEST(CpuCacheTest, AcquireTimeoutLeavesTheLoadRunning) {
  GatedLoader gate;
  auto cache = CpuCache::Create({}, gate.fn());
  ASSERT_TRUE(cache.ok());
  auto r = (*cache)->Acquire(3, LoadPriority::kDecode, absl::Milliseconds(1));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ((*cache)->Find(3).state, CpuResidency::State::kLoading);
  gate.Open();
  WaitFor([&] { return (*cache)->stats().loads == 1; });
  EXPECT_EQ((*cache)->Find(3).leases, 0);  // the timed-out waiter holds nothing
}

TEST(CpuCacheTest, ShutdownCancelsQueuedLoads) {
  GatedLoader gate;
  CpuCacheOptions o;
  o.max_inflight_loads = 1;
  auto cache = CpuCache::Create(o, gate.fn());
  ASSERT_TRUE(cache.ok());
  ASSERT_TRUE((*cache)->Prefetch(1).ok());
  WaitFor([&] { return gate.started() == 1; });
  ASSERT_TRUE((*cache)->Prefetch(2).ok());
  gate.Open();
  cache->reset();  // must not hang; 2 may or may not have run
  SUCCEED();
}

// Many threads acquire and release random revisions under a budget that holds a quarter of
// them, with a quarter of the loads failing, for every policy. Checks lease contents and the
// accounting invariants; run under TSan by `tools/dev test --tsan`.
class CpuCacheStressTest : public ::testing::TestWithParam<EvictionPolicyKind> {};

TEST_P(CpuCacheStressTest, RandomAcquireReleaseWithFailures) {
  constexpr uint64_t kBytes = 64;
  constexpr uint64_t kRevisions = 48;
  CpuCacheOptions o;
  o.policy = GetParam();
  o.budget_bytes = kBytes * kRevisions / 4;
  o.max_inflight_loads = 3;
  o.max_queued_loads = 4;
  o.negative_ttl = absl::Microseconds(200);
  std::atomic<uint64_t> attempts{0};
  auto cache = CpuCache::Create(
      o, [&](uint64_t rev) -> absl::StatusOr<std::shared_ptr<const CachedAdapter>> {
        uint64_t n = attempts.fetch_add(1);
        if ((rev * 7 + n) % 4 == 0) return absl::UnavailableError("injected failure");
        return FakeAdapter(rev, kBytes);
      });
  ASSERT_TRUE(cache.ok());
  std::atomic<uint64_t> ok{0}, failed{0}, rejected{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(t);
      std::vector<CpuLease> held;
      for (int i = 0; i < 1500; ++i) {
        uint64_t rev = rng() % kRevisions;
        int op = static_cast<int>(rng() % 10);
        if (op == 0) {
          (void)(*cache)->Prefetch(rev);
        } else if (op == 1) {
          absl::Status st = (*cache)->Evict(rev);
          EXPECT_TRUE(st.ok() || absl::IsNotFound(st) || absl::IsFailedPrecondition(st)) << st;
        } else {
          auto lease =
              (*cache)->Acquire(rev, rng() % 2 ? LoadPriority::kDecode : LoadPriority::kPrefetch);
          if (lease.ok()) {
            ok++;
            const TensorView* w = lease->tensors().Find("w");
            ASSERT_NE(w, nullptr);
            ASSERT_EQ(w->data[0], std::byte(rev & 0xff));
            ASSERT_EQ(w->data[kBytes - 1], std::byte(rev & 0xff));
            held.push_back(*std::move(lease));
          } else if (absl::IsResourceExhausted(lease.status())) {
            rejected++;
          } else {
            ASSERT_EQ(lease.status().code(), absl::StatusCode::kUnavailable) << lease.status();
            failed++;
          }
        }
        if (held.size() > 3 || (!held.empty() && rng() % 3 == 0)) {
          held.erase(held.begin() + static_cast<ptrdiff_t>(rng() % held.size()));
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  CpuCacheStats s = (*cache)->stats();
  EXPECT_GT(ok.load(), 0u);
  EXPECT_GT(failed.load(), 0u);
  EXPECT_GT(s.evictions, 0u);
  EXPECT_EQ(s.leased_bytes, 0u);
  EXPECT_LE(s.resident_bytes, o.budget_bytes);
  EXPECT_EQ(s.resident_bytes, s.resident_entries * kBytes);
  EXPECT_EQ(s.bytes_in - s.bytes_out, s.resident_bytes);
  EXPECT_EQ(s.loads + s.load_failures, attempts.load());
  EXPECT_GE(s.rejections, rejected.load());  // Prefetch rejections count too
}

INSTANTIATE_TEST_SUITE_P(Policies, CpuCacheStressTest,
                         ::testing::Values(EvictionPolicyKind::kLru, EvictionPolicyKind::kS3Fifo,
                                           EvictionPolicyKind::kWTinyLfu),
                         [](const auto& info) { return EvictionPolicyName(info.param); });

}  // namespace
}  // namespace loradb::tiers
