#include <gtest/gtest.h>
#include <lmdb.h>

#include <filesystem>
#include <fstream>

#include "storage/catalog/codec.h"
#include "storage/maintenance/maintenance.h"
#include "storage/util/store_lock.h"
#include "tests/storage/maint_test_util.h"
#include "tests/test_paths.h"
#include "tests/test_util.h"

namespace loradb {
namespace {

using ::loradb::testing::TempDir;
using maint_test::BuildStore;
using maint_test::OpenStore;
using maint_test::Publish;
using maint_test::Snapshot;
using maint_test::VerifyProblems;
using maint_test::WriteV1Store;
namespace fs = std::filesystem;

size_t CountFiles(const std::string& dir) {
  size_t n = 0;
  for (auto& e : fs::recursive_directory_iterator(dir)) n += e.is_regular_file() ? 1 : 0;
  return n;
}

// Copies the checked-in fixture `fixture` of schema `version` to `dir` and checks that this build
// refuses to open it, pointing at `loradb migrate`.
void CopyOldFixture(const std::string& fixture, uint32_t version, const std::string& dir) {
  maint_test::CopyTree(fixture, dir);
  ASSERT_EQ(*ReadStoreSchemaVersion(dir), version);
  StoreOptions so;
  so.create_if_missing = false;
  auto refused = Store::Open(dir, so);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("loradb migrate"), std::string::npos);
}

TEST(Compact, DropsDeletedKeepsVisibleRevisionsAndCollectsBlobs) {
  TempDir t;
  const std::string dir = t.file("store");
  BuildStore(dir);
  ASSERT_EQ(VerifyProblems(dir), "");
  const auto before = Snapshot(dir);
  ASSERT_EQ(before.count("rev 1"), 1u);
  ASSERT_EQ(before.count("rev 2"), 0u);
  const size_t files_before = CountFiles(dir + "/blobs");

  CompactOptions o;
  auto rep = CompactStore(dir, o);
  ASSERT_TRUE(rep.ok()) << rep.status();
  EXPECT_EQ(rep->revisions_before, 9u);
  EXPECT_EQ(rep->dropped_deleted, 2u);  // 2 and 4; 9 stays as the id tombstone
  EXPECT_EQ(rep->revisions_kept, 7u);
  EXPECT_EQ(rep->live_revisions_kept, 6u);
  EXPECT_EQ(rep->dropped_retention, 0u);
  EXPECT_GT(rep->catalog_bytes_before, 0u);
  EXPECT_GT(rep->catalog_bytes_after, 0u);
  // Blobs of revisions 2, 4, 9 had no references in the old generation either: deleted, with
  // the orphan file.
  EXPECT_EQ(rep->blob_files_deleted, 4u);
  EXPECT_EQ(CountFiles(dir + "/blobs"), files_before - 4);
  EXPECT_TRUE(fs::exists(dir + "/catalog/prev.mdb"));
  EXPECT_FALSE(fs::exists(dir + "/.maint"));
  EXPECT_EQ(VerifyProblems(dir), "");
  EXPECT_EQ(Snapshot(dir), before);

  // Ids are never reused: the next revision gets 10 even though records went away.
  {
    auto s = OpenStore(dir);
    ASSERT_NE(s, nullptr);
    EXPECT_EQ(Publish(*s, "a/p", 77.0f), 10u);
    auto gone = s->GetRevision(2);
    EXPECT_TRUE(absl::IsNotFound(gone.status())) << gone.status();
    EXPECT_TRUE(s->Rollback("a/p", "serving").ok());  // back to 3, still there
  }
  o.drop_previous = true;
  rep = CompactStore(dir, o);
  ASSERT_TRUE(rep.ok()) << rep.status();
  EXPECT_FALSE(fs::exists(dir + "/catalog/prev.mdb"));
  EXPECT_EQ(VerifyProblems(dir), "");
}

TEST(Compact, DryRunChangesNothing) {
  TempDir t;
  const std::string dir = t.file("store");
  BuildStore(dir);
  const auto before = Snapshot(dir);
  const size_t files = CountFiles(dir);
  CompactOptions o;
  o.dry_run = true;
  auto rep = CompactStore(dir, o);
  ASSERT_TRUE(rep.ok()) << rep.status();
  EXPECT_TRUE(rep->dry_run);
  EXPECT_EQ(rep->dropped_deleted, 2u);
  EXPECT_EQ(rep->catalog_bytes_after, 0u);
  EXPECT_EQ(CountFiles(dir), files);
  EXPECT_FALSE(fs::exists(dir + "/catalog/prev.mdb"));
  EXPECT_EQ(Snapshot(dir), before);
}

TEST(Compact, RefusesWhileTheStoreIsInUse) {
  TempDir t;
  const std::string dir = t.file("store");
  BuildStore(dir);
  auto held = StoreLock::Acquire(dir, StoreLock::Mode::kShared);
  ASSERT_TRUE(held.ok()) << held.status();
  auto rep = CompactStore(dir, {});
  EXPECT_TRUE(absl::IsUnavailable(rep.status())) << rep.status();
  EXPECT_NE(rep.status().message().find("in use"), std::string::npos);
  auto mig = MigrateStore(dir, {});
  EXPECT_TRUE(absl::IsUnavailable(mig.status())) << mig.status();
  EXPECT_FALSE(fs::exists(dir + "/catalog/prev.mdb"));
  held->Release();
  // And the other way round: maintenance running keeps writers out.
  auto excl = StoreLock::Acquire(dir, StoreLock::Mode::kExclusive);
  ASSERT_TRUE(excl.ok());
  auto shared = StoreLock::Acquire(dir, StoreLock::Mode::kShared);
  EXPECT_TRUE(absl::IsUnavailable(shared.status()));
  EXPECT_NE(shared.status().message().find("maintenance"), std::string::npos);
}

TEST(Compact, RetentionKeepsNewestAliasedAndHistory) {
  TempDir t;
  const std::string dir = t.file("store");
  {
    auto s = OpenStore(dir);
    ASSERT_NE(s, nullptr);
    ASSERT_TRUE(s->AddBaseFromModuleTable("tiny", maint_test::kModuleTable).ok());
    ASSERT_TRUE(s->CreatePolicy("p", "tiny").ok());
    for (int i = 1; i <= 10; ++i) Publish(*s, "p", static_cast<float>(i));
    ASSERT_TRUE(s->SetAlias("p", "old", 4).ok());
    ASSERT_TRUE(s->SetAlias("p", "serving", 2).ok());
    ASSERT_TRUE(s->SetAlias("p", "serving", 9).ok());  // 2 stays in serving's history
  }
  CompactOptions o;
  o.retention.keep_last = 3;
  o.retention.alias_history_window_us = 0;  // only current alias targets protect
  o.now_us = int64_t{1} << 62;              // every log entry is outside the window
  auto plan = CompactStore(dir, [&] {
    CompactOptions d = o;
    d.dry_run = true;
    return d;
  }());
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->dropped_retention, 6u);    // 1,2,3,5,6,7; kept 4 (alias), 8,9,10 (newest)
  o.retention.alias_history_window_us = -1;  // the whole history protects 2 as well
  auto rep = CompactStore(dir, o);
  ASSERT_TRUE(rep.ok()) << rep.status();
  EXPECT_EQ(rep->dropped_retention, 5u);
  EXPECT_EQ(VerifyProblems(dir), "");
  auto snap = Snapshot(dir);
  for (int id : {2, 4, 8, 9, 10}) EXPECT_EQ(snap.count(absl::StrCat("rev ", id)), 1u) << id;
  for (int id : {1, 3, 5, 6, 7}) EXPECT_EQ(snap.count(absl::StrCat("rev ", id)), 0u) << id;
  // The previous generation keeps the dropped revisions' blobs until it goes.
  EXPECT_EQ(rep->blob_files_kept_for_previous, 5u);
  CompactOptions again;
  again.drop_previous = true;
  rep = CompactStore(dir, again);
  ASSERT_TRUE(rep.ok()) << rep.status();
  EXPECT_EQ(rep->blob_files_deleted, 5u);
  EXPECT_EQ(VerifyProblems(dir), "");
}

