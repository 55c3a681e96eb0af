// The C API's catalog calls: bases, policies, aliases and Locate. JSON answers use the one
// renderer per record (storage/store/record_json.h), so they match HTTP and `loradb --json`.
#include <algorithm>
#include <cstdlib>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "api/c/internal.h"
#include "storage/store/record_json.h"
#include "storage/util/json.h"

using loradb::capi::CopyOut;
using loradb::capi::CopyString;
using loradb::capi::Fail;
using loradb::capi::Guarded;
using loradb::capi::kTiers;
using loradb::capi::Report;
using loradb::capi::ReturnJson;
using loradb::capi::ToCEnum;

extern "C" {

// ---- bases

loradb_status_t loradb_base_add_modules(loradb_store_t* store, const char* name, size_t name_len,
                                        const char* modules_json, size_t modules_json_len,
                                        char** errmsg) {
  return Guarded(errmsg, [&]() -> loradb_status_t {
    LORADB_C_CHECK_STORE(store);
    LORADB_C_STRING(n, name, name_len, "name");
    LORADB_C_STRING(j, modules_json, modules_json_len, "modules_json");
    return Report(store->store->AddBaseFromModuleTable(n, j).status(), errmsg);
  });
}

loradb_status_t loradb_base_add_config(loradb_store_t* store, const char* name, size_t name_len,
                                       const char* config_path, size_t config_path_len,
                                       const char* weights, size_t weights_len, char** errmsg) {
  return Guarded(errmsg, [&]() -> loradb_status_t {
    LORADB_C_CHECK_STORE(store);
    LORADB_C_STRING(n, name, name_len, "name");
    LORADB_C_STRING(c, config_path, config_path_len, "config_path");
    LORADB_C_STRING(w, weights, weights_len, "weights");
    return Report(store->store->AddBaseFromConfig(n, c, w).status(), errmsg);
  });
}

loradb_status_t loradb_base_list(loradb_store_t* store, char** json, size_t* json_len,
                                 char** errmsg) {
  return Guarded(errmsg, [&]() -> loradb_status_t {
    LORADB_C_CHECK_STORE(store);
    if (json == nullptr) return Fail(LORADB_INVALID_ARGUMENT, "json is NULL", errmsg);
    absl::StatusOr<std::vector<loradb::BaseRecord>> bases = store->store->ListBases();
    if (!bases.ok()) return Report(bases.status(), errmsg);
    nlohmann::json arr = nlohmann::json::array();
    for (const auto& b : *bases) arr.push_back(loradb::BaseJson(b, /*with_modules=*/false));
    return ReturnJson(arr, json, json_len);
  });
}

// ---- policies

loradb_status_t loradb_policy_create(loradb_store_t* store, const char* name, size_t name_len,
                                     const char* base, size_t base_len, const char* labels_json,
                                     size_t labels_json_len, uint64_t* policy_id, char** errmsg) {
  return Guarded(errmsg, [&]() -> loradb_status_t {
    LORADB_C_CHECK_STORE(store);
    LORADB_C_STRING(n, name, name_len, "name");
    LORADB_C_STRING(b, base, base_len, "base");
    LORADB_C_STRING(l, labels_json, labels_json_len, "labels_json");
    std::map<std::string, std::string> labels;
    if (!l.empty()) {
      absl::StatusOr<nlohmann::json> parsed = loradb::ParseJson(l, "labels_json");
      if (!parsed.ok()) return Report(parsed.status(), errmsg);
      const nlohmann::json& j = *parsed;
      if (!j.is_object()) {
        return Fail(LORADB_INVALID_ARGUMENT, "labels_json must be a JSON object", errmsg);
      }
      for (const auto& [k, v] : j.items()) {
        if (!v.is_string()) {
          return Fail(LORADB_INVALID_ARGUMENT, "label values must be strings", errmsg);
        }
        labels[k] = v.get<std::string>();
      }
    }
    absl::StatusOr<loradb::PolicyRecord> p = store->store->CreatePolicy(n, b, labels);
    if (!p.ok()) return Report(p.status(), errmsg);
    if (policy_id != nullptr) *policy_id = p->id;
    return LORADB_OK;
  });
}

loradb_status_t loradb_policy_archive(loradb_store_t* store, const char* name, size_t name_len,
                                      int archived, char** errmsg) {
  return Guarded(errmsg, [&]() -> loradb_status_t {
    LORADB_C_CHECK_STORE(store);
    LORADB_C_STRING(n, name, name_len, "name");
    if (archived != 0 && archived != 1) {
      return Fail(LORADB_INVALID_ARGUMENT, "archived must be 0 or 1", errmsg);
    }
    return Report(store->store->ArchivePolicy(n, archived == 1), errmsg);
  });
}

loradb_status_t loradb_policy_list(loradb_store_t* store, uint64_t after_id, size_t limit,
                                   char** json, size_t* json_len, uint64_t* next_cursor,
                                   char** errmsg) {
  return Guarded(errmsg, [&]() -> loradb_status_t {
    LORADB_C_CHECK_STORE(store);
    if (json == nullptr) return Fail(LORADB_INVALID_ARGUMENT, "json is NULL", errmsg);
    if (limit < 1 || limit > 1000) {
      return Fail(LORADB_INVALID_ARGUMENT, "limit must be 1..1000", errmsg);
    }
    absl::StatusOr<std::vector<loradb::PolicyRecord>> all = store->store->ListPolicies();
    if (!all.ok()) return Report(all.status(), errmsg);
    std::sort(all->begin(), all->end(), [](const auto& a, const auto& b) { return a.id < b.id; });
    nlohmann::json arr = nlohmann::json::array();
    uint64_t next = 0;
    for (const auto& p : *all) {
      if (p.id <= after_id) continue;
      if (arr.size() == limit) {
        next = arr.back()["id"].get<uint64_t>();
        break;
      }
      arr.push_back(loradb::PolicyJson(p));
    }
    if (next_cursor != nullptr) *next_cursor = next;
    return ReturnJson(arr, json, json_len);
  });
}

// ---- aliases

loradb_status_t loradb_alias_set(loradb_store_t* store, const char* policy, size_t policy_len,
                                 const char* alias, size_t alias_len, uint64_t revision,
                                 const char* reason, size_t reason_len, char** errmsg) {
  return Guarded(errmsg, [&]() -> loradb_status_t {
    LORADB_C_CHECK_STORE(store);
    LORADB_C_STRING(p, policy, policy_len, "policy");
    LORADB_C_STRING(a, alias, alias_len, "alias");
    LORADB_C_STRING(r, reason, reason_len, "reason");
    return Report(store->store->SetAlias(p, a, revision, r.empty() ? "set" : r), errmsg);
  });
}

loradb_status_t loradb_alias_rollback(loradb_store_t* store, const char* policy, size_t policy_len,
                                      const char* alias, size_t alias_len, uint64_t* revision,
                                      char** errmsg) {
  return Guarded(errmsg, [&]() -> loradb_status_t {
    LORADB_C_CHECK_STORE(store);
    LORADB_C_STRING(p, policy, policy_len, "policy");
    LORADB_C_STRING(a, alias, alias_len, "alias");
    absl::StatusOr<uint64_t> now = store->store->Rollback(p, a);
    if (!now.ok()) return Report(now.status(), errmsg);
    if (revision != nullptr) *revision = *now;
    return LORADB_OK;
  });
}

loradb_status_t loradb_alias_history(loradb_store_t* store, const char* policy, size_t policy_len,
                                     const char* alias, size_t alias_len, char** json,
                                     size_t* json_len, char** errmsg) {
  return Guarded(errmsg, [&]() -> loradb_status_t {
    LORADB_C_CHECK_STORE(store);
    LORADB_C_STRING(p, policy, policy_len, "policy");
    LORADB_C_STRING(a, alias, alias_len, "alias");
    if (json == nullptr) return Fail(LORADB_INVALID_ARGUMENT, "json is NULL", errmsg);
    absl::Status st = loradb::ValidateAliasName(a);
    if (!st.ok()) return Report(st, errmsg);
    absl::StatusOr<loradb::PolicyRecord> pol = store->store->GetPolicy(p);
    if (!pol.ok()) return Report(pol.status(), errmsg);
    absl::StatusOr<std::vector<loradb::AliasLogEntry>> log =
        store->store->catalog().AliasLog(pol->id, a);
    if (!log.ok()) return Report(log.status(), errmsg);
    nlohmann::json arr = nlohmann::json::array();
    for (const auto& e : *log) arr.push_back(loradb::AliasLogJson(e));
    return ReturnJson(arr, json, json_len);
  });
}

loradb_status_t loradb_locate(loradb_store_t* store, const char* policy, size_t policy_len,
                              const char* alias, size_t alias_len, loradb_located_t* out,
                              char** errmsg) {
  return Guarded(errmsg, [&]() -> loradb_status_t {
    LORADB_C_CHECK_STORE(store);
    LORADB_C_STRING(p, policy, policy_len, "policy");
    LORADB_C_STRING(a, alias, alias_len, "alias");
    LORADB_C_CHECK_GROWN_STRUCT(out, loradb_located_t, LORADB_LOCATED_V1_SIZE);
    absl::StatusOr<loradb::Located> l = store->store->Locate(p, a);
    if (!l.ok()) return Report(l.status(), errmsg);
    loradb::tiers::TierPlace place;  // storage, no leases, when there are no tiers
    if (store->tiers != nullptr) place = store->tiers->Where(l->revision.id);
    loradb_located_t full{};
    full.base_name = CopyString(l->base.name);
    full.blob_path = CopyString(l->location.blob_path);
    if (full.base_name == nullptr || full.blob_path == nullptr) {
      std::free(full.base_name);
      std::free(full.blob_path);
      return Fail(LORADB_INTERNAL, "out of memory", errmsg);
    }
    full.checkpoint_id = l->checkpoint.has_value() ? l->checkpoint->id : 0;
    full.revision_id = l->revision.id;
    full.tier = ToCEnum<loradb_tier_t>(place.tier, kTiers);
    full.bytes = l->location.bytes;
    full.has_slot = place.slot.has_value() ? 1 : 0;
    full.slot = place.slot.value_or(0);
    full.cpu_leases = place.cpu_leases;
    full.device_leases = place.device_leases;
    full.device_bytes = place.device_bytes;
    full.tp_rank = static_cast<uint32_t>(place.tp.rank);
    full.tp_degree = static_cast<uint32_t>(place.tp.degree);
    CopyOut(full, out);
    return LORADB_OK;
  });
}

}  // extern "C"
