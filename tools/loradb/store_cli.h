// Helpers shared by the store subcommands (init, base, policy, import, export, ls, show, alias,
// rollback, rm, verify): opening the store named by --store and describing records. Their JSON
// is storage/store/record_json.h's, the same as the HTTP endpoint's and the C API's.
#ifndef LORADB_TOOLS_LORADB_STORE_CLI_H_
#define LORADB_TOOLS_LORADB_STORE_CLI_H_

#include <map>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "storage/store/record_json.h"
#include "storage/store/store.h"
#include "tools/loradb/command.h"

namespace loradb::cli {

// Opens an existing store (NotFound with a hint to run `loradb init` when there is none).
[[nodiscard]] absl::StatusOr<std::unique_ptr<Store>> OpenExistingStore(const std::string& dir);

// Arranges that choosing `sub` on the command line runs `fn` on the store named by --store
// (opened with OpenExistingStore, closed when `fn` returns).
void OnStore(CLI::App* sub, Invocation* inv, std::function<absl::Status(Store&)> fn);

// Maps policy ids to names, asking the catalog once per id.
class PolicyNames {
 public:
  explicit PolicyNames(const Store& store) : store_(store) {}
  std::string Name(uint64_t policy_id);

 private:
  const Store& store_;
  std::map<uint64_t, std::string> names_;
};

// One text line for a revision.
std::string RevisionLine(const RevisionRecord& r, const std::string& policy_name);

}  // namespace loradb::cli

#endif  // LORADB_TOOLS_LORADB_STORE_CLI_H_
