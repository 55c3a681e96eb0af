// Zero-copy reads: CatalogReader views match the owning decode, see one snapshot, refuse bad
// input like the owning lookups, and die loudly when used after their transaction.
#include <gtest/gtest.h>
#include <lmdb.h>

#include <string>
#include <thread>
#include <vector>

#include "storage/catalog/catalog.h"
#include "tests/test_util.h"

namespace loradb {
namespace {

using ::loradb::testing::TempDir;

class CatalogViewTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto c = Catalog::Open(dir_.path());
    ASSERT_TRUE(c.ok()) << c.status();
    cat_ = *c;
    BaseRecord b;
    b.name = "tiny";
    b.arch.family = "custom";
    b.modules = {{"layers.0.self_attn.q_proj", 8, 16}};
    ASSERT_TRUE(cat_->PutBase(b).ok());
    auto p = cat_->CreatePolicy("acme/support", "tiny");
    ASSERT_TRUE(p.ok()) << p.status();
    policy_ = *p;
  }

  uint64_t Publish(const std::string& alias = "", uint64_t seed = 1,
                   const std::string& dtype = "BF16") {
    NewRevision r;
    r.policy_id = policy_.id;
    r.lora.r = 8;
    r.lora.alpha = 16;
    r.lora.target_modules = {"q_proj"};
    r.dtype = dtype;
    r.layout = Layout::kPacked;
    r.source.kind = SourceKind::kTrained;
    r.source.checkpoint_id = 7 * seed;
    r.blob.hash = Hash128{seed, seed + 100};
    r.blob.bytes = 4096 + seed;
    r.blob.tensors = 3;
    r.alias = alias;
    auto rec = cat_->Publish(r, "");
    EXPECT_TRUE(rec.ok()) << rec.status();
    return rec.ok() ? rec->id : 0;
  }

  TempDir dir_;
  std::shared_ptr<Catalog> cat_;
  PolicyRecord policy_;
};

TEST_F(CatalogViewTest, ViewMatchesOwningRecord) {
  const uint64_t id = Publish("serving");
  ASSERT_TRUE(cat_->SetEvalScore(id, "mmlu", 0.5f).ok());
  auto owned = cat_->GetRevision(id);
  ASSERT_TRUE(owned.ok()) << owned.status();
  ASSERT_TRUE(cat_->Read([&](const CatalogReader& r) -> absl::Status {
                    auto v = r.Revision(id);
                    if (!v.ok()) return v.status();
                    EXPECT_EQ(v->id(), owned->id);
                    EXPECT_EQ(v->policy_id(), policy_.id);
                    EXPECT_EQ(v->seq(), owned->seq);
                    EXPECT_EQ(v->base(), "tiny");
                    EXPECT_EQ(v->parent(), 0u);
                    EXPECT_EQ(v->source_kind(), SourceKind::kTrained);
                    EXPECT_EQ(v->source_checkpoint_id(), 7u);
                    EXPECT_EQ(v->lora_r(), 8);
                    EXPECT_EQ(v->lora_alpha(), 16.0f);
                    EXPECT_EQ(v->dtype(), "BF16");
                    EXPECT_EQ(v->layout(), Layout::kPacked);
                    EXPECT_EQ(v->blob().hash, owned->blob.hash);
                    EXPECT_EQ(v->blob().bytes, owned->blob.bytes);
                    EXPECT_EQ(v->blob().tensors, 3u);
                    EXPECT_EQ(v->created_us(), owned->created_us);
                    EXPECT_TRUE(v->live());
                    const RevisionRecord copy = v->ToRecord();
                    EXPECT_EQ(copy.evals, owned->evals);
                    EXPECT_EQ(copy.lora, owned->lora);
                    EXPECT_EQ(copy.source.checkpoint_id, owned->source.checkpoint_id);

                    auto by_alias = r.RevisionByAlias(policy_.id, "serving");
                    if (!by_alias.ok()) return by_alias.status();
                    EXPECT_EQ(by_alias->id(), id);
                    auto by_seq = r.RevisionBySeq(policy_.id, owned->seq);
                    if (!by_seq.ok()) return by_seq.status();
                    EXPECT_EQ(by_seq->id(), id);
                    auto pid = r.PolicyId("acme/support");
                    if (!pid.ok()) return pid.status();
                    EXPECT_EQ(*pid, policy_.id);
                    auto p = r.Policy("acme/support");
                    if (!p.ok()) return p.status();
                    EXPECT_EQ(p->id(), policy_.id);
                    EXPECT_EQ(p->name(), "acme/support");
                    EXPECT_EQ(p->base(), "tiny");
                    EXPECT_FALSE(p->archived());
                    return absl::OkStatus();
                  })
                  .ok());
}

