// Shared by the compute tests that drive the built `loradb` binary (LORADB_CLI_PATH) in child
// processes: running it with captured output, reading a file whole, and skipping when this
// LibTorch has no c10d (the dist / tp commands need it).
#ifndef LORADB_TESTS_COMPUTE_CLI_TEST_UTIL_H_
#define LORADB_TESTS_COMPUTE_CLI_TEST_UTIL_H_

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "tests/test_paths.h"
#include "absl/strings/str_cat.h"
#include "compute/distributed/process_group.h"
#include "tests/test_util.h"

namespace loradb::testing {

// The whole content of `path` ("" when it cannot be read).
inline std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// One run of the `loradb` CLI: exit code (-1 when it did not exit normally), stdout, stderr.
struct CliRun {
  int rc = -1;
  std::string out, err;
};

// Runs `loradb --store STORE ARGS` through the shell with `env` (e.g. "OMP_NUM_THREADS=1", may be
// empty) set for it; stdout and stderr go through files `stdout` / `stderr` in `dir`, which each
// run overwrites. ARGS is shell text: quote paths that may hold spaces.
inline CliRun Cli(const TempDir& dir, const std::string& store, const std::string& args,
                  const std::string& env = "") {
  CliRun r;
  const std::string out = dir.file("stdout"), err = dir.file("stderr");
  const std::string cmd =
      absl::StrCat(env, env.empty() ? "" : " ", "'", LORADB_CLI_PATH, "' --store '", store, "' ",
                   args, " >'", out, "' 2>'", err, "'");
  const int st = std::system(cmd.c_str());
  r.rc = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  r.out = Slurp(out);
  r.err = Slurp(err);
  return r;
}

}  // namespace loradb::testing

// Skips the test when LibTorch was built without c10d.
#define SKIP_WITHOUT_C10D()                                                       \
  do {                                                                            \
    std::string why;                                                              \
    if (!::loradb::dist::C10dAvailable(&why)) GTEST_SKIP() << "no c10d: " << why; \
  } while (0)

#endif  // LORADB_TESTS_COMPUTE_CLI_TEST_UTIL_H_