TEST(Compact, RefusesWhenTheRebuiltCatalogFailsVerification) {
  TempDir t;
  const std::string dir = t.file("store");
  BuildStore(dir);
  // Remove the blob file of a live revision: the rebuilt generation cannot be verified.
  std::string path;
  {
    auto s = OpenStore(dir);
    auto r = s->GetRevision(1);
    ASSERT_TRUE(r.ok());
    path = s->BlobPath(r->blob.hash);
  }
  ASSERT_TRUE(fs::remove(path));
  auto rep = CompactStore(dir, {});
  EXPECT_TRUE(absl::IsDataLoss(rep.status())) << rep.status();
  EXPECT_NE(rep.status().message().find("store is unchanged"), std::string::npos);
  EXPECT_FALSE(fs::exists(dir + "/catalog/prev.mdb"));
  EXPECT_FALSE(fs::exists(dir + "/.maint"));
}

// ---- verify

class VerifyCorruption : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = t_.file("store");
    BuildStore(dir_);
    auto s = OpenStore(dir_);
    auto r = s->GetRevision(1);
    ASSERT_TRUE(r.ok());
    blob_ = s->BlobPath(r->blob.hash);
    ASSERT_EQ(VerifyProblems(dir_), "");
  }
  TempDir t_;
  std::string dir_;
  std::string blob_;
};

