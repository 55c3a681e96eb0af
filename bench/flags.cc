// ParseFlags (bench_util.h): a scenario's arguments through CLI11, the parser of the `loradb`
// command, so every scenario takes flags the same way.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <string>
#include <vector>

#include "bench/bench_util.h"

namespace loradb::bench {

absl::Status ParseFlags(CLI::App* app, const std::vector<std::string>& args) {
  // CLI11 reads a vector of arguments from its back.
  std::vector<std::string> reversed(args.rbegin(), args.rend());
  try {
    app->parse(reversed);
  } catch (const CLI::CallForHelp&) {
    std::fputs(app->help().c_str(), stdout);
    return absl::CancelledError("help printed");
  } catch (const CLI::ParseError& e) {
    return absl::InvalidArgumentError(e.what());
  }
  return absl::OkStatus();
}

}  // namespace loradb::bench
