// The checked-in schema-v3 fixture (tests/storage/fixtures/v3_store): real v3 bytes (revision
// records in layout 1, with every revision field in use), written once by the v3 build, and
// every record as that build read it through the API (fixtures/v3_records.txt). Migrating the
// fixture forward must read back exactly those records. To rewrite both (only with a build whose
// schema version is 3):
//   LORADB_WRITE_V3_FIXTURE=1 build/tests/loradb_storage_tests --gtest_filter='V3Fixture.*'
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "storage/maintenance/maintenance.h"
#include "storage/store/record_json.h"
#include "storage/store/store.h"
#include "tests/storage/maint_test_util.h"
#include "tests/test_util.h"

namespace loradb {
namespace {

namespace fs = std::filesystem;
using ::loradb::testing::TempDir;

const std::string kV3Fixture = std::string(LORADB_SOURCE_DIR) + "/tests/storage/fixtures/v3_store";
const std::string kV3Records =
    std::string(LORADB_SOURCE_DIR) + "/tests/storage/fixtures/v3_records.txt";

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

TEST(V3Fixture, MigratesAndReadsIdentically) {
  const char* regen = std::getenv("LORADB_WRITE_V3_FIXTURE");
  if (regen != nullptr && std::string(regen) == "1") {
    ASSERT_EQ(kCatalogSchemaVersion, 3u) << "the v3 fixture is written by a v3 build only";
    fs::remove_all(kV3Fixture);
    WriteRichStore(kV3Fixture);
    std::ofstream(kV3Records) << Records(kV3Fixture);
    fs::remove(kV3Fixture + "/catalog/lock.mdb");
    fs::remove(kV3Fixture + "/LOCK");
  }
  const std::string expected = ReadText(kV3Records);
  ASSERT_FALSE(expected.empty());
  TempDir t;
  const std::string dir = t.file("store");
  maint_test::CopyTree(kV3Fixture, dir);
  ASSERT_EQ(*ReadStoreSchemaVersion(dir), 3u);
  auto rep = MigrateStore(dir, {});
  ASSERT_TRUE(rep.ok()) << rep.status();
  EXPECT_EQ(rep->from_version, 3u);
  EXPECT_EQ(rep->to_version, kCatalogSchemaVersion);
  EXPECT_EQ(*ReadStoreSchemaVersion(dir), kCatalogSchemaVersion);
  EXPECT_EQ(maint_test::VerifyProblems(dir), "");
  EXPECT_EQ(Records(dir), expected);
}

}  // namespace
}  // namespace loradb
