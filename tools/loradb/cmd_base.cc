// `loradb base add|ls` and `loradb policy create|ls`.
#include <cstdio>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "storage/util/file_util.h"
#include "tools/loradb/command.h"
#include "tools/loradb/store_cli.h"

namespace loradb::cli {
namespace {

struct BaseAddOpts {
  std::string name, config, weights, modules;
  bool json = false;
};

void SetupBase(CLI::App* sub, Invocation* inv) {
  sub->require_subcommand(1);
  auto add = sub->add_subcommand("add", "register a base from a config.json or a module table");
  auto o = std::make_shared<BaseAddOpts>();
  add->add_option("NAME", o->name, "base name")->required();
  add->add_option("--config", o->config, "Hugging Face config.json (Qwen3 family) or its dir");
  add->add_option("--weights", o->weights,
                  "safetensors file or model.safetensors.index.json to fingerprint");
  add->add_option("--modules", o->modules,
                  "JSON module table {\"modules\":[{\"name\",\"in\",\"out\"}]} (other families)");
  AddJsonFlag(add, &o->json);
  add->callback([inv, o] {
    inv->run = [inv, o]() -> absl::Status {
      if (o->config.empty() == o->modules.empty()) {
        return absl::InvalidArgumentError("base add needs exactly one of --config or --modules");
      }
      if (!o->modules.empty() && !o->weights.empty()) {
        return absl::InvalidArgumentError("--weights goes with --config");
      }
      auto store = OpenExistingStore(inv->global.store);
      if (!store.ok()) return store.status();
      absl::StatusOr<BaseRecord> b;
      if (!o->config.empty()) {
        b = (*store)->AddBaseFromConfig(o->name, o->config, o->weights);
      } else {
        auto text = ReadFileToString(o->modules);
        if (!text.ok()) return text.status();
        b = (*store)->AddBaseFromModuleTable(o->name, *text);
      }
      if (!b.ok()) return b.status();
      if (o->json) {
        PrintJson(BaseJson(*b, false));
      } else {
        std::printf("base %s: %s, %zu modules\n", b->name.c_str(), b->arch.family.c_str(),
                    b->modules.size());
      }
      return absl::OkStatus();
    };
  });
  auto ls = sub->add_subcommand("ls", "list bases");
  auto json = std::make_shared<bool>(false);
  AddJsonFlag(ls, json.get());
  OnStore(ls, inv, [json](Store& store) -> absl::Status {
    auto bases = store.ListBases();
    if (!bases.ok()) return bases.status();
    nlohmann::json out = nlohmann::json::array();
    for (const auto& b : *bases) {
      if (*json) {
        out.push_back(BaseJson(b, false));
      } else {
        std::printf("%s\t%s\t%zu modules\t%s\n", b.name.c_str(), b.arch.family.c_str(),
                    b.modules.size(), b.weights_fingerprint.c_str());
      }
    }
    if (*json) PrintJson(out);
    return absl::OkStatus();
  });
}

struct PolicyCreateOpts {
  std::string name, base;
  std::vector<std::string> labels;
  bool json = false;
};

void SetupPolicy(CLI::App* sub, Invocation* inv) {
  sub->require_subcommand(1);
  auto create = sub->add_subcommand("create", "create a policy bound to a base");
  auto o = std::make_shared<PolicyCreateOpts>();
  create->add_option("NAME", o->name, "policy name (letters, digits, _ . - /)")->required();
  create->add_option("--base", o->base, "base name")->required();
  create->add_option("--label", o->labels, "KEY=VALUE label (repeatable)");
  AddJsonFlag(create, &o->json);
  create->callback([inv, o] {
    inv->run = [inv, o]() -> absl::Status {
      std::map<std::string, std::string> labels;
      for (const auto& l : o->labels) {
        const size_t eq = l.find('=');
        if (eq == std::string::npos || eq == 0) {
          return absl::InvalidArgumentError(absl::StrCat("label '", l, "' is not KEY=VALUE"));
        }
        labels[l.substr(0, eq)] = l.substr(eq + 1);
      }
      auto store = OpenExistingStore(inv->global.store);
      if (!store.ok()) return store.status();
      auto p = (*store)->CreatePolicy(o->name, o->base, labels);
      if (!p.ok()) return p.status();
      if (o->json) {
        PrintJson(PolicyJson(*p));
      } else {
        std::printf("policy %s (id %llu) on base %s\n", p->name.c_str(),
                    static_cast<unsigned long long>(p->id), p->base.c_str());
      }
      return absl::OkStatus();
    };
  });
  auto ls = sub->add_subcommand("ls", "list policies");
  auto json = std::make_shared<bool>(false);
  AddJsonFlag(ls, json.get());
  OnStore(ls, inv, [json](Store& store) -> absl::Status {
    auto ps = store.ListPolicies();
    if (!ps.ok()) return ps.status();
    nlohmann::json out = nlohmann::json::array();
    for (const auto& p : *ps) {
      if (*json) {
        out.push_back(PolicyJson(p));
      } else {
        std::printf("%llu\t%s\t%s\t%llu revisions%s\n", static_cast<unsigned long long>(p.id),
                    p.name.c_str(), p.base.c_str(), static_cast<unsigned long long>(p.next_seq - 1),
                    p.archived ? "\tarchived" : "");
      }
    }
    if (*json) PrintJson(out);
    return absl::OkStatus();
  });
}

LORADB_REGISTER_COMMAND("base", "register and list bases (add, ls)", SetupBase);
LORADB_REGISTER_COMMAND("policy", "create and list policies (create, ls)", SetupPolicy);

}  // namespace
}  // namespace loradb::cli
