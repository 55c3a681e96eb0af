// Export from tensor-parallel adapter state (issue 11): per-rank shards gather back into one
// whole adapter (GatherAdapterShards) that is published as an ordinary revision, the reverse of
// slicing at load. Blobs are content-addressed, so a gathered revision has the very blob an
// unsharded publish of the same factors has.
#ifndef LORADB_COMPUTE_DISTRIBUTED_TP_EXPORT_H_
#define LORADB_COMPUTE_DISTRIBUTED_TP_EXPORT_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "storage/formats/tensor.h"
#include "storage/store/store.h"

namespace loradb::distributed {

// Gathers `shards` (rank order; see GatherAdapterShards) and publishes the whole adapter as a
// revision of `policy` with `options`. Errors: GatherAdapterShards' (nothing is published) and
// Store::PublishTensors'.
[[nodiscard]] absl::StatusOr<RevisionRecord> PublishGatheredAdapter(
    Store& store, const std::string& policy, const std::vector<const TensorSet*>& shards,
    const PublishOptions& options);

}  // namespace loradb::distributed

#endif  // LORADB_COMPUTE_DISTRIBUTED_TP_EXPORT_H_
