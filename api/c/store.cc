// The C API's store handle: loradb_open, loradb_close and loradb_verify.
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "api/c/internal.h"
#include "storage/maintenance/maintenance.h"

using loradb::Store;
using loradb::capi::Fail;
using loradb::capi::Guarded;
using loradb::capi::Registry;
using loradb::capi::Report;
using loradb::capi::ReturnJson;

extern "C" {

loradb_status_t loradb_open(const char* dir, size_t dir_len, const loradb_options_t* options,
                            loradb_store_t** out, char** errmsg) {
  return Guarded(errmsg, [&]() -> loradb_status_t {
    if (out == nullptr) return Fail(LORADB_INVALID_ARGUMENT, "out is NULL", errmsg);
    *out = nullptr;
    LORADB_C_STRING(path, dir, dir_len, "dir");
    if (path.empty()) return Fail(LORADB_INVALID_ARGUMENT, "dir is empty", errmsg);
    if (path.find('\0') != std::string::npos) {
      return Fail(LORADB_INVALID_ARGUMENT, "dir contains a NUL byte", errmsg);
    }
    loradb::StoreOptions opts;
    if (options != nullptr) {
      if (!Registry().Contains(options)) {
        return Fail(LORADB_INVALID_HANDLE, "options handle was destroyed", errmsg);
      }
      opts = options->options;
    }
    bool tiers_enabled = true;
    loradb::tiers::StoreTiersOptions tier_opts = loradb_options_t().tiers;
    if (options != nullptr) {
      tiers_enabled = options->tiers_enabled;
      tier_opts = options->tiers;
    }
    // The Store owns the tiers (StoreOptions::tiers); its Locate reports the live tier and its
    // DeleteRevision drops unleased copies.
    if (tiers_enabled) opts.tiers = tier_opts;
    absl::StatusOr<std::unique_ptr<Store>> store = Store::Open(path, opts);
    if (!store.ok()) return Report(store.status(), errmsg);
    auto handle = std::make_unique<loradb_store_t>();
    handle->store = std::move(*store);
    handle->tiers = handle->store->tiers();
    Registry().Add(handle.get());
    *out = handle.release();
    return LORADB_OK;
  });
}

loradb_status_t loradb_close(loradb_store_t** store) {
  if (store == nullptr) return LORADB_INVALID_ARGUMENT;
  if (*store == nullptr) return LORADB_OK;
  if (!Registry().Contains(*store)) return LORADB_INVALID_HANDLE;
  // Leases point into the tiers: refuse (changing nothing) while any is alive.
  if ((*store)->leases.load() != 0) return LORADB_CONFLICT;
  if (!Registry().Remove(*store)) return LORADB_INVALID_HANDLE;
  delete *store;
  *store = nullptr;
  return LORADB_OK;
}

// ---- verification

loradb_status_t loradb_verify(loradb_store_t* store, int* ok, char** report_json,
                              size_t* report_json_len, char** errmsg) {
  return Guarded(errmsg, [&]() -> loradb_status_t {
    LORADB_C_CHECK_STORE(store);
    if (ok == nullptr) return Fail(LORADB_INVALID_ARGUMENT, "ok is NULL", errmsg);
    absl::StatusOr<loradb::StoreVerifyReport> rep = loradb::VerifyOpenStore(*store->store);
    if (!rep.ok()) return Report(rep.status(), errmsg);
    *ok = rep->ok() ? 1 : 0;
    if (report_json != nullptr) {
      nlohmann::json j = {{"ok", rep->ok()},
                          {"problems", rep->problems},
                          {"reclaimable", rep->reclaimable},
                          {"blobs_checked", rep->blobs_checked},
                          {"bytes_checked", rep->bytes_checked}};
      return ReturnJson(j, report_json, report_json_len);
    }
    return LORADB_OK;
  });
}

}  // extern "C"