TEST_F(VerifyCorruption, FlippedByte) {
  std::fstream f(blob_, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(100);
  char c;
  f.read(&c, 1);
  c = static_cast<char>(c ^ 0x10);
  f.seekp(100);
  f.write(&c, 1);
  f.close();
  EXPECT_NE(VerifyProblems(dir_).find("xxh3-128"), std::string::npos) << VerifyProblems(dir_);
}

TEST_F(VerifyCorruption, TruncatedBlob) {
  fs::resize_file(blob_, fs::file_size(blob_) - 7);
  EXPECT_NE(VerifyProblems(dir_).find("bytes, recorded"), std::string::npos);
}

TEST_F(VerifyCorruption, MissingBlob) {
  fs::remove(blob_);
  EXPECT_NE(VerifyProblems(dir_).find("missing"), std::string::npos);
}

// Writes a raw key/value into a named database of the store's catalog (no Catalog open).
void RawPut(const std::string& dir, const char* db, const std::string& key,
            const std::string& value) {
  MDB_env* env;
  ASSERT_EQ(mdb_env_create(&env), 0);
  mdb_env_set_maxdbs(env, 16);
  mdb_env_set_mapsize(env, size_t{1} << 30);
  ASSERT_EQ(mdb_env_open(env, (dir + "/catalog").c_str(), MDB_NOTLS, 0644), 0);
  MDB_txn* txn;
  ASSERT_EQ(mdb_txn_begin(env, nullptr, 0, &txn), 0);
  MDB_dbi dbi;
  ASSERT_EQ(mdb_dbi_open(txn, db, 0, &dbi), 0);
  MDB_val k{key.size(), const_cast<char*>(key.data())};
  MDB_val v{value.size(), const_cast<char*>(value.data())};
  ASSERT_EQ(mdb_put(txn, dbi, &k, &v, 0), 0);
  ASSERT_EQ(mdb_txn_commit(txn), 0);
  mdb_env_close(env);
}

std::string BE64(uint64_t v) {
  std::string s(8, '\0');
  for (int i = 7; i >= 0; --i, v >>= 8) s[static_cast<size_t>(i)] = static_cast<char>(v & 0xff);
  return s;
}

// The alias_log key of entry `n` of `alias` on policy `policy_id`.
std::string AliasLogKey(uint64_t policy_id, const std::string& alias, uint64_t n) {
  return BE64(policy_id) + std::string(1, static_cast<char>(alias.size())) + alias + BE64(n);
}

std::string LogEntry(uint64_t from, uint64_t to) {
  AliasLogEntry e;
  e.time_us = 1;
  e.from_revision = from;
  e.to_revision = to;
  e.reason = "set";
  return catalog_codec::EncodeAliasLogEntry(e);
}

TEST_F(VerifyCorruption, RecordPointingAtNothing) {
  // An alias of policy 1 whose only move went to revision 999, which never existed.
  RawPut(dir_, "alias_log", AliasLogKey(1, "ghost", 1), LogEntry(0, 999));
  const std::string problems = VerifyProblems(dir_);
  EXPECT_NE(problems.find("alias 'ghost' of policy id 1 points at missing"), std::string::npos)
      << problems;
}

TEST_F(VerifyCorruption, AliasLogChainBroken) {
  // serving's log: 0 -> 1, 1 -> 3, 3 -> 5. An entry 4 moving from 3 (not 5) to 6 breaks the
  // chain; the alias's value is 6, a live revision, so only the chain check sees it.
  RawPut(dir_, "alias_log", AliasLogKey(1, "serving", 4), LogEntry(3, 6));
  const std::string problems = VerifyProblems(dir_);
  EXPECT_NE(problems.find("'a/p:serving' log entry 4 moves from 3 but entry 3 moved it to 5"),
            std::string::npos)
      << problems;
  auto s = OpenStore(dir_);
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->GetRevisionByAlias("a/p", "serving")->id, 6u);
}

