#include "storage/catalog/catalog.h"

#include <gtest/gtest.h>
#include <lmdb.h>

#include <atomic>
#include <map>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "storage/util/file_util.h"
#include "tests/test_util.h"

namespace loradb {
namespace {

using ::loradb::testing::TempDir;

BaseRecord TinyBase(const std::string& name = "tiny") {
  BaseRecord b;
  b.name = name;
  b.arch.family = "custom";
  b.arch.hidden_size = 8;
  b.modules = {{"layers.0.self_attn.q_proj", 8, 16}, {"layers.0.self_attn.k_proj", 8, 4}};
  return b;
}

NewRevision Rev(uint64_t policy_id, uint64_t blob_seed = 1) {
  NewRevision r;
  r.policy_id = policy_id;
  r.lora.r = 4;
  r.lora.alpha = 8;
  r.dtype = "F32";
  r.blob.hash = Hash128{blob_seed, blob_seed * 3};
  r.blob.bytes = 1000 + blob_seed;
  r.blob.tensors = 4;
  return r;
}

class CatalogTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto c = Catalog::Open(dir_.path());
    ASSERT_TRUE(c.ok()) << c.status();
    cat_ = *c;
    ASSERT_TRUE(cat_->PutBase(TinyBase()).ok());
    auto p = cat_->CreatePolicy("acme/support", "tiny", {{"team", "a"}});
    ASSERT_TRUE(p.ok()) << p.status();
    policy_ = *p;
  }
  TempDir dir_;
  std::shared_ptr<Catalog> cat_;
  PolicyRecord policy_;
};

TEST(CatalogOpen, SecondOpenReturnsSameHandleAndIdPersists) {
  TempDir dir;
  std::string id;
  {
    auto a = Catalog::Open(dir.path());
    ASSERT_TRUE(a.ok()) << a.status();
    auto b = Catalog::Open(dir.path() + "/.");
    ASSERT_TRUE(b.ok());
    EXPECT_EQ(a->get(), b->get());
    id = (*a)->store_id();
    EXPECT_EQ(id.size(), 32u);
  }
  auto c = Catalog::Open(dir.path());
  ASSERT_TRUE(c.ok());
  EXPECT_EQ((*c)->store_id(), id);
}

TEST(CatalogOpen, MissingStoreWithoutCreateIsNotFound) {
  TempDir dir;
  CatalogOptions o;
  o.create_if_missing = false;
  auto c = Catalog::Open(dir.file("nope"), o);
  EXPECT_TRUE(absl::IsNotFound(c.status())) << c.status();
}

TEST(CatalogOpen, NewerSchemaVersionIsClearError) {
  TempDir dir;
  { ASSERT_TRUE(Catalog::Open(dir.path()).ok()); }
  // Rewrite meta.schema_version with raw LMDB, as a newer loradb would have.
  MDB_env* env = nullptr;
  ASSERT_EQ(mdb_env_create(&env), 0);
  mdb_env_set_maxdbs(env, 16);
  ASSERT_EQ(mdb_env_open(env, dir.file("catalog").c_str(), 0, 0644), 0);
  MDB_txn* txn = nullptr;
  ASSERT_EQ(mdb_txn_begin(env, nullptr, 0, &txn), 0);
  MDB_dbi meta;
  ASSERT_EQ(mdb_dbi_open(txn, "meta", 0, &meta), 0);
  uint8_t v[8] = {0, 0, 0, 0, 0, 0, 0, 99};
  std::string key = "schema_version";
  MDB_val k{key.size(), key.data()}, val{8, v};
  ASSERT_EQ(mdb_put(txn, meta, &k, &val, 0), 0);
  ASSERT_EQ(mdb_txn_commit(txn), 0);
  mdb_env_close(env);
  auto c = Catalog::Open(dir.path());
  ASSERT_FALSE(c.ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(c.status())) << c.status();
  EXPECT_NE(c.status().message().find("newer"), std::string::npos) << c.status();
}

