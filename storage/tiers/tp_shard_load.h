// Reading one TP rank's shard of an adapter blob from a file (the slicing rules are
// tp_shard.h's). Two ways:
// - slice at load: the revision's blob is stored whole; the rank reads it and keeps its slice.
//   ReadAdapterShardFile does that either by reading the whole blob (every stored tensor's
//   xxh3-64 verified, then sliced in memory) or by reading only the header and the byte ranges of
//   its slice (pread per contiguous run; replicated tensors whole). A partial read cannot check a
//   sharded tensor's checksum (it covers the whole tensor): only the header checksum and
//   replicated tensors are verified then.
// - derived blob: a pre-sliced blob per (source blob, TP degree, rank), written once under a
//   cache directory by LoadDerivedShard and read (verified) afterwards; its name carries the
//   source blob's content hash, so it never goes stale (blobs are immutable). Lifecycle: a
//   derived blob lives while its source blob is referenced; RemoveDerivedShards drops those of
//   one source (Store::DeleteRevision, when the blob's refcount reaches 0) and
//   CollectDerivedShards sweeps a whole directory against the catalog (StoreTiers::Open), also
//   removing the temp files of writers that died mid-write. A derived blob is a cache: removing
//   one that is still needed only costs a rebuild.
// The device tier uses the derived blob when StoreTiersOptions::tp_derived_dir is set;
// compute/distributed/tp_load.h adds the model-config checks; docs/distributed.md section 2
// compares the ways with `loradb-bench dist tp-load`.
#ifndef LORADB_STORAGE_TIERS_TP_SHARD_LOAD_H_
#define LORADB_STORAGE_TIERS_TP_SHARD_LOAD_H_

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "storage/formats/tensor.h"
#include "storage/tiers/tp_shard.h"
#include "storage/util/hash.h"

namespace loradb::tiers {

enum class ShardReadMode : uint8_t {
  kWholeVerified = 0,  // read the whole blob, verify every tensor, slice in memory
  kPartial,            // read the header and the slice's byte ranges only
};

// What one shard load cost.
struct ShardReadStats {
  uint64_t bytes_read = 0;  // bytes of files read (a verified mapped file counts whole)
  uint64_t reads = 0;       // pread calls (or files mapped)
  bool verified = false;    // every returned byte checked against a stored checksum
  bool from_derived = false;
};

// Reads `spec`'s slice of the adapter blob at `blob_path` (original, PEFT tensor names; MoE
// packed groups come back as per-expert views into the sliced packed tensor). Errors: the
// file's (NotFound, ...), InvalidArgument for a bad spec, a malformed blob or a split dimension
// not divisible by the degree, DataLoss on a checksum mismatch.
[[nodiscard]] absl::StatusOr<TensorSet> ReadAdapterShardFile(const std::string& blob_path,
                                                             const TpShardSpec& spec,
                                                             ShardReadMode mode,
                                                             ShardReadStats* stats = nullptr);

// `cache_dir`/tp<degree>/<source hex>.r<rank>.blob.
std::string DerivedShardPath(const std::string& cache_dir, const Hash128& source,
                             const TpShardSpec& spec);

// The derived-blob path: reads the pre-sliced blob of (`source`, `spec`) from `cache_dir` when
// present (verified), else reads `blob_path` whole (verified), slices it, writes the derived blob
// crash-safely (temp name + fsync + rename: a crash leaves at most a temp file, never a partial
// derived blob) and returns the slice. The returned set's metadata holds kTpDegreeKey, kTpRankKey
// and kTpSourceKey (so a consumer can tell a shard from a whole adapter). A derived blob that
// fails verification (header checksum, any tensor's xxh3-64, file size: DataLoss or
// InvalidArgument) or whose metadata names another source/degree/rank (DataLoss) is an error,
// never served; the message says deleting the file rebuilds it.
[[nodiscard]] absl::StatusOr<TensorSet> LoadDerivedShard(const std::string& blob_path,
                                                         const Hash128& source,
                                                         const std::string& cache_dir,
                                                         const TpShardSpec& spec,
                                                         ShardReadStats* stats = nullptr);

// Removes every derived blob of `source` (all degrees and ranks) under `cache_dir`; returns how
// many files went. A missing directory is nothing to remove (0). Errors: a failed unlink or
// directory read (the files before it are gone).
[[nodiscard]] absl::StatusOr<uint64_t> RemoveDerivedShards(const std::string& cache_dir,
                                                           const Hash128& source);

// Whether the source blob `hash` is still referenced (Store: a blob record with refcount > 0).
using SourceReferencedFn = std::function<absl::StatusOr<bool>(const Hash128& hash)>;

// What CollectDerivedShards did.
struct DerivedShardSweep {
  uint64_t kept = 0;           // derived blobs whose source is referenced
  uint64_t removed = 0;        // derived blobs of unreferenced sources
  uint64_t removed_bytes = 0;  // their sizes
  uint64_t temps_removed = 0;  // temp files of writers no longer running (a crash mid-write)
  uint64_t temps_kept = 0;     // temp files of running writers
  uint64_t ignored = 0;        // other files under cache_dir/tp*/ (left alone)
};

// Sweeps `cache_dir` (its tp<degree>/ subdirectories): removes each derived blob whose source
// `referenced` answers false for, and each temp file ("<name>.tmp.<pid>.<n>", WriteFileAtomic's)
// whose writer process is gone; keeps everything else. A missing directory is an empty sweep.
// Errors: `referenced`'s (the sweep stops there), a failed unlink or directory read. Writers in
// other PID namespaces sharing the directory look dead: sweep only where the writers run.
[[nodiscard]] absl::StatusOr<DerivedShardSweep> CollectDerivedShards(
    const std::string& cache_dir, const SourceReferencedFn& referenced);

}  // namespace loradb::tiers

#endif  // LORADB_STORAGE_TIERS_TP_SHARD_LOAD_H_
