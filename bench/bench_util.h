// Shared plumbing for loradb-bench scenarios: the scenario registry, JSON-line output
// (DESIGN.md section 8), timing helpers, scratch directories, loopback sockets and child
// commands. Measurements go to stdout as one JSON object per
// line; progress goes to stderr.
#ifndef LORADB_BENCH_BENCH_UTIL_H_
#define LORADB_BENCH_BENCH_UTIL_H_

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace CLI {
class App;
}  // namespace CLI

namespace loradb::bench {

// The source tree this binary was built from (scenarios read shipped files such as
// compute/configs/*.json). Defined in main.cc, the one bench object compiled with the path, so
// that every other bench file compiles the same in every checkout and ccache shares it.
const char* SourceDir();

// A scenario gets the arguments after its name (`loradb-bench SCENARIO [CASE] [--flags]`).
using ScenarioFn = std::function<absl::Status(const std::vector<std::string>& args)>;

struct ScenarioDef {
  std::string name;
  std::string help;
  ScenarioFn run;
  // Arguments `loradb-bench all` passes: sizes that fit a 2-core, 24 GiB machine.
  std::vector<std::string> all_args;
};

std::vector<ScenarioDef>& ScenarioRegistry();

// Parses a scenario's arguments (after its name) with `app`, whose options the scenario declared:
// `--flag value` or `--flag=value`, lists comma-separated (`->delimiter(',')`), as the `loradb`
// command takes them. InvalidArgument naming the bad argument; with `--help`, prints the
// scenario's flags and returns Cancelled.
[[nodiscard]] absl::Status ParseFlags(CLI::App* app, const std::vector<std::string>& args);
bool RegisterScenario(ScenarioDef def);

// Prints one measurement line. `fields` must carry "bench" and "case".
void Emit(const nlohmann::json& fields);

// Prints a goal line: {"bench":..,"goal":..,"value":..,"target":..,"met":..}.
void EmitGoal(const std::string& bench, const std::string& goal, double value,
              const std::string& target, bool met);

// Progress text on stderr.
void Progress(const std::string& text);

// Monotonic seconds since an arbitrary origin.
inline double NowSeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// The q-quantile (0..1) of `samples` (copied, then partially sorted). 0 for an empty set.
double Quantile(std::vector<double> samples, double q);

// A fresh directory under the system temp dir named PREFIX-PID, removed (with its contents)
// when this goes out of scope.
class ScopedBenchDir {
 public:
  explicit ScopedBenchDir(const std::string& prefix);
  ~ScopedBenchDir();
  ScopedBenchDir(const ScopedBenchDir&) = delete;
  ScopedBenchDir& operator=(const ScopedBenchDir&) = delete;
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

// A blocking TCP socket connected to 127.0.0.1:`port` with TCP_NODELAY set (the caller closes
// it), or -1 when the socket cannot be created or connected.
int ConnectLoopback(int port);

// What RunJsonCommand saw: the command's exit status (-1 when it did not exit normally) and the
// last line of its stdout that parses as a JSON object with the asked-for key (null when none
// did).
struct JsonCommandResult {
  int exit_status = -1;
  nlohmann::json last_object;
};

// Runs `command` through /bin/sh, its stderr going to ours, and collects its stdout; with `key`,
// only object lines that have that key count. Errors: Internal when the command cannot be started.
[[nodiscard]] absl::StatusOr<JsonCommandResult> RunJsonCommand(const std::string& command,
                                                               const std::string& key = "");

}  // namespace loradb::bench

#define LORADB_SOURCE_DIR (::loradb::bench::SourceDir())

#define LORADB_BENCH_CONCAT_INNER_(a, b) a##b
#define LORADB_BENCH_CONCAT_(a, b) LORADB_BENCH_CONCAT_INNER_(a, b)
#define LORADB_REGISTER_SCENARIO(...)                                                   \
  static const bool LORADB_BENCH_CONCAT_(loradb_scenario_, __LINE__) [[maybe_unused]] = \
      ::loradb::bench::RegisterScenario(__VA_ARGS__)

#endif  // LORADB_BENCH_BENCH_UTIL_H_
