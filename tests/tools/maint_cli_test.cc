// `loradb compact`, `loradb migrate` and `loradb verify` through the real binary: JSON output,
// exit status 1 with an `error:` line on failure.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "absl/strings/str_cat.h"
#include "storage/catalog/records.h"
#include "storage/util/store_lock.h"
#include "tests/storage/maint_test_util.h"
#include "tests/test_paths.h"
#include "tests/test_util.h"

namespace loradb {
namespace {

using ::loradb::testing::TempDir;

struct CliRun {
  int status = -1;
  std::string out;
};

// Runs `loradb --store DIR ARGS` with stderr folded into the output.
CliRun Loradb(const std::string& dir, const std::string& args) {
  CliRun r;
  const std::string cmd = std::string(LORADB_CLI_PATH) + " --store '" + dir + "' " + args + " 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) r.out.append(buf, n);
  const int st = ::pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

nlohmann::json LastJson(const std::string& out) {
  const size_t start = out.rfind("\n{");
  return nlohmann::json::parse(start == std::string::npos ? out : out.substr(start + 1));
}

TEST(MaintCli, CompactVerifyAndCorruption) {
  TempDir t;
  const std::string dir = t.file("store");
  maint_test::BuildStore(dir);
  CliRun v = Loradb(dir, "verify --json");
  ASSERT_EQ(v.status, 0) << v.out;
  EXPECT_TRUE(LastJson(v.out)["ok"].get<bool>());
  EXPECT_EQ(LastJson(v.out)["schema_version"].get<int>(), static_cast<int>(kCatalogSchemaVersion));

  CliRun dry = Loradb(dir, "compact --dry-run --json");
  ASSERT_EQ(dry.status, 0) << dry.out;
  EXPECT_EQ(LastJson(dry.out)["dropped_deleted"].get<int>(), 2);
  EXPECT_TRUE(LastJson(dry.out)["dry_run"].get<bool>());

  CliRun c = Loradb(dir, "compact --json --keep-last 1 --keep-alias-history 30d");
  ASSERT_EQ(c.status, 0) << c.out;
  const auto j = LastJson(c.out);
  EXPECT_EQ(j["revisions_before"].get<int>(), 9);
  EXPECT_GT(j["catalog_bytes_before"].get<uint64_t>(), 0u);
  EXPECT_GT(j["catalog_bytes_after"].get<uint64_t>(), 0u);
  EXPECT_FALSE(j["previous_generation"].get<std::string>().empty());
  v = Loradb(dir, "verify --json");
  ASSERT_EQ(v.status, 0) << v.out;

  // Text output names the counts.
  CliRun text = Loradb(dir, "compact --drop-previous");
  ASSERT_EQ(text.status, 0) << text.out;
  EXPECT_NE(text.out.find("catalog bytes"), std::string::npos) << text.out;

  // A truncated blob: verify exits 1 and lists it.
  std::string victim;
  for (auto& e : std::filesystem::recursive_directory_iterator(dir + "/blobs")) {
    if (e.is_regular_file()) victim = e.path().string();
  }
  ASSERT_FALSE(victim.empty());
  std::filesystem::resize_file(victim, std::filesystem::file_size(victim) - 1);
  v = Loradb(dir, "verify --json");
  EXPECT_EQ(v.status, 1) << v.out;
  EXPECT_NE(v.out.find("error: verify found"), std::string::npos) << v.out;
  const size_t brace = v.out.find('{');
  ASSERT_NE(brace, std::string::npos);
  const auto bad = nlohmann::json::parse(v.out.substr(brace, v.out.find('\n', brace) - brace));
  EXPECT_FALSE(bad["ok"].get<bool>());
  EXPECT_FALSE(bad["problems"].empty());
}

TEST(MaintCli, BusyStoreAndMigrate) {
  TempDir t;
  const std::string dir = t.file("store");
  maint_test::WriteV1Store(dir);
  CliRun dry = Loradb(dir, "migrate --dry-run --json");
  ASSERT_EQ(dry.status, 0) << dry.out;
  EXPECT_EQ(LastJson(dry.out)["from_version"].get<int>(), 1);
  EXPECT_EQ(LastJson(dry.out)["changes"].size(), 7u);  // the version + one per step
  {
    auto held = StoreLock::Acquire(dir, StoreLock::Mode::kShared);
    ASSERT_TRUE(held.ok());
    CliRun busy = Loradb(dir, "migrate");
    EXPECT_EQ(busy.status, 1);
    EXPECT_NE(busy.out.find("error: store"), std::string::npos) << busy.out;
    EXPECT_NE(busy.out.find("in use"), std::string::npos) << busy.out;
  }
  CliRun m = Loradb(dir, "migrate");
  ASSERT_EQ(m.status, 0) << m.out;
  EXPECT_NE(m.out.find(absl::StrCat("schema 1 -> ", kCatalogSchemaVersion)), std::string::npos)
      << m.out;
  EXPECT_NE(m.out.find("policy names: keyed by length, then name"), std::string::npos) << m.out;
  CliRun again = Loradb(dir, "migrate");
  ASSERT_EQ(again.status, 0) << again.out;
  EXPECT_NE(again.out.find("nothing to do"), std::string::npos) << again.out;
  CliRun v = Loradb(dir, "verify");
  EXPECT_EQ(v.status, 0) << v.out;
}

}  // namespace
}  // namespace loradb
