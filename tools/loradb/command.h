// Subcommand registry for the `loradb` command. Each cmd_*.cc registers its subcommands with
// LORADB_REGISTER_COMMAND; main.cc builds the CLI11 app from the registry and runs the one the
// user chose. A subcommand reports failure by returning a non-OK status: main prints
// "error: <message>" on stderr and exits 1.
#ifndef LORADB_TOOLS_LORADB_COMMAND_H_
#define LORADB_TOOLS_LORADB_COMMAND_H_

#include <CLI/CLI.hpp>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace loradb::cli {

// Options given before the subcommand.
struct GlobalOptions {
  // --store DIR; default $LORADB_STORE, else ./loradb-store.
  std::string store;
};

// What a subcommand's setup leaves behind: the function to run once parsing succeeded.
struct Invocation {
  GlobalOptions global;
  std::function<absl::Status()> run;
};

// Declares options on `sub` and arranges (via sub->callback) that `inv->run` is set when the
// subcommand is chosen. `inv` outlives parsing and running.
using SetupFn = std::function<void(CLI::App* sub, Invocation* inv)>;

struct CommandDef {
  std::string name;
  std::string help;
  SetupFn setup;
};

std::vector<CommandDef>& CommandRegistry();
bool RegisterCommand(CommandDef def);

// Adds the conventional `--json` flag to a subcommand.
inline CLI::Option* AddJsonFlag(CLI::App* sub, bool* json) {
  return sub->add_flag("--json", *json, "print one JSON document instead of text");
}

// Prints `j` as JSON on stdout followed by a newline.
void PrintJson(const nlohmann::json& j);

}  // namespace loradb::cli

#define LORADB_CLI_CONCAT_INNER_(a, b) a##b
#define LORADB_CLI_CONCAT_(a, b) LORADB_CLI_CONCAT_INNER_(a, b)
#define LORADB_REGISTER_COMMAND(name, help, setup)                                          \
  static const bool LORADB_CLI_CONCAT_(loradb_cmd_registered_, __LINE__) [[maybe_unused]] = \
      ::loradb::cli::RegisterCommand({name, help, setup})

#endif  // LORADB_TOOLS_LORADB_COMMAND_H_
