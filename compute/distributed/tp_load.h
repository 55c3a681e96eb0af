// Loading one TP rank's shard of an adapter revision from storage, with the model
// config's checks (TpLocalConfig) on top of storage/tiers/tp_shard_load.h. Two ways:
// - slice at load: the revision's blob is stored whole; the rank reads it and keeps its slice.
//   ReadAdapterShard does that either by reading the whole blob (every stored tensor's xxh3-64
//   verified, then sliced in memory) or by reading only the header and the byte ranges of its
//   slice (pread per contiguous run; replicated tensors whole). A partial read cannot check a
//   sharded tensor's checksum (it covers the whole tensor): only the header checksum and
//   replicated tensors are verified then.
// - derived blob: a pre-sliced blob per (source blob, TP degree, rank), written once under a
//   cache directory by LoadAdapterShardCached and read (verified) afterwards; its name carries
//   the source blob's content hash, so it never goes stale (blobs are immutable).
// docs/distributed.md section 2 compares them with `loradb-bench dist tp-load`.
#ifndef LORADB_COMPUTE_DISTRIBUTED_TP_LOAD_H_
#define LORADB_COMPUTE_DISTRIBUTED_TP_LOAD_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "compute/distributed/tp_shard.h"
#include "storage/formats/model_config.h"
#include "storage/formats/tensor.h"
#include "storage/tiers/tp_shard_load.h"
#include "storage/util/hash.h"

namespace loradb::distributed {

using tiers::DerivedShardPath;
using tiers::ShardReadMode;
using tiers::ShardReadStats;

// Reads `spec`'s slice of the adapter blob at `blob_path` (original, PEFT tensor names; MoE
// packed groups come back as per-expert views into the sliced packed tensor). Errors: the
// file's (NotFound, ...), InvalidArgument for a malformed blob or a split dimension not
// divisible by the degree, DataLoss on a checksum mismatch, and TpLocalConfig's.
[[nodiscard]] absl::StatusOr<TensorSet> ReadAdapterShard(const std::string& blob_path,
                                                         const ModelConfig& config,
                                                         const TpShardSpec& spec,
                                                         ShardReadMode mode,
                                                         ShardReadStats* stats = nullptr);

// The derived-blob path: reads the pre-sliced blob of (`source`, `spec`) from `cache_dir` when
// present (verified), else reads `blob_path` whole (verified), slices it, writes the derived blob
// crash-safely (metadata tp_degree, tp_rank, tp_source) and returns the slice. A derived blob
// whose metadata names another source/degree/rank is an error (DataLoss), never served.
[[nodiscard]] absl::StatusOr<TensorSet> LoadAdapterShardCached(
    const std::string& blob_path, const Hash128& source, const std::string& cache_dir,
    const ModelConfig& config, const TpShardSpec& spec, ShardReadStats* stats = nullptr);

}  // namespace loradb::distributed

#endif  // LORADB_COMPUTE_DISTRIBUTED_TP_LOAD_H_
