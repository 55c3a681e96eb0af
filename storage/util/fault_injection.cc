#include "storage/util/fault_injection.h"

#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>

#include "absl/base/attributes.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "storage/util/file_util.h"
#include "storage/util/mutex.h"

namespace loradb {
namespace fault_internal {

ABSL_CONST_INIT std::atomic<bool> g_active{false};

namespace {

struct FaultState {
  Mutex mu;  // loradb::Mutex: visible to ThreadSanitizer
  bool armed ABSL_GUARDED_BY(mu) = false;
  std::string point ABSL_GUARDED_BY(mu);
  uint64_t remaining ABSL_GUARDED_BY(mu) = 0;
  FaultAction action ABSL_GUARDED_BY(mu) = FaultAction::kKill;
  bool recording ABSL_GUARDED_BY(mu) = false;
  std::vector<std::string> recorded ABSL_GUARDED_BY(mu);
};

FaultState& State() {
  static auto* s = new FaultState();
  return *s;
}

void UpdateActive(FaultState& s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu) {
  g_active.store(s.armed || s.recording, std::memory_order_relaxed);
}

// Arms from LORADB_FAULT at start-up, so a child process (or the CLI) can be told where to die.
[[maybe_unused]] const bool kArmedFromEnv = [] {
  const char* spec = std::getenv("LORADB_FAULT");
  if (spec == nullptr || *spec == '\0') return false;
  absl::Status st = ArmFaultFromSpec(spec);
  if (!st.ok()) {
    std::fprintf(stderr, "loradb: ignoring LORADB_FAULT: %s\n", std::string(st.message()).c_str());
    return false;
  }
  return true;
}();

}  // namespace

absl::Status Hit(const char* name) {
  FaultState& s = State();
  FaultAction action;
  {
    MutexLock lock(&s.mu);
    if (s.recording) s.recorded.emplace_back(name);
    if (!s.armed || s.point != name) return absl::OkStatus();
    if (--s.remaining > 0) return absl::OkStatus();
    s.armed = false;
    UpdateActive(s);
    action = s.action;
  }
  switch (action) {
    case FaultAction::kKill:
      ::kill(::getpid(), SIGKILL);
      ::_exit(137);  // not reached
    case FaultAction::kEnospc:
      return ErrnoToStatus(ENOSPC, absl::StrCat("injected fault at ", name));
    case FaultAction::kEio:
      return ErrnoToStatus(EIO, absl::StrCat("injected fault at ", name));
  }
  return absl::OkStatus();
}

}  // namespace fault_internal

using fault_internal::State;

void ArmFault(absl::string_view point, uint64_t nth, FaultAction action) {
  auto& s = State();
  MutexLock lock(&s.mu);
  s.armed = true;
  s.point = std::string(point);
  s.remaining = nth == 0 ? 1 : nth;
  s.action = action;
  fault_internal::UpdateActive(s);
}

void DisarmFaults() {
  auto& s = State();
  MutexLock lock(&s.mu);
  s.armed = false;
  s.recording = false;
  fault_internal::UpdateActive(s);
}

absl::Status ArmFaultFromSpec(absl::string_view spec) {
  FaultAction action = FaultAction::kKill;
  const size_t colon = spec.rfind(':');
  if (colon != absl::string_view::npos) {
    const absl::string_view a = spec.substr(colon + 1);
    if (a == "kill") {
      action = FaultAction::kKill;
    } else if (a == "enospc") {
      action = FaultAction::kEnospc;
    } else if (a == "eio") {
      action = FaultAction::kEio;
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("fault action '", a, "' is not kill, enospc or eio"));
    }
    spec = spec.substr(0, colon);
  }
  uint64_t nth = 1;
  const size_t at = spec.rfind('@');
  if (at != absl::string_view::npos) {
    if (!absl::SimpleAtoi(spec.substr(at + 1), &nth) || nth == 0) {
      return absl::InvalidArgumentError(absl::StrCat("bad fault hit count in '", spec, "'"));
    }
    spec = spec.substr(0, at);
  }
  if (spec.empty()) return absl::InvalidArgumentError("fault spec names no point");
  ArmFault(spec, nth, action);
  return absl::OkStatus();
}

void StartFaultRecording() {
  auto& s = State();
  MutexLock lock(&s.mu);
  s.recording = true;
  s.recorded.clear();
  fault_internal::UpdateActive(s);
}

std::vector<std::string> RecordedFaultPoints() {
  auto& s = State();
  MutexLock lock(&s.mu);
  return s.recorded;
}

}  // namespace loradb
