// The checked-in schema-v3 to v6 fixtures (tests/storage/fixtures/vN_store): real bytes of each
// version (v3: revision records in layout 1; v4: layout 2, policy names as raw keys; v5: layout
// 2, policy names keyed by length; v6: layout 3, and aliases moved, rolled back and set under
// names that share a prefix), written once by the build of that version from the same rich store
// (every revision field in use), and every record as that build read it through the API
// (fixtures/vN_records.txt). Migrating a fixture forward must read back exactly those records.
// To rewrite one (only with a build whose schema version is N):
//   LORADB_WRITE_V3_FIXTURE=1 build/tests/loradb_storage_tests --gtest_filter='V3Fixture.*'
//   LORADB_WRITE_V4_FIXTURE=1 build/tests/loradb_storage_tests --gtest_filter='V4Fixture.*'
//   LORADB_WRITE_V5_FIXTURE=1 build/tests/loradb_storage_tests --gtest_filter='V5Fixture.*'
//   LORADB_WRITE_V6_FIXTURE=1 build/tests/loradb_storage_tests --gtest_filter='V6Fixture.*'
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "storage/maintenance/maintenance.h"
#include "storage/store/record_json.h"
#include "storage/store/store.h"
#include "tests/storage/maint_test_util.h"
#include "tests/test_util.h"

