// Aliases read from their log (schema v7): an alias's value is the `to` of its last alias_log
// entry, found with one cursor positioning. These tests move aliases (rollbacks included) and
// look them up through the owning calls and the views, with names and policy ids placed so that
// the entry just before the probe belongs to another alias or another policy; and they check
// that revision records leave their base to the policy and still read it back.
#include <gtest/gtest.h>

#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "storage/catalog/catalog.h"
#include "storage/catalog/codec.h"
#include "tests/test_util.h"

namespace loradb {
namespace {

using ::loradb::testing::TempDir;

class CatalogAliasTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto c = Catalog::Open(dir_.path());
    ASSERT_TRUE(c.ok()) << c.status();
    cat_ = *c;
    for (const char* name : {"tiny", "other-base"}) {
      BaseRecord b;
      b.name = name;
      b.arch.family = "custom";
      b.modules = {{"layers.0.self_attn.q_proj", 8, 16}};
      ASSERT_TRUE(cat_->PutBase(b).ok());
    }
  }

  uint64_t NewPolicy(const std::string& name, const std::string& base = "tiny") {
    auto p = cat_->CreatePolicy(name, base);
    EXPECT_TRUE(p.ok()) << p.status();
    return p.ok() ? p->id : 0;
  }

  uint64_t Publish(uint64_t policy_id, const std::string& alias = "") {
    NewRevision r;
    r.policy_id = policy_id;
    r.lora.r = 8;
    r.lora.alpha = 16;
    r.dtype = "BF16";
    r.blob.hash = Hash128{++seed_, 7};
    r.blob.bytes = 4096;
    r.blob.tensors = 2;
    r.alias = alias;
    auto rec = cat_->Publish(r, "");
    EXPECT_TRUE(rec.ok()) << rec.status();
    return rec.ok() ? rec->id : 0;
  }

  // The alias's revision through the owning lookup and through a view; 0 when it is not set (both
  // must agree on NotFound).
  uint64_t Lookup(uint64_t policy_id, const std::string& alias) {
    auto owned = cat_->GetRevisionByAlias(policy_id, alias);
    uint64_t viewed = 0;
    absl::Status st = cat_->Read([&](const CatalogReader& r) -> absl::Status {
      auto v = r.RevisionByAlias(policy_id, alias);
      if (!v.ok()) return v.status();
      viewed = v->id();
      return absl::OkStatus();
    });
    EXPECT_EQ(owned.ok(), st.ok()) << policy_id << ":" << alias << " " << st;
    if (!owned.ok()) {
      EXPECT_TRUE(absl::IsNotFound(owned.status())) << owned.status();
      EXPECT_TRUE(absl::IsNotFound(st)) << st;
      return 0;
    }
    EXPECT_EQ(owned->id, viewed) << policy_id << ":" << alias;
    return owned->id;
  }

  TempDir dir_;
  std::shared_ptr<Catalog> cat_;
  uint64_t seed_ = 0;
};

TEST_F(CatalogAliasTest, RollbackTwiceReadsTheLastEntry) {
  const uint64_t p = NewPolicy("acme/support");
  const uint64_t r1 = Publish(p, "serving");
  const uint64_t r2 = Publish(p);
  const uint64_t r3 = Publish(p);
  ASSERT_TRUE(cat_->SetAlias(p, "serving", r2).ok());
  ASSERT_TRUE(cat_->SetAlias(p, "serving", r3).ok());
  EXPECT_EQ(Lookup(p, "serving"), r3);
  ASSERT_EQ(*cat_->Rollback(p, "serving"), r2);
  EXPECT_EQ(Lookup(p, "serving"), r2);
  ASSERT_EQ(*cat_->Rollback(p, "serving"), r3);
  EXPECT_EQ(Lookup(p, "serving"), r3);
  auto log = cat_->AliasLog(p, "serving");
  ASSERT_TRUE(log.ok());
  ASSERT_EQ(log->size(), 5u);
  EXPECT_EQ(log->back().to_revision, r3);
  EXPECT_EQ((*log)[3].reason, "rollback");
  // The value of every alias in a listing is its last entry's `to`.
  auto aliases = cat_->ListAliases(p);
  ASSERT_TRUE(aliases.ok());
  ASSERT_EQ(aliases->size(), 1u);
  EXPECT_EQ((*aliases)[0].revision, r3);
  // The revision an alias points at is the one delete refuses; the one it left is free.
  EXPECT_TRUE(absl::IsFailedPrecondition(cat_->DeleteRevision(r3)));
  EXPECT_TRUE(cat_->DeleteRevision(r1).ok());
  EXPECT_TRUE(cat_->CheckIntegrity()->problems.empty());
}

