// The device tier under a tensor-parallel placement (DeviceSlotsOptions::tp): slots
// hold only the rank's shard of each adapter (B of q/k/v/gate/up by output rows, A of o/down by
// input columns, MoE experts likewise, the other factor whole), the bytes in a slot are exactly
// the slice of the whole tensor, the arena and Locate count shard bytes, mixed adapters share one
// batch, and a bad placement is a clear error that leaves nothing pinned. Also the derived-blob
// mode (StoreTiersOptions::tp_derived_dir), where the CPU tier holds the rank's pre-sliced blob.
// LORADB_TEST_TIERS_DEVICE=cuda runs the fixture's tiers on the CUDA backend (the GPU script,
// compute/distributed/check-on-gpu.sh, does); the default is the host backend.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "storage/formats/blob.h"
#include "storage/store/store_tiers.h"
#include "storage/tiers/tp_shard.h"
#include "storage/tiers/tp_shard_load.h"
#include "tests/storage/adapter_test_util.h"
#include "tests/test_util.h"

namespace loradb::tiers {
namespace {

using ::loradb::testing::TempDir;

constexpr char kPrefix[] = "base_model.model.model.layers.0.";

// One LoRA factor: a row-major fp32 matrix with distinct values.
struct Factor {
  std::string name;
  int64_t rows = 0, cols = 0;
  std::vector<float> values;
  TpAxis axis = TpAxis::kReplicated;  // what the rules say (checked independently below)
};

// An adapter over q_proj (in 8, out 16), o_proj (in 16, out 8) and, optionally, two MoE experts'
// down_proj (in 12, out 8; stored as a packed group). `rank` is the LoRA rank.
struct TestAdapter {
  std::vector<Factor> factors;
  std::vector<TensorView> views;

  TestAdapter(int64_t rank, float seed, bool experts, bool only_q = false) {
    auto add = [&](const std::string& module, int64_t in, int64_t out, TpAxis a_axis,
                   TpAxis b_axis) {
      for (int side = 0; side < 2; ++side) {
        Factor f;
        f.name = absl::StrCat(kPrefix, module, side == 0 ? ".lora_A.weight" : ".lora_B.weight");
        f.rows = side == 0 ? rank : out;
        f.cols = side == 0 ? in : rank;
        f.axis = side == 0 ? a_axis : b_axis;
        f.values.resize(static_cast<size_t>(f.rows * f.cols));
        for (size_t i = 0; i < f.values.size(); ++i) {
          f.values[i] = seed + static_cast<float>(factors.size()) * 1000.0f + static_cast<float>(i);
        }
        factors.push_back(std::move(f));
      }
    };
    add("self_attn.q_proj", 8, 16, TpAxis::kReplicated, TpAxis::kOut);
    if (!only_q) add("self_attn.o_proj", 16, 8, TpAxis::kIn, TpAxis::kReplicated);
    if (experts) {
      add("mlp.experts.0.down_proj", 12, 8, TpAxis::kIn, TpAxis::kReplicated);
      add("mlp.experts.1.down_proj", 12, 8, TpAxis::kIn, TpAxis::kReplicated);
    }
    for (const Factor& f : factors) {
      views.push_back(TensorView{f.name,
                                 DType::kF32,
                                 {f.rows, f.cols},
                                 reinterpret_cast<const std::byte*>(f.values.data()),
                                 f.values.size() * sizeof(float)});
    }
  }
};

// The rank's slice of `f`, computed here element by element (not with SliceTensors).
std::vector<float> ExpectedSlice(const Factor& f, int rank, int degree, int64_t* rows,
                                 int64_t* cols) {
  *rows = f.rows;
  *cols = f.cols;
  std::vector<float> out;
  if (f.axis == TpAxis::kOut) {
    *rows = f.rows / degree;
    for (int64_t r = rank * *rows; r < (rank + 1) * *rows; ++r) {
      for (int64_t c = 0; c < f.cols; ++c)
        out.push_back(f.values[static_cast<size_t>(r * f.cols + c)]);
    }
  } else if (f.axis == TpAxis::kIn) {
    *cols = f.cols / degree;
    for (int64_t r = 0; r < f.rows; ++r) {
      for (int64_t c = rank * *cols; c < (rank + 1) * *cols; ++c) {
        out.push_back(f.values[static_cast<size_t>(r * f.cols + c)]);
      }
    }
  } else {
    out = f.values;
  }
  return out;
}

std::vector<float> DeviceFloats(const DeviceSlots& slots, const DeviceTensor& t) {
  std::vector<float> out(t.nbytes / sizeof(float));
  EXPECT_TRUE(const_cast<DeviceBackend&>(slots.backend())
                  .CopyToHost(reinterpret_cast<std::byte*>(out.data()), t.data, t.nbytes)
                  .ok());
  return out;
}

// Checks every tensor of `dev` against the element-wise slice of `a` for (rank, degree).
void ExpectExactShard(const DeviceSlots& slots, const DeviceAdapter& dev, const TestAdapter& a,
                      int rank, int degree) {
  ASSERT_EQ(dev.tensors.size(), a.factors.size());
  EXPECT_EQ(dev.tp.rank, rank);
  EXPECT_EQ(dev.tp.degree, degree);
  for (const Factor& f : a.factors) {
    EXPECT_EQ(AdapterTensorAxis(f.name), f.axis) << f.name;
    const DeviceTensor* t = dev.Find(f.name);
    ASSERT_NE(t, nullptr) << f.name;
    int64_t rows = 0, cols = 0;
    const std::vector<float> want = ExpectedSlice(f, rank, degree, &rows, &cols);
    EXPECT_EQ(t->shape, (std::vector<int64_t>{rows, cols})) << f.name;
    EXPECT_EQ(t->nbytes, want.size() * sizeof(float)) << f.name;
    EXPECT_EQ(DeviceFloats(slots, *t), want) << f.name << " rank " << rank << " of " << degree;
  }
}

constexpr char kModules[] = R"({"modules": [
    {"name": "layers.0.self_attn.q_proj", "in": 8, "out": 16},
    {"name": "layers.0.self_attn.o_proj", "in": 16, "out": 8},
    {"name": "layers.0.mlp.experts.0.down_proj", "in": 12, "out": 8},
    {"name": "layers.0.mlp.experts.1.down_proj", "in": 12, "out": 8}]})";

