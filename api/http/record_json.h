// JSON forms of the catalog's records for the HTTP admin endpoint, and the OpenAPI schemas that
// describe them (kept side by side so the document matches what is sent).
#ifndef LORADB_API_HTTP_RECORD_JSON_H_
#define LORADB_API_HTTP_RECORD_JSON_H_

#include <nlohmann/json.hpp>
#include <string>

#include "storage/catalog/records.h"

namespace loradb::http {

// `with_modules`: include the whole module table (it can be long).
nlohmann::json BaseJson(const BaseRecord& base, bool with_modules);
nlohmann::json PolicyJson(const PolicyRecord& policy);
// `policy_name` is the name of revision.policy_id (the record holds only the id).
nlohmann::json RevisionJson(const RevisionRecord& revision, const std::string& policy_name);
nlohmann::json AliasLogJson(const AliasLogEntry& entry);
nlohmann::json CheckpointJson(const CheckpointRecord& checkpoint, const std::string& policy_name);
nlohmann::json BlobRefJson(const BlobRef& blob);

// OpenAPI schemas (JSON Schema 2020-12) of the objects above, keyed by component name:
// Base, Policy, Revision, AliasLogEntry, Checkpoint, BlobRef.
nlohmann::json RecordSchemas();

}  // namespace loradb::http

#endif  // LORADB_API_HTTP_RECORD_JSON_H_