TEST_F(VerifyCorruption, AliasLogNumberGap) {
  // serving's log holds entries 1..3; an entry numbered 7 (from 5 to 5: the chain and the alias
  // still agree) leaves a gap in the commit order.
  RawPut(dir_, "alias_log", AliasLogKey(1, "serving", 7), LogEntry(5, 5));
  const std::string problems = VerifyProblems(dir_);
  EXPECT_NE(problems.find("'a/p:serving' log entry 4 is numbered 7"), std::string::npos)
      << problems;
}

TEST_F(VerifyCorruption, CompactionCannotHideCorruption) {
  fs::resize_file(blob_, fs::file_size(blob_) - 1);
  auto rep = CompactStore(dir_, {});
  EXPECT_TRUE(absl::IsDataLoss(rep.status())) << rep.status();
}

// ---- migration from real v1 bytes

TEST(Migrate, V1StoreMovesForward) {
  TempDir t;
  const std::string dir = t.file("store");
  WriteV1Store(dir);
  auto v = ReadStoreSchemaVersion(dir);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(*v, 1u);
  // This build refuses to open it and points at migrate.
  StoreOptions so;
  so.create_if_missing = false;
  auto refused = Store::Open(dir, so);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("loradb migrate"), std::string::npos);

  MigrateOptions dry;
  dry.dry_run = true;
  auto plan = MigrateStore(dir, dry);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->from_version, 1u);
  EXPECT_EQ(plan->to_version, kCatalogSchemaVersion);
  ASSERT_EQ(plan->changes.size(), 7u);
  EXPECT_EQ(plan->index_entries, 4u);
  EXPECT_EQ(*ReadStoreSchemaVersion(dir), 1u);  // dry run: unchanged

  auto rep = MigrateStore(dir, {});
  ASSERT_TRUE(rep.ok()) << rep.status();
  EXPECT_EQ(*ReadStoreSchemaVersion(dir), kCatalogSchemaVersion);
  EXPECT_TRUE(fs::exists(dir + "/catalog/prev.mdb"));
  EXPECT_EQ(VerifyProblems(dir), "");
  {
    auto s = OpenStore(dir);
    ASSERT_NE(s, nullptr);
    auto serving = s->GetRevisionByAlias("legacy/p", "serving");
    ASSERT_TRUE(serving.ok()) << serving.status();
    EXPECT_EQ(serving->id, 3u);
    EXPECT_TRUE(s->ReadTensors(*serving).ok());
    // Revisions 1 and 3 hold the same content: the new index finds both.
    auto by_blob = s->catalog().ListRevisionsByBlob(serving->blob.hash);
    ASSERT_TRUE(by_blob.ok());
    EXPECT_EQ(*by_blob, (std::vector<uint64_t>{1, 3}));
    auto deleted = s->GetRevision(2);
    ASSERT_TRUE(deleted.ok());
    EXPECT_EQ(deleted->state, RevisionState::kDeleted);
    // Publishing continues the id and seq sequences, and feeds the index.
    const uint64_t id = Publish(*s, "legacy/p", 1.0f);
    EXPECT_EQ(id, 5u);
    by_blob = s->catalog().ListRevisionsByBlob(serving->blob.hash);
    EXPECT_EQ(*by_blob, (std::vector<uint64_t>{1, 3, 5}));
    EXPECT_EQ(s->GetRevision(5)->seq, 5u);
  }
  EXPECT_EQ(VerifyProblems(dir), "");
  // Current now: nothing to do.
  rep = MigrateStore(dir, {});
  ASSERT_TRUE(rep.ok());
  EXPECT_TRUE(rep->changes.empty());
  // The previous generation is the v1 file, intact.
  fs::create_directories(t.file("prev/catalog"));
  fs::copy_file(dir + "/catalog/prev.mdb", t.file("prev/catalog/data.mdb"));
  EXPECT_EQ(*ReadStoreSchemaVersion(t.file("prev")), 1u);
}

TEST(Migrate, CompactRefusesAnOldStore) {
  TempDir t;
  const std::string dir = t.file("store");
  WriteV1Store(dir);
  auto rep = CompactStore(dir, {});
  EXPECT_TRUE(absl::IsFailedPrecondition(rep.status())) << rep.status();
  EXPECT_NE(rep.status().message().find("migrate"), std::string::npos);
  EXPECT_EQ(VerifyProblems(dir).find("schema version 1"), 0u);
}