// 600 moves of one alias: entry numbers past one byte (256) and two pages of the log; the value is
// always the last move.
TEST_F(CatalogAliasTest, ManyMovesOfOneAlias) {
  const uint64_t p = NewPolicy("acme/support");
  std::vector<uint64_t> revs;
  for (int i = 0; i < 3; ++i) revs.push_back(Publish(p));
  uint64_t expected = 0;
  for (int i = 0; i < 600; ++i) {
    expected = revs[static_cast<size_t>(i) % revs.size()];
    ASSERT_TRUE(cat_->SetAlias(p, "canary", expected).ok()) << i;
    if (i % 97 == 0) {
      EXPECT_EQ(Lookup(p, "canary"), expected) << i;
    }
  }
  EXPECT_EQ(Lookup(p, "canary"), expected);
  auto log = cat_->AliasLog(p, "canary");
  ASSERT_TRUE(log.ok());
  ASSERT_EQ(log->size(), 600u);
  EXPECT_EQ(log->back().seq, 600u);
  ASSERT_EQ(cat_->ListAliases(p)->size(), 1u);
  EXPECT_EQ(cat_->ListAliases(p)->front().revision, expected);
  // Rollback goes to the value before the last move.
  EXPECT_EQ(*cat_->Rollback(p, "canary"), revs[598 % 3]);
  EXPECT_EQ(Lookup(p, "canary"), revs[598 % 3]);
}

// A view's alias lookup reads through a cursor its pooled transaction keeps and renews for each
// transaction: every lookup sees the snapshot of its own transaction, across many transactions,
// commits in between and a map that grew (which ends every pooled transaction).
TEST_F(CatalogAliasTest, ViewLookupsFollowEachTransactionsSnapshot) {
  TempDir small_dir;
  CatalogOptions small_map;
  small_map.initial_map_bytes = 64 * 1024;
  cat_ = Catalog::Open(small_dir.path(), small_map).value();  // Lookup and Publish use cat_
  BaseRecord b;
  b.name = "tiny";
  b.modules = {{"layers.0.self_attn.q_proj", 8, 16}};
  ASSERT_TRUE(cat_->PutBase(b).ok());
  const uint64_t p = NewPolicy("acme/support");
  std::vector<uint64_t> revs;
  for (int i = 0; i < 4; ++i) revs.push_back(Publish(p));
  const uint64_t bytes_before = *cat_->DataBytes();
  for (int i = 0; i < 200; ++i) {
    const uint64_t to = revs[static_cast<size_t>(i) % revs.size()];
    ASSERT_TRUE(cat_->SetAlias(p, "serving", to).ok());
    EXPECT_EQ(Lookup(p, "serving"), to) << i;
    if (i == 100) {
      // Past the 64 KiB map: it grows, which ends every pooled transaction.
      for (int j = 0; j < 300; ++j) Publish(p);
    }
  }
  EXPECT_GT(*cat_->DataBytes(), 64u * 1024);
  EXPECT_GT(*cat_->DataBytes(), bytes_before);
}