// A dtype the record layout keeps as a code and one it keeps as a string read the same way.
TEST_F(CatalogViewTest, ViewReadsDtypesStoredAsCodeOrString) {
  const uint64_t coded = Publish("", 1, "F16");
  const uint64_t named = Publish("", 2, "Q4_K");
  const uint64_t none = Publish("", 3, "");
  ASSERT_TRUE(
      cat_->Read([&](const CatalogReader& r) -> absl::Status {
            for (const auto& [id, dtype] :
                 {std::pair<uint64_t, std::string>{coded, "F16"}, {named, "Q4_K"}, {none, ""}}) {
              auto v = r.Revision(id);
              if (!v.ok()) return v.status();
              EXPECT_EQ(v->dtype(), dtype);
              EXPECT_EQ(v->ToRecord().dtype, dtype);
            }
            return absl::OkStatus();
          })
          .ok());
}

TEST_F(CatalogViewTest, LatestSkipsDeletedRevisions) {
  const uint64_t first = Publish("", 1);
  const uint64_t second = Publish("", 2);
  ASSERT_TRUE(cat_->DeleteRevision(second).ok());
  ASSERT_TRUE(cat_->Read([&](const CatalogReader& r) -> absl::Status {
                    auto v = r.RevisionByAlias(policy_.id, "latest");
                    if (!v.ok()) return v.status();
                    EXPECT_EQ(v->id(), first);
                    auto deleted = r.Revision(second);
                    if (!deleted.ok()) return deleted.status();
                    EXPECT_EQ(deleted->state(), RevisionState::kDeleted);
                    return absl::OkStatus();
                  })
                  .ok());
}

TEST_F(CatalogViewTest, ErrorsMatchOwningLookups) {
  Publish();
  ASSERT_TRUE(cat_->Read([&](const CatalogReader& r) -> absl::Status {
                    EXPECT_TRUE(absl::IsNotFound(r.Revision(999).status()));
                    EXPECT_TRUE(absl::IsNotFound(r.RevisionBySeq(policy_.id, 9).status()));
                    EXPECT_TRUE(absl::IsNotFound(r.RevisionByAlias(policy_.id, "canary").status()));
                    EXPECT_TRUE(
                        absl::IsInvalidArgument(r.RevisionByAlias(policy_.id, "").status()));
                    EXPECT_TRUE(absl::IsInvalidArgument(r.PolicyId("a//b").status()));
                    EXPECT_TRUE(absl::IsNotFound(r.Policy("acme/other").status()));
                    EXPECT_TRUE(absl::IsNotFound(r.PolicyById(42).status()));
                    return absl::OkStatus();
                  })
                  .ok());
  // The callback's status is Read's.
  EXPECT_TRUE(absl::IsNotFound(
      cat_->Read([](const CatalogReader& r) { return r.Revision(12345).status(); })));
}

