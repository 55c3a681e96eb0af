// A collective self-check for one rank of a launched group (`loradb dist-check`): all-reduce
// (sum, average, max), broadcast, all-gather, byte broadcast and barrier over known values,
// each result checked exactly. The GPU script and the tests run it for Gloo and NCCL.
// Torch-free header (the CLI includes it).
#ifndef LORADB_COMPUTE_DISTRIBUTED_PROCESS_GROUP_SELFCHECK_H_
#define LORADB_COMPUTE_DISTRIBUTED_PROCESS_GROUP_SELFCHECK_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace loradb::dist {

struct SelfCheckOptions {
  std::string backend = "gloo";  // gloo | nccl
  std::string device = "cpu";    // cpu | cuda (gloo carries both; nccl needs cuda)
  int64_t elements = 1 << 16;    // all-reduce size
  // Test hook for failure handling: this rank SIGKILLs itself after joining the group (-1: no).
  int die_rank = -1;
};

struct SelfCheckResult {
  int rank = 0;
  int world_size = 1;
  int64_t collectives = 0;
  double allreduce_ms = 0;  // the checked sum all-reduce, this rank's wall time
};

// Joins the group described by the environment (launcher.h) and runs the checks. Internal
// with the first mismatch; the process group's errors (Unavailable, DeadlineExceeded) as is.
[[nodiscard]] absl::StatusOr<SelfCheckResult> RunSelfCheck(const SelfCheckOptions& options);

}  // namespace loradb::dist

#endif  // LORADB_COMPUTE_DISTRIBUTED_PROCESS_GROUP_SELFCHECK_H_
