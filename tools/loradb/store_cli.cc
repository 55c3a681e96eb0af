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

nlohmann::json RevisionJson(const RevisionRecord& r, const std::string& policy_name) {
  nlohmann::json j;
  j["id"] = r.id;
  j["policy"] = policy_name;
  j["seq"] = r.seq;
  j["base"] = r.base;
  j["tensors"] = r.blob.tensors;
  j["bytes"] = r.blob.bytes;
  j["dtype"] = r.dtype;
  j["layout"] = std::string(LayoutName(r.layout));
  j["r"] = r.lora.r;
  j["alpha"] = r.lora.alpha;
  j["use_rslora"] = r.lora.use_rslora;
  j["state"] = std::string(RevisionStateName(r.state));
  j["parent"] = r.parent;
  j["created_us"] = r.created_us;
  j["blob"] = r.blob.hash.Hex();
  nlohmann::json src;
  if (r.source.kind == SourceKind::kTrained) {
    src["kind"] = "trained";
    src["checkpoint"] = r.source.checkpoint_id;
    src["step"] = r.source.step;
  } else {
    src["kind"] = "imported";
    src["origin"] = r.source.origin;
    src["content_hash"] = r.source.content_hash;
  }
  j["source"] = src;
  nlohmann::json evals = nlohmann::json::object();
  for (const auto& [k, v] : r.evals) evals[k] = v;
  j["evals"] = evals;
  return j;
}

std::string RevisionLine(const RevisionRecord& r, const std::string& policy_name) {
  return absl::StrFormat("%d\t%s@%d\t%s\t%d tensors\t%d bytes\t%s r=%d\t%s", r.id, policy_name,
                         r.seq, r.base, r.blob.tensors, r.blob.bytes, r.dtype, r.lora.r,
                         RevisionStateName(r.state));
}

nlohmann::json BaseJson(const BaseRecord& b, bool with_modules) {
  nlohmann::json j;
  j["name"] = b.name;
  j["family"] = b.arch.family;
  j["hidden_size"] = b.arch.hidden_size;
  j["layers"] = b.arch.num_layers;
  j["heads"] = b.arch.num_heads;
  j["kv_heads"] = b.arch.num_kv_heads;
  j["head_dim"] = b.arch.head_dim;
  j["intermediate_size"] = b.arch.intermediate_size;
  j["experts"] = b.arch.num_experts;
  j["vocab_size"] = b.arch.vocab_size;
  j["modules"] = b.modules.size();
  j["weights_fingerprint"] = b.weights_fingerprint;
  j["created_us"] = b.created_us;
  if (with_modules) {
    nlohmann::json m = nlohmann::json::array();
    for (const auto& s : b.modules) m.push_back({{"name", s.name}, {"in", s.in}, {"out", s.out}});
    j["module_table"] = m;
  }
  return j;
}

}  // namespace loradb::cli