TEST(CatalogNames, PolicyNameRules) {
  EXPECT_TRUE(ValidatePolicyName("acme/support-v1.2_x").ok());
  EXPECT_TRUE(ValidatePolicyName("9lives").ok());
  EXPECT_TRUE(ValidatePolicyName(std::string(128, 'a')).ok());
  EXPECT_FALSE(ValidatePolicyName(std::string(129, 'a')).ok());
  EXPECT_FALSE(ValidatePolicyName("").ok());
  EXPECT_FALSE(ValidatePolicyName("/abs").ok());
  EXPECT_FALSE(ValidatePolicyName("-x").ok());
  EXPECT_FALSE(ValidatePolicyName("a b").ok());
  EXPECT_FALSE(ValidatePolicyName("a:b").ok());
  EXPECT_TRUE(ValidateAliasName("serving").ok());
  EXPECT_FALSE(ValidateAliasName("1x").ok());
  EXPECT_FALSE(ValidateAliasName("a/b").ok());
}

// Names read as paths: every '/'-separated segment is non-empty and starts with a letter or
// digit. Base names follow the same check.
TEST(CatalogNames, PolicyNameSegments) {
  for (const char* good : {"a/b", "a/b/c", "acme/v1.2", "a/9", "a/b-c_d.e"}) {
    EXPECT_TRUE(ValidatePolicyName(good).ok()) << good;
    EXPECT_TRUE(ValidateBaseName(good).ok()) << good;
  }
  for (const char* bad : {"a/../b", "a//b", "x/", "/x", "a/./b", "a/..", "a/.", ".", "..",
                          "a/.hidden", "a/-x", "a/_x"}) {
    absl::Status st = ValidatePolicyName(bad);
    EXPECT_TRUE(absl::IsInvalidArgument(st)) << bad;
    EXPECT_NE(st.message().find(bad), absl::string_view::npos) << st;
    EXPECT_TRUE(absl::IsInvalidArgument(ValidateBaseName(bad))) << bad;
  }
  EXPECT_NE(ValidatePolicyName("a//b").message().find("empty segment"), absl::string_view::npos);
  EXPECT_NE(ValidatePolicyName("a/../b").message().find("segment '..'"), absl::string_view::npos);
}

TEST(CatalogNames, CanonicalIds) {
  uint64_t id = 0;
  EXPECT_TRUE(ParseCanonicalId("2", &id));
  EXPECT_EQ(id, 2u);
  EXPECT_TRUE(ParseCanonicalId("0", &id));
  EXPECT_TRUE(ParseCanonicalId("18446744073709551615", &id));
  EXPECT_EQ(id, UINT64_MAX);
  for (const char* bad : {"", " 2", "2 ", "01", "00", "+2", "-2", "0x2", "2a", "1e3",
                          "18446744073709551616", "99999999999999999999"}) {
    EXPECT_FALSE(ParseCanonicalId(bad, &id)) << bad;
  }
}

// Names no record can have are refused before they reach LMDB (an empty key is an LMDB error,
// which once surfaced as an internal error), as InvalidArgument naming the rule.
TEST_F(CatalogTest, LookupsRefuseInvalidNames) {
  for (const std::string& bad : std::vector<std::string>{"", "a//b", "x/", std::string(600, 'a')}) {
    EXPECT_TRUE(absl::IsInvalidArgument(cat_->GetPolicy(bad).status())) << bad;
    EXPECT_TRUE(absl::IsInvalidArgument(cat_->GetBase(bad).status())) << bad;
    EXPECT_TRUE(absl::IsInvalidArgument(cat_->CreatePolicy(bad, "tiny").status())) << bad;
  }
  auto r = cat_->Publish(Rev(policy_.id), "");
  ASSERT_TRUE(r.ok());
  for (const std::string& bad : std::vector<std::string>{"", "1x", std::string(300, 'a')}) {
    EXPECT_TRUE(absl::IsInvalidArgument(cat_->GetRevisionByAlias(policy_.id, bad).status()));
    EXPECT_TRUE(absl::IsInvalidArgument(cat_->AliasLog(policy_.id, bad).status())) << bad;
    EXPECT_TRUE(absl::IsInvalidArgument(cat_->Rollback(policy_.id, bad).status())) << bad;
    EXPECT_TRUE(absl::IsInvalidArgument(cat_->SetAlias(policy_.id, bad, r->id))) << bad;
  }
  EXPECT_TRUE(cat_->GetPolicy("acme/support").ok());
}

