// Tensor-parallel sharding for compute/distributed/: the rules live in storage
// (storage/tiers/tp_shard.h, one definition the device tier uses too); these are the names the TP
// model, decode and export code uses for them.
#ifndef LORADB_COMPUTE_DISTRIBUTED_TP_SHARD_H_
#define LORADB_COMPUTE_DISTRIBUTED_TP_SHARD_H_

#include "storage/tiers/tp_shard.h"

namespace loradb::distributed {

using tiers::AdapterTensorAxis;
using tiers::BaseTensorAxis;
using tiers::GatherAdapterShards;
using tiers::ShardAdapter;
using tiers::ShardBaseCheckpoint;
using tiers::SliceTensors;
using tiers::TpAxis;
using tiers::TpAxisName;
using tiers::TpLocalConfig;
using tiers::TpShardSpec;
using tiers::TpSplitDim;
using tiers::ValidateTpShard;

}  // namespace loradb::distributed

#endif  // LORADB_COMPUTE_DISTRIBUTED_TP_SHARD_H_