// ---- v6 -> v7: the `aliases` database is dropped; each alias must equal its log's last `to`.

const std::string kV6Fixture = std::string(LORADB_SOURCE_DIR) + "/tests/storage/fixtures/v6_store";

// Migration refuses a v6 store whose `aliases` value disagrees with the log, or whose log has an
// alias `aliases` lacks, naming the alias, and leaves the store as it was (still v6, same bytes).
TEST(Migrate, V6RefusesAnAliasThatIsNotItsLogsLastEntry) {
  struct Case {
    const char* db;
    std::string key, value;
    const char* message;
  };
  const Case cases[] = {
      // a/p:serving's log ends at 6 (see WriteRichStoreWithAliasMoves).
      {"aliases", BE64(1) + "serving", BE64(5),
       "alias 'a/p:serving' points at revision 5 but its log's last entry moved it to 6"},
      {"aliases", BE64(2) + "canary", BE64(7),
       "alias 'b/q:canary' points at revision 7 but has no log entry"},
      {"alias_log", AliasLogKey(2, "ghost", 1), LogEntry(0, 7),
       "alias 'b/q:ghost' has a log (last moved to 7) but no value"},
  };
  for (const Case& c : cases) {
    TempDir t;
    const std::string dir = t.file("store");
    CopyOldFixture(kV6Fixture, 6, dir);
    RawPut(dir, c.db, c.key, c.value);
    auto before = ReadFileToString(dir + "/catalog/data.mdb");
    ASSERT_TRUE(before.ok());
    for (bool dry_run : {true, false}) {
      MigrateOptions o;
      o.dry_run = dry_run;
      auto rep = MigrateStore(dir, o);
      EXPECT_TRUE(absl::IsFailedPrecondition(rep.status())) << rep.status();
      EXPECT_NE(rep.status().message().find(c.message), std::string::npos) << rep.status();
    }
    EXPECT_EQ(*ReadStoreSchemaVersion(dir), 6u);
    EXPECT_FALSE(fs::exists(dir + "/catalog/prev.mdb"));
    auto after = ReadFileToString(dir + "/catalog/data.mdb");
    ASSERT_TRUE(after.ok());
    EXPECT_TRUE(*before == *after) << c.message;
  }
}

// A v6 store migrated to v7 has no `aliases` database; every alias reads from its log, and
// further moves and rollbacks continue the log's numbering.
TEST(Migrate, V6AliasesMoveOnFromTheirLog) {
  TempDir t;
  const std::string dir = t.file("store");
  CopyOldFixture(kV6Fixture, 6, dir);
  auto rep = MigrateStore(dir, {});
  ASSERT_TRUE(rep.ok()) << rep.status();
  EXPECT_EQ(rep->from_version, 6u);
  EXPECT_EQ(VerifyProblems(dir), "");
  {
    MDB_env* env;
    ASSERT_EQ(mdb_env_create(&env), 0);
    mdb_env_set_maxdbs(env, 16);
    ASSERT_EQ(mdb_env_open(env, (dir + "/catalog").c_str(), MDB_RDONLY | MDB_NOTLS, 0644), 0);
    MDB_txn* txn;
    ASSERT_EQ(mdb_txn_begin(env, nullptr, MDB_RDONLY, &txn), 0);
    MDB_dbi dbi;
    EXPECT_EQ(mdb_dbi_open(txn, "aliases", 0, &dbi), MDB_NOTFOUND);
    mdb_txn_abort(txn);
    mdb_env_close(env);
  }
  auto s = OpenStore(dir);
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->GetRevisionByAlias("a/p", "serving")->id, 6u);
  EXPECT_EQ(s->GetRevisionByAlias("a/p", "serving2")->id, 1u);
  EXPECT_EQ(s->GetRevisionByAlias("c/r", "serving")->id, 10u);
  EXPECT_EQ(*s->Rollback("a/p", "serving"), 5u);
  EXPECT_EQ(*s->Rollback("a/p", "serving"), 6u);
  ASSERT_TRUE(s->SetAlias("a/p", "serving2", 3).ok());
  auto log = s->AliasLog("a/p", "serving");
  ASSERT_TRUE(log.ok());
  ASSERT_EQ(log->size(), 8u);
  EXPECT_EQ(log->back().seq, 8u);
  EXPECT_EQ(log->back().reason, "rollback");
  EXPECT_EQ(s->GetRevisionByAlias("a/p", "serving2")->id, 3u);
  s.reset();
  EXPECT_EQ(VerifyProblems(dir), "");
}

