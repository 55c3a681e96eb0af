// Starts K ranks of one program as separate processes on this machine (loopback), like
// torchrun's local launcher: each child gets LORADB_RANK, LORADB_WORLD_SIZE,
// LORADB_RENDEZVOUS (a fresh FileStore in a temporary directory unless one is given) and
// LORADB_DIST_TIMEOUT_MS, which process_group.h's GroupOptionsFromEnvironment reads.
//
// When one rank fails (non-zero exit or a signal), the others are stopped (SIGTERM, then SIGKILL
// after `grace`, to each rank's whole process group: every rank leads one) and the launch
// reports which rank failed first: a DP or TP job is only useful whole. Ranks get SIGTERM when
// the launcher dies (PR_SET_PDEATHSIG), so Ctrl-C on the launcher stops the job.
// Torch-free (the CLI includes it).
#ifndef LORADB_COMPUTE_DISTRIBUTED_LAUNCHER_H_
#define LORADB_COMPUTE_DISTRIBUTED_LAUNCHER_H_

#include <chrono>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace loradb::dist {

struct LaunchOptions {
  std::vector<std::string> argv;  // argv[0]: the program's path (execv, no PATH search)
  int world_size = 2;
  std::string rendezvous;  // empty: file:<fresh temp dir>/rendezvous, removed afterwards
  std::chrono::milliseconds collective_timeout{60000};  // LORADB_DIST_TIMEOUT_MS of the ranks
  // The whole launch: past it every rank is killed and DeadlineExceeded returned. 0: none.
  std::chrono::milliseconds deadline{0};
  std::chrono::milliseconds grace{3000};  // SIGTERM -> SIGKILL of the survivors
  // Ranks > 0 write stdout to /dev/null (their stderr stays), so output is rank 0's.
  bool quiet_followers = true;
  // Extra NAME=VALUE entries for every rank's environment.
  std::vector<std::string> env;
};

struct RankExit {
  int rank = 0;
  int exit_code = 0;  // when exited normally
  int signal = 0;     // when killed by a signal
  bool stopped_by_launcher = false;
};

// Runs the ranks to completion. OK (with every rank's exit) when all exit 0. Aborted when a rank
// failed (the message names the first one and how it ended), DeadlineExceeded past `deadline`,
// InvalidArgument for an empty argv or world_size < 1, Internal when fork/exec fails.
[[nodiscard]] absl::StatusOr<std::vector<RankExit>> LaunchRanks(const LaunchOptions& options);

// The path of the running executable (/proc/self/exe), for programs that re-launch themselves.
[[nodiscard]] absl::StatusOr<std::string> SelfExecutable();
// This process's argv as started (/proc/self/cmdline), argv[0] replaced by SelfExecutable().
[[nodiscard]] absl::StatusOr<std::vector<std::string>> SelfCommandLine();

}  // namespace loradb::dist

#endif  // LORADB_COMPUTE_DISTRIBUTED_LAUNCHER_H_
