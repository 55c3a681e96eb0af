// `loradb tp-export`: export from tensor-parallel adapter state across processes
// (compute/distributed/tp_export.h). Run without LORADB_RANK in the environment
// it is the launcher: it starts --tp K copies of itself that meet in a Gloo (or
// NCCL) group. Each rank holds its shard of --from-revision (read from the
// store with the TP slicing rules: the state a TP rank serves or trains), the
// shards travel to rank 0 over the group, and rank 0 publishes one revision of
// --policy (created on the source revision's base if missing). With --tp 1 the
// whole adapter is published directly: the TP = 1 export whose blob hash a TP
// export must reproduce.
#ifdef LORADB_COMPUTE_AVAILABLE

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "compute/distributed/launcher.h"
#include "compute/distributed/process_group.h"
#include "compute/distributed/tp_export.h"
#include "storage/tiers/tp_shard_load.h"
#include "storage/util/status_macros.h"
#include "tools/loradb/command.h"

namespace loradb::cli {
namespace {

struct TpExportArgs {
  int tp = 2;
  uint64_t from_revision = 0;
  std::string policy;
  std::string alias;
  std::string backend = "gloo";
  int timeout_ms = 60000;
  int die_rank = -1;
  bool json = false;
};

absl::Status Print(const TpExportArgs& a, const distributed::GatheredExport& r, int degree) {
  if (a.json) {
    PrintJson({{"tp", degree},
               {"revision", r.revision},
               {"blob_hash", r.blob_hash},
               {"shard_bytes_rank0", r.shard_bytes},
               {"gathered_bytes", r.gathered_bytes}});
  } else {
    std::printf("tp %d: published revision %llu (blob %s) from %d shard(s), %llu bytes gathered\n",
                degree, static_cast<unsigned long long>(r.revision), r.blob_hash.c_str(), degree,
                static_cast<unsigned long long>(r.gathered_bytes));
  }
  return absl::OkStatus();
}

absl::Status RunExport(const TpExportArgs& a, const std::string& store_dir) {
  StoreOptions so;
  so.create_if_missing = false;
  LORADB_ASSIGN_OR_RETURN(std::unique_ptr<Store> store, Store::Open(store_dir, so));
  LORADB_ASSIGN_OR_RETURN(RevisionRecord src, store->GetRevision(a.from_revision));
  PublishOptions po;
  po.alias = a.alias;
  po.create_policy_base = src.base;
  po.lora = src.lora;
  po.pack = src.layout == Layout::kPacked;
  const std::string blob = store->BlobPath(src.blob.hash);
  if (std::getenv("LORADB_RANK") == nullptr) {  // TP = 1: the whole adapter, published directly
    LORADB_ASSIGN_OR_RETURN(
        TensorSet whole,
        tiers::ReadAdapterShardFile(blob, {0, 1}, tiers::ShardReadMode::kWholeVerified));
    LORADB_ASSIGN_OR_RETURN(RevisionRecord rec,
                            distributed::PublishGatheredAdapter(*store, a.policy, {&whole}, po));
    distributed::GatheredExport r;
    r.revision = rec.id;
    r.blob_hash = rec.blob.hash.Hex();
    for (const TensorView& v : whole.tensors()) r.shard_bytes += v.nbytes;
    r.gathered_bytes = r.shard_bytes;
    return Print(a, r, 1);
  }
  LORADB_ASSIGN_OR_RETURN(dist::GroupOptions go, dist::GroupOptionsFromEnvironment());
  LORADB_ASSIGN_OR_RETURN(go.backend, dist::ParseBackend(a.backend));
  LORADB_ASSIGN_OR_RETURN(std::unique_ptr<dist::ProcessGroup> group,
                          dist::ProcessGroup::Create(go));
  const tiers::TpShardSpec spec{group->rank(), group->world_size()};
  // The rank's sharded state: its slice of the source revision (verified whole read).
  LORADB_ASSIGN_OR_RETURN(TensorSet shard, tiers::ReadAdapterShardFile(
                                               blob, spec, tiers::ShardReadMode::kWholeVerified));
  if (spec.rank != 0) store.reset();  // only rank 0 writes
  distributed::GatherExportHooks hooks;
  if (a.die_rank >= 0) {
    const int die = a.die_rank;
    hooks.before_payload = [die](int rank) {
      if (rank == die) raise(SIGKILL);
    };
  }
  absl::StatusOr<distributed::GatheredExport> r =
      distributed::GatherAndPublishAdapter(*group, shard, store.get(), a.policy, po, hooks);
  if (!r.ok()) return r.status();
  LORADB_RETURN_IF_ERROR(group->Barrier());
  return spec.rank == 0 ? Print(a, *r, spec.degree) : absl::OkStatus();
}

void SetupTpExport(CLI::App* sub, Invocation* inv) {
  auto a = std::make_shared<TpExportArgs>();
  sub->add_option("--tp", a->tp, "tensor-parallel degree = number of ranks (default 2)");
  sub->add_option("--from-revision", a->from_revision,
                  "the revision whose shards the ranks hold (the sharded state)")
      ->required();
  sub->add_option("--policy", a->policy, "publish the gathered adapter into this policy")
      ->required();
  sub->add_option("--alias", a->alias, "move this alias to the published revision");
  sub->add_option("--backend", a->backend, "gloo (CPU) | nccl (CUDA); default gloo");
  sub->add_option("--timeout-ms", a->timeout_ms, "collective timeout (default 60000)");
  sub->add_option("--die-rank", a->die_rank,
                  "test hook: this rank kills itself after the layout check, mid-gather");
  AddJsonFlag(sub, &a->json);
  sub->callback([inv, a] {
    inv->run = [inv, a]() -> absl::Status {
      if (a->tp < 1) return absl::InvalidArgumentError("--tp must be >= 1");
      if (std::getenv("LORADB_RANK") == nullptr && a->tp > 1) {
        LORADB_ASSIGN_OR_RETURN(std::vector<std::string> argv, dist::SelfCommandLine());
        dist::LaunchOptions lo;
        lo.argv = argv;
        lo.world_size = a->tp;
        lo.collective_timeout = std::chrono::milliseconds(a->timeout_ms);
        absl::StatusOr<std::vector<dist::RankExit>> exits = dist::LaunchRanks(lo);
        if (!exits.ok()) {
          return absl::Status(exits.status().code(),
                              absl::StrCat("tensor-parallel export aborted, nothing published: ",
                                           exits.status().message()));
        }
        return absl::OkStatus();
      }
      return RunExport(*a, inv->global.store);
    };
  });
}

LORADB_REGISTER_COMMAND("tp-export",
                        "gather an adapter's TP shards from K local ranks to rank 0 and publish "
                        "one revision",
                        SetupTpExport);

}  // namespace
}  // namespace loradb::cli

#endif  // LORADB_COMPUTE_AVAILABLE
