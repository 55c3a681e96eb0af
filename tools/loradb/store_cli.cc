#include "tools/loradb/store_cli.h"

#include <sys/stat.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace loradb::cli {

absl::StatusOr<std::unique_ptr<Store>> OpenExistingStore(const std::string& dir) {
  struct stat st;
  if (::stat((dir + "/catalog/data.mdb").c_str(), &st) != 0) {
    return absl::NotFoundError(
        absl::StrCat("no store at '", dir, "' (create one with `loradb --store ", dir, " init`)"));
  }
  StoreOptions o;
  o.create_if_missing = false;
  return Store::Open(dir, o);
}

void OnStore(CLI::App* sub, Invocation* inv, std::function<absl::Status(Store&)> fn) {
  sub->callback([inv, fn = std::move(fn)] {
    inv->run = [inv, fn]() -> absl::Status {
      auto store = OpenExistingStore(inv->global.store);
      if (!store.ok()) return store.status();
      return fn(**store);
    };
  });
}

std::string PolicyNames::Name(uint64_t policy_id) {
  auto it = names_.find(policy_id);
  if (it != names_.end()) return it->second;
  auto p = store_.catalog().GetPolicyById(policy_id);
  std::string name = p.ok() ? p->name : absl::StrCat("#", policy_id);
  names_[policy_id] = name;
  return name;
}

std::string RevisionLine(const RevisionRecord& r, const std::string& policy_name) {
  return absl::StrFormat("%d\t%s@%d\t%s\t%d tensors\t%d bytes\t%s r=%d\t%s", r.id, policy_name,
                         r.seq, r.base, r.blob.tensors, r.blob.bytes, r.dtype, r.lora.r,
                         RevisionStateName(r.state));
}

}  // namespace loradb::cli
