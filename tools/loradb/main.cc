// The `loradb` command: one binary, many subcommands (see command.h).
#include <cstdio>
#include <cstdlib>
#include <iostream>

#include "tools/loradb/command.h"

namespace loradb::cli {

std::vector<CommandDef>& CommandRegistry() {
  static auto* registry = new std::vector<CommandDef>();
  return *registry;
}

bool RegisterCommand(CommandDef def) {
  CommandRegistry().push_back(std::move(def));
  return true;
}

void PrintJson(const nlohmann::json& j) { std::cout << j.dump() << "\n"; }

}  // namespace loradb::cli

int main(int argc, char** argv) {
  using loradb::cli::Invocation;
  CLI::App app{"loradb: an embedded database of LoRA adapters with compute attached"};
  app.set_version_flag("--version", std::string("loradb ") + LORADB_VERSION);
  app.require_subcommand(1);
  Invocation inv;
  const char* env_store = std::getenv("LORADB_STORE");
  inv.global.store = env_store != nullptr && *env_store != '\0' ? env_store : "./loradb-store";
  app.add_option("--store", inv.global.store,
                 "store directory (default $LORADB_STORE, else ./loradb-store)");
  for (const auto& def : loradb::cli::CommandRegistry()) {
    CLI::App* sub = app.add_subcommand(def.name, def.help);
    def.setup(sub, &inv);
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  if (!inv.run) {
    std::fprintf(stderr, "error: no subcommand given (see --help)\n");
    return 1;
  }
  absl::Status status = inv.run();
  if (!status.ok()) {
    std::fprintf(stderr, "error: %s\n", std::string(status.message()).c_str());
    return 1;
  }
  return 0;
}
