// The options of the residency tiers a Store owns (StoreOptions::tiers): the loader, the CPU
// cache and the device slots, plus which device backend runs the slots. Kept apart from
// store_tiers.h so storage/store/store.h can hold them without including the tiers' classes.
#ifndef LORADB_STORAGE_TIERS_TIER_OPTIONS_H_
#define LORADB_STORAGE_TIERS_TIER_OPTIONS_H_

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

}  // namespace loradb::tiers

#endif  // LORADB_STORAGE_TIERS_TIER_OPTIONS_H_
