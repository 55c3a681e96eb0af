// Fencing of the catalog's replication stream (storage/replication): every publisher takes a new
// writer epoch; a publisher whose epoch was superseded (a second writer, or a stale one after a
// failover) cannot publish, and followers never move to a generation of a lower epoch.
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "storage/replication/replication.h"
#include "storage/util/file_util.h"
#include "tests/test_util.h"

namespace loradb {
namespace {

constexpr char kPolicy[] = "fence/p";

// A store with one base and one policy; `Write(i)` publishes revision i and moves `prod`.
class FencingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = tmp_.file("store");
    auto store = Store::Open(dir_);
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = std::move(*store);
    ASSERT_TRUE(store_
                    ->AddBaseFromModuleTable(
                        "b", R"({"modules":[{"name":"layers.0.self_attn.q_proj","in":8,"out":8}]})")
                    .ok());
    ASSERT_TRUE(store_->CreatePolicy(kPolicy, "b").ok());
    auto catalog = Catalog::Open(dir_);
    ASSERT_TRUE(catalog.ok()) << catalog.status();
    catalog_ = *catalog;
    root_ = ReplicaRootFor(dir_);
  }

  uint64_t Write(int i) {
    std::vector<float> a(2 * 8, static_cast<float>(i)), b(8 * 2, static_cast<float>(-i));
    std::vector<TensorView> v(2);
    v[0].name = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight";
    v[0].shape = {2, 8};
    v[0].data = reinterpret_cast<const std::byte*>(a.data());
    v[0].nbytes = a.size() * sizeof(float);
    v[1].name = "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight";
    v[1].shape = {8, 2};
    v[1].data = reinterpret_cast<const std::byte*>(b.data());
    v[1].nbytes = b.size() * sizeof(float);
    PublishOptions o;
    o.alias = "prod";
    auto rev = store_->PublishTensors(kPolicy, v, o);
    EXPECT_TRUE(rev.ok()) << rev.status();
    return rev.ok() ? rev->id : 0;
  }

  std::vector<std::string> Names() {
    std::vector<std::string> out;
    for (const auto& e : std::filesystem::directory_iterator(root_)) {
      out.push_back(e.path().filename().string());
    }
    std::sort(out.begin(), out.end());
    return out;
  }

  testing::TempDir tmp_;
  std::string dir_, root_;
  std::unique_ptr<Store> store_;
  std::shared_ptr<Catalog> catalog_;
};

TEST_F(FencingTest, SecondWriterFencesTheFirstAndNothingAcknowledgedIsLost) {
  PublisherOptions no_flock;  // as on a shared file system, or a take-over after failover
  no_flock.use_flock = false;
  auto a = ReplicaPublisher::Open(catalog_, root_, no_flock);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ((*a)->epoch(), 1u);
  const uint64_t r1 = Write(1);
  auto g1 = (*a)->Publish();
  ASSERT_TRUE(g1.ok()) << g1.status();
  EXPECT_EQ(g1->epoch, 1u);
  auto follower = ReplicaFollower::Open(root_);
  ASSERT_TRUE(follower.ok()) << follower.status();

  // Writer B takes over (epoch 2). A's write below was acknowledged by the catalog (LMDB
  // commit) but A may no longer publish it: B's generations carry it.
  auto b = ReplicaPublisher::Open(catalog_, root_, no_flock);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ((*b)->epoch(), 2u);
  auto epoch = ReadWriterEpoch(root_);
  ASSERT_TRUE(epoch.ok());
  EXPECT_EQ(*epoch, 2u);
  const uint64_t r2 = Write(2);
  const std::vector<std::string> before = Names();
  auto stale = (*a)->Publish();
  ASSERT_TRUE(absl::IsFailedPrecondition(stale.status())) << stale.status();
  EXPECT_NE(stale.status().message().find("fenced"), std::string::npos) << stale.status();
  EXPECT_NE(stale.status().message().find("epoch 2"), std::string::npos) << stale.status();
  EXPECT_EQ(Names(), before);  // nothing written: no generation, no tmp-, CURRENT unchanged
  EXPECT_TRUE(absl::IsFailedPrecondition((*a)->PublishIfChanged().status()));
  auto current = ReadCurrentGeneration(root_);
  ASSERT_TRUE(current.ok());
  EXPECT_EQ(*current, 1u);

  auto g2 = (*b)->Publish();
  ASSERT_TRUE(g2.ok()) << g2.status();
  EXPECT_EQ(g2->generation, 2u);
  EXPECT_EQ(g2->epoch, 2u);
  auto swapped = (*follower)->Refresh();
  ASSERT_TRUE(swapped.ok()) << swapped.status();
  EXPECT_TRUE(*swapped);
  auto prod = (*follower)->store()->GetRevisionByAlias(kPolicy, "prod");
  ASSERT_TRUE(prod.ok()) << prod.status();
  EXPECT_EQ(prod->id, r2);
  EXPECT_TRUE((*follower)->store()->GetRevision(r1).ok());
  EXPECT_EQ((*follower)->manifest().epoch, 2u);
}