TEST(CatalogOpen, RegularFileIsNotAStoreDirectory) {
  TempDir dir;
  ASSERT_TRUE(WriteFileAtomic(dir.file("file"), "not a store").ok());
  auto c = Catalog::Open(dir.file("file"));
  EXPECT_TRUE(absl::IsInvalidArgument(c.status())) << c.status();
  EXPECT_NE(c.status().message().find("is not a store directory: it is a regular file"),
            std::string::npos)
      << c.status();
}

TEST_F(CatalogTest, BasesAndPolicies) {
  EXPECT_TRUE(absl::IsAlreadyExists(cat_->PutBase(TinyBase())));
  BaseRecord empty = TinyBase("empty");
  empty.modules.clear();
  EXPECT_TRUE(absl::IsInvalidArgument(cat_->PutBase(empty)));
  BaseRecord dup = TinyBase("dup");
  dup.modules.push_back(dup.modules[0]);
  EXPECT_TRUE(absl::IsInvalidArgument(cat_->PutBase(dup)));
  auto b = cat_->GetBase("tiny");
  ASSERT_TRUE(b.ok());
  ASSERT_EQ(b->modules.size(), 2u);
  EXPECT_EQ(b->modules[0].name, "layers.0.self_attn.k_proj");  // sorted
  ASSERT_NE(b->FindModule("layers.0.self_attn.q_proj"), nullptr);
  EXPECT_EQ(b->FindModule("layers.0.self_attn.q_proj")->out, 16);
  EXPECT_EQ(b->FindModule("nope"), nullptr);
  EXPECT_TRUE(absl::IsNotFound(cat_->GetBase("nope").status()));

  EXPECT_TRUE(absl::IsAlreadyExists(cat_->CreatePolicy("acme/support", "tiny").status()));
  EXPECT_TRUE(absl::IsNotFound(cat_->CreatePolicy("other", "nobase").status()));
  EXPECT_TRUE(absl::IsInvalidArgument(cat_->CreatePolicy("bad name", "tiny").status()));
  auto p2 = cat_->CreatePolicy("other", "tiny");
  ASSERT_TRUE(p2.ok());
  EXPECT_EQ(p2->id, policy_.id + 1);
  auto all = cat_->ListPolicies();
  ASSERT_TRUE(all.ok());
  ASSERT_EQ(all->size(), 2u);
  EXPECT_EQ((*all)[0].labels.at("team"), "a");
  auto byid = cat_->GetPolicyById(p2->id);
  ASSERT_TRUE(byid.ok());
  EXPECT_EQ(byid->name, "other");
}

TEST_F(CatalogTest, PublishAssignsIdsSeqsAndRefsBlobs) {
  auto r1 = cat_->Publish(Rev(policy_.id, 1), "");
  ASSERT_TRUE(r1.ok()) << r1.status();
  auto r2 = cat_->Publish(Rev(policy_.id, 1), "");
  ASSERT_TRUE(r2.ok());
  EXPECT_EQ(r1->id, 1u);
  EXPECT_EQ(r1->seq, 1u);
  EXPECT_EQ(r2->id, 2u);
  EXPECT_EQ(r2->seq, 2u);
  EXPECT_EQ(r2->base, "tiny");
  auto blob = cat_->GetBlob(Hash128{1, 3});
  ASSERT_TRUE(blob.ok());
  EXPECT_EQ(blob->refcount, 2u);
  EXPECT_EQ(blob->relpath, BlobRelPath(Hash128{1, 3}));
  // Same hash with a different size is corruption, and the failed publish changes nothing.
  NewRevision bad = Rev(policy_.id, 1);
  bad.blob.bytes = 7;
  EXPECT_FALSE(cat_->Publish(bad, "").ok());
  EXPECT_EQ(cat_->GetBlob(Hash128{1, 3})->refcount, 2u);
  EXPECT_EQ(cat_->GetPolicyById(policy_.id)->next_seq, 3u);

  auto got = cat_->GetRevision(2);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->lora.r, 4);
  EXPECT_EQ(got->blob.hash, (Hash128{1, 3}));
  auto by_seq = cat_->GetRevisionBySeq(policy_.id, 1);
  ASSERT_TRUE(by_seq.ok());
  EXPECT_EQ(by_seq->id, 1u);
  EXPECT_TRUE(absl::IsNotFound(cat_->GetRevisionBySeq(policy_.id, 3).status()));
  EXPECT_TRUE(absl::IsNotFound(cat_->GetRevision(99).status()));
  EXPECT_TRUE(absl::IsNotFound(cat_->Publish(Rev(12345), "").status()));
  auto latest = cat_->GetRevisionByAlias(policy_.id, "latest");
  ASSERT_TRUE(latest.ok());
  EXPECT_EQ(latest->id, 2u);
}

