// Lifecycles of what the tiers keep beside the catalog:
// - derived TP blobs (StoreTiersOptions::tp_derived_dir): a derived shard lives while its source
//   blob is referenced; DeleteRevision removes it once the blob's refcount is 0, StoreTiers::Open
//   sweeps what was left by processes without the directory, a crash mid-write leaves only a temp
//   file that is never served and is swept, and a bad derived file is refused, never served;
// - the host-buffer pool: its free buffers count against the CPU cache's budget, so resident +
//   pooled never exceeds the budget after a cache operation, and the pool gives way first.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "storage/formats/blob.h"
#include "storage/store/store.h"
#include "storage/store/store_tiers.h"
#include "storage/tiers/cpu_cache.h"
#include "storage/tiers/host_buffer.h"
#include "storage/tiers/tp_shard.h"
#include "storage/tiers/tp_shard_load.h"
#include "storage/util/fault_injection.h"
#include "tests/storage/host_buffer_pool_test_util.h"
#include "tests/test_util.h"

namespace loradb::tiers {
namespace {

using ::loradb::testing::TempDir;

constexpr uint64_t kMiB = uint64_t{1} << 20;

// A q_proj adapter (in 8, out 16) at rank 4 with values from `seed`: B splits by output rows.
struct QAdapter {
  std::vector<float> a, b;
  std::vector<TensorView> views;
  explicit QAdapter(float seed) {
    a.resize(4 * 8);
    b.resize(16 * 4);
    for (size_t i = 0; i < a.size(); ++i) a[i] = seed + static_cast<float>(i);
    for (size_t i = 0; i < b.size(); ++i) b[i] = seed - static_cast<float>(i);
    const std::string p = "base_model.model.model.layers.0.self_attn.q_proj.";
    views.push_back({p + "lora_A.weight",
                     DType::kF32,
                     {4, 8},
                     reinterpret_cast<const std::byte*>(a.data()),
                     a.size() * sizeof(float)});
    views.push_back({p + "lora_B.weight",
                     DType::kF32,
                     {16, 4},
                     reinterpret_cast<const std::byte*>(b.data()),
                     b.size() * sizeof(float)});
  }
};

bool Exists(const std::string& path) { return std::filesystem::exists(path); }

// Files under `dir` (recursively) whose name contains `part`.
int CountFiles(const std::string& dir, const std::string& part) {
  int n = 0;
  std::error_code ec;
  for (auto it = std::filesystem::recursive_directory_iterator(dir, ec);
       !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec)) {
    if (it->is_regular_file() && it->path().filename().string().find(part) != std::string::npos) {
      ++n;
    }
  }
  return n;
}

class DerivedShardLifecycleTest : public ::testing::Test {
 protected:
  // A store at `dir_/store`; with `tiers`, it owns TP-placed tiers (rank 0 of 2) with the derived
  // directory `derived_`.
  std::unique_ptr<Store> OpenStore(bool tiers) {
    StoreOptions so;
    if (tiers) so.tiers = TierOptions();
    auto s = Store::Open(dir_.file("store"), so);
    EXPECT_TRUE(s.ok()) << s.status();
    if (!s.ok()) return nullptr;
    if (!(*s)->GetBase("tiny").ok()) {
      EXPECT_TRUE(
          (*s)->AddBaseFromModuleTable("tiny", R"({"modules":[{"name":"layers.0.self_attn.q_proj",
                                      "in":8,"out":16}]})")
              .ok());
      EXPECT_TRUE((*s)->CreatePolicy("acme/tp", "tiny").ok());
    }
    return std::move(*s);
  }
  StoreTiersOptions TierOptions() const {
    StoreTiersOptions o;
    o.device = DeviceKind::kHost;
    o.slots.arena_bytes = 1 << 20;
    o.slots.page_bytes = 256;
    o.slots.tp = {0, 2};
    o.tp_derived_dir = derived_;
    return o;
  }
  RevisionRecord Publish(Store& store, const QAdapter& a) {
    PublishOptions o;
    o.lora.alpha = 8.0f;
    auto rev = store.PublishTensors("acme/tp", a.views, o);
    EXPECT_TRUE(rev.ok()) << rev.status();
    return rev.ok() ? *rev : RevisionRecord{};
  }
  // Builds the derived blob by loading the revision into the CPU tier (then drops the lease).
  void Load(StoreTiers& t, uint64_t id) {
    auto lease = t.AcquireCpu(id);
    ASSERT_TRUE(lease.ok()) << lease.status();
    EXPECT_EQ(lease->tensors().metadata().at(std::string(kTpDegreeKey)), "2");
  }
  std::string DerivedPath(const RevisionRecord& rev, int rank = 0) const {
    return DerivedShardPath(derived_, rev.blob.hash, {rank, 2});
  }

  TempDir dir_;
  const std::string derived_ = dir_.file("derived");
};