DeviceKind TestDevice() {
  const char* d = std::getenv("LORADB_TEST_TIERS_DEVICE");
  return d != nullptr && std::string(d) == "cuda" ? DeviceKind::kCuda : DeviceKind::kHost;
}

class TiersShardTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto s = testing::OpenStoreWithPolicy(dir_.file("store"), "tiny", kModules, "acme/tp");
    ASSERT_TRUE(s.ok()) << s.status();
    store_ = std::move(*s);
  }
  uint64_t Publish(const TestAdapter& a) {
    PublishOptions o;
    o.lora.alpha = 8.0f;
    auto rev = store_->PublishTensors("acme/tp", a.views, o);
    EXPECT_TRUE(rev.ok()) << rev.status();
    return rev.ok() ? rev->id : 0;
  }
  std::unique_ptr<StoreTiers> Open(TpShardSpec tp, const std::string& derived_dir = "") {
    StoreTiersOptions o;
    o.device = TestDevice();
    o.slots.arena_bytes = 1 << 20;
    o.slots.page_bytes = 256;
    o.slots.tp = tp;
    o.tp_derived_dir = derived_dir;
    auto t = StoreTiers::Open(store_.get(), o);
    EXPECT_TRUE(t.ok()) << t.status();
    return t.ok() ? std::move(*t) : nullptr;
  }
  TempDir dir_;
  std::unique_ptr<Store> store_;
};

TEST_F(TiersShardTest, SlotBytesAreExactlyTheSliceOfTheWholeTensor) {
  const TestAdapter a(4, 1.0f, /*experts=*/true);
  const uint64_t id = Publish(a);
  for (int degree : {1, 2, 4}) {
    for (int rank = 0; rank < degree; ++rank) {
      std::unique_ptr<StoreTiers> t = Open({rank, degree});
      ASSERT_NE(t, nullptr);
      auto lease = t->device()->AcquireBatch(std::vector<uint64_t>{id});
      ASSERT_TRUE(lease.ok()) << lease.status();
      ExpectExactShard(*t->device(), *lease->Find(id), a, rank, degree);
      // The CPU tier keeps the whole revision.
      auto cpu = t->AcquireCpu(id);
      ASSERT_TRUE(cpu.ok());
      EXPECT_EQ(cpu->tensors().Find(a.factors[1].name)->shape, (std::vector<int64_t>{16, 4}));
    }
  }
}

