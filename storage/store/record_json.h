// JSON forms of the catalog's records: the one shape each record has on every surface that
// prints it (the HTTP admin endpoint, `loradb ... --json`, the C API's JSON lists), and the
// OpenAPI schemas that describe them, kept side by side so the document matches what is sent.
// docs/json.md shows each shape.
#ifndef LORADB_STORAGE_STORE_RECORD_JSON_H_
#define LORADB_STORAGE_STORE_RECORD_JSON_H_

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "storage/catalog/records.h"

namespace loradb {

// `with_modules`: include the whole module table (it can be long) as "modules".
nlohmann::json BaseJson(const BaseRecord& base, bool with_modules);
nlohmann::json PolicyJson(const PolicyRecord& policy);
// `policy_name` is the name of revision.policy_id (the record holds only the id).
nlohmann::json RevisionJson(const RevisionRecord& revision, const std::string& policy_name);
// Where an alias points: {"policy", "alias", "revision": id}.
nlohmann::json AliasJson(const std::string& policy_name, const std::string& alias,
                         uint64_t revision_id);
nlohmann::json AliasLogJson(const AliasLogEntry& entry);
nlohmann::json CheckpointJson(const CheckpointRecord& checkpoint, const std::string& policy_name);
nlohmann::json BlobRefJson(const BlobRef& blob);

// OpenAPI schemas (JSON Schema 2020-12) of the objects above, keyed by component name:
// Base, Policy, Revision, Alias, AliasLogEntry, Checkpoint, BlobRef.
nlohmann::json RecordSchemas();

}  // namespace loradb

#endif  // LORADB_STORAGE_STORE_RECORD_JSON_H_