TEST_F(DerivedShardLifecycleTest, DeleteRemovesTheShardOfAnUnreferencedBlobOnly) {
  std::unique_ptr<Store> store = OpenStore(/*tiers=*/true);
  ASSERT_NE(store, nullptr);
  const RevisionRecord one = Publish(*store, QAdapter(1.0f));
  const RevisionRecord two = Publish(*store, QAdapter(2.0f));
  Load(*store->tiers(), one.id);
  Load(*store->tiers(), two.id);
  ASSERT_TRUE(Exists(DerivedPath(one)));
  ASSERT_TRUE(Exists(DerivedPath(two)));
  // Another rank's shard of the same source (same directory) goes with it.
  ASSERT_TRUE(
      LoadDerivedShard(store->BlobPath(one.blob.hash), one.blob.hash, derived_, {1, 2}).ok());
  ASSERT_TRUE(Exists(DerivedPath(one, 1)));

  ASSERT_TRUE(store->DeleteRevision(one.id).ok());
  EXPECT_FALSE(Exists(DerivedPath(one)));
  EXPECT_FALSE(Exists(DerivedPath(one, 1)));
  EXPECT_TRUE(Exists(DerivedPath(two)));  // still referenced: stays
  auto sweep = store->tiers()->CollectDerivedShards();
  ASSERT_TRUE(sweep.ok()) << sweep.status();
  EXPECT_EQ(sweep->kept, 1u);
  EXPECT_EQ(sweep->removed, 0u);
  // The live revision still loads from its derived blob.
  ShardReadStats st;
  ASSERT_TRUE(
      LoadDerivedShard(store->BlobPath(two.blob.hash), two.blob.hash, derived_, {0, 2}, &st).ok());
  EXPECT_TRUE(st.from_derived);
}

TEST_F(DerivedShardLifecycleTest, ABlobSharedByTwoRevisionsKeepsItsShardUntilTheLastGoes) {
  std::unique_ptr<Store> store = OpenStore(/*tiers=*/true);
  ASSERT_NE(store, nullptr);
  const QAdapter same(5.0f);
  const RevisionRecord one = Publish(*store, same);
  const RevisionRecord two = Publish(*store, same);
  ASSERT_EQ(one.blob.hash, two.blob.hash);  // content-addressed: one blob, refcount 2
  Load(*store->tiers(), one.id);
  ASSERT_TRUE(Exists(DerivedPath(one)));
  ASSERT_TRUE(store->DeleteRevision(one.id).ok());
  EXPECT_TRUE(Exists(DerivedPath(one)));  // `two` still references the blob
  ASSERT_TRUE(store->DeleteRevision(two.id).ok());
  EXPECT_FALSE(Exists(DerivedPath(one)));
}

TEST_F(DerivedShardLifecycleTest, OpenSweepsShardsOfRevisionsDeletedWithoutTheDirectory) {
  RevisionRecord gone, kept;
  {
    std::unique_ptr<Store> store = OpenStore(/*tiers=*/true);
    ASSERT_NE(store, nullptr);
    gone = Publish(*store, QAdapter(1.0f));
    kept = Publish(*store, QAdapter(2.0f));
    Load(*store->tiers(), gone.id);
    Load(*store->tiers(), kept.id);
  }
  {
    // A process without tiers (the CLI, an HTTP server without TP) deletes a revision: nothing
    // removes the derived shard then.
    std::unique_ptr<Store> store = OpenStore(/*tiers=*/false);
    ASSERT_NE(store, nullptr);
    ASSERT_TRUE(store->DeleteRevision(gone.id).ok());
  }
  ASSERT_TRUE(Exists(DerivedPath(gone)));
  // A file that is not a derived blob is left alone.
  std::filesystem::create_directories(derived_ + "/tp2");
  std::ofstream(derived_ + "/tp2/NOTES.txt") << "operator's file";
  {
    std::unique_ptr<Store> store = OpenStore(/*tiers=*/true);  // Open sweeps
    ASSERT_NE(store, nullptr);
    EXPECT_FALSE(Exists(DerivedPath(gone)));
    EXPECT_TRUE(Exists(DerivedPath(kept)));
    EXPECT_TRUE(Exists(derived_ + "/tp2/NOTES.txt"));
    auto sweep = store->tiers()->CollectDerivedShards();
    ASSERT_TRUE(sweep.ok());
    EXPECT_EQ(sweep->kept, 1u);
    EXPECT_EQ(sweep->ignored, 1u);
  }
}