// Policies 1-3 hold `serving` / `serving2` so that the log entry just before each probe is another
// alias's (a name that is a prefix of another, one of the same length) or another policy's, and a
// policy's last alias is the last key of the database (the MDB_LAST path).
TEST_F(CatalogAliasTest, PrefixSharingNamesAndPoliciesStaySeparate) {
  const uint64_t a = NewPolicy("tenant/serving");
  const uint64_t b = NewPolicy("tenant/serving2");
  const uint64_t c = NewPolicy("tenant/servin");
  const uint64_t d = NewPolicy("tenant/empty");
  const uint64_t a1 = Publish(a, "serving");
  const uint64_t a2 = Publish(a, "serving2");
  const uint64_t b1 = Publish(b, "serving2");
  const uint64_t b2 = Publish(b);
  const uint64_t c1 = Publish(c, "serving");
  ASSERT_TRUE(cat_->SetAlias(b, "serving2", b2).ok());
  ASSERT_TRUE(cat_->SetAlias(a, "serving", a2).ok());
  ASSERT_TRUE(cat_->SetAlias(a, "serving2", a1).ok());

  EXPECT_EQ(Lookup(a, "serving"), a2);
  EXPECT_EQ(Lookup(a, "serving2"), a1);
  EXPECT_EQ(Lookup(b, "serving2"), b2);
  EXPECT_EQ(Lookup(c, "serving"), c1);  // the last key of alias_log
  // Not set: the entry before each probe is another alias or another policy's.
  EXPECT_EQ(Lookup(a, "servin"), 0u);    // a prefix of both names; before every entry of a
  EXPECT_EQ(Lookup(a, "servinh"), 0u);   // same length as `serving`, sorts after it
  EXPECT_EQ(Lookup(a, "serving3"), 0u);  // same length as `serving2`, sorts after it
  EXPECT_EQ(Lookup(b, "serving"), 0u);   // before it: policy a's `serving2`
  EXPECT_EQ(Lookup(c, "serving2"), 0u);  // past the end: the last key is c's `serving`
  EXPECT_EQ(Lookup(d, "serving"), 0u);   // a policy with no alias, past every key
  EXPECT_EQ(Lookup(b1 + 1000, "serving"), 0u);

  auto la = cat_->ListAliases(a);
  ASSERT_TRUE(la.ok());
  ASSERT_EQ(la->size(), 2u);
  EXPECT_EQ((*la)[0].alias, "serving");
  EXPECT_EQ((*la)[0].revision, a2);
  EXPECT_EQ((*la)[1].alias, "serving2");
  EXPECT_EQ((*la)[1].revision, a1);
  auto lb = cat_->ListAliases(b);
  ASSERT_EQ(lb->size(), 1u);
  EXPECT_EQ((*lb)[0].alias, "serving2");
  EXPECT_EQ((*lb)[0].revision, b2);
  EXPECT_TRUE(cat_->ListAliases(d)->empty());
  // Delete refuses the revisions aliases point at now, and only those.
  EXPECT_TRUE(absl::IsFailedPrecondition(cat_->DeleteRevision(a1)));
  EXPECT_TRUE(absl::IsFailedPrecondition(cat_->DeleteRevision(a2)));
  EXPECT_TRUE(cat_->DeleteRevision(b1).ok());
  // A rollback of one alias leaves the other alone.
  EXPECT_EQ(*cat_->Rollback(a, "serving"), a1);
  EXPECT_EQ(Lookup(a, "serving2"), a1);
  auto integ = cat_->CheckIntegrity();
  ASSERT_TRUE(integ.ok());
  EXPECT_TRUE(integ->problems.empty()) << (integ->problems.empty() ? "" : integ->problems[0]);
  EXPECT_EQ(integ->aliases, 4u);
}

// Revision records leave their base to the policy (Publish always takes the policy's base), and
// every reader puts it back: the owning lookups, the views and the listings; rewrites of the
// record (evals, delete) keep it that way.
TEST_F(CatalogAliasTest, RevisionBaseIsFilledInFromThePolicy) {
  const uint64_t p = NewPolicy("acme/support", "tiny");
  const uint64_t q = NewPolicy("acme/other", "other-base");
  const uint64_t r1 = Publish(p, "serving");
  const uint64_t r2 = Publish(q);
  ASSERT_TRUE(cat_->SetEvalScore(r1, "acc", 0.5f).ok());
  ASSERT_TRUE(cat_->DeleteRevision(r2).ok());
  EXPECT_EQ(cat_->GetRevision(r1)->base, "tiny");
  EXPECT_EQ(cat_->GetRevision(r2)->base, "other-base");
  EXPECT_EQ(cat_->GetRevisionByAlias(p, "serving")->base, "tiny");
  auto page = cat_->ListRevisions(0, 0, true);
  ASSERT_TRUE(page.ok());
  ASSERT_EQ(page->items.size(), 2u);
  EXPECT_EQ(page->items[0].base, "tiny");
  EXPECT_EQ(page->items[1].base, "other-base");
  EXPECT_EQ(page->items[0].evals.at("acc"), 0.5f);
  ASSERT_TRUE(cat_->Read([&](const CatalogReader& r) -> absl::Status {
                    auto v1 = r.Revision(r1);
                    auto v2 = r.Revision(r2);
                    if (!v1.ok()) return v1.status();
                    if (!v2.ok()) return v2.status();
                    EXPECT_EQ(v1->base(), "tiny");
                    EXPECT_EQ(v2->base(), "other-base");
                    EXPECT_EQ(v1->ToRecord().base, "tiny");
                    return absl::OkStatus();
                  })
                  .ok());
  // Stored without it: the records do not read without their policy's base.
  int records = 0;
  ASSERT_TRUE(cat_->ScanRevisionsRaw([&](uint64_t id, std::span<const uint8_t> bytes) {
                    ++records;
                    std::vector<uint64_t> aligned((bytes.size() + 7) / 8);
                    std::memcpy(aligned.data(), bytes.data(), bytes.size());
                    auto plain = catalog_codec::DecodeRevision(
                        {reinterpret_cast<const uint8_t*>(aligned.data()), bytes.size()}, id);
                    EXPECT_TRUE(absl::IsFailedPrecondition(plain.status())) << id;
                  })
                  .ok());
  EXPECT_EQ(records, 2);
  EXPECT_TRUE(cat_->CheckIntegrity()->problems.empty());
}

}  // namespace
}  // namespace loradb