TEST(Migrate, RefusesANewerStore) {
  TempDir t;
  const std::string dir = t.file("store");
  WriteV1Store(dir);
  RawPut(dir, "meta", "schema_version", BE64(kCatalogSchemaVersion + 1));
  auto rep = MigrateStore(dir, {});
  EXPECT_TRUE(absl::IsFailedPrecondition(rep.status())) << rep.status();
  EXPECT_NE(rep.status().message().find("newer"), std::string::npos);
  StoreOptions so;
  so.create_if_missing = false;
  auto refused = Store::Open(dir, so);
  EXPECT_FALSE(refused.ok());
  EXPECT_EQ(*ReadStoreSchemaVersion(dir), kCatalogSchemaVersion + 1);
}

}  // namespace
}  // namespace loradb

// ---- the checked-in v1 fixture (tests/storage/fixtures/v1_store): real v1 bytes, forever.
// Its blob files are adapter blobs as the Store writes them, so the fixture also pins the blob
// format: once a blob format has shipped, it must stay readable (MigratesAndVerifies). It was
// regenerated once, when the pre-release adapter blobs moved from safetensors to the packed
// blob format. Regenerate (only for such a pre-release change) with
//   LORADB_WRITE_V1_FIXTURE=1 build/tests/loradb_storage_tests --gtest_filter='V1Fixture.*'

