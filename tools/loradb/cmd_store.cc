// `loradb init` and `loradb verify`.
#include <cstdio>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "storage/maintenance/maintenance.h"
#include "tools/loradb/command.h"
#include "tools/loradb/store_cli.h"

namespace loradb::cli {
namespace {

void SetupInit(CLI::App* sub, Invocation* inv) {
  auto json = std::make_shared<bool>(false);
  AddJsonFlag(sub, json.get());
  sub->callback([inv, json] {
    inv->run = [inv, json]() -> absl::Status {
      auto store = Store::Open(inv->global.store);
      if (!store.ok()) return store.status();
      if (*json) {
        PrintJson({{"store", (*store)->dir()},
                   {"store_id", (*store)->catalog().store_id()},
                   {"schema_version", (*store)->catalog().schema_version()}});
      } else {
        std::printf("store %s (id %s)\n", (*store)->dir().c_str(),
                    (*store)->catalog().store_id().c_str());
      }
      return absl::OkStatus();
    };
  });
}

void SetupVerify(CLI::App* sub, Invocation* inv) {
  struct Args {
    bool json = false;
    std::string blob_root;
  };
  auto args = std::make_shared<Args>();
  AddJsonFlag(sub, &args->json);
  sub->add_option("--blob-root", args->blob_root, "blob directory (default STORE/blobs)");
  sub->callback([inv, args] {
    inv->run = [inv, args]() -> absl::Status {
      // Store::Verify plus the maintenance checks (alias logs, revisions_by_blob, pruned ids).
      StoreVerifyOptions o;
      o.blob_root = args->blob_root;
      auto rep = VerifyStore(inv->global.store, o);
      if (!rep.ok()) return rep.status();
      if (args->json) {
        PrintJson({{"ok", rep->ok()},
                   {"problems", rep->problems},
                   {"reclaimable", rep->reclaimable},
                   {"reclaimable_bytes", rep->reclaimable_bytes},
                   {"blobs", rep->blobs_checked},
                   {"blob_bytes", rep->bytes_checked},
                   {"schema_version", rep->schema_version},
                   {"policies", rep->policies},
                   {"revisions", rep->revisions},
                   {"live_revisions", rep->live_revisions},
                   {"aliases", rep->aliases},
                   {"alias_log_entries", rep->alias_log_entries},
                   {"checkpoints", rep->checkpoints},
                   {"pruned_references", rep->pruned_references}});
      } else {
        for (const auto& p : rep->problems) std::printf("problem: %s\n", p.c_str());
        for (const auto& r : rep->reclaimable) std::printf("reclaimable: %s\n", r.c_str());
        std::printf(
            "%s: %llu policies, %llu revisions (%llu live), %llu blobs checked, %zu "
            "reclaimable (%llu bytes)\n",
            rep->ok() ? "ok" : "FAILED", static_cast<unsigned long long>(rep->policies),
            static_cast<unsigned long long>(rep->revisions),
            static_cast<unsigned long long>(rep->live_revisions),
            static_cast<unsigned long long>(rep->blobs_checked), rep->reclaimable.size(),
            static_cast<unsigned long long>(rep->reclaimable_bytes));
      }
      if (!rep->ok()) {
        return absl::DataLossError(absl::StrCat("verify found ", rep->problems.size(),
                                                " problem(s); first: ", rep->problems.front()));
      }
      return absl::OkStatus();
    };
  });
}

LORADB_REGISTER_COMMAND("init", "create a store (the --store directory)", SetupInit);
LORADB_REGISTER_COMMAND(
    "verify", "check the catalog, blob checksums, refcounts and alias logs; list reclaimable blobs",
    SetupVerify);

}  // namespace
}  // namespace loradb::cli