TEST_F(CatalogViewTest, CorruptRecordIsDataLossNotAView) {
  const uint64_t id = Publish();
  cat_.reset();
  {
    // Overwrite the record with bytes that are no FlatBuffers table, through LMDB directly.
    MDB_env* env = nullptr;
    ASSERT_EQ(mdb_env_create(&env), 0);
    mdb_env_set_maxdbs(env, 16);
    ASSERT_EQ(mdb_env_open(env, (dir_.path() + "/catalog").c_str(), 0, 0644), 0);
    MDB_txn* txn = nullptr;
    ASSERT_EQ(mdb_txn_begin(env, nullptr, 0, &txn), 0);
    MDB_dbi dbi;
    ASSERT_EQ(mdb_dbi_open(txn, "revisions", 0, &dbi), 0);
    uint8_t key[8] = {0, 0, 0, 0, 0, 0, 0, static_cast<uint8_t>(id)};
    std::vector<uint8_t> junk(64, 0xee);
    MDB_val k{8, key}, v{junk.size(), junk.data()};
    ASSERT_EQ(mdb_put(txn, dbi, &k, &v, 0), 0);
    ASSERT_EQ(mdb_txn_commit(txn), 0);
    mdb_env_close(env);
  }
  auto c = Catalog::Open(dir_.path());
  ASSERT_TRUE(c.ok()) << c.status();
  absl::Status st = (*c)->Read([&](const CatalogReader& r) { return r.Revision(id).status(); });
  EXPECT_TRUE(absl::IsDataLoss(st)) << st;
  EXPECT_TRUE(absl::IsDataLoss((*c)->GetRevision(id).status()));
}

// A reader's snapshot holds while another thread commits: the view keeps the values of the
// transaction it was read in.
TEST_F(CatalogViewTest, ViewSeesItsSnapshotAcrossAnotherThreadsCommit) {
  const uint64_t id = Publish("serving", 1);
  const uint64_t other = Publish("", 2);
  ASSERT_TRUE(cat_->Read([&](const CatalogReader& r) -> absl::Status {
                    auto v = r.RevisionByAlias(policy_.id, "serving");
                    if (!v.ok()) return v.status();
                    std::thread writer([&] {
                      EXPECT_TRUE(cat_->SetAlias(policy_.id, "serving", other).ok());
                      EXPECT_TRUE(cat_->SetEvalScore(id, "x", 1.0f).ok());
                    });
                    writer.join();
                    EXPECT_EQ(v->id(), id);
                    EXPECT_TRUE(v->ToRecord().evals.empty());
                    auto again = r.RevisionByAlias(policy_.id, "serving");
                    if (!again.ok()) return again.status();
                    EXPECT_EQ(again->id(), id);  // same snapshot
                    return absl::OkStatus();
                  })
                  .ok());
  auto now = cat_->GetRevisionByAlias(policy_.id, "serving");
  ASSERT_TRUE(now.ok());
  EXPECT_EQ(now->id, other);
}

// A view kept past its callback and used after a commit: the process dies with a message
// instead of reading a page a later transaction may have reused.
TEST_F(CatalogViewTest, ViewUsedAfterItsTransactionDies) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const uint64_t id = Publish("serving");
  RevisionView leaked;
  PolicyView leaked_policy;
  ASSERT_TRUE(cat_->Read([&](const CatalogReader& r) -> absl::Status {
                    auto v = r.Revision(id);
                    if (!v.ok()) return v.status();
                    leaked = *v;
                    auto p = r.PolicyById(policy_.id);
                    if (!p.ok()) return p.status();
                    leaked_policy = *p;
                    return absl::OkStatus();
                  })
                  .ok());
  ASSERT_TRUE(cat_->SetEvalScore(id, "after", 2.0f).ok());  // a commit
  EXPECT_DEATH((void)leaked.id(), "RevisionView was used after its read transaction ended");
  EXPECT_DEATH((void)leaked.ToRecord(), "RevisionView was used after its read transaction");
  EXPECT_DEATH((void)leaked_policy.name(), "PolicyView was used after its read transaction");
  RevisionView empty;
  EXPECT_DEATH((void)empty.seq(), "empty RevisionView");
}

// The pooled transaction a leaked view came from serves the next Read: the view still dies.
TEST_F(CatalogViewTest, ViewDiesEvenWhenItsPooledTransactionIsReused) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const uint64_t id = Publish();
  RevisionView leaked;
  ASSERT_TRUE(cat_->Read([&](const CatalogReader& r) -> absl::Status {
                    auto v = r.Revision(id);
                    if (!v.ok()) return v.status();
                    leaked = *v;
                    return absl::OkStatus();
                  })
                  .ok());
  ASSERT_TRUE(cat_->Read([&](const CatalogReader& r) -> absl::Status {
                    EXPECT_DEATH((void)leaked.id(), "used after its read transaction ended");
                    return r.Revision(id).status();
                  })
                  .ok());
}

}  // namespace
}  // namespace loradb
