// Export from tensor-parallel state across processes: K ranks each hold their shard of
// an adapter, the shards travel to rank 0 over c10d (Gloo on loopback) and rank 0 publishes one
// revision whose blob hash equals the TP = 1 export of the same weights (`loradb tp-export`,
// compute/distributed/tp_export.h). A rank dying mid-gather fails the export clearly and
// publishes nothing; ranks whose shard layouts disagree fail before anything travels.
#include "compute/distributed/tp_export.h"

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "compute/distributed/process_group.h"
#include "nlohmann/json.hpp"
#include "storage/tiers/tp_shard.h"
#include "storage/tiers/tp_shard_load.h"
#include "tests/compute/tp_test_util.h"

namespace loradb::distributed {
namespace {

// Exports revision `rev` at TP 1, 2 and 4 (separate processes over Gloo) into three policies:
// the three blobs are the same bytes (equal content hashes).
void ExpectTpExportsMatchTp1(const std::string& name, const std::vector<int>& degrees) {
  SKIP_WITHOUT_C10D();
  TpFixture f(name);
  const uint64_t rev = f.options.revisions[1];
  std::vector<std::string> hashes;
  for (int tp : degrees) {
    SCOPED_TRACE(tp);
    CliRun r = Cli(f.dir, f.options.store_dir,
                   absl::StrCat("tp-export --tp ", tp, " --from-revision ", rev, " --policy out/tp",
                                tp, " --alias serving --timeout-ms 30000 --json"));
    ASSERT_EQ(r.rc, 0) << r.err;
    nlohmann::json doc = nlohmann::json::parse(r.out);
    EXPECT_EQ(doc["tp"].get<int>(), tp);
    if (tp > 1) {
      EXPECT_LT(doc["shard_bytes_rank0"].get<uint64_t>(), doc["gathered_bytes"].get<uint64_t>());
    }
    hashes.push_back(doc["blob_hash"].get<std::string>());
  }
  for (size_t i = 1; i < hashes.size(); ++i) EXPECT_EQ(hashes[i], hashes[0]) << "degree " << i;
  StoreOptions so;
  so.create_if_missing = false;
  auto store = Store::Open(f.options.store_dir, so);
  ASSERT_TRUE(store.ok()) << store.status();
  auto src = (*store)->GetRevision(rev);
  ASSERT_TRUE(src.ok());
  // Gathering the shards of a revision gives back the revision's own blob.
  EXPECT_EQ(hashes[0], src->blob.hash.Hex());
  for (int tp : degrees) {
    auto loc = (*store)->Locate(absl::StrCat("out/tp", tp), "serving");
    ASSERT_TRUE(loc.ok()) << loc.status();
    EXPECT_EQ(loc->revision.blob.hash.Hex(), hashes[0]);
    EXPECT_EQ(loc->revision.lora.alpha, src->lora.alpha);
  }
  EXPECT_TRUE((*store)->Verify()->ok());
}

TEST(TpExport, DenseShardsGatheredFrom2And4ProcessesMatchTheTp1Export) {
  ExpectTpExportsMatchTp1("tiny-dense", {1, 2, 4});
}

TEST(TpExport, PackedMoeShardsGatheredFrom2ProcessesMatchTheTp1Export) {
  ExpectTpExportsMatchTp1("tiny-moe", {1, 2});
}

TEST(TpExport, ARankDyingMidGatherFailsClearlyAndPublishesNothing) {
  SKIP_WITHOUT_C10D();
  TpFixture f("tiny-dense");
  CliRun r =
      Cli(f.dir, f.options.store_dir,
          absl::StrCat("tp-export --tp 2 --from-revision ", f.options.revisions[0],
                       " --policy out/dead --alias serving --die-rank 1 --timeout-ms 20000"));
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("tensor-parallel export aborted, nothing published"), std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("rank 1 was killed by signal 9"), std::string::npos) << r.err;
  StoreOptions so;
  so.create_if_missing = false;
  auto store = Store::Open(f.options.store_dir, so);
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_EQ((*store)->GetPolicy("out/dead").status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE((*store)->Verify()->ok());
}

// Two ranks as threads of this process (a FileStore rendezvous): rank 1 holds the shard of
// another degree, so the layouts disagree; both ranks fail naming rank 1 and nothing is published.
TEST(TpExport, ShardLayoutsThatDisagreeFailOnEveryRankBeforeAnythingTravels) {
  SKIP_WITHOUT_C10D();
  TpFixture f("tiny-dense");
  StoreOptions so;
  so.create_if_missing = false;
  auto store = Store::Open(f.options.store_dir, so);
  ASSERT_TRUE(store.ok()) << store.status();
  auto src = (*store)->GetRevision(f.options.revisions[0]);
  ASSERT_TRUE(src.ok());
  const std::string blob = (*store)->BlobPath(src->blob.hash);
  auto s0 = tiers::ReadAdapterShardFile(blob, {0, 2}, tiers::ShardReadMode::kWholeVerified);
  auto s1 = tiers::ReadAdapterShardFile(blob, {1, 4}, tiers::ShardReadMode::kWholeVerified);
  ASSERT_TRUE(s0.ok() && s1.ok());
  PublishOptions po;
  po.create_policy_base = src->base;
  po.lora = src->lora;
  absl::Status st[2];
  auto run = [&](int rank) {
    dist::GroupOptions go;
    go.rank = rank;
    go.world_size = 2;
    go.rendezvous = "file:" + f.dir.file("rendezvous");
    go.timeout = std::chrono::milliseconds(20000);
    auto group = dist::ProcessGroup::Create(go);
    if (!group.ok()) {
      st[rank] = group.status();
      return;
    }
    st[rank] = GatherAndPublishAdapter(**group, rank == 0 ? *s0 : *s1,
                                       rank == 0 ? store->get() : nullptr, "out/mixed", po)
                   .status();
  };
  std::thread t1(run, 1);
  run(0);
  t1.join();
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_EQ(st[rank].code(), absl::StatusCode::kInvalidArgument) << rank << ": " << st[rank];
    EXPECT_NE(st[rank].message().find("rank(s) 1 differs from rank 0's"), absl::string_view::npos)
        << st[rank];
  }
  EXPECT_EQ((*store)->GetPolicy("out/mixed").status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace loradb::distributed
