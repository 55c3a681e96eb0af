// Export from tensor-parallel adapter state: per-rank shards gather back into one
// whole adapter (GatherAdapterShards, storage/tiers/tp_shard.h) that is published as an ordinary
// revision, the reverse of slicing at load. Blobs are content-addressed, so a gathered revision
// has the very blob an unsharded (TP = 1) publish of the same factors has.
//
// Two forms: PublishGatheredAdapter takes every shard in one process; GatherAndPublishAdapter
// runs on every rank of a c10d process group (Gloo on CPU, NCCL on GPU) with the rank's own shard
// and moves the shards to rank 0 over the group before rank 0 publishes.
#ifndef LORADB_COMPUTE_DISTRIBUTED_TP_EXPORT_H_
#define LORADB_COMPUTE_DISTRIBUTED_TP_EXPORT_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "compute/distributed/process_group.h"
#include "storage/formats/tensor.h"
#include "storage/store/store.h"

namespace loradb::distributed {

// Gathers `shards` (rank order; see GatherAdapterShards) and publishes the whole adapter as a
// revision of `policy` with `options`. Errors: GatherAdapterShards' (nothing is published) and
// Store::PublishTensors'.
[[nodiscard]] absl::StatusOr<RevisionRecord> PublishGatheredAdapter(
    Store& store, const std::string& policy, const std::vector<const TensorSet*>& shards,
    const PublishOptions& options);

// What every rank learns from a cross-process export.
struct GatheredExport {
  uint64_t revision = 0;        // the published revision
  std::string blob_hash;        // its blob's content hash (hex)
  uint64_t shard_bytes = 0;     // bytes of this rank's shard
  uint64_t gathered_bytes = 0;  // bytes rank 0 received from all ranks (0 elsewhere)
};

struct GatherExportHooks {
  // Test hook: runs on every rank after the ranks agreed on the layout, just before the shards
  // travel (a test kills a rank here to model a rank dying mid-gather).
  std::function<void(int rank)> before_payload;
};

// Runs on every rank of `group` at once, each with its own shard `shard` (PEFT names; rank r of
// group.world_size() under tp_shard.h's rules). Steps: (1) rank 0 broadcasts its shard's layout
// (names, dtypes, shapes) and every rank compares its own with it, the verdicts are all-gathered;
// (2) every rank's shard travels to rank 0 as one flat byte bucket in one all-gather; (3) rank 0
// gathers them (GatherAdapterShards: split tensors concatenated in rank order, replicated ones
// checked equal) and publishes one revision of `policy` into `store` (used on rank 0 only; may be
// null elsewhere); (4) rank 0 broadcasts the outcome, which every rank returns.
// Errors (nothing is published): InvalidArgument naming the ranks whose layout differs from
// rank 0's, or from GatherAdapterShards (e.g. a replicated tensor that differs); a failed
// collective (a rank died or hung: Unavailable / DeadlineExceeded, from the group) on the ranks
// that see it; the publish error (every rank returns it).
[[nodiscard]] absl::StatusOr<GatheredExport> GatherAndPublishAdapter(
    dist::ProcessGroup& group, const TensorSet& shard, Store* store, const std::string& policy,
    const PublishOptions& options, const GatherExportHooks& hooks = {});

}  // namespace loradb::distributed

#endif  // LORADB_COMPUTE_DISTRIBUTED_TP_EXPORT_H_
