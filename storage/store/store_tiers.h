// The residency tiers attached to a loradb::Store: a loader, a CPU cache whose load function is
// "revision id -> catalog record -> blob path + content hash -> loaded tensors", and (optionally)
// device slots over that cache. StoreTiers::Locate answers Store::Locate's four questions with
// the tier (and device slot) the bytes are in now.
//
// A Store opened with StoreOptions::tiers owns one (Store::tiers()) and its Locate reports the
// live tier; StoreTiers::Open over a Store opened without tiers still works (the caller owns
// it, and only StoreTiers::Locate sees its residency). Blobs are read with formats/blob.h's
// ParseBlob (original tensor names as views); the per-revision LoRA settings are added to each
// entry's metadata ("lora.r", "lora.alpha", "lora.use_rslora") so consumers find the scale source.
//
// This glue lives in storage/store, not storage/tiers: it reads the Store's records and blob
// paths, so storage/store includes storage/tiers and never the other way round.
#ifndef LORADB_STORAGE_STORE_STORE_TIERS_H_
#define LORADB_STORAGE_STORE_STORE_TIERS_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "storage/store/store.h"
#include "storage/tiers/cpu_cache.h"
#include "storage/tiers/device_slots.h"
#include "storage/tiers/loader.h"
#include "storage/tiers/tier_options.h"
#include "storage/tiers/tp_shard_load.h"

namespace loradb::tiers {

// Where a revision's bytes are, best tier first.
struct TierPlace {
  Tier tier = Tier::kStorage;
  std::optional<uint32_t> slot;  // set when tier == kGpu
  int cpu_leases = 0;
  int device_leases = 0;
  uint64_t device_bytes = 0;  // bytes in the device slot (the rank's shard under a TP placement)
  TpShardSpec tp;             // the device tier's TP placement ({0, 1} without one)
};

// Store::Locate's answers with the live tier (the same as Store::Locate when the Store owns
// these tiers).
struct TieredLocated {
  Located located;  // located.location.tier is the live tier
  std::optional<uint32_t> slot;
  uint64_t device_bytes = 0;  // as TierPlace
  TpShardSpec tp;
};

class StoreTiers {
 public:
  // `store` (not owned) must outlive the tiers. Errors: bad options (InvalidArgument), the CUDA
  // backend asked for without a device (Unavailable), the arena allocation.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<StoreTiers>> Open(
      Store* store, StoreTiersOptions options = {});

  Loader& loader() { return *loader_; }
  CpuCache& cpu() { return *cpu_; }
  // nullptr when opened with DeviceKind::kNone.
  DeviceSlots* device() { return device_.get(); }

  // A lease on revision `id` in the CPU tier (see CpuCache::Acquire).
  [[nodiscard]] absl::StatusOr<CpuLease> AcquireCpu(uint64_t id,
                                                    LoadPriority priority = LoadPriority::kDecode);

  // The TP placement (DeviceSlotsOptions::tp; {0, 1} without one) and whether the CPU tier
  // holds derived per-rank blobs (tp_derived_dir set with degree > 1).
  TpShardSpec tp() const { return tp_; }
  bool tp_derived() const { return !tp_derived_dir_.empty() && tp_.degree > 1; }

  TierPlace Where(uint64_t revision) const;
  // Evicts `revision` from the device and CPU tiers where it is resident and unleased; a leased
  // or loading copy stays. Returns whether any tier dropped it.
  bool Drop(uint64_t revision);
  [[nodiscard]] absl::StatusOr<TieredLocated> Locate(const std::string& policy,
                                                     const std::string& alias) const;

  // Derived TP blobs (StoreTiersOptions::tp_derived_dir; tp_shard_load.h) live while their source
  // blob is referenced. Sweeps the directory against the catalog: removes the derived blobs of
  // sources no record references (deleted revisions, compacted blobs) and the temp files of
  // writers that died mid-write. Open runs it once; an empty sweep without tp_derived_dir.
  [[nodiscard]] absl::StatusOr<DerivedShardSweep> CollectDerivedShards() const;
  // Removes the derived blobs of `source` (every degree and rank) when no record references it
  // any more (refcount 0 or no blob record); returns how many files went (0 when still
  // referenced or without tp_derived_dir). Store::DeleteRevision calls it.
  [[nodiscard]] absl::StatusOr<uint64_t> ForgetDerivedShards(const Hash128& source) const;

 private:
  StoreTiers() = default;
  absl::StatusOr<std::shared_ptr<const CachedAdapter>> LoadRevision(uint64_t id);
  // Whether a record references the blob `hash` (refcount > 0).
  absl::StatusOr<bool> SourceReferenced(const Hash128& hash) const;

  Store* store_ = nullptr;
  TpShardSpec tp_;              // the device slots' placement
  std::string tp_derived_dir_;  // StoreTiersOptions::tp_derived_dir
  std::unique_ptr<Loader> loader_;
  std::unique_ptr<CpuCache> cpu_;
  std::unique_ptr<DeviceSlots> device_;  // destroyed before cpu_ (declared after)
};

}  // namespace loradb::tiers

#endif  // LORADB_STORAGE_STORE_STORE_TIERS_H_