namespace loradb {
namespace {

namespace fs = std::filesystem;
using ::loradb::testing::TempDir;

// The standard maintenance store plus revisions that use every field a revision record holds:
// a trained one (checkpoint, step, parent, rank and alpha patterns, rslora, evals) and an
// imported one (origin, content hash), and an eval score set after publishing.
void WriteRichStore(const std::string& dir) {
  maint_test::BuildStore(dir);
  auto s = maint_test::OpenStore(dir);
  ASSERT_NE(s, nullptr);
  ASSERT_TRUE(s->CreatePolicy("c/r", "tiny", {{"team", "rl"}, {"tier", "gold"}}).ok());
  PublishOptions trained;
  trained.alias = "serving";
  trained.parent = 1;
  trained.source.kind = SourceKind::kTrained;
  trained.source.checkpoint_id = 1;
  trained.source.step = 10;
  trained.lora.r = 2;
  trained.lora.alpha = 4.5f;
  trained.lora.use_rslora = true;
  trained.lora.modules = {{"q_proj", 2, 8.0f, true}, {"v_proj", 0, 3.0f, true}};
  trained.lora.target_modules = {"q_proj", "v_proj"};
  trained.evals = {{"acc", 0.75f}, {"loss", 1.25f}};
  maint_test::Adapter a = maint_test::MakeAdapter(300.0f);
  auto r1 = s->PublishTensors("c/r", a.views, trained);
  ASSERT_TRUE(r1.ok()) << r1.status();
  PublishOptions imported;
  imported.source.kind = SourceKind::kImported;
  imported.source.origin = "hf://org/adapter@main";
  imported.source.content_hash = "0123456789abcdef0123456789abcdef";
  imported.lora.r = 2;
  imported.lora.alpha = 16.0f;
  maint_test::Adapter b = maint_test::MakeAdapter(301.0f);
  auto r2 = s->PublishTensors("c/r", b.views, imported);
  ASSERT_TRUE(r2.ok()) << r2.status();
  ASSERT_TRUE(s->SetEvalScore(3, "win_rate", 0.5f).ok());
}

// The rich store with more alias history (the v6 fixture): `a/p:serving` rolled back twice and
// moved again, `a/p:serving2` (a name `serving` is a prefix of) set and moved, `c/r:serving` moved
// and rolled back, so an alias's value is the `to` of a log entry that is not always a plain set.
void WriteRichStoreWithAliasMoves(const std::string& dir) {
  WriteRichStore(dir);
  auto s = maint_test::OpenStore(dir);
  ASSERT_NE(s, nullptr);
  // a/p: serving 1 -> 3 -> 5 (BuildStore); revisions 2 and 4 are deleted.
  ASSERT_EQ(*s->Rollback("a/p", "serving"), 3u);
  ASSERT_EQ(*s->Rollback("a/p", "serving"), 5u);
  ASSERT_TRUE(s->SetAlias("a/p", "serving", 6).ok());
  ASSERT_TRUE(s->SetAlias("a/p", "serving2", 6).ok());
  ASSERT_TRUE(s->SetAlias("a/p", "serving2", 1).ok());
  // c/r: serving -> 10 (published with it), then 11, then back to 10.
  ASSERT_TRUE(s->SetAlias("c/r", "serving", 11).ok());
  ASSERT_EQ(*s->Rollback("c/r", "serving"), 10u);
}

// Every record the API shows, one JSON line each: policies, revisions (deleted ones too), alias
// logs, checkpoints and blob records.
std::string Records(const std::string& dir) {
  StoreOptions o;
  o.create_if_missing = false;
  auto s = Store::Open(dir, o);
  if (!s.ok()) return std::string(s.status().message());
  const Catalog& cat = (*s)->catalog();
  std::ostringstream out;
  std::map<uint64_t, std::string> names;
  auto policies = cat.ListPolicies();
  EXPECT_TRUE(policies.ok());
  if (!policies.ok()) return "";
  for (const PolicyRecord& p : *policies) {
    names[p.id] = p.name;
    out << PolicyJson(p).dump() << "\n";
  }
  auto revs = cat.ListRevisions(0, 0, /*include_deleted=*/true);
  EXPECT_TRUE(revs.ok());
  if (!revs.ok()) return "";
  for (const RevisionRecord& r : revs->items) {
    out << RevisionJson(r, names[r.policy_id]).dump() << "\n";
  }
  for (const PolicyRecord& p : *policies) {
    auto aliases = cat.ListAliases(p.id);
    EXPECT_TRUE(aliases.ok());
    if (!aliases.ok()) continue;
    for (const AliasEntry& a : *aliases) {
      out << AliasJson(p.name, a.alias, a.revision).dump() << "\n";
      auto log = cat.AliasLog(p.id, a.alias);
      EXPECT_TRUE(log.ok());
      if (!log.ok()) continue;
      for (const AliasLogEntry& e : *log) out << AliasLogJson(e).dump() << "\n";
    }
    auto cks = cat.ListCheckpoints(p.id);
    EXPECT_TRUE(cks.ok());
    if (!cks.ok()) continue;
    for (const CheckpointRecord& c : *cks) out << CheckpointJson(c, p.name).dump() << "\n";
  }
  auto blobs = cat.ListBlobs();
  EXPECT_TRUE(blobs.ok());
  if (!blobs.ok()) return "";
  for (const BlobRecord& b : *blobs) {
    out << b.hash.Hex() << " " << b.relpath << " " << b.bytes << " refs " << b.refcount << " "
        << BlobKindName(b.kind) << "\n";
  }
  return out.str();
}

std::string ReadText(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Rewrites the version-`version` fixture when `regen_env` is "1" (a build of that version
// only), then migrates a copy forward and checks verify and every record against the fixture's.
void MigrateFixtureAndCompare(uint32_t version, const char* regen_env,
                              void (*write)(const std::string&) = WriteRichStore) {
  const std::string fixture =
      absl::StrCat(LORADB_SOURCE_DIR, "/tests/storage/fixtures/v", version, "_store");
  const std::string records =
      absl::StrCat(LORADB_SOURCE_DIR, "/tests/storage/fixtures/v", version, "_records.txt");
  const char* regen = std::getenv(regen_env);
  if (regen != nullptr && std::string(regen) == "1") {
    ASSERT_EQ(kCatalogSchemaVersion, version)
        << "the v" << version << " fixture is written by a v" << version << " build only";
    fs::remove_all(fixture);
    write(fixture);
    std::ofstream(records) << Records(fixture);
    fs::remove(fixture + "/catalog/lock.mdb");
    fs::remove(fixture + "/LOCK");
  }
  const std::string expected = ReadText(records);
  ASSERT_FALSE(expected.empty());
  TempDir t;
  const std::string dir = t.file("store");
  maint_test::CopyTree(fixture, dir);
  ASSERT_EQ(*ReadStoreSchemaVersion(dir), version);
  auto rep = MigrateStore(dir, {});
  ASSERT_TRUE(rep.ok()) << rep.status();
  EXPECT_EQ(rep->from_version, version);
  EXPECT_EQ(rep->to_version, kCatalogSchemaVersion);
  EXPECT_EQ(*ReadStoreSchemaVersion(dir), kCatalogSchemaVersion);
  EXPECT_EQ(maint_test::VerifyProblems(dir), "");
  EXPECT_EQ(Records(dir), expected);
  // Every policy is found by its name in the migrated name index.
  StoreOptions o;
  o.create_if_missing = false;
  auto s = Store::Open(dir, o);
  ASSERT_TRUE(s.ok()) << s.status();
  auto policies = (*s)->catalog().ListPolicies();
  ASSERT_TRUE(policies.ok());
  ASSERT_FALSE(policies->empty());
  for (const PolicyRecord& p : *policies) {
    auto by_name = (*s)->catalog().GetPolicy(p.name);
    ASSERT_TRUE(by_name.ok()) << p.name << ": " << by_name.status();
    EXPECT_EQ(by_name->id, p.id);
  }
}

TEST(V3Fixture, MigratesAndReadsIdentically) {
  MigrateFixtureAndCompare(3, "LORADB_WRITE_V3_FIXTURE");
}

TEST(V4Fixture, MigratesAndReadsIdentically) {
  MigrateFixtureAndCompare(4, "LORADB_WRITE_V4_FIXTURE");
}

TEST(V5Fixture, MigratesAndReadsIdentically) {
  MigrateFixtureAndCompare(5, "LORADB_WRITE_V5_FIXTURE");
}

TEST(V6Fixture, MigratesAndReadsIdentically) {
  MigrateFixtureAndCompare(6, "LORADB_WRITE_V6_FIXTURE", WriteRichStoreWithAliasMoves);
}

}  // namespace
}  // namespace loradb
