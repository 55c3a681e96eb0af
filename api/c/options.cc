// The C API's store options (loradb_options_*): catalog, CPU cache, loader, device tier and
// tensor-parallel placement settings a later loradb_open uses. A refused call changes nothing.
#include <optional>
#include <string>

#include "absl/time/time.h"
#include "api/c/internal.h"
#include "storage/tiers/eviction.h"

using loradb::capi::Fail;
using loradb::capi::FromCEnum;
using loradb::capi::Guarded;
using loradb::capi::kDevices;
using loradb::capi::kLoaders;
using loradb::capi::Registry;
using loradb::capi::ToString;
using loradb::tiers::DeviceKind;
using loradb::tiers::LoaderBackend;

extern "C" {

loradb_status_t loradb_options_create(loradb_options_t** out) {
  char** errmsg = nullptr;
  return Guarded(errmsg, [&]() -> loradb_status_t {
    if (out == nullptr) return LORADB_INVALID_ARGUMENT;
    *out = new loradb_options_t();
    Registry().Add(*out);
    return LORADB_OK;
  });
}

loradb_status_t loradb_options_destroy(loradb_options_t** options) {
  if (options == nullptr) return LORADB_INVALID_ARGUMENT;
  if (*options == nullptr) return LORADB_OK;
  if (!Registry().Remove(*options)) return LORADB_INVALID_HANDLE;
  delete *options;
  *options = nullptr;
  return LORADB_OK;
}

loradb_status_t loradb_options_set_create_if_missing(loradb_options_t* options, int value) {
  if (options == nullptr) return LORADB_INVALID_ARGUMENT;
  if (!Registry().Contains(options)) return LORADB_INVALID_HANDLE;
  if (value != 0 && value != 1) return LORADB_INVALID_ARGUMENT;
  options->options.create_if_missing = value == 1;
  options->options.catalog.create_if_missing = value == 1;
  return LORADB_OK;
}

loradb_status_t loradb_options_set_blob_root(loradb_options_t* options, const char* path,
                                             size_t path_len) {
  char** errmsg = nullptr;
  return Guarded(errmsg, [&]() -> loradb_status_t {
    if (options == nullptr) return LORADB_INVALID_ARGUMENT;
    if (!Registry().Contains(options)) return LORADB_INVALID_HANDLE;
    std::string root;
    if (!ToString(path, path_len, &root)) return LORADB_INVALID_ARGUMENT;
    options->options.blob_root = root;
    return LORADB_OK;
  });
}

loradb_status_t loradb_options_set_no_sync(loradb_options_t* options, int value) {
  if (options == nullptr) return LORADB_INVALID_ARGUMENT;
  if (!Registry().Contains(options)) return LORADB_INVALID_HANDLE;
  if (value != 0 && value != 1) return LORADB_INVALID_ARGUMENT;
  options->options.catalog.no_sync = value == 1;
  return LORADB_OK;
}

loradb_status_t loradb_options_set_cpu_cache(loradb_options_t* options, uint64_t budget_bytes,
                                             const char* eviction, size_t eviction_len,
                                             uint64_t expected_entries) {
  char** errmsg = nullptr;
  return Guarded(errmsg, [&]() -> loradb_status_t {
    if (options == nullptr) return LORADB_INVALID_ARGUMENT;
    if (!Registry().Contains(options)) return LORADB_INVALID_HANDLE;
    std::string name;
    if (!ToString(eviction, eviction_len, &name)) return LORADB_INVALID_ARGUMENT;
    loradb::tiers::EvictionPolicyKind policy = options->tiers.cpu.policy;
    if (!name.empty()) {
      absl::StatusOr<loradb::tiers::EvictionPolicyKind> parsed =
          loradb::tiers::ParseEvictionPolicy(name);
      if (!parsed.ok()) return LORADB_INVALID_ARGUMENT;
      policy = *parsed;
    }
    // Validated first: a refused call changes nothing.
    options->tiers_enabled = budget_bytes > 0;
    if (budget_bytes > 0) options->tiers.cpu.budget_bytes = budget_bytes;
    options->tiers.cpu.policy = policy;
    if (expected_entries > 0) options->tiers.cpu.expected_entries = expected_entries;
    return LORADB_OK;
  });
}

loradb_status_t loradb_options_set_loader(loradb_options_t* options, loradb_loader_t loader,
                                          uint32_t max_inflight_loads, uint32_t max_queued_loads,
                                          uint32_t negative_ttl_ms) {
  if (options == nullptr) return LORADB_INVALID_ARGUMENT;
  if (!Registry().Contains(options)) return LORADB_INVALID_HANDLE;
  constexpr uint32_t kMax = 65536;
  if (max_inflight_loads == 0 || max_inflight_loads > kMax || max_queued_loads > kMax) {
    return LORADB_INVALID_ARGUMENT;
  }
  std::optional<LoaderBackend> backend = FromCEnum(loader, kLoaders);
  if (!backend.has_value()) return LORADB_INVALID_ARGUMENT;
  options->tiers.loader.backend = *backend;
  options->tiers.cpu.max_inflight_loads = max_inflight_loads;
  options->tiers.cpu.max_queued_loads = max_queued_loads;
  options->tiers.cpu.negative_ttl = absl::Milliseconds(negative_ttl_ms);
  return LORADB_OK;
}

loradb_status_t loradb_options_set_device(loradb_options_t* options, loradb_device_t device,
                                          uint64_t arena_bytes, uint64_t page_bytes) {
  if (options == nullptr) return LORADB_INVALID_ARGUMENT;
  if (!Registry().Contains(options)) return LORADB_INVALID_HANDLE;
  std::optional<DeviceKind> found = FromCEnum(device, kDevices);
  if (!found.has_value()) return LORADB_INVALID_ARGUMENT;
  const DeviceKind kind = *found;
  if (kind != loradb::tiers::DeviceKind::kNone) {
    if (arena_bytes == 0) return LORADB_INVALID_ARGUMENT;
    if (page_bytes != 0 &&
        (page_bytes < 256 || (page_bytes & (page_bytes - 1)) != 0 || page_bytes > arena_bytes)) {
      return LORADB_INVALID_ARGUMENT;
    }
    options->tiers.slots.arena_bytes = arena_bytes;
    if (page_bytes != 0) options->tiers.slots.page_bytes = page_bytes;
  }
  options->tiers.device = kind;
  return LORADB_OK;
}

loradb_status_t loradb_options_set_tp(loradb_options_t* options, const loradb_tp_options_t* tp,
                                      char** errmsg) {
  return Guarded(errmsg, [&]() -> loradb_status_t {
    if (options == nullptr) return Fail(LORADB_INVALID_ARGUMENT, "options is NULL", errmsg);
    if (!Registry().Contains(options)) {
      return Fail(LORADB_INVALID_HANDLE, "options handle was destroyed", errmsg);
    }
    if (tp == nullptr) {
      options->tiers.slots.tp = {};
      options->tiers.tp_derived_dir.clear();
      options->tiers.cuda_device = 0;
      return LORADB_OK;
    }
    LORADB_C_CHECK_STRUCT(tp, loradb_tp_options_t);
    constexpr uint32_t kMaxDegree = 4096;
    if (tp->degree == 0 || tp->degree > kMaxDegree) {
      return Fail(LORADB_INVALID_ARGUMENT,
                  absl::StrCat("tp->degree is ", tp->degree, ": use 1..", kMaxDegree), errmsg);
    }
    if (tp->rank >= tp->degree) {
      return Fail(LORADB_INVALID_ARGUMENT,
                  absl::StrCat("tp->rank ", tp->rank, " is not below tp->degree ", tp->degree),
                  errmsg);
    }
    if (tp->cuda_device < -1) {
      return Fail(LORADB_INVALID_ARGUMENT,
                  absl::StrCat("tp->cuda_device is ", tp->cuda_device, ": use -1 or a device"),
                  errmsg);
    }
    LORADB_C_STRING(dir, tp->derived_dir, tp->derived_dir_len, "tp->derived_dir");
    if (dir.find('\0') != std::string::npos) {
      return Fail(LORADB_INVALID_ARGUMENT, "tp->derived_dir contains a NUL byte", errmsg);
    }
    if (!dir.empty() && tp->degree == 1) {
      return Fail(LORADB_INVALID_ARGUMENT,
                  "tp->derived_dir needs tp->degree > 1 (a TP 1 rank holds whole revisions)",
                  errmsg);
    }
    // Validated first: a refused call changes nothing.
    options->tiers.slots.tp = {static_cast<int>(tp->rank), static_cast<int>(tp->degree)};
    options->tiers.tp_derived_dir = dir;
    if (tp->cuda_device >= 0) options->tiers.cuda_device = tp->cuda_device;
    return LORADB_OK;
  });
}

}  // extern "C"
