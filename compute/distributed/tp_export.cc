#include "compute/distributed/tp_export.h"

#include "compute/distributed/tp_shard.h"
#include "storage/util/status_macros.h"

namespace loradb::distributed {

absl::StatusOr<RevisionRecord> PublishGatheredAdapter(Store& store, const std::string& policy,
                                                      const std::vector<const TensorSet*>& shards,
                                                      const PublishOptions& options) {
  LORADB_ASSIGN_OR_RETURN(TensorSet whole, GatherAdapterShards(shards));
  return store.PublishTensors(policy, whole.tensors(), options);
}

}  // namespace loradb::distributed