TEST_F(CatalogTest, AliasesLogAndRollback) {
  NewRevision a = Rev(policy_.id);
  a.alias = "serving";
  auto r1 = cat_->Publish(a, "");
  ASSERT_TRUE(r1.ok());
  auto r2 = cat_->Publish(Rev(policy_.id), "");
  auto r3 = cat_->Publish(Rev(policy_.id), "");
  ASSERT_TRUE(r2.ok() && r3.ok());
  EXPECT_EQ(cat_->GetRevisionByAlias(policy_.id, "serving")->id, r1->id);
  ASSERT_TRUE(cat_->SetAlias(policy_.id, "serving", r2->id, "promote").ok());
  ASSERT_TRUE(cat_->SetAlias(policy_.id, "serving", r3->id, "promote").ok());
  // Setting to the current value is a no-op (not logged).
  ASSERT_TRUE(cat_->SetAlias(policy_.id, "serving", r3->id).ok());
  EXPECT_TRUE(absl::IsInvalidArgument(cat_->SetAlias(policy_.id, "latest", r1->id)));
  EXPECT_TRUE(absl::IsNotFound(cat_->SetAlias(policy_.id, "serving", 999)));
  auto other = cat_->CreatePolicy("other", "tiny");
  ASSERT_TRUE(other.ok());
  EXPECT_TRUE(absl::IsInvalidArgument(cat_->SetAlias(other->id, "serving", r1->id)));

  auto log = cat_->AliasLog(policy_.id, "serving");
  ASSERT_TRUE(log.ok());
  ASSERT_EQ(log->size(), 3u);
  for (size_t i = 0; i < log->size(); ++i) EXPECT_EQ((*log)[i].seq, i + 1);
  EXPECT_EQ((*log)[0].from_revision, 0u);
  EXPECT_EQ((*log)[0].to_revision, r1->id);
  EXPECT_EQ((*log)[0].reason, "publish");
  EXPECT_EQ((*log)[2].from_revision, r2->id);
  EXPECT_EQ((*log)[2].to_revision, r3->id);

  auto back = cat_->Rollback(policy_.id, "serving");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, r2->id);
  EXPECT_EQ(cat_->GetRevisionByAlias(policy_.id, "serving")->id, r2->id);
  // Rolling back again returns to the value before the last move (the rollback itself).
  EXPECT_EQ(*cat_->Rollback(policy_.id, "serving"), r3->id);
  EXPECT_EQ(cat_->AliasLog(policy_.id, "serving")->back().reason, "rollback");
  EXPECT_TRUE(absl::IsNotFound(cat_->Rollback(policy_.id, "canary").status()));

  // An alias whose only move was its creation has nothing to roll back to.
  ASSERT_TRUE(cat_->SetAlias(policy_.id, "canary", r1->id).ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(cat_->Rollback(policy_.id, "canary").status()));
  EXPECT_EQ(cat_->GetRevisionByAlias(policy_.id, "canary")->id, r1->id);

  auto aliases = cat_->ListAliases(policy_.id);
  ASSERT_TRUE(aliases.ok());
  ASSERT_EQ(aliases->size(), 2u);
  EXPECT_EQ((*aliases)[0].alias, "canary");
  EXPECT_EQ((*aliases)[1].revision, r3->id);
  // Aliases of another policy with a prefix-sharing id space stay separate.
  EXPECT_TRUE(cat_->ListAliases(other->id)->empty());
}

