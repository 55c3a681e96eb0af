#include "compute/distributed/tp_load.h"

#include "storage/util/status_macros.h"

namespace loradb::distributed {

absl::StatusOr<TensorSet> ReadAdapterShard(const std::string& blob_path, const ModelConfig& config,
                                           const TpShardSpec& spec, ShardReadMode mode,
                                           ShardReadStats* stats) {
  if (stats != nullptr) *stats = ShardReadStats{};
  LORADB_RETURN_IF_ERROR(ValidateTpShard(spec));
  LORADB_RETURN_IF_ERROR(TpLocalConfig(config, spec.degree).status());
  return tiers::ReadAdapterShardFile(blob_path, spec, mode, stats);
}

absl::StatusOr<TensorSet> LoadAdapterShardCached(const std::string& blob_path,
                                                 const Hash128& source,
                                                 const std::string& cache_dir,
                                                 const ModelConfig& config, const TpShardSpec& spec,
                                                 ShardReadStats* stats) {
  if (stats != nullptr) *stats = ShardReadStats{};
  LORADB_RETURN_IF_ERROR(ValidateTpShard(spec));
  LORADB_RETURN_IF_ERROR(TpLocalConfig(config, spec.degree).status());
  LORADB_ASSIGN_OR_RETURN(TensorSet shard,
                          tiers::LoadDerivedShard(blob_path, source, cache_dir, spec, stats));
  for (const char* key : {tiers::kTpDegreeKey, tiers::kTpRankKey, tiers::kTpSourceKey}) {
    shard.metadata().erase(key);
  }
  return shard;
}

}  // namespace loradb::distributed
