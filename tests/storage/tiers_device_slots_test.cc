#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <random>
#include <set>
#include <thread>
#include <vector>

#include "storage/tiers/device_slots.h"

namespace loradb::tiers {
namespace {

constexpr int64_t kHidden = 64;

// Rank of revision `rev` in these tests: 1..16, so adapters differ in size.
int64_t RankOf(uint64_t rev) { return static_cast<int64_t>(rev % 16) + 1; }

// A LoRA-shaped adapter: two modules, each A [r, hidden] and B [hidden, r] (f32), with
// deterministic contents, in one buffer with 64-byte aligned tensors.
std::shared_ptr<const CachedAdapter> LoraAdapter(uint64_t rev) {
  int64_t r = RankOf(rev);
  std::vector<std::pair<std::string, std::vector<int64_t>>> shapes = {{"q.lora_A", {r, kHidden}},
                                                                      {"q.lora_B", {kHidden, r}},
                                                                      {"v.lora_A", {r, kHidden}},
                                                                      {"v.lora_B", {kHidden, r}}};
  uint64_t total = 0;
  for (auto& s : shapes)
    total += (static_cast<uint64_t>(s.second[0] * s.second[1]) * 4 + 63) / 64 * 64;
  auto buf = std::make_shared<std::vector<std::byte>>(total);
  for (size_t i = 0; i < buf->size(); ++i) (*buf)[i] = std::byte((rev * 31 + i * 7) & 0xff);
  auto a = std::make_shared<CachedAdapter>();
  a->tensors = TensorSet(buf);
  uint64_t off = 0;
  for (auto& [name, shape] : shapes) {
    TensorView v;
    v.name = name;
    v.dtype = DType::kF32;
    v.shape = shape;
    v.data = buf->data() + off;
    v.nbytes = static_cast<uint64_t>(shape[0] * shape[1]) * 4;
    EXPECT_TRUE(a->tensors.Add(v).ok());
    off += (v.nbytes + 63) / 64 * 64;
  }
  a->tensors.metadata()["r"] = std::to_string(r);
  a->tensors.metadata()["lora_alpha"] = "16";
  a->bytes = total;
  return a;
}

// Checks every device tensor of `a` against the host adapter it came from.
void ExpectSameBytes(const DeviceBackend& backend, const DeviceAdapter& a) {
  auto host = LoraAdapter(a.revision);
  ASSERT_EQ(a.tensors.size(), host->tensors.size());
  for (const TensorView& v : host->tensors.tensors()) {
    const DeviceTensor* d = a.Find(v.name);
    ASSERT_NE(d, nullptr) << v.name;
    EXPECT_EQ(d->shape, v.shape);
    EXPECT_EQ(d->dtype, v.dtype);
    ASSERT_EQ(d->nbytes, v.nbytes);
    std::vector<std::byte> back(v.nbytes);
    ASSERT_TRUE(
        const_cast<DeviceBackend&>(backend).CopyToHost(back.data(), d->data, v.nbytes).ok());
    EXPECT_EQ(std::memcmp(back.data(), v.data, v.nbytes), 0)
        << "revision " << a.revision << " tensor " << v.name;
  }
}

struct Tiers {
  std::unique_ptr<CpuCache> cache;
  std::unique_ptr<DeviceSlots> slots;
};

Tiers Make(uint64_t arena_bytes, uint64_t page_bytes = 4096,
           std::unique_ptr<DeviceBackend> backend = MakeHostBackend(),
           AdapterLoadFn load = nullptr) {
  Tiers t;
  CpuCacheOptions co;
  co.budget_bytes = 1 << 20;
  co.negative_ttl = absl::ZeroDuration();
  if (!load) {
    load = [](uint64_t rev) -> absl::StatusOr<std::shared_ptr<const CachedAdapter>> {
      return LoraAdapter(rev);
    };
  }
  t.cache = *CpuCache::Create(co, std::move(load));
  DeviceSlotsOptions o;
  o.arena_bytes = arena_bytes;
  o.page_bytes = page_bytes;
  o.max_chunk_bytes = 8192;
  auto slots = DeviceSlots::Create(o, t.cache.get(), std::move(backend));
  EXPECT_TRUE(slots.ok()) << slots.status();
  if (slots.ok()) t.slots = std::move(*slots);
  return t;
}

TEST(DeviceSlotsTest, BatchOf64DistinctAdaptersWithMixedRanks) {
  Tiers t = Make(16 << 20);
  std::vector<uint64_t> batch;
  for (uint64_t r = 1000; r < 1064; ++r) batch.push_back(r);
  batch.push_back(1000);  // duplicates collapse
  auto lease = t.slots->AcquireBatch(batch);
  ASSERT_TRUE(lease.ok()) << lease.status();
  ASSERT_EQ(lease->size(), 64u);
  std::set<uint32_t> slot_ids;
  uint64_t pages = 0, payload = 0;
  for (size_t i = 0; i < lease->size(); ++i) {
    const DeviceAdapter& a = (*lease)[i];
    EXPECT_EQ(a.revision, batch[i]);
    slot_ids.insert(a.slot);
    pages += a.pages;
    payload += a.bytes;
    EXPECT_EQ(a.metadata.at("r"), std::to_string(RankOf(a.revision)));
    ExpectSameBytes(t.slots->backend(), a);
    EXPECT_EQ(t.slots->Find(a.revision).slot, a.slot);
    EXPECT_EQ(t.slots->Find(a.revision).leases, 1);
  }
  EXPECT_EQ(slot_ids.size(), 64u);
  DeviceSlotsStats s = t.slots->stats();
  EXPECT_EQ(s.misses, 64u);
  EXPECT_EQ(s.resident_adapters, 64u);
  EXPECT_EQ(s.leased_adapters, 64u);
  EXPECT_EQ(s.pages_total - s.pages_free, pages);
  EXPECT_EQ(s.payload_bytes, payload);
  // No padding to the largest rank: 64 rank-16 adapters would need far more pages.
  auto max_rank = LoraAdapter(15);  // rank 16
  EXPECT_LT(pages, 64 * ((max_rank->bytes + 4095) / 4096));
  EXPECT_EQ(s.page_waste_bytes, pages * 4096 - payload);
  lease->Release();
  EXPECT_EQ(t.slots->stats().leased_adapters, 0u);
  EXPECT_EQ(t.slots->Find(1000).leases, 0);
  // A second batch is all hits.
  auto again = t.slots->AcquireBatch(batch);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(t.slots->stats().hits, 64u);
}

TEST(DeviceSlotsTest, UnleasedAdaptersAreEvictedLeastRecentlyUsedFirst) {
  uint64_t one = (LoraAdapter(15)->bytes + 4095) / 4096 * 4096;  // a rank-16 adapter's pages
  Tiers t = Make(3 * one);
  for (uint64_t r : {15, 31, 47}) {  // all rank 16
    auto l = t.slots->AcquireBatch(std::vector<uint64_t>{r});
    ASSERT_TRUE(l.ok()) << l.status();
  }
  { auto touch = t.slots->AcquireBatch(std::vector<uint64_t>{15}); }
  auto l = t.slots->AcquireBatch(std::vector<uint64_t>{63});
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_FALSE(t.slots->Find(31).resident);  // least recently used
  EXPECT_TRUE(t.slots->Find(15).resident);
  EXPECT_TRUE(t.slots->Find(47).resident);
  EXPECT_EQ(t.slots->stats().evictions, 1u);
}

TEST(DeviceSlotsTest, BatchThatCannotFitIsAClearErrorAndPinsNothing) {
  uint64_t one = (LoraAdapter(15)->bytes + 4095) / 4096 * 4096;
  Tiers t = Make(3 * one);
  auto held = t.slots->AcquireBatch(std::vector<uint64_t>{15, 31});
  ASSERT_TRUE(held.ok());
  auto too_big = t.slots->AcquireBatch(std::vector<uint64_t>{47, 63});
  ASSERT_EQ(too_big.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(too_big.status().message().find("not leased"), absl::string_view::npos)
      << too_big.status();
  EXPECT_EQ(t.slots->stats().leased_adapters, 2u);
  EXPECT_EQ(t.slots->stats().batch_failures, 1u);
  // The two leased adapters were not touched; one more fits.
  auto ok = t.slots->AcquireBatch(std::vector<uint64_t>{47, 15});
  ASSERT_TRUE(ok.ok()) << ok.status();
  ExpectSameBytes(t.slots->backend(), *ok->Find(47));
  held->Release();
  ok->Release();
  EXPECT_EQ(t.slots->stats().leased_adapters, 0u);
}

TEST(DeviceSlotsTest, LoadErrorsNameTheRevisionAndPinNothing) {
  Tiers t = Make(1 << 20, 4096, MakeHostBackend(),
                 [](uint64_t rev) -> absl::StatusOr<std::shared_ptr<const CachedAdapter>> {
                   if (rev == 13) return absl::DataLossError("corrupt blob");
                   return LoraAdapter(rev);
                 });
  auto r = t.slots->AcquireBatch(std::vector<uint64_t>{1, 13, 2});
  ASSERT_EQ(r.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(r.status().message().find("revision 13"), absl::string_view::npos);
  EXPECT_EQ(t.slots->stats().leased_adapters, 0u);
  EXPECT_EQ(t.slots->stats().resident_adapters, 0u);
  EXPECT_EQ(t.slots->AcquireBatch(std::vector<uint64_t>{}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(DeviceSlotsTest, FragmentationIsReportedAndHandled) {
  // Page 256 B; max chunk 8 KiB: a rank-1 adapter is ~1 KiB -> 4..5 pages in one chunk.
  Tiers t = Make(128 * 256, 256);
  std::vector<uint64_t> revs;
  std::vector<DeviceBatchLease> leases;
  for (uint64_t r = 0; r < 64; r += 16) {  // rank 1 each
    auto l = t.slots->AcquireBatch(std::vector<uint64_t>{r});
    ASSERT_TRUE(l.ok()) << l.status();
    revs.push_back(r);
    leases.push_back(*std::move(l));
  }
  leases[1].Release();
  leases[3].Release();
  ASSERT_TRUE(t.slots->Evict(revs[1]).ok());
  EXPECT_EQ(t.slots->Evict(revs[0]).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(t.slots->Evict(999).code(), absl::StatusCode::kNotFound);
  DeviceSlotsStats s = t.slots->stats();
  EXPECT_GT(s.fragmentation, 0.0);
  EXPECT_LT(s.largest_free_run, s.pages_free);
  // A rank-16 adapter (~16 KiB in two 8 KiB chunks) still fits once the LRU unleased one goes.
  auto big = t.slots->AcquireBatch(std::vector<uint64_t>{15});
  ASSERT_TRUE(big.ok()) << big.status();
  ExpectSameBytes(t.slots->backend(), *big->Find(15));
}

TEST(DeviceSlotsTest, BadOptions) {
  CpuCacheOptions co;
  auto cache =
      *CpuCache::Create(co, [](uint64_t) -> absl::StatusOr<std::shared_ptr<const CachedAdapter>> {
        return LoraAdapter(1);
      });
  DeviceSlotsOptions o;
  o.page_bytes = 1000;
  EXPECT_EQ(DeviceSlots::Create(o, cache.get(), MakeHostBackend()).status().code(),
            absl::StatusCode::kInvalidArgument);
  o = {};
  o.arena_bytes = 10;
  EXPECT_EQ(DeviceSlots::Create(o, cache.get(), MakeHostBackend()).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(DeviceSlots::Create({}, nullptr, MakeHostBackend()).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(DeviceSlotsTest, CudaBackend) {
  auto backend = MakeCudaBackend(0);
  if (!backend.ok()) GTEST_SKIP() << "no CUDA device: " << backend.status();
  Tiers t = Make(16 << 20, 4096, std::move(*backend));
  std::vector<uint64_t> batch;
  for (uint64_t r = 0; r < 64; ++r) batch.push_back(r);
  auto lease = t.slots->AcquireBatch(batch);
  ASSERT_TRUE(lease.ok()) << lease.status();
  for (size_t i = 0; i < lease->size(); ++i) ExpectSameBytes(t.slots->backend(), (*lease)[i]);
}

// Threads acquire random batches under an arena that holds about a third of the adapters,
// with injected load failures; checks contents and that nothing stays leased. Run under TSan.
TEST(DeviceSlotsStressTest, RandomBatchesUnderATightArena) {
  std::atomic<uint64_t> attempts{0};
  Tiers t = Make(24 * 4096 * 5, 4096, MakeHostBackend(),
                 [&](uint64_t rev) -> absl::StatusOr<std::shared_ptr<const CachedAdapter>> {
                   if ((rev + attempts.fetch_add(1)) % 5 == 0)
                     return absl::UnavailableError("injected");
                   return LoraAdapter(rev);
                 });
  std::atomic<int> ok{0}, failed{0};
  std::vector<std::thread> threads;
  for (int th = 0; th < 6; ++th) {
    threads.emplace_back([&, th] {
      std::mt19937_64 rng(th + 100);
      for (int i = 0; i < 150; ++i) {
        std::vector<uint64_t> batch;
        size_t n = 1 + rng() % 6;
        for (size_t k = 0; k < n; ++k) batch.push_back(rng() % 64);
        auto lease = t.slots->AcquireBatch(batch);
        if (!lease.ok()) {
          EXPECT_TRUE(absl::IsUnavailable(lease.status()) ||
                      absl::IsResourceExhausted(lease.status()))
              << lease.status();
          failed++;
          continue;
        }
        ok++;
        const DeviceAdapter& a = (*lease)[rng() % lease->size()];
        ExpectSameBytes(t.slots->backend(), a);
        if (rng() % 4 == 0) (void)t.slots->Evict(batch[0]);
      }
    });
  }
  for (auto& th : threads) th.join();
  DeviceSlotsStats s = t.slots->stats();
  EXPECT_GT(ok.load(), 0);
  EXPECT_GT(failed.load(), 0);
  EXPECT_GT(s.evictions, 0u);
  EXPECT_EQ(s.leased_adapters, 0u);
  EXPECT_EQ(s.batches, static_cast<uint64_t>(ok.load()));
  EXPECT_EQ(s.batch_failures, static_cast<uint64_t>(failed.load()));
}

}  // namespace
}  // namespace loradb::tiers