namespace loradb {
namespace {

const std::string kFixture = std::string(LORADB_SOURCE_DIR) + "/tests/storage/fixtures/v1_store";

TEST(V1Fixture, WriterReproducesTheCheckedInBytes) {
  const char* regen = std::getenv("LORADB_WRITE_V1_FIXTURE");
  if (regen != nullptr && std::string(regen) == "1") {
    fs::remove_all(kFixture);
    WriteV1Store(kFixture);
    fs::remove(kFixture + "/catalog/lock.mdb");
  }
  ASSERT_TRUE(fs::exists(kFixture + "/catalog/data.mdb"));
  TempDir t;
  WriteV1Store(t.file("s"));
  auto fresh = ReadFileToString(t.file("s/catalog/data.mdb"));
  auto fixture = ReadFileToString(kFixture + "/catalog/data.mdb");
  ASSERT_TRUE(fresh.ok() && fixture.ok());
  EXPECT_TRUE(*fresh == *fixture) << "the v1 writer no longer writes the checked-in v1 bytes";
}

TEST(V1Fixture, MigratesAndVerifies) {
  TempDir t;
  const std::string dir = t.file("store");
  maint_test::CopyTree(kFixture, dir);
  ASSERT_EQ(*ReadStoreSchemaVersion(dir), 1u);
  auto rep = MigrateStore(dir, {});
  ASSERT_TRUE(rep.ok()) << rep.status();
  EXPECT_EQ(rep->from_version, 1u);
  EXPECT_EQ(rep->index_entries, 4u);
  EXPECT_EQ(VerifyProblems(dir), "");
  const auto snap = Snapshot(dir);
  EXPECT_EQ(snap.at("alias legacy/p:serving"), "3");
  for (int id : {1, 3, 4}) {
    EXPECT_NE(snap.at(absl::StrCat("rev ", id)).find("readable"), std::string::npos) << id;
  }
  EXPECT_EQ(snap.count("rev 2"), 0u);  // deleted in the fixture
}

// ---- the checked-in v2 fixture (tests/storage/fixtures/v2_store): real schema-v2 bytes, written
// once by the v2 build (commit c87ee55) as BuildStore plus policy c/r with revisions 10 and 11
// (11 deleted: c/r's highest seq) and a/p revision 12. v2 policy records hold the exact next
// seq; v3 reads them as a lower bound.

const std::string kV2Fixture = std::string(LORADB_SOURCE_DIR) + "/tests/storage/fixtures/v2_store";

TEST(V2Fixture, MigratesAndKeepsEverySeq) {
  TempDir t;
  const std::string dir = t.file("store");
  CopyOldFixture(kV2Fixture, 2, dir);

  auto rep = MigrateStore(dir, {});
  ASSERT_TRUE(rep.ok()) << rep.status();
  EXPECT_EQ(rep->from_version, 2u);
  EXPECT_EQ(rep->to_version, kCatalogSchemaVersion);
  ASSERT_EQ(rep->changes.size(), 6u);
  EXPECT_NE(rep->changes[1].find("next_seq"), std::string::npos) << rep->changes[1];
  EXPECT_NE(rep->changes[2].find("layout 4"), std::string::npos) << rep->changes[2];
  EXPECT_NE(rep->changes[3].find("policy records: the id"), std::string::npos) << rep->changes[3];
  EXPECT_NE(rep->changes[4].find("drop the aliases database"), std::string::npos)
      << rep->changes[4];
  EXPECT_NE(rep->changes[5].find("policy names"), std::string::npos) << rep->changes[5];
  EXPECT_EQ(*ReadStoreSchemaVersion(dir), kCatalogSchemaVersion);
  EXPECT_EQ(VerifyProblems(dir), "");
  auto snap = Snapshot(dir);
  EXPECT_EQ(snap.at("policy a/p"), "1 next 8");
  EXPECT_EQ(snap.at("policy b/q"), "2 next 4");
  EXPECT_EQ(snap.at("policy c/r"), "3 next 3");  // 11 (seq 2) is deleted: 2 is not reused
  EXPECT_EQ(snap.at("alias a/p:serving"), "5");
  EXPECT_EQ(snap.at("alias b/q:prod"), "7");
  EXPECT_EQ(snap.at("alias c/r:serving"), "10");
  for (int id : {1, 3, 5, 6, 7, 8, 10, 12}) {
    EXPECT_NE(snap.at(absl::StrCat("rev ", id)).find("readable"), std::string::npos) << id;
  }
  EXPECT_EQ(snap.count("rev 11"), 0u);
  EXPECT_EQ(snap.count("ckpt 1"), 1u);

  {
    auto s = OpenStore(dir);
    ASSERT_NE(s, nullptr);
    const uint64_t r13 = Publish(*s, "c/r", 400.0f);
    const uint64_t r14 = Publish(*s, "c/r", 401.0f);
    EXPECT_EQ(s->catalog().GetRevision(r13)->seq, 3u);
    EXPECT_EQ(s->catalog().GetRevision(r14)->seq, 4u);
    EXPECT_EQ(s->catalog().GetRevision(Publish(*s, "a/p", 402.0f))->seq, 8u);
    ASSERT_TRUE(s->DeleteRevision(r14).ok());  // c/r's highest seq, not the highest id
  }
  // Compaction drops 14's index entry; c/r's record (next_seq 3 on disk) must not hand out 4.
  CompactOptions co;
  co.drop_previous = true;
  ASSERT_TRUE(CompactStore(dir, co).ok());
  EXPECT_EQ(VerifyProblems(dir), "");
  auto s = OpenStore(dir);
  ASSERT_NE(s, nullptr);
  EXPECT_FALSE(s->catalog().GetRevision(14).ok());
  EXPECT_EQ(s->GetPolicy("c/r")->next_seq, 5u);
  EXPECT_EQ(s->catalog().GetRevision(Publish(*s, "c/r", 403.0f))->seq, 5u);
}

}  // namespace
}  // namespace loradb

// ---- migrate --repack / --unpack

namespace loradb {
namespace {

constexpr const char* kMoeTable = R"({"modules": [
  {"name": "layers.0.self_attn.q_proj", "in": 8, "out": 16},
  {"name": "layers.0.mlp.experts.0.gate_proj", "in": 8, "out": 16},
  {"name": "layers.0.mlp.experts.1.gate_proj", "in": 8, "out": 16},
  {"name": "layers.0.mlp.experts.2.gate_proj", "in": 8, "out": 16}]})";

maint_test::Adapter MoeAdapter(float seed) {
  maint_test::Adapter a;
  for (int e = 0; e < 3; ++e) {
    const std::string m = absl::StrCat("layers.0.mlp.experts.", e, ".gate_proj");
    a.Add(m, false, 2, 8, seed + static_cast<float>(e));
    a.Add(m, true, 16, 2, seed + 10 + static_cast<float>(e));
  }
  return a;
}

