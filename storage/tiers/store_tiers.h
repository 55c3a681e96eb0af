// The residency tiers attached to a loradb::Store: a loader, a CPU cache whose load function is
// "revision id -> catalog record -> blob path + content hash -> loaded tensors", and (optionally)
// device slots over that cache. StoreTiers::Locate answers Store::Locate's four questions with
// the tier (and device slot) the bytes are in now.
//
// The Store itself does not own these yet (its files belong to the catalog work); this is the
// smallest hook that needs no change there. Blobs are read with formats/blob.h's ParseBlob
// (original tensor names as views); the per-revision LoRA settings are added to each entry's
// metadata ("lora.r", "lora.alpha", "lora.use_rslora") so consumers find the scale source.
#ifndef LORADB_STORAGE_TIERS_STORE_TIERS_H_
#define LORADB_STORAGE_TIERS_STORE_TIERS_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "storage/store/store.h"
#include "storage/tiers/cpu_cache.h"
#include "storage/tiers/device_slots.h"
#include "storage/tiers/loader.h"

namespace loradb::tiers {

enum class DeviceKind {
  kNone,  // no device tier
  kHost,  // host-memory backend (no GPU needed)
  kCuda,  // CUDA runtime backend; Open fails when no device is present
  kAuto,  // CUDA when a device is present, else host
};

struct StoreTiersOptions {
  LoaderOptions loader;
  CpuCacheOptions cpu;
  DeviceKind device = DeviceKind::kAuto;
  DeviceSlotsOptions slots;
};

// Where a revision's bytes are, best tier first.
struct TierPlace {
  Tier tier = Tier::kStorage;
  std::optional<uint32_t> slot;  // set when tier == kGpu
  int cpu_leases = 0;
  int device_leases = 0;
};

// Store::Locate's answers with the live tier.
struct TieredLocated {
  Located located;  // located.location.tier is the live tier
  std::optional<uint32_t> slot;
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

  TierPlace Where(uint64_t revision) const;
  [[nodiscard]] absl::StatusOr<TieredLocated> Locate(const std::string& policy,
                                                     const std::string& alias) const;

 private:
  StoreTiers() = default;
  absl::StatusOr<std::shared_ptr<const CachedAdapter>> LoadRevision(uint64_t id);

  Store* store_ = nullptr;
  std::unique_ptr<Loader> loader_;
  std::unique_ptr<CpuCache> cpu_;
  std::unique_ptr<DeviceSlots> device_;  // destroyed before cpu_ (declared after)
};

}  // namespace loradb::tiers

#endif  // LORADB_STORAGE_TIERS_STORE_TIERS_H_