TEST_F(TiersShardTest, Tp2UsesHalfTheSlotBytesOfTp1ForShardedTensors) {
  const TestAdapter a(8, 3.0f, /*experts=*/true);
  const uint64_t id = Publish(a);
  uint64_t split_bytes[3] = {0, 0, 0}, replicated_bytes[3] = {0, 0, 0}, slot_bytes[3] = {0, 0, 0};
  for (int degree : {1, 2}) {
    std::unique_ptr<StoreTiers> t = Open({degree - 1, degree});
    ASSERT_NE(t, nullptr);
    auto lease = t->device()->AcquireBatch(std::vector<uint64_t>{id});
    ASSERT_TRUE(lease.ok()) << lease.status();
    const DeviceAdapter& dev = *lease->Find(id);
    for (const DeviceTensor& dt : dev.tensors) {
      (AdapterTensorAxis(dt.name) == TpAxis::kReplicated ? replicated_bytes
                                                         : split_bytes)[degree] += dt.nbytes;
    }
    slot_bytes[degree] = dev.bytes;
    // The arena accounts the shard, and Locate / Where report it with the placement.
    EXPECT_EQ(t->device()->stats().payload_bytes, dev.bytes);
    EXPECT_EQ(t->device()->stats().pages_total - t->device()->stats().pages_free, dev.pages);
    const TierPlace p = t->Where(id);
    EXPECT_EQ(p.tier, Tier::kGpu);
    EXPECT_EQ(p.device_bytes, dev.bytes);
    EXPECT_EQ(p.tp.degree, degree);
    EXPECT_EQ(p.tp.rank, degree - 1);
  }
  EXPECT_EQ(split_bytes[2] * 2, split_bytes[1]);
  EXPECT_EQ(replicated_bytes[2], replicated_bytes[1]);
  // Half of the split factors' bytes, plus the replicated ones (and 64-byte alignment gaps).
  EXPECT_LT(slot_bytes[2], slot_bytes[1]);
  EXPECT_LE(slot_bytes[2], replicated_bytes[1] + split_bytes[1] / 2 + 64 * a.factors.size());
  EXPECT_GE(slot_bytes[2], replicated_bytes[1] + split_bytes[1] / 2);
}

TEST_F(TiersShardTest, MixedAdaptersShareOneBatch) {
  const TestAdapter a(2, 1.0f, /*experts=*/false);
  const TestAdapter b(4, 50.0f, /*experts=*/true);
  const TestAdapter c(8, 900.0f, /*experts=*/false, /*only_q=*/true);
  const uint64_t ia = Publish(a), ib = Publish(b), ic = Publish(c);
  std::unique_ptr<StoreTiers> t = Open({1, 2});
  ASSERT_NE(t, nullptr);
  auto lease = t->device()->AcquireBatch(std::vector<uint64_t>{ib, ia, ic, ib});
  ASSERT_TRUE(lease.ok()) << lease.status();
  ASSERT_EQ(lease->size(), 3u);
  ExpectExactShard(*t->device(), *lease->Find(ia), a, 1, 2);
  ExpectExactShard(*t->device(), *lease->Find(ib), b, 1, 2);
  ExpectExactShard(*t->device(), *lease->Find(ic), c, 1, 2);
  EXPECT_EQ(t->device()->stats().resident_adapters, 3u);
  EXPECT_EQ(t->device()->stats().payload_bytes,
            lease->Find(ia)->bytes + lease->Find(ib)->bytes + lease->Find(ic)->bytes);
}

