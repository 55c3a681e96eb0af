// loradb-bench dist [CASE] [--flags]: distributed cases, one per file: bench/dist_bench.cc
// holds the scenario and the `dp` case; other files add
// cases with LORADB_REGISTER_DIST_CASE (e.g. `tp`). `loradb-bench dist` runs every case.
#ifndef LORADB_BENCH_DIST_BENCH_H_
#define LORADB_BENCH_DIST_BENCH_H_

#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace loradb::bench {

struct DistCaseDef {
  std::string name;
  std::string help;
  // Gets the flags after the case name.
  std::function<absl::Status(const std::vector<std::string>& flags)> run;
};

std::vector<DistCaseDef>& DistCaseRegistry();
bool RegisterDistCase(DistCaseDef def);

// Helpers shared by the dist cases.
std::string Env(const char* name);  // "" when unset
double LoadAverage1m();             // /proc/loadavg's first field (0 if unreadable)

}  // namespace loradb::bench

#define LORADB_DIST_CONCAT_INNER_(a, b) a##b
#define LORADB_DIST_CONCAT_(a, b) LORADB_DIST_CONCAT_INNER_(a, b)
#define LORADB_REGISTER_DIST_CASE(...)                                                  \
  static const bool LORADB_DIST_CONCAT_(loradb_dist_case_, __LINE__) [[maybe_unused]] = \
      ::loradb::bench::RegisterDistCase(__VA_ARGS__)

#endif  // LORADB_BENCH_DIST_BENCH_H_