TEST_F(DerivedShardLifecycleTest, CrashMidWriteLeavesATempFileThatIsNeverServedAndIsSwept) {
  // The source blob, written directly (no Store: the child below must not inherit threads).
  const QAdapter a(3.0f);
  const std::string source = dir_.file("source.blob");
  auto info = WriteBlobFile(source, a.views, {});
  ASSERT_TRUE(info.ok()) << info.status();
  const TpShardSpec spec{1, 2};
  const std::string path = DerivedShardPath(derived_, info->content_hash, spec);

  // The child dies (SIGKILL) after writing and fsyncing the temp file, before the rename.
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ArmFault("file.before_rename", 1, FaultAction::kKill);
    (void)LoadDerivedShard(source, info->content_hash, derived_, spec);
    _exit(3);  // not reached when the fault fires
  }
  int wstatus = 0;
  ASSERT_EQ(waitpid(child, &wstatus, 0), child);
  ASSERT_TRUE(WIFSIGNALED(wstatus) && WTERMSIG(wstatus) == SIGKILL) << wstatus;
  EXPECT_FALSE(Exists(path));
  ASSERT_EQ(CountFiles(derived_, ".tmp."), 1);

  // The next load does not see the temp file: it builds the derived blob from the source.
  ShardReadStats st;
  auto shard = LoadDerivedShard(source, info->content_hash, derived_, spec, &st);
  ASSERT_TRUE(shard.ok()) << shard.status();
  EXPECT_FALSE(st.from_derived);
  EXPECT_TRUE(st.verified);
  const TensorView* b = shard->Find(a.views[1].name);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->shape, (std::vector<int64_t>{8, 4}));
  EXPECT_EQ(std::memcmp(b->data, a.b.data() + 8 * 4, 8 * 4 * sizeof(float)), 0);

  // A temp file of a live writer (this process) stays; the dead child's goes.
  const std::string live_tmp = absl::StrCat(path, ".tmp.", getpid(), ".7");
  std::ofstream(live_tmp) << "in flight";
  auto sweep = CollectDerivedShards(derived_, [](const Hash128&) { return true; });
  ASSERT_TRUE(sweep.ok()) << sweep.status();
  EXPECT_EQ(sweep->temps_removed, 1u);
  EXPECT_EQ(sweep->temps_kept, 1u);
  EXPECT_EQ(sweep->kept, 1u);
  EXPECT_EQ(CountFiles(derived_, ".tmp."), 1);
  EXPECT_TRUE(Exists(live_tmp));
  EXPECT_TRUE(Exists(path));
}