TEST_F(FencingTest, FollowerRefusesAGenerationOfALowerEpoch) {
  auto a = ReplicaPublisher::Open(catalog_, root_);
  ASSERT_TRUE(a.ok()) << a.status();
  Write(1);
  ASSERT_TRUE((*a)->Publish().ok());
  a->reset();  // releases the flock: the next writer opens normally
  auto b = ReplicaPublisher::Open(catalog_, root_);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ((*b)->epoch(), 2u);
  Write(2);
  auto g2 = (*b)->Publish();
  ASSERT_TRUE(g2.ok()) << g2.status();
  auto follower = ReplicaFollower::Open(root_);
  ASSERT_TRUE(follower.ok()) << follower.status();
  EXPECT_EQ((*follower)->manifest().generation, 2u);

  // A stale writer of epoch 1 that got past its checks (the race the follower check closes):
  // its generation 3 is a valid copy, but of a fenced epoch.
  const std::string g2dir = root_ + "/" + GenerationDirName(2);
  const std::string g3dir = root_ + "/" + GenerationDirName(3);
  std::filesystem::copy(g2dir, g3dir, std::filesystem::copy_options::recursive);
  auto text = ReadFileToString(g3dir + "/MANIFEST.json");
  ASSERT_TRUE(text.ok());
  nlohmann::json j = nlohmann::json::parse(*text);
  j["generation"] = 3;
  j["writer_epoch"] = 1;
  ASSERT_TRUE(WriteFileAtomic(g3dir + "/MANIFEST.json", j.dump()).ok());
  ASSERT_TRUE(WriteFileAtomic(root_ + "/CURRENT", GenerationDirName(3) + "\n").ok());
  auto refused = (*follower)->Refresh();
  ASSERT_TRUE(absl::IsFailedPrecondition(refused.status())) << refused.status();
  EXPECT_NE(refused.status().message().find("fenced writer epoch 1"), std::string::npos)
      << refused.status();
  EXPECT_EQ((*follower)->manifest().generation, 2u);  // still serving epoch 2's generation

  // The live writer moves on (numbering after every generation on disk); the follower follows.
  Write(3);
  auto g4 = (*b)->Publish();
  ASSERT_TRUE(g4.ok()) << g4.status();
  EXPECT_EQ(g4->generation, 4u);
  auto swapped = (*follower)->Refresh();
  ASSERT_TRUE(swapped.ok()) << swapped.status();
  EXPECT_TRUE(*swapped);
  EXPECT_EQ((*follower)->manifest().generation, 4u);

  // A manifest with a malformed epoch is refused as data loss.
  j["writer_epoch"] = "two";
  ASSERT_TRUE(WriteFileAtomic(g3dir + "/MANIFEST.json", j.dump()).ok());
  EXPECT_TRUE(absl::IsDataLoss(ReadManifest(root_, 3).status()));
}

}  // namespace
}  // namespace loradb