TEST_F(TiersShardTest, BadPlacementIsAClearErrorAndLeavesNothingPinned) {
  for (TpShardSpec bad : {TpShardSpec{2, 2}, TpShardSpec{-1, 2}, TpShardSpec{0, 0}}) {
    StoreTiersOptions o;
    o.device = DeviceKind::kHost;
    o.slots.arena_bytes = 1 << 20;
    o.slots.tp = bad;
    auto t = StoreTiers::Open(store_.get(), o);
    ASSERT_FALSE(t.ok()) << bad.rank << " of " << bad.degree;
    EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(t.status().message().find("TP"), absl::string_view::npos) << t.status();
  }
  // A degree that does not divide a split dimension (q_proj B has 16 rows; 3 does not divide).
  const TestAdapter a(4, 1.0f, false);
  const TestAdapter good(2, 7.0f, false, /*only_q=*/true);
  const uint64_t id = Publish(a), ok_id = Publish(good);
  std::unique_ptr<StoreTiers> t = Open({0, 3});
  ASSERT_NE(t, nullptr);
  auto lease = t->device()->AcquireBatch(std::vector<uint64_t>{id});
  ASSERT_FALSE(lease.ok());
  EXPECT_EQ(lease.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(lease.status().message().find(absl::StrCat("revision ", id)), absl::string_view::npos)
      << lease.status();
  EXPECT_NE(lease.status().message().find("not divisible by the TP degree 3"),
            absl::string_view::npos)
      << lease.status();
  DeviceSlotsStats s = t->device()->stats();
  EXPECT_EQ(s.resident_adapters, 0u);
  EXPECT_EQ(s.leased_adapters, 0u);
  EXPECT_EQ(s.batch_failures, 1u);
  EXPECT_EQ(s.pages_free, s.pages_total);
  EXPECT_EQ(t->Where(id).tier, Tier::kCpu);  // the whole revision stays usable in the CPU tier
  EXPECT_EQ(t->cpu().Find(id).leases, 0);
  // A mixed batch with the bad revision fails whole: the good one is not left pinned either.
  lease = t->device()->AcquireBatch(std::vector<uint64_t>{ok_id, id});
  ASSERT_FALSE(lease.ok());
  EXPECT_EQ(t->device()->stats().leased_adapters, 0u);
  // The same revisions on a placement that divides every split dimension work.
  std::unique_ptr<StoreTiers> t4 = Open({3, 4});
  auto fine = t4->device()->AcquireBatch(std::vector<uint64_t>{ok_id, id});
  ASSERT_TRUE(fine.ok()) << fine.status();
  ExpectExactShard(*t4->device(), *fine->Find(id), a, 3, 4);
}

TEST_F(TiersShardTest, ShardOfAnotherPlacementIsRefused) {
  const TestAdapter a(4, 1.0f, false);
  TensorSet whole;
  for (const TensorView& v : a.views) ASSERT_TRUE(whole.Add(v).ok());
  TensorSet scratch;
  auto shard = AdapterShardFor(whole, {1, 2}, &scratch);
  ASSERT_TRUE(shard.ok()) << shard.status();
  EXPECT_EQ(*shard, &scratch);
  EXPECT_EQ(AdapterShardFor(whole, {0, 1}, &scratch).value(), &whole);  // degree 1: as is
  scratch.metadata()[kTpDegreeKey] = "2";
  scratch.metadata()[kTpRankKey] = "1";
  TensorSet again;
  EXPECT_EQ(AdapterShardFor(scratch, {1, 2}, &again).value(), &scratch);  // already the shard
  auto other = AdapterShardFor(scratch, {0, 2}, &again);
  EXPECT_EQ(other.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(other.status().message().find("rank 1 of 2"), absl::string_view::npos)
      << other.status();
}

TEST_F(TiersShardTest, DerivedModeCpuHoldsTheRanksShardAndSlotsMatchSliceMode) {
  const TestAdapter a(4, 2.0f, /*experts=*/true);
  const uint64_t id = Publish(a);
  const std::string derived = dir_.file("derived");
  auto rev = store_->GetRevision(id);
  ASSERT_TRUE(rev.ok());
  const std::string file = DerivedShardPath(derived, rev->blob.hash, {1, 2});
  uint64_t whole_cpu_bytes = 0;
  {
    std::unique_ptr<StoreTiers> t = Open({1, 2});
    auto cpu = t->AcquireCpu(id);
    ASSERT_TRUE(cpu.ok());
    whole_cpu_bytes = cpu->adapter().bytes;
  }
  for (int round = 0; round < 2; ++round) {  // builds the derived blob, then reads it
    std::unique_ptr<StoreTiers> t = Open({1, 2}, derived);
    ASSERT_NE(t, nullptr);
    auto lease = t->device()->AcquireBatch(std::vector<uint64_t>{id});
    ASSERT_TRUE(lease.ok()) << lease.status();
    ExpectExactShard(*t->device(), *lease->Find(id), a, 1, 2);
    EXPECT_TRUE(std::filesystem::exists(file)) << file;
    auto cpu = t->AcquireCpu(id);
    ASSERT_TRUE(cpu.ok());
    EXPECT_EQ(cpu->tensors().metadata().at(kTpRankKey), "1");
    EXPECT_EQ(cpu->tensors().metadata().at("lora.alpha"), "8");
    EXPECT_EQ(cpu->tensors().Find(a.factors[1].name)->shape, (std::vector<int64_t>{8, 4}));
    EXPECT_LT(cpu->adapter().bytes, whole_cpu_bytes);
  }
  // A damaged derived blob (one byte of a tensor flipped) is refused (DataLoss), never served.
  {
    std::vector<std::byte> bytes(std::filesystem::file_size(file));
    std::FILE* f = std::fopen(file.c_str(), "r+b");
    ASSERT_NE(f, nullptr);
    ASSERT_EQ(std::fread(bytes.data(), 1, bytes.size(), f), bytes.size());
    BlobLayout layout;
    ASSERT_TRUE(ParseBlobStored(bytes, nullptr, false, &layout).ok());
    ASSERT_FALSE(layout.stored.empty());
    std::fseek(f, static_cast<long>(layout.stored[0].offset), SEEK_SET);
    std::fputc(static_cast<int>(bytes[layout.stored[0].offset] ^ std::byte{0x5a}), f);
    std::fclose(f);
  }
  std::unique_ptr<StoreTiers> t = Open({1, 2}, derived);
  auto lease = t->device()->AcquireBatch(std::vector<uint64_t>{id});
  ASSERT_FALSE(lease.ok());
  EXPECT_EQ(lease.status().code(), absl::StatusCode::kDataLoss) << lease.status();
  EXPECT_EQ(t->device()->stats().resident_adapters, 0u);
}

// A Store that owns TP-placed tiers reports the shard bytes and the placement in Locate.
TEST(StoreOwnedTpTiersTest, StoreLocateReportsShardBytesAndPlacement) {
  TempDir dir;
  StoreOptions so;
  so.tiers.emplace();
  so.tiers->device = DeviceKind::kHost;
  so.tiers->slots.arena_bytes = 1 << 20;
  so.tiers->slots.page_bytes = 256;
  so.tiers->slots.tp = {0, 2};
  auto s = Store::Open(dir.file("store"), so);
  ASSERT_TRUE(s.ok()) << s.status();
  Store& store = **s;
  ASSERT_TRUE(store
                  .AddBaseFromModuleTable("tiny", R"({"modules": [
        {"name": "layers.0.self_attn.q_proj", "in": 8, "out": 16},
        {"name": "layers.0.self_attn.o_proj", "in": 16, "out": 8}]})")
                  .ok());
  ASSERT_TRUE(store.CreatePolicy("acme/tp", "tiny").ok());
  const TestAdapter a(4, 1.0f, false);
  PublishOptions po;
  po.alias = "serving";
  po.lora.alpha = 8.0f;
  auto rev = store.PublishTensors("acme/tp", a.views, po);
  ASSERT_TRUE(rev.ok()) << rev.status();
  auto lease = store.tiers()->device()->AcquireBatch(std::vector<uint64_t>{rev->id});
  ASSERT_TRUE(lease.ok()) << lease.status();
  auto loc = store.Locate("acme/tp", "serving");
  ASSERT_TRUE(loc.ok()) << loc.status();
  EXPECT_EQ(loc->location.tier, Tier::kGpu);
  EXPECT_EQ(loc->location.device_bytes, lease->Find(rev->id)->bytes);
  EXPECT_EQ(loc->location.tp.degree, 2);
  EXPECT_EQ(loc->location.tp.rank, 0);
  // The shard: half of each split factor (q B 16x4 -> 8x4, o A 4x16 -> 4x8), the rest whole.
  EXPECT_EQ(loc->location.device_bytes, (4 * 8 + 8 * 4 + 4 * 8 + 8 * 4) * sizeof(float));
}

}  // namespace
}  // namespace loradb::tiers
