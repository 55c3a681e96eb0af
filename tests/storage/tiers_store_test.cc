#include <gtest/gtest.h>

#include <cstring>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "storage/store/store_tiers.h"
#include "tests/storage/adapter_test_util.h"
#include "tests/test_util.h"

namespace loradb::tiers {
namespace {

using ::loradb::testing::Adapter;
using ::loradb::testing::OpenStoreWithPolicy;
using ::loradb::testing::TempDir;

constexpr char kModules[] =
    R"({"modules": [{"name": "layers.0.self_attn.q_proj", "in": 8, "out": 16}]})";
constexpr char kModule[] = "layers.0.self_attn.q_proj";

class StoreTiersTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto s = OpenStoreWithPolicy(dir_.file("store"), "tiny", kModules, "acme/support");
    ASSERT_TRUE(s.ok()) << s.status();
    store_ = std::move(*s);
  }
  uint64_t Publish(int64_t r, float seed, const std::string& alias) {
    Adapter a;
    a.Add(kModule, false, r, 8, seed);
    a.Add(kModule, true, 16, r, seed + 100);
    PublishOptions o;
    o.alias = alias;
    o.lora.alpha = 2.0f * static_cast<float>(r);
    auto rev = store_->PublishTensors("acme/support", a.views, o);
    EXPECT_TRUE(rev.ok()) << rev.status();
    return rev.ok() ? rev->id : 0;
  }
  TempDir dir_;
  std::unique_ptr<Store> store_;
};

TEST_F(StoreTiersTest, LocateFollowsTheBytesThroughTheTiers) {
  uint64_t id = Publish(4, 1.0f, "serving");
  StoreTiersOptions o;
  o.device = DeviceKind::kHost;
  o.slots.arena_bytes = 1 << 20;
  o.slots.page_bytes = 4096;
  auto tiers = StoreTiers::Open(store_.get(), o);
  ASSERT_TRUE(tiers.ok()) << tiers.status();

  auto loc = (*tiers)->Locate("acme/support", "serving");
  ASSERT_TRUE(loc.ok()) << loc.status();
  EXPECT_EQ(loc->located.revision.id, id);
  EXPECT_EQ(loc->located.location.tier, Tier::kStorage);
  EXPECT_FALSE(loc->slot.has_value());

  {
    auto lease = (*tiers)->AcquireCpu(id);
    ASSERT_TRUE(lease.ok()) << lease.status();
    const TensorView* a =
        lease->tensors().Find("base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight");
    ASSERT_NE(a, nullptr);
    EXPECT_EQ(a->shape, (std::vector<int64_t>{4, 8}));
    float first;
    std::memcpy(&first, a->data, sizeof(first));
    EXPECT_EQ(first, 1.0f);
    EXPECT_EQ(lease->tensors().metadata().at("lora.r"), "4");
    EXPECT_EQ(lease->tensors().metadata().at("lora.alpha"), "8");
  }
  loc = (*tiers)->Locate("acme/support", "serving");
  EXPECT_EQ(loc->located.location.tier, Tier::kCpu);

  {
    auto batch = (*tiers)->device()->AcquireBatch(std::vector<uint64_t>{id});
    ASSERT_TRUE(batch.ok()) << batch.status();
    const DeviceAdapter* d = batch->Find(id);
    ASSERT_NE(d, nullptr);
    EXPECT_EQ(d->metadata.at("lora.alpha"), "8");
    loc = (*tiers)->Locate("acme/support", "serving");
    EXPECT_EQ(loc->located.location.tier, Tier::kGpu);
    ASSERT_TRUE(loc->slot.has_value());
    EXPECT_EQ(*loc->slot, d->slot);
    EXPECT_EQ((*tiers)->Where(id).device_leases, 1);
  }
  EXPECT_EQ((*tiers)->Where(id).device_leases, 0);
}

