// Helpers shared by loradb's C++ tests.
#ifndef LORADB_TESTS_TEST_UTIL_H_
#define LORADB_TESTS_TEST_UTIL_H_

#include "tests/test_paths.h"
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>

namespace loradb::testing {

// A fresh directory under $TMPDIR, removed (recursively) when the object dies.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "loradb-test-XXXXXX").string();
    char* p = ::mkdtemp(tmpl.data());
    EXPECT_NE(p, nullptr);
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// Path of a file in tests/testdata (third-party files, with their licenses; see its README.md).
inline std::string TestData(const std::string& rel) {
  return std::string(LORADB_TESTDATA_DIR) + "/" + rel;
}

// True when long soak/scale tests should run (LORADB_SLOW_TESTS=1, set by `tools/dev test --all`).
inline bool SlowTestsEnabled() {
  const char* v = std::getenv("LORADB_SLOW_TESTS");
  return v != nullptr && std::string(v) == "1";
}

}  // namespace loradb::testing

// Skips the current test, visibly, unless slow tests are enabled.
#define LORADB_SLOW_TEST()                                                              \
  do {                                                                                  \
    if (!::loradb::testing::SlowTestsEnabled())                                         \
      GTEST_SKIP() << "slow test: run with LORADB_SLOW_TESTS=1 (tools/dev test --all)"; \
  } while (0)

#endif  // LORADB_TESTS_TEST_UTIL_H_
