// Helpers for the storage tests that kill or follow a child process: the child is the test
// binary itself, re-executed with extra environment variables that a static initializer in the
// test file reads (it runs the child's loop and never returns to gtest). The child reports
// progress as lines on an acknowledgement pipe.
#ifndef LORADB_TESTS_STORAGE_CHILD_PROCESS_TEST_UTIL_H_
#define LORADB_TESTS_STORAGE_CHILD_PROCESS_TEST_UTIL_H_

#include <gtest/gtest.h>
#include <spawn.h>
#include <unistd.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "storage/formats/synthetic.h"
#include "storage/store/store.h"

extern char** environ;

namespace loradb::testing {

// Adds base "b" (kTinyQProjModuleTable: what MakeTinyQProjAdapter fits) and `policy` on it.
inline absl::Status AddQProjBaseAndPolicy(Store& store, const std::string& policy) {
  auto base = store.AddBaseFromModuleTable("b", kTinyQProjModuleTable);
  if (!base.ok()) return base.status();
  return store.CreatePolicy(policy, "b").status();
}

// A child process and the read end of its acknowledgement pipe.
struct AckChild {
  pid_t pid = 0;
  int fd = -1;
};

// Re-executes this test binary with the environment plus `env` (name, value) and
// `ack_fd_env`=<write end of a new pipe>. The parent keeps the read end (returned in `fd`). On a
// failure the test fails (non-fatally) and `pid` stays 0.
inline AckChild SpawnSelfWithAckPipe(const std::vector<std::pair<std::string, std::string>>& env,
                                     const char* ack_fd_env) {
  AckChild child;
  int fds[2];
  if (pipe(fds) != 0) {
    ADD_FAILURE() << "pipe failed";
    return child;
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addclose(&actions, fds[0]);
  std::vector<std::string> env_strings;
  for (char** e = environ; *e != nullptr; ++e) env_strings.emplace_back(*e);
  for (const auto& [name, value] : env) env_strings.push_back(absl::StrCat(name, "=", value));
  env_strings.push_back(absl::StrCat(ack_fd_env, "=", fds[1]));
  std::vector<char*> envp;
  for (auto& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::string exe = "/proc/self/exe";
  std::string arg = "--gtest_list_tests";  // never reached: the child's hook takes over
  char* argv[] = {exe.data(), arg.data(), nullptr};
  const int rc = posix_spawn(&child.pid, exe.c_str(), &actions, nullptr, argv, envp.data());
  posix_spawn_file_actions_destroy(&actions);
  close(fds[1]);
  if (rc != 0) {
    ADD_FAILURE() << "posix_spawn failed: " << rc;
    close(fds[0]);
    child.pid = 0;
    return child;
  }
  child.fd = fds[0];
  return child;
}

}  // namespace loradb::testing

#endif  // LORADB_TESTS_STORAGE_CHILD_PROCESS_TEST_UTIL_H_