TEST_F(DerivedShardLifecycleTest, ABadDerivedFileIsRefusedAndRebuiltOnceRemoved) {
  const QAdapter a(4.0f);
  const std::string source = dir_.file("source.blob");
  auto info = WriteBlobFile(source, a.views, {});
  ASSERT_TRUE(info.ok()) << info.status();
  const TpShardSpec spec{0, 2};
  const std::string path = DerivedShardPath(derived_, info->content_hash, spec);
  ASSERT_TRUE(LoadDerivedShard(source, info->content_hash, derived_, spec).ok());
  const auto good_size = std::filesystem::file_size(path);

  for (const char* damage : {"flip", "truncate"}) {
    SCOPED_TRACE(damage);
    if (std::string(damage) == "flip") {
      // Flip one bit inside the sliced B tensor's bytes (rank 0: B's first 8 rows).
      std::string bytes;
      {
        std::ifstream in(path, std::ios::binary);
        bytes.assign(std::istreambuf_iterator<char>(in), {});
      }
      const std::string slice(reinterpret_cast<const char*>(a.b.data()), 8 * 4 * sizeof(float));
      const size_t at = bytes.find(slice);
      ASSERT_NE(at, std::string::npos);
      bytes[at + slice.size() / 2] = static_cast<char>(bytes[at + slice.size() / 2] ^ 0x40);
      std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
    } else {
      std::filesystem::resize_file(path, good_size - 16);
    }
    auto bad = LoadDerivedShard(source, info->content_hash, derived_, spec);
    ASSERT_FALSE(bad.ok());
    EXPECT_TRUE(absl::IsDataLoss(bad.status()) || absl::IsInvalidArgument(bad.status()))
        << bad.status();
    EXPECT_NE(bad.status().message().find("delete the file"), absl::string_view::npos);
    // Deleting the derived blobs of the source (what DeleteRevision and a sweep do) rebuilds it.
    auto removed = RemoveDerivedShards(derived_, info->content_hash);
    ASSERT_TRUE(removed.ok());
    EXPECT_EQ(*removed, 1u);
    ShardReadStats st;
    auto shard = LoadDerivedShard(source, info->content_hash, derived_, spec, &st);
    ASSERT_TRUE(shard.ok()) << shard.status();
    EXPECT_FALSE(st.from_derived);
    const TensorView* b = shard->Find(a.views[1].name);
    ASSERT_NE(b, nullptr);
    EXPECT_EQ(std::memcmp(b->data, a.b.data(), 8 * 4 * sizeof(float)), 0);
    ShardReadStats again;
    ASSERT_TRUE(LoadDerivedShard(source, info->content_hash, derived_, spec, &again).ok());
    EXPECT_TRUE(again.from_derived);
    EXPECT_EQ(std::filesystem::file_size(path), good_size);
  }
}

// ---------------------------------------------------------------------------------------------
// The host-buffer pool inside the CPU budget
// ---------------------------------------------------------------------------------------------

using ::loradb::testing::HostBufferPoolScope;

// Loads revision r as an adapter of `sizes[r]` bytes in a buffer from AllocateForOverwrite (as
// the loader does), charged at the buffer's capacity.
AdapterLoadFn PooledLoad(std::vector<uint64_t> sizes) {
  return [sizes](uint64_t r) -> absl::StatusOr<std::shared_ptr<const CachedAdapter>> {
    if (r >= sizes.size()) return absl::NotFoundError("no such adapter");
    auto buf = HostBuffer::AllocateForOverwrite(sizes[r], false);
    if (!buf.ok()) return buf.status();
    std::shared_ptr<HostBuffer> owned(std::move(*buf));
    std::memset(owned->data(), static_cast<int>(r), owned->size());
    auto a = std::make_shared<CachedAdapter>();
    a->bytes = owned->capacity();
    a->tensors = TensorSet(owned);
    return a;
  };
}

// resident + pooled <= budget, the invariant.
void ExpectWithinBudget(const CpuCache& cache) {
  const CpuCacheStats s = cache.stats();
  const uint64_t budget = cache.options().budget_bytes;
  EXPECT_LE(s.resident_bytes + s.pooled_bytes, budget)
      << "resident " << s.resident_bytes << " + pooled " << s.pooled_bytes;
  EXPECT_EQ(s.pooled_bytes, GetHostBufferPoolStats().bytes);
}

