// Named fault points for crash and I/O-error testing, compiled into release code. A fault point
// is a call `LORADB_RETURN_IF_ERROR(FaultPoint("compact.before_swap"))` at a moment worth
// testing (before/after an fsync, a rename, a commit). Disarmed (the default) it costs one relaxed
// atomic load. Armed, the N-th hit of the named point either kills the process with SIGKILL or
// returns a simulated ENOSPC / EIO error.
//
// Arming: the environment variable LORADB_FAULT="POINT[@N][:ACTION]" read at start-up (ACTION is
// kill (default), enospc or eio; N defaults to 1), or ArmFault() from a test. Recording:
// StartFaultRecording() makes every hit append its name to a list, so a test can enumerate the
// points an operation passes through.
#ifndef LORADB_STORAGE_UTIL_FAULT_INJECTION_H_
#define LORADB_STORAGE_UTIL_FAULT_INJECTION_H_

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace loradb {

enum class FaultAction : uint8_t { kKill = 0, kEnospc = 1, kEio = 2 };

namespace fault_internal {
// True while a fault is armed or hits are recorded.
extern std::atomic<bool> g_active;
absl::Status Hit(const char* name);
}  // namespace fault_internal

// Passes through fault point `name`. OK unless an armed fault fires (then SIGKILL, or an
// ENOSPC / EIO status naming the point).
[[nodiscard]] inline absl::Status FaultPoint(const char* name) {
  if (!fault_internal::g_active.load(std::memory_order_relaxed)) return absl::OkStatus();
  return fault_internal::Hit(name);
}

// Arms `point`: its `nth` hit (1-based) from now on performs `action`. Replaces an earlier arm.
void ArmFault(absl::string_view point, uint64_t nth, FaultAction action);
// Disarms, and stops recording.
void DisarmFaults();
// Parses "POINT[@N][:ACTION]". InvalidArgument for a bad spec.
[[nodiscard]] absl::Status ArmFaultFromSpec(absl::string_view spec);

// Starts recording the names of the fault points hit (clears the list).
void StartFaultRecording();
// The names recorded since StartFaultRecording, in order.
std::vector<std::string> RecordedFaultPoints();

}  // namespace loradb

#endif  // LORADB_STORAGE_UTIL_FAULT_INJECTION_H_