TEST_F(CatalogTest, DeleteRefusedWhileAliasedAndRollbackToDeletedFails) {
  auto r1 = cat_->Publish(Rev(policy_.id, 5), "");
  auto r2 = cat_->Publish(Rev(policy_.id, 6), "");
  ASSERT_TRUE(r1.ok() && r2.ok());
  ASSERT_TRUE(cat_->SetAlias(policy_.id, "serving", r1->id).ok());
  absl::Status st = cat_->DeleteRevision(r1->id);
  EXPECT_TRUE(absl::IsFailedPrecondition(st)) << st;
  EXPECT_NE(st.message().find("serving"), std::string::npos);
  EXPECT_EQ(cat_->GetRevision(r1->id)->state, RevisionState::kLive);
  ASSERT_TRUE(cat_->SetAlias(policy_.id, "serving", r2->id).ok());
  ASSERT_TRUE(cat_->DeleteRevision(r1->id).ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(cat_->DeleteRevision(r1->id)));
  EXPECT_EQ(cat_->GetRevision(r1->id)->state, RevisionState::kDeleted);
  EXPECT_EQ(cat_->GetBlob(Hash128{5, 15})->refcount, 0u);
  EXPECT_TRUE(absl::IsFailedPrecondition(cat_->Rollback(policy_.id, "serving").status()));
  EXPECT_TRUE(absl::IsFailedPrecondition(cat_->SetAlias(policy_.id, "x", r1->id)));
  // latest skips deleted revisions.
  ASSERT_TRUE(cat_->SetAlias(policy_.id, "serving", r2->id).ok());
  auto r3 = cat_->Publish(Rev(policy_.id, 7), "");
  ASSERT_TRUE(r3.ok());
  ASSERT_TRUE(cat_->DeleteRevision(r3->id).ok());
  EXPECT_EQ(cat_->GetRevisionByAlias(policy_.id, "latest")->id, r2->id);
}

TEST_F(CatalogTest, ListingPaginatesInOrderPerPolicy) {
  auto other = cat_->CreatePolicy("other", "tiny");
  ASSERT_TRUE(other.ok());
  for (int i = 0; i < 25; ++i) {
    ASSERT_TRUE(cat_->Publish(Rev(i % 2 == 0 ? policy_.id : other->id), "").ok());
  }
  std::vector<uint64_t> seqs;
  uint64_t after = 0;
  int pages = 0;
  while (true) {
    auto page = cat_->ListPolicyRevisions(policy_.id, after, 5);
    ASSERT_TRUE(page.ok());
    for (const auto& r : page->items) {
      EXPECT_EQ(r.policy_id, policy_.id);
      seqs.push_back(r.seq);
    }
    ++pages;
    if (!page->next_after) break;
    after = *page->next_after;
  }
  ASSERT_EQ(seqs.size(), 13u);
  for (size_t i = 0; i < seqs.size(); ++i) EXPECT_EQ(seqs[i], i + 1);
  EXPECT_EQ(pages, 3);
  EXPECT_EQ(*cat_->CountPolicyRevisions(policy_.id), 13u);
  EXPECT_EQ(*cat_->CountPolicyRevisions(other->id), 12u);
  EXPECT_EQ(*cat_->CountPolicyRevisions(9999), 0u);

  auto all = cat_->ListRevisions(0, 10);
  ASSERT_TRUE(all.ok());
  ASSERT_EQ(all->items.size(), 10u);
  EXPECT_EQ(all->items.front().id, 1u);
  ASSERT_TRUE(all->next_after.has_value());
  auto rest = cat_->ListRevisions(*all->next_after, 0);
  ASSERT_TRUE(rest.ok());
  EXPECT_EQ(rest->items.size(), 15u);
  EXPECT_FALSE(rest->next_after.has_value());

  ASSERT_TRUE(cat_->DeleteRevision(3).ok());
  EXPECT_EQ(cat_->ListPolicyRevisions(policy_.id, 0, 0)->items.size(), 12u);
  EXPECT_EQ(cat_->ListPolicyRevisions(policy_.id, 0, 0, true)->items.size(), 13u);
  EXPECT_EQ(cat_->ListRevisions(0, 0)->items.size(), 24u);
}