TEST(HostBufferPoolBudgetTest, ResidentPlusPooledNeverExceedsTheBudget) {
  HostBufferPoolScope scope(uint64_t{1} << 30);
  // Pooled before the cache opens: 5 x 6 MiB. The cache's 20 MiB budget caps the pool at once.
  {
    std::vector<std::unique_ptr<HostBuffer>> held;
    for (int i = 0; i < 5; ++i) {
      auto b = HostBuffer::AllocateForOverwrite(6 * kMiB, false);
      ASSERT_TRUE(b.ok());
      held.push_back(std::move(*b));
    }
  }
  ASSERT_EQ(GetHostBufferPoolStats().bytes, 30 * kMiB);
  CpuCacheOptions o;
  o.budget_bytes = 20 * kMiB;
  o.policy = EvictionPolicyKind::kLru;
  // Revisions 0-4: 6 MiB each; 5: 8 MiB (no 6 MiB buffer fits it).
  auto cache =
      CpuCache::Create(o, PooledLoad({6 * kMiB, 6 * kMiB, 6 * kMiB, 6 * kMiB, 6 * kMiB, 8 * kMiB}));
  ASSERT_TRUE(cache.ok());
  EXPECT_EQ(GetHostBufferPoolStats().cap, 20 * kMiB);
  EXPECT_LE(GetHostBufferPoolStats().bytes, 20 * kMiB);
  ExpectWithinBudget(**cache);

  // Three loads take pooled buffers and fill the cache; the pool shrinks to the room left.
  for (uint64_t r = 0; r < 3; ++r) {
    ASSERT_TRUE((*cache)->Acquire(r).ok());
    ExpectWithinBudget(**cache);
  }
  EXPECT_EQ((*cache)->stats().resident_bytes, 18 * kMiB);
  EXPECT_EQ(GetHostBufferPoolStats().bytes, 0u);  // 2 MiB of room holds no 6 MiB buffer

  // A fourth evicts the least recent; its buffer finds no room in the pool and is unmapped.
  ASSERT_TRUE((*cache)->Acquire(3).ok());
  EXPECT_EQ((*cache)->stats().evictions, 1u);
  ExpectWithinBudget(**cache);

  // An explicit eviction makes room: the freed buffer is pooled (12 resident + 6 pooled).
  ASSERT_TRUE((*cache)->Evict(3).ok());
  EXPECT_EQ(GetHostBufferPoolStats().bytes, 6 * kMiB);
  ExpectWithinBudget(**cache);

  // An 8 MiB load cannot use it; once the new entry is charged (20 MiB resident) the pool gives
  // way — its buffer is released, no resident entry is evicted for it.
  const uint64_t evictions = (*cache)->stats().evictions;
  ASSERT_TRUE((*cache)->Acquire(5).ok());
  EXPECT_EQ((*cache)->stats().resident_bytes, 20 * kMiB);
  EXPECT_EQ((*cache)->stats().evictions, evictions);
  EXPECT_EQ(GetHostBufferPoolStats().bytes, 0u);
  ExpectWithinBudget(**cache);

  // A 6 MiB load evicts to fit, and reuses nothing (the pool is empty) but stays in budget.
  ASSERT_TRUE((*cache)->Acquire(4).ok());
  ExpectWithinBudget(**cache);

  // With the cache gone the pool is back to its own limit.
  cache->reset();
  EXPECT_EQ(GetHostBufferPoolStats().accounts, 0u);
  EXPECT_EQ(GetHostBufferPoolStats().cap, uint64_t{1} << 30);
}

TEST(HostBufferPoolBudgetTest, ARecycledBufferServesTheNextLoadWithinBudget) {
  HostBufferPoolScope scope(uint64_t{1} << 30);
  CpuCacheOptions o;
  o.budget_bytes = 12 * kMiB;
  auto cache = CpuCache::Create(o, PooledLoad({6 * kMiB, 6 * kMiB, 6 * kMiB}));
  ASSERT_TRUE(cache.ok());
  ASSERT_TRUE((*cache)->Acquire(0).ok());
  ASSERT_TRUE((*cache)->Acquire(1).ok());
  ASSERT_TRUE((*cache)->Evict(0).ok());  // 6 resident + 6 pooled
  EXPECT_EQ(GetHostBufferPoolStats().bytes, 6 * kMiB);
  const uint64_t reused = GetHostBufferPoolStats().reused;
  ASSERT_TRUE((*cache)->Acquire(2).ok());  // takes the pooled buffer
  EXPECT_EQ(GetHostBufferPoolStats().reused, reused + 1);
  EXPECT_EQ((*cache)->stats().evictions, 1u);
  ExpectWithinBudget(**cache);
}

TEST(HostBufferPoolBudgetTest, TwoCachesShareTheirUnusedBudgets) {
  HostBufferPoolScope scope(uint64_t{1} << 30);
  CpuCacheOptions o;
  o.budget_bytes = 8 * kMiB;
  auto a = CpuCache::Create(o, PooledLoad({6 * kMiB}));
  auto b = CpuCache::Create(o, PooledLoad({6 * kMiB}));
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(GetHostBufferPoolStats().cap, 16 * kMiB);
  ASSERT_TRUE((*a)->Acquire(0).ok());
  ASSERT_TRUE((*b)->Acquire(0).ok());
  EXPECT_EQ(GetHostBufferPoolStats().cap, 4 * kMiB);  // 2 + 2 MiB of room
  ASSERT_TRUE((*a)->Evict(0).ok());
  EXPECT_EQ(GetHostBufferPoolStats().bytes, 6 * kMiB);  // fits the 8 + 2 MiB of room
  const uint64_t total =
      (*a)->stats().resident_bytes + (*b)->stats().resident_bytes + GetHostBufferPoolStats().bytes;
  EXPECT_LE(total, 16 * kMiB);
}

}  // namespace
}  // namespace loradb::tiers
