// Revision commands: import, export, ls, show, alias, rollback, rm.
#include <cstdio>
#include <memory>

#include "absl/strings/str_cat.h"
#include "tools/loradb/command.h"
#include "tools/loradb/store_cli.h"

namespace loradb::cli {
namespace {

struct ImportOpts {
  std::string policy, base, alias, dir;
  bool pack = false;
  bool json = false;
};

void SetupImport(CLI::App* sub, Invocation* inv) {
  auto o = std::make_shared<ImportOpts>();
  sub->add_option("--policy", o->policy, "policy to publish into")->required();
  sub->add_option("--base", o->base, "base of the policy (creates the policy when missing)");
  sub->add_option("--alias", o->alias, "move this alias to the new revision");
  sub->add_flag("--pack", o->pack, "store MoE expert tensors in the packed layout");
  sub->add_option("PEFT_DIR", o->dir, "adapter_config.json + adapter_model.safetensors")
      ->required();
  AddJsonFlag(sub, &o->json);
  OnStore(sub, inv, [o](Store& store) -> absl::Status {
    auto policy = store.GetPolicy(o->policy);
    PublishOptions opts;
    opts.alias = o->alias;
    opts.pack = o->pack;
    if (policy.ok()) {
      if (!o->base.empty() && policy->base != o->base) {
        return absl::InvalidArgumentError(absl::StrCat(
            "policy '", o->policy, "' is bound to base '", policy->base, "', not '", o->base, "'"));
      }
    } else if (absl::IsNotFound(policy.status())) {
      if (o->base.empty()) {
        return absl::NotFoundError(
            absl::StrCat("no policy named '", o->policy, "' (pass --base BASE to create it)"));
      }
      opts.create_policy_base = o->base;
    } else {
      return policy.status();
    }
    auto rev = store.PublishPeftDir(o->policy, o->dir, opts);
    if (!rev.ok()) return rev.status();
    if (o->json) {
      PrintJson(RevisionJson(*rev, o->policy));
    } else {
      std::printf("%s\n", RevisionLine(*rev, o->policy).c_str());
    }
    return absl::OkStatus();
  });
}

struct ExportOpts {
  std::string ref, out;
  std::string layout = "peft";
  bool json = false;
};

void SetupExport(CLI::App* sub, Invocation* inv) {
  auto o = std::make_shared<ExportOpts>();
  sub->add_option("REV", o->ref, "revision id, POLICY:ALIAS or POLICY@SEQ")->required();
  sub->add_option("OUT_DIR", o->out, "PEFT directory to write")->required();
  sub->add_option("--layout", o->layout,
                  "peft: the adapter's own layout, as imported or trained (default); per-expert: "
                  "LoRA on fused expert parameters (target_parameters) written as per-expert "
                  "target_modules (experts.{e}.gate_proj ...); also required for per-expert "
                  "LoRA trained on qwen3_moe experts (loadable by peft on transformers < 5 only)")
      ->check(CLI::IsMember({"peft", "per-expert"}));
  AddJsonFlag(sub, &o->json);
  OnStore(sub, inv, [o](Store& store) -> absl::Status {
    auto rev = store.Resolve(o->ref);
    if (!rev.ok()) return rev.status();
    absl::Status st =
        store.ExportPeftDir(*rev, o->out,
                            o->layout == "per-expert" ? Store::PeftExportLayout::kPerExpert
                                                      : Store::PeftExportLayout::kAsImported);
    if (!st.ok()) return st;
    PolicyNames names(store);
    if (o->json) {
      nlohmann::json j = RevisionJson(*rev, names.Name(rev->policy_id));
      j["out_dir"] = o->out;
      j["layout"] = o->layout;
      PrintJson(j);
    } else {
      std::printf("exported revision %llu to %s\n", static_cast<unsigned long long>(rev->id),
                  o->out.c_str());
    }
    return absl::OkStatus();
  });
}

struct LsOpts {
  std::string policy;
  size_t limit = 100;
  uint64_t after = 0;
  bool json = false;
};

void SetupLs(CLI::App* sub, Invocation* inv) {
  auto o = std::make_shared<LsOpts>();
  sub->add_option("--policy", o->policy, "list one policy's revisions in seq order");
  sub->add_option("--limit", o->limit, "at most N revisions (default 100; 0: all)");
  sub->add_option("--after", o->after,
                  "cursor: the `cursor` of the last item of the previous page");
  AddJsonFlag(sub, &o->json);
  OnStore(sub, inv, [o](Store& store) -> absl::Status {
    absl::StatusOr<Page<RevisionRecord>> page =
        o->policy.empty() ? store.ListAllRevisions(o->after, o->limit)
                          : store.ListRevisions(o->policy, o->after, o->limit);
    if (!page.ok()) return page.status();
    PolicyNames names(store);
    nlohmann::json out = nlohmann::json::array();
    for (const auto& r : page->items) {
      const std::string name = names.Name(r.policy_id);
      if (o->json) {
        nlohmann::json j = RevisionJson(r, name);
        j["cursor"] = o->policy.empty() ? r.id : r.seq;
        out.push_back(std::move(j));
      } else {
        std::printf("%s\n", RevisionLine(r, name).c_str());
      }
    }
    if (o->json) PrintJson(out);
    if (page->next_after) {
      std::fprintf(stderr, "more: --after %llu\n",
                   static_cast<unsigned long long>(*page->next_after));
    }
    return absl::OkStatus();
  });
}

struct RefOpts {
  std::string ref;
  bool json = false;
};

void SetupShow(CLI::App* sub, Invocation* inv) {
  auto o = std::make_shared<RefOpts>();
  sub->add_option("REV", o->ref, "revision id, POLICY:ALIAS or POLICY@SEQ")->required();
  AddJsonFlag(sub, &o->json);
  OnStore(sub, inv, [o](Store& store) -> absl::Status {
    auto rev = store.Resolve(o->ref);
    if (!rev.ok()) return rev.status();
    PolicyNames names(store);
    const std::string policy = names.Name(rev->policy_id);
    auto aliases = store.catalog().ListAliases(rev->policy_id);
    if (!aliases.ok()) return aliases.status();
    std::vector<std::string> mine;
    for (const auto& a : *aliases) {
      if (a.revision == rev->id) mine.push_back(a.alias);
    }
    nlohmann::json j = RevisionJson(*rev, policy);
    j["aliases"] = mine;
    j["blob_path"] = store.BlobPath(rev->blob.hash);
    if (o->json) {
      PrintJson(j);
    } else {
      std::printf("%s\n", j.dump(2).c_str());
    }
    return absl::OkStatus();
  });
}

struct AliasOpts {
  std::string policy, alias, ref;
  bool json = false;
};

void PrintAlias(bool json, const std::string& policy, const std::string& alias, uint64_t id) {
  if (json) {
    PrintJson(AliasJson(policy, alias, id));
  } else {
    std::printf("%s:%s -> %llu\n", policy.c_str(), alias.c_str(),
                static_cast<unsigned long long>(id));
  }
}

void SetupAlias(CLI::App* sub, Invocation* inv) {
  auto o = std::make_shared<AliasOpts>();
  sub->add_option("POLICY", o->policy, "policy")->required();
  sub->add_option("ALIAS", o->alias, "alias name (e.g. serving, canary)")->required();
  sub->add_option("REV", o->ref, "revision id, POLICY:ALIAS or POLICY@SEQ")->required();
  AddJsonFlag(sub, &o->json);
  OnStore(sub, inv, [o](Store& store) -> absl::Status {
    auto rev = store.Resolve(o->ref);
    if (!rev.ok()) return rev.status();
    absl::Status st = store.SetAlias(o->policy, o->alias, rev->id, "cli");
    if (!st.ok()) return st;
    PrintAlias(o->json, o->policy, o->alias, rev->id);
    return absl::OkStatus();
  });
}

void SetupRollback(CLI::App* sub, Invocation* inv) {
  auto o = std::make_shared<AliasOpts>();
  sub->add_option("POLICY", o->policy, "policy")->required();
  sub->add_option("ALIAS", o->alias, "alias to move back to its previous revision")->required();
  AddJsonFlag(sub, &o->json);
  OnStore(sub, inv, [o](Store& store) -> absl::Status {
    auto id = store.Rollback(o->policy, o->alias);
    if (!id.ok()) return id.status();
    PrintAlias(o->json, o->policy, o->alias, *id);
    return absl::OkStatus();
  });
}

void SetupRm(CLI::App* sub, Invocation* inv) {
  auto o = std::make_shared<RefOpts>();
  sub->add_option("REV", o->ref, "revision id, POLICY:ALIAS or POLICY@SEQ")->required();
  AddJsonFlag(sub, &o->json);
  OnStore(sub, inv, [o](Store& store) -> absl::Status {
    auto rev = store.Resolve(o->ref);
    if (!rev.ok()) return rev.status();
    absl::Status st = store.DeleteRevision(rev->id);
    if (!st.ok()) return st;
    if (o->json) {
      PrintJson({{"id", rev->id}, {"state", "deleted"}});
    } else {
      std::printf("deleted revision %llu\n", static_cast<unsigned long long>(rev->id));
    }
    return absl::OkStatus();
  });
}

LORADB_REGISTER_COMMAND("import", "publish a PEFT adapter directory as a new revision",
                        SetupImport);
LORADB_REGISTER_COMMAND("export", "write a revision as a PEFT adapter directory", SetupExport);
LORADB_REGISTER_COMMAND("ls", "list revisions (all, or one policy's) with cursor pagination",
                        SetupLs);
LORADB_REGISTER_COMMAND("show", "describe one revision", SetupShow);
LORADB_REGISTER_COMMAND("alias", "point POLICY:ALIAS at a revision (logged)", SetupAlias);
LORADB_REGISTER_COMMAND("rollback", "move an alias back to the revision before its last move",
                        SetupRollback);
LORADB_REGISTER_COMMAND("rm", "delete a revision (refused while an alias points at it)", SetupRm);

}  // namespace
}  // namespace loradb::cli