TEST_F(CatalogTest, ArchivedPolicyRejectsPublishAndAliasMoves) {
  auto r1 = cat_->Publish(Rev(policy_.id), "");
  ASSERT_TRUE(r1.ok());
  ASSERT_TRUE(cat_->SetPolicyArchived("acme/support", true).ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(cat_->Publish(Rev(policy_.id), "").status()));
  EXPECT_TRUE(absl::IsFailedPrecondition(cat_->SetAlias(policy_.id, "serving", r1->id)));
  EXPECT_TRUE(cat_->GetRevision(r1->id).ok());
  ASSERT_TRUE(cat_->SetPolicyArchived("acme/support", false).ok());
  EXPECT_TRUE(cat_->Publish(Rev(policy_.id), "").ok());
}

TEST_F(CatalogTest, EvalScoresAndBatchPublish) {
  std::vector<NewRevision> batch;
  for (int i = 0; i < 10; ++i) batch.push_back(Rev(policy_.id, 9));
  auto ids = cat_->PublishBatch(batch, {});
  ASSERT_TRUE(ids.ok()) << ids.status();
  ASSERT_EQ(ids->size(), 10u);
  EXPECT_EQ(cat_->GetBlob(Hash128{9, 27})->refcount, 10u);
  // A batch with one bad entry commits nothing.
  batch.push_back(Rev(4242));
  EXPECT_FALSE(cat_->PublishBatch(batch, {}).ok());
  EXPECT_EQ(cat_->GetBlob(Hash128{9, 27})->refcount, 10u);
  EXPECT_EQ(*cat_->CountPolicyRevisions(policy_.id), 10u);

  ASSERT_TRUE(cat_->SetEvalScore((*ids)[0], "mmlu", 0.5f).ok());
  EXPECT_FLOAT_EQ(cat_->GetRevision((*ids)[0])->evals.at("mmlu"), 0.5f);
}

// One transaction's publishes read each policy, the last id and each blob once: seqs still count
// per policy, a policy created inside the batch gets its own, blob references add up across the
// batch, and an alias moved inside it points at the right revision.
TEST_F(CatalogTest, BatchPublishAcrossPoliciesKeepsSeqsAndReferences) {
  auto other = cat_->CreatePolicy("acme/other", "tiny");
  ASSERT_TRUE(other.ok());
  ASSERT_TRUE(cat_->Publish(Rev(policy_.id, 5), "").ok());  // seq 1 before the batch
  std::vector<NewRevision> batch;
  for (int i = 0; i < 6; ++i) batch.push_back(Rev(i % 2 == 0 ? policy_.id : other->id, 5));
  batch[3].alias = "serving";
  NewRevision created = Rev(0, 6);
  created.create_policy = "acme/new";
  created.create_policy_base = "tiny";
  batch.push_back(created);
  auto ids = cat_->PublishBatch(batch, {});
  ASSERT_TRUE(ids.ok()) << ids.status();
  ASSERT_EQ(ids->size(), 7u);
  std::vector<uint64_t> seqs;
  for (uint64_t id : *ids) seqs.push_back(cat_->GetRevision(id)->seq);
  EXPECT_EQ(seqs, (std::vector<uint64_t>{2, 1, 3, 2, 4, 3, 1}));
  EXPECT_EQ(cat_->GetPolicy("acme/support")->next_seq, 5u);
  EXPECT_EQ(cat_->GetPolicy("acme/other")->next_seq, 4u);
  EXPECT_EQ(cat_->GetPolicy("acme/new")->next_seq, 2u);
  EXPECT_EQ(cat_->GetBlob(Hash128{5, 15})->refcount, 7u);
  EXPECT_EQ(cat_->GetBlob(Hash128{6, 18})->refcount, 1u);
  EXPECT_EQ(cat_->ListRevisionsByBlob(Hash128{5, 15})->size(), 7u);
  EXPECT_EQ(cat_->GetRevisionByAlias(other->id, "serving")->id, (*ids)[3]);
  auto integrity = cat_->CheckIntegrity();
  ASSERT_TRUE(integrity.ok());
  EXPECT_TRUE(integrity->problems.empty()) << integrity->problems.front();

  // The same blob referenced with another size inside one batch: DataLoss, nothing committed.
  std::vector<NewRevision> bad = {Rev(policy_.id, 7), Rev(policy_.id, 7)};
  bad[1].blob.bytes += 1;
  EXPECT_TRUE(absl::IsDataLoss(cat_->PublishBatch(bad, {}).status()));
  EXPECT_TRUE(absl::IsNotFound(cat_->GetBlob(Hash128{7, 21}).status()));
  EXPECT_EQ(*cat_->CountPolicyRevisions(policy_.id), 4u);
}

