// The options of the residency tiers a Store owns (StoreOptions::tiers): the loader, the CPU
// cache and the device slots, plus which device backend runs the slots. Kept apart from
// store_tiers.h so storage/store/store.h can hold them without including the tiers' classes.
#ifndef LORADB_STORAGE_TIERS_TIER_OPTIONS_H_
#define LORADB_STORAGE_TIERS_TIER_OPTIONS_H_

#include <string>

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
  int cuda_device = 0;  // the CUDA device of the arena (kCuda / kAuto), e.g. a TP rank's GPU
  DeviceSlotsOptions slots;
  // With a TP placement (slots.tp.degree > 1) and this set: the CPU tier holds the rank's
  // pre-sliced derived blob of each revision (tp_shard_load.h: built under this directory from the
  // whole blob on first use, read verified afterwards) instead of the whole revision, so a cold
  // load reads only the rank's bytes. Empty: the CPU tier holds whole revisions and the device
  // slots slice them. docs/distributed.md section 2 has the measurement behind the choice.
  std::string tp_derived_dir;
};

}  // namespace loradb::tiers

#endif  // LORADB_STORAGE_TIERS_TIER_OPTIONS_H_