// Revision id -> (layout, blob hash, name -> tensor bytes) as the API returns them.
std::map<uint64_t, std::tuple<Layout, std::string, std::map<std::string, std::string>>> Contents(
    const std::string& dir) {
  std::map<uint64_t, std::tuple<Layout, std::string, std::map<std::string, std::string>>> out;
  auto s = OpenStore(dir);
  EXPECT_NE(s, nullptr);
  if (s == nullptr) return out;
  auto page = s->ListAllRevisions(0, 0);
  EXPECT_TRUE(page.ok());
  for (const RevisionRecord& r : page->items) {
    auto t = s->ReadTensors(r);
    EXPECT_TRUE(t.ok()) << t.status();
    std::map<std::string, std::string> tensors;
    if (t.ok()) {
      for (const TensorView& v : t->tensors()) {
        tensors[v.name] = std::string(reinterpret_cast<const char*>(v.data), v.nbytes);
      }
    }
    out[r.id] = {r.layout, r.blob.hash.Hex(), tensors};
  }
  return out;
}

TEST(Repack, PackAndUnpackKeepIdsAndTensors) {
  TempDir t;
  const std::string dir = t.file("store");
  {
    auto s = OpenStore(dir);
    ASSERT_NE(s, nullptr);
    ASSERT_TRUE(s->AddBaseFromModuleTable("moe", kMoeTable).ok());
    ASSERT_TRUE(s->CreatePolicy("m", "moe").ok());
    maint_test::Adapter moe = MoeAdapter(1.0f);
    PublishOptions o;
    o.alias = "serving";
    ASSERT_TRUE(s->PublishTensors("m", moe.views, o).ok());  // 1
    o.alias.clear();
    ASSERT_TRUE(s->PublishTensors("m", moe.views, o).ok());  // 2: same blob as 1
    Publish(*s, "m", 5.0f);                                  // 3: dense, nothing to pack
    maint_test::Adapter other = MoeAdapter(7.0f);
    ASSERT_TRUE(s->PublishTensors("m", other.views, o).ok());  // 4, deleted below
    ASSERT_TRUE(s->DeleteRevision(4).ok());
  }
  const auto before = Contents(dir);
  ASSERT_EQ(before.size(), 3u);
  ASSERT_EQ(std::get<0>(before.at(1)), Layout::kPlain);

  MigrateOptions o;
  o.repack = Repack::kPack;
  o.dry_run = true;
  auto plan = MigrateStore(dir, o);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->revisions_rewritten, 2u);
  EXPECT_EQ(plan->blobs_written, 1u);
  EXPECT_EQ(Contents(dir), before);

  o.dry_run = false;
  auto rep = MigrateStore(dir, o);
  ASSERT_TRUE(rep.ok()) << rep.status();
  EXPECT_EQ(rep->revisions_rewritten, 2u);
  EXPECT_EQ(VerifyProblems(dir), "");
  const auto packed = Contents(dir);
  ASSERT_EQ(packed.size(), 3u);
  for (uint64_t id : {1, 2}) {
    EXPECT_EQ(std::get<0>(packed.at(id)), Layout::kPacked) << id;
    EXPECT_NE(std::get<1>(packed.at(id)), std::get<1>(before.at(id))) << id;
    EXPECT_EQ(std::get<2>(packed.at(id)), std::get<2>(before.at(id))) << id;  // same tensors
  }
  EXPECT_EQ(std::get<1>(packed.at(1)), std::get<1>(packed.at(2)));  // still one shared blob
  EXPECT_EQ(packed.at(3), before.at(3));                            // dense: untouched
  {
    auto s = OpenStore(dir);
    auto serving = s->GetRevisionByAlias("m", "serving");
    ASSERT_TRUE(serving.ok());
    EXPECT_EQ(serving->id, 1u);
    auto ids = s->catalog().ListRevisionsByBlob(serving->blob.hash);
    ASSERT_TRUE(ids.ok());
    EXPECT_EQ(*ids, (std::vector<uint64_t>{1, 2}));
    auto blob = s->catalog().GetBlob(serving->blob.hash);
    ASSERT_TRUE(blob.ok());
    EXPECT_EQ(blob->refcount, 2u);
  }

  o.repack = Repack::kUnpack;
  rep = MigrateStore(dir, o);
  ASSERT_TRUE(rep.ok()) << rep.status();
  EXPECT_EQ(rep->revisions_rewritten, 2u);
  EXPECT_EQ(VerifyProblems(dir), "");
  // Serialization is deterministic: unpacking gives back the very same plain blobs.
  EXPECT_EQ(Contents(dir), before);

  // Packing needs a current store.
  TempDir t2;
  WriteV1Store(t2.file("v1"));
  o.repack = Repack::kPack;
  auto old = MigrateStore(t2.file("v1"), o);
  EXPECT_TRUE(absl::IsFailedPrecondition(old.status())) << old.status();
}

}  // namespace
}  // namespace loradb