TEST_F(CatalogTest, Checkpoints) {
  NewCheckpoint c;
  c.policy_id = policy_.id;
  c.step = 100;
  c.master = {Hash128{7, 7}, 64, 2};
  c.optimizer = {Hash128{8, 8}, 128, 4};
  c.scheduler_name = "cosine";
  c.scheduler_position = 100;
  c.rng_state = std::string("\x01\x00\x02", 3);
  auto c1 = cat_->PutCheckpoint(c);
  ASSERT_TRUE(c1.ok()) << c1.status();
  c.step = 50;
  c.parent = c1->id;
  auto c2 = cat_->PutCheckpoint(c);
  ASSERT_TRUE(c2.ok());
  c.parent = 77;
  EXPECT_TRUE(absl::IsNotFound(cat_->PutCheckpoint(c).status()));
  NewCheckpoint no_master;
  no_master.policy_id = policy_.id;
  EXPECT_TRUE(absl::IsInvalidArgument(cat_->PutCheckpoint(no_master).status()));

  auto got = cat_->GetCheckpoint(c1->id);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->rng_state, std::string("\x01\x00\x02", 3));
  EXPECT_EQ(got->optimizer.bytes, 128u);
  EXPECT_TRUE(got->gradients.empty());
  auto list = cat_->ListCheckpoints(policy_.id);
  ASSERT_TRUE(list.ok());
  ASSERT_EQ(list->size(), 2u);
  EXPECT_EQ((*list)[0].step, 50u);  // ordered by step
  EXPECT_EQ(cat_->GetBlob(Hash128{7, 7})->refcount, 2u);
  EXPECT_EQ(cat_->GetBlob(Hash128{7, 7})->kind, BlobKind::kCheckpoint);
}

TEST(CatalogMap, GrowsWhenFull) {
  TempDir dir;
  CatalogOptions o;
  o.initial_map_bytes = 64 * 1024;
  auto c = Catalog::Open(dir.path(), o);
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_TRUE((*c)->PutBase(TinyBase()).ok());
  auto p = (*c)->CreatePolicy("p", "tiny");
  ASSERT_TRUE(p.ok());
  std::vector<NewRevision> batch(2000, Rev(p->id));
  auto ids = (*c)->PublishBatch(batch, {});
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_EQ(*(*c)->CountPolicyRevisions(p->id), 2000u);
  EXPECT_GT(*(*c)->DataBytes(), 64u * 1024);
}

TEST_F(CatalogTest, SpaceAccountsForEveryUsedPage) {
  std::vector<NewRevision> batch;
  for (int i = 0; i < 300; ++i) batch.push_back(Rev(policy_.id, 1 + i % 5));
  ASSERT_TRUE(cat_->PublishBatch(batch, {}).ok());
  ASSERT_TRUE(cat_->SetAlias(policy_.id, "serving", 7).ok());
  auto space = cat_->Space();
  ASSERT_TRUE(space.ok()) << space.status();
  EXPECT_EQ(space->page_size * space->used_pages, *cat_->DataBytes());
  uint64_t pages = space->meta_pages + space->main.pages() + space->freelist_pages +
                   space->free_pages + space->unaccounted_pages;
  std::map<std::string, CatalogDbSpace> by_name;
  for (const CatalogDbSpace& db : space->dbs) {
    pages += db.pages();
    by_name[db.name] = db;
  }
  EXPECT_EQ(pages, space->used_pages);
  EXPECT_EQ(by_name.at("revisions").entries, 300u);
  EXPECT_EQ(by_name.at("policy_revisions").entries, 300u);
  EXPECT_EQ(by_name.at("revisions_by_blob").entries, 300u);
  EXPECT_EQ(by_name.at("blobs").entries, 5u);
  EXPECT_EQ(by_name.count("aliases"), 0u);  // v7: the values are the log's
  EXPECT_EQ(by_name.at("alias_log").entries, 1u);
  EXPECT_EQ(by_name.at("checkpoints").pages(), 0u);
  // 300 records of at least 100 bytes do not fit in one page.
  EXPECT_GT(by_name.at("revisions").key_value_bytes, 300u * 100);
  EXPECT_GT(by_name.at("revisions").leaf_pages, 1u);
  EXPECT_GT(by_name.at("revisions").depth, 1u);
}