TEST_F(StoreTiersTest, CorruptBlobIsDetectedAndRemembered) {
  uint64_t id = Publish(2, 5.0f, "serving");
  auto rev = store_->GetRevision(id);
  ASSERT_TRUE(rev.ok());
  std::string path = store_->BlobPath(rev->blob.hash);
  {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-3, std::ios::end);
    f.put('\x7f');
  }
  StoreTiersOptions o;
  o.device = DeviceKind::kNone;
  auto tiers = StoreTiers::Open(store_.get(), o);
  ASSERT_TRUE(tiers.ok());
  auto lease = (*tiers)->AcquireCpu(id);
  ASSERT_EQ(lease.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(lease.status().message().find(rev->blob.hash.Hex()), absl::string_view::npos);
  EXPECT_EQ((*tiers)->loader().stats().checksum_failures, 1u);
  // Remembered: the second request fails fast without reading again.
  EXPECT_EQ((*tiers)->AcquireCpu(id).status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ((*tiers)->loader().stats().checksum_failures, 1u);
  EXPECT_EQ((*tiers)->cpu().stats().negative_hits, 1u);
  EXPECT_EQ((*tiers)->device(), nullptr);
  EXPECT_EQ((*tiers)->AcquireCpu(999).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(StoreTiersTest, CudaRequestedWithoutADeviceIsUnavailable) {
  StoreTiersOptions o;
  o.device = DeviceKind::kCuda;
  auto tiers = StoreTiers::Open(store_.get(), o);
  if (tiers.ok()) GTEST_SKIP() << "a CUDA device is present";
  EXPECT_EQ(tiers.status().code(), absl::StatusCode::kUnavailable);
}

// A Store opened with StoreOptions::tiers owns them: Store::Locate reports the live tier and
// slot, DeleteRevision drops unleased copies.
TEST(StoreOwnedTiersTest, StoreLocateReportsTheLiveTierAndSlot) {
  ::loradb::testing::TempDir dir;
  StoreOptions so;
  so.tiers.emplace();
  so.tiers->device = DeviceKind::kHost;
  so.tiers->cpu.budget_bytes = 1 << 20;
  so.tiers->slots.arena_bytes = 1 << 20;
  so.tiers->slots.page_bytes = 4096;
  auto s = OpenStoreWithPolicy(dir.file("store"), "tiny", kModules, "acme/support", so);
  ASSERT_TRUE(s.ok()) << s.status();
  Store& store = **s;
  ASSERT_NE(store.tiers(), nullptr);
  ASSERT_NE(store.tiers()->device(), nullptr);
  EXPECT_EQ(store.tiers()->cpu().options().budget_bytes, uint64_t{1} << 20);
  Adapter a;
  a.Add(kModule, false, 4, 8, 1.0f);
  a.Add(kModule, true, 16, 4, 2.0f);
  PublishOptions po;
  po.alias = "serving";
  po.lora.alpha = 8.0f;
  auto rev = store.PublishTensors("acme/support", a.views, po);
  ASSERT_TRUE(rev.ok()) << rev.status();

  auto loc = store.Locate("acme/support", "serving");
  ASSERT_TRUE(loc.ok()) << loc.status();
  EXPECT_EQ(loc->location.tier, Tier::kStorage);
  EXPECT_FALSE(loc->location.slot.has_value());

  ASSERT_TRUE(store.tiers()->cpu().Prefetch(rev->id).ok());
  auto lease = store.tiers()->AcquireCpu(rev->id);
  ASSERT_TRUE(lease.ok()) << lease.status();
  loc = store.Locate("acme/support", "serving");
  ASSERT_TRUE(loc.ok());
  EXPECT_EQ(loc->location.tier, Tier::kCpu);
  lease->Release();

  uint32_t slot = 0;
  {
    auto batch = store.tiers()->device()->AcquireBatch(std::vector<uint64_t>{rev->id});
    ASSERT_TRUE(batch.ok()) << batch.status();
    slot = batch->Find(rev->id)->slot;
    loc = store.Locate("acme/support", "serving");
    ASSERT_TRUE(loc.ok());
    EXPECT_EQ(loc->location.tier, Tier::kGpu);
    ASSERT_TRUE(loc->location.slot.has_value());
    EXPECT_EQ(*loc->location.slot, slot);
    // StoreTiers::Locate over the owned tiers agrees.
    auto tl = store.tiers()->Locate("acme/support", "serving");
    ASSERT_TRUE(tl.ok());
    EXPECT_EQ(tl->located.location.tier, Tier::kGpu);
    EXPECT_EQ(tl->slot, loc->location.slot);
  }
  // Still resident (unleased) on the device after the batch lease ends.
  EXPECT_EQ(store.Locate("acme/support", "serving")->location.tier, Tier::kGpu);

  // Deleting the revision drops it from both tiers (it is unleased).
  auto rev2 = store.PublishTensors("acme/support", a.views, po);  // same bytes, new revision
  ASSERT_TRUE(rev2.ok()) << rev2.status();
  ASSERT_TRUE(store.DeleteRevision(rev->id).ok());
  TierPlace p = store.tiers()->Where(rev->id);
  EXPECT_EQ(p.tier, Tier::kStorage);
  EXPECT_EQ(store.tiers()->cpu().stats().resident_entries, 0u);
  EXPECT_EQ(store.tiers()->device()->stats().resident_adapters, 0u);
  // A deleted revision is not loaded again.
  EXPECT_EQ(store.tiers()->AcquireCpu(rev->id).status().code(), absl::StatusCode::kNotFound);
}

TEST(StoreOwnedTiersTest, NoTiersByDefaultAndBadTierOptionsFailOpenCleanly) {
  ::loradb::testing::TempDir dir;
  {
    auto s = Store::Open(dir.file("store"));
    ASSERT_TRUE(s.ok()) << s.status();
    EXPECT_EQ((*s)->tiers(), nullptr);
  }
  StoreOptions bad;
  bad.tiers.emplace();
  bad.tiers->cpu.budget_bytes = 0;
  auto s = Store::Open(dir.file("store"), bad);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  bad.tiers->cpu.budget_bytes = 1 << 20;
  bad.tiers->slots.page_bytes = 1000;  // not a power of two
  bad.tiers->device = DeviceKind::kHost;
  s = Store::Open(dir.file("store"), bad);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  // The failed opens left nothing held: the store opens again, with tiers.
  bad.tiers->slots.page_bytes = 4096;
  bad.tiers->slots.arena_bytes = 1 << 20;
  s = Store::Open(dir.file("store"), bad);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_NE((*s)->tiers(), nullptr);
}

}  // namespace
}  // namespace loradb::tiers