// Policy names are keyed by length, then name (schema v5), so names that count up, created in
// that order, go in at the end of the name index and its pages are filled. Keyed by the bare
// name, "tenant10/support" sorts between "tenant1/support" and "tenant2/support", and LMDB's
// half splits left the pages of this sequence about half empty (16 leaves here instead of 9).
TEST(CatalogNames, NamesThatCountUpFillTheNameIndex) {
  TempDir dir;
  CatalogOptions o;
  o.no_sync = true;
  auto c = Catalog::Open(dir.path(), o);
  ASSERT_TRUE(c.ok()) << c.status();
  Catalog& cat = **c;
  ASSERT_TRUE(cat.PutBase(TinyBase()).ok());
  for (int i = 0; i < 1000; ++i) {
    ASSERT_TRUE(cat.CreatePolicy(absl::StrCat("tenant", i, "/support"), "tiny").ok()) << i;
  }
  for (int i : {0, 1, 9, 10, 11, 99, 100, 101, 999}) {
    auto p = cat.GetPolicy(absl::StrCat("tenant", i, "/support"));
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_EQ(p->id, static_cast<uint64_t>(i) + 1);
  }
  EXPECT_TRUE(absl::IsNotFound(cat.GetPolicy("tenant1000/support").status()));
  EXPECT_TRUE(absl::IsNotFound(cat.GetPolicy("tenant1").status()));
  auto integrity = cat.CheckIntegrity();
  ASSERT_TRUE(integrity.ok());
  EXPECT_TRUE(integrity->problems.empty()) << integrity->problems.front();
  auto space = cat.Space();
  ASSERT_TRUE(space.ok()) << space.status();
  for (const CatalogDbSpace& db : space->dbs) {
    if (db.name != "policies") continue;
    ASSERT_EQ(db.entries, 1000u);
    // Every entry packed: key + value + LMDB's 8-byte node header and 2-byte slot, in pages
    // of page_size - 16 bytes; one page of slack.
    const uint64_t usable = space->page_size - 16;
    const uint64_t packed_leaves = (db.key_value_bytes + 10 * db.entries + usable - 1) / usable;
    EXPECT_LE(db.leaf_pages, packed_leaves + 1) << "packed: " << packed_leaves;
  }
}

TEST_F(CatalogTest, ConcurrentReadersDuringWrites) {
  ASSERT_TRUE(cat_->Publish(Rev(policy_.id), "").ok());
  std::atomic<bool> stop{false};
  std::atomic<int> errors{0};
  std::vector<std::thread> readers;
  for (int t = 0; t < 4; ++t) {
    readers.emplace_back([&] {
      while (!stop.load()) {
        auto r = cat_->GetRevision(1);
        if (!r.ok() || r->id != 1) errors.fetch_add(1);
        auto l = cat_->GetRevisionByAlias(policy_.id, "latest");
        if (!l.ok()) errors.fetch_add(1);
      }
    });
  }
  for (int i = 0; i < 200; ++i) ASSERT_TRUE(cat_->Publish(Rev(policy_.id), "").ok());
  stop = true;
  for (auto& t : readers) t.join();
  EXPECT_EQ(errors.load(), 0);
  EXPECT_EQ(cat_->GetRevisionByAlias(policy_.id, "latest")->seq, 201u);
}

}  // namespace
}  // namespace loradb
