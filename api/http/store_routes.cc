#include "api/http/store_routes.h"

#include <algorithm>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "storage/formats/model_config.h"
#include "storage/store/record_json.h"
#include "storage/store/store_tiers.h"
#include "storage/util/status_macros.h"

namespace loradb::http {
namespace {

using nlohmann::json;

constexpr size_t kDefaultLimit = 100;
constexpr size_t kMaxLimit = 1000;

json Ref(const std::string& name) { return {{"$ref", "#/components/schemas/" + name}}; }
json ArrayOf(json items) { return {{"type", "array"}, {"items", std::move(items)}}; }
json Cursor() { return {{"type", json::array({"string", "null"})}}; }

json QueryParam(const std::string& name, json schema, const std::string& description) {
  return {{"name", name},
          {"in", "query"},
          {"required", false},
          {"schema", std::move(schema)},
          {"description", description}};
}

json PageParams() {
  return json::array(
      {QueryParam("limit", {{"type", "integer"}, {"minimum", 1}, {"maximum", kMaxLimit}},
                  "page size (default 100)"),
       QueryParam("cursor", {{"type", "string"}}, "next_cursor of the previous page")});
}

json JsonBody(json schema) {
  return {{"required", true}, {"content", {{"application/json", {{"schema", std::move(schema)}}}}}};
}

// Reads ?limit= and ?cursor= (a decimal key; the next page starts after it).
absl::Status ReadPage(const Call& call, size_t* limit, uint64_t* after) {
  *limit = kDefaultLimit;
  *after = 0;
  if (auto v = call.Query("limit")) {
    LORADB_ASSIGN_OR_RETURN(uint64_t n, ParseUint(*v, "limit"));
    if (n < 1 || n > kMaxLimit) {
      return absl::InvalidArgumentError(absl::StrCat("limit must be 1..", kMaxLimit));
    }
    *limit = n;
  }
  if (auto v = call.Query("cursor")) {
    LORADB_ASSIGN_OR_RETURN(*after, ParseUint(*v, "cursor"));
  }
  return absl::OkStatus();
}

json CursorJson(const std::optional<uint64_t>& next) {
  return next.has_value() ? json(std::to_string(*next)) : json(nullptr);
}

class StoreApi {
 public:
  explicit StoreApi(std::shared_ptr<Store> store) : store_(std::move(store)) {}

  absl::StatusOr<PolicyRecord> Policy(const Call& call) const {
    const std::string& name = call.Param("policy");
    LORADB_RETURN_IF_ERROR(ValidatePolicyName(name));
    return store_->catalog().GetPolicy(name);
  }

  absl::StatusOr<std::string> Alias(const Call& call) const {
    const std::string& alias = call.Param("alias");
    LORADB_RETURN_IF_ERROR(ValidateAliasName(alias));
    return alias;
  }

  absl::StatusOr<uint64_t> RevisionId(const Call& call, const std::string& param) const {
    return ParseUint(call.Param(param), param);
  }

  std::string PolicyName(uint64_t policy_id) const {
    absl::StatusOr<PolicyRecord> p = store_->catalog().GetPolicyById(policy_id);
    return p.ok() ? p->name : "";
  }

  // Policy JSON plus its aliases and revision count (what the status page shows).
  absl::StatusOr<json> PolicySummary(const PolicyRecord& p) const {
    json j = PolicyJson(p);
    LORADB_ASSIGN_OR_RETURN(std::vector<AliasEntry> aliases, store_->catalog().ListAliases(p.id));
    json a = json::object();
    for (const AliasEntry& e : aliases) a[e.alias] = e.revision;
    j["aliases"] = a;
    LORADB_ASSIGN_OR_RETURN(uint64_t count, store_->catalog().CountPolicyRevisions(p.id));
    j["revision_count"] = count;
    return j;
  }

  // ---- bases
  absl::StatusOr<Reply> ListBases(const Call&) const {
    LORADB_ASSIGN_OR_RETURN(std::vector<BaseRecord> bases, store_->catalog().ListBases());
    json items = json::array();
    for (const BaseRecord& b : bases) items.push_back(BaseJson(b, false));
    return Reply::Json({{"bases", items}});
  }

  absl::StatusOr<Reply> GetBase(const Call& call) const {
    const std::string& name = call.Param("base");
    LORADB_RETURN_IF_ERROR(ValidateBaseName(name));
    LORADB_ASSIGN_OR_RETURN(BaseRecord base, store_->catalog().GetBase(name));
    return Reply::Json(BaseJson(base, true));
  }

  absl::StatusOr<Reply> CreateBase(const Call& call) const {
    LORADB_ASSIGN_OR_RETURN(json body, ParseJsonObject(call, {"name", "config", "modules", "family",
                                                              "weights_fingerprint"}));
    LORADB_ASSIGN_OR_RETURN(std::optional<std::string> name, GetString(body, "name", true));
    LORADB_RETURN_IF_ERROR(ValidateBaseName(*name));
    BaseRecord base;
    base.name = *name;
    const bool has_config = body.contains("config"), has_modules = body.contains("modules");
    if (has_config == has_modules) {
      return absl::InvalidArgumentError("give exactly one of 'config' and 'modules'");
    }
    if (has_config) {
      if (!body["config"].is_object()) {
        return absl::InvalidArgumentError("field 'config' must be a config.json object");
      }
      LORADB_ASSIGN_OR_RETURN(ModelConfig cfg, ParseModelConfigJson(body["config"].dump()));
      base = BaseRecordFromConfig(*name, cfg, cfg.ToJson());
    } else {
      const json& mods = body["modules"];
      if (!mods.is_array() || mods.empty()) {
        return absl::InvalidArgumentError("field 'modules' must be a non-empty array");
      }
      for (const json& m : mods) {
        if (!m.is_object() || !m.contains("name") || !m["name"].is_string() || m.size() != 3 ||
            !m.contains("in") || !m.contains("out") || !m["in"].is_number_integer() ||
            !m["out"].is_number_integer() || m["in"].get<int64_t>() < 1 ||
            m["out"].get<int64_t>() < 1 || m["name"].get<std::string>().empty()) {
          return absl::InvalidArgumentError(
              "each module must be {\"name\": non-empty string, \"in\": int >= 1, \"out\": int "
              ">= 1}");
        }
        base.modules.push_back(
            {m["name"].get<std::string>(), m["in"].get<int64_t>(), m["out"].get<int64_t>()});
      }
      LORADB_ASSIGN_OR_RETURN(std::optional<std::string> family, GetString(body, "family", false));
      base.arch.family = family.value_or("custom");
    }
    LORADB_ASSIGN_OR_RETURN(std::optional<std::string> fp,
                            GetString(body, "weights_fingerprint", false));
    if (fp.has_value() && !fp->empty()) {
      LORADB_RETURN_IF_ERROR(ParseHash128(*fp).status());
      base.weights_fingerprint = *fp;
    }
    LORADB_RETURN_IF_ERROR(store_->AddBase(base).status());
    LORADB_ASSIGN_OR_RETURN(BaseRecord stored, store_->catalog().GetBase(base.name));
    return Reply::Json(BaseJson(stored, false), 201);
  }

  // ---- policies
  absl::StatusOr<Reply> ListPolicies(const Call& call) const {
    size_t limit;
    uint64_t after;
    LORADB_RETURN_IF_ERROR(ReadPage(call, &limit, &after));
    LORADB_ASSIGN_OR_RETURN(std::vector<PolicyRecord> all, store_->catalog().ListPolicies());
    std::sort(all.begin(), all.end(),
              [](const PolicyRecord& a, const PolicyRecord& b) { return a.id < b.id; });
    std::optional<std::string> base = call.Query("base");
    json items = json::array();
    std::optional<uint64_t> next;
    for (const PolicyRecord& p : all) {
      if (p.id <= after || (base.has_value() && p.base != *base)) continue;
      if (items.size() == limit) {
        next = items.back()["id"].get<uint64_t>();
        break;
      }
      LORADB_ASSIGN_OR_RETURN(json j, PolicySummary(p));
      items.push_back(std::move(j));
    }
    return Reply::Json({{"policies", items}, {"next_cursor", CursorJson(next)}});
  }

  absl::StatusOr<Reply> GetPolicy(const Call& call) const {
    LORADB_ASSIGN_OR_RETURN(PolicyRecord p, Policy(call));
    LORADB_ASSIGN_OR_RETURN(json j, PolicySummary(p));
    return Reply::Json(j);
  }

  absl::StatusOr<Reply> CreatePolicy(const Call& call) const {
    LORADB_ASSIGN_OR_RETURN(json body, ParseJsonObject(call, {"name", "base", "labels"}));
    LORADB_ASSIGN_OR_RETURN(std::optional<std::string> name, GetString(body, "name", true));
    LORADB_ASSIGN_OR_RETURN(std::optional<std::string> base, GetString(body, "base", true));
    LORADB_RETURN_IF_ERROR(ValidatePolicyName(*name));
    LORADB_RETURN_IF_ERROR(ValidateBaseName(*base));
    std::map<std::string, std::string> labels;
    if (body.contains("labels")) {
      const json& l = body["labels"];
      if (!l.is_object()) return absl::InvalidArgumentError("field 'labels' must be an object");
      if (l.size() > 64) return absl::InvalidArgumentError("at most 64 labels");
      for (const auto& [k, v] : l.items()) {
        if (!v.is_string() || k.empty() || k.size() > 128 || v.get<std::string>().size() > 1024) {
          return absl::InvalidArgumentError(
              "labels must map 1-128 character keys to strings of at most 1024 bytes");
        }
        labels[k] = v.get<std::string>();
      }
    }
    LORADB_ASSIGN_OR_RETURN(PolicyRecord p, store_->CreatePolicy(*name, *base, labels));
    LORADB_ASSIGN_OR_RETURN(json j, PolicySummary(p));
    return Reply::Json(j, 201);
  }

  absl::StatusOr<Reply> ArchivePolicy(const Call& call) const {
    LORADB_ASSIGN_OR_RETURN(json body, ParseJsonObject(call, {"archived"}));
    LORADB_ASSIGN_OR_RETURN(std::optional<bool> archived, GetBool(body, "archived", false));
    LORADB_ASSIGN_OR_RETURN(PolicyRecord p, Policy(call));
    LORADB_RETURN_IF_ERROR(store_->ArchivePolicy(p.name, archived.value_or(true)));
    LORADB_ASSIGN_OR_RETURN(PolicyRecord updated, store_->catalog().GetPolicy(p.name));
    LORADB_ASSIGN_OR_RETURN(json j, PolicySummary(updated));
    return Reply::Json(j);
  }

  absl::StatusOr<Reply> ListPolicyRevisions(const Call& call) const {
    size_t limit;
    uint64_t after;
    LORADB_RETURN_IF_ERROR(ReadPage(call, &limit, &after));
    bool include_deleted = false;
    if (auto v = call.Query("include_deleted")) {
      if (*v != "true" && *v != "false") {
        return absl::InvalidArgumentError("include_deleted must be true or false");
      }
      include_deleted = *v == "true";
    }
    LORADB_ASSIGN_OR_RETURN(PolicyRecord p, Policy(call));
    LORADB_ASSIGN_OR_RETURN(Page<RevisionRecord> page, store_->catalog().ListPolicyRevisions(
                                                           p.id, after, limit, include_deleted));
    json items = json::array();
    for (const RevisionRecord& r : page.items) items.push_back(RevisionJson(r, p.name));
    return Reply::Json({{"revisions", items}, {"next_cursor", CursorJson(page.next_after)}});
  }

  // ---- revisions
  absl::StatusOr<Reply> GetRevision(const Call& call) const {
    LORADB_ASSIGN_OR_RETURN(uint64_t id, RevisionId(call, "id"));
    LORADB_ASSIGN_OR_RETURN(RevisionRecord r, store_->catalog().GetRevision(id));
    return Reply::Json(RevisionJson(r, PolicyName(r.policy_id)));
  }

  absl::StatusOr<Reply> DeleteRevision(const Call& call) const {
    LORADB_ASSIGN_OR_RETURN(uint64_t id, RevisionId(call, "id"));
    LORADB_RETURN_IF_ERROR(store_->DeleteRevision(id));
    LORADB_ASSIGN_OR_RETURN(RevisionRecord r, store_->catalog().GetRevision(id));
    return Reply::Json(RevisionJson(r, PolicyName(r.policy_id)));
  }

  absl::StatusOr<Reply> RevisionTensors(const Call& call) const {
    LORADB_ASSIGN_OR_RETURN(uint64_t id, RevisionId(call, "id"));
    LORADB_ASSIGN_OR_RETURN(RevisionRecord r, store_->GetRevision(id));
    LORADB_ASSIGN_OR_RETURN(TensorSet tensors, store_->ReadTensors(r));
    json items = json::array();
    for (const TensorView& t : tensors.tensors()) {
      items.push_back({{"name", t.name},
                       {"dtype", std::string(DTypeName(t.dtype))},
                       {"shape", t.shape},
                       {"bytes", t.nbytes}});
    }
    return Reply::Json(
        {{"revision", id}, {"tensors", items}, {"total_bytes", tensors.total_bytes()}});
  }

  absl::StatusOr<Reply> RevisionTier(const Call& call) const {
    LORADB_ASSIGN_OR_RETURN(uint64_t id, RevisionId(call, "id"));
    LORADB_ASSIGN_OR_RETURN(RevisionRecord r, store_->GetRevision(id));
    return Reply::Json({{"revision", id}, {"location", LocationJson(r)}});
  }

  // Where the bytes are: the live tier (and device slot) when the Store owns residency tiers,
  // else storage; blob_present says whether the blob file is there.
  json LocationJson(const RevisionRecord& r) const {
    std::string path = store_->BlobPath(r.blob.hash);
    std::error_code ec;
    bool present = std::filesystem::is_regular_file(path, ec);
    Tier tier = Tier::kStorage;
    json slot = nullptr;
    if (store_->tiers() != nullptr) {
      tiers::TierPlace place = store_->tiers()->Where(r.id);
      tier = place.tier;
      if (place.slot.has_value()) slot = *place.slot;
    }
    return {{"tier", std::string(TierName(tier))},
            {"slot", slot},
            {"blob_path", path},
            {"blob_present", present},
            {"hash", r.blob.hash.Hex()},
            {"bytes", r.blob.bytes}};
  }

  absl::StatusOr<Reply> Locate(const Call& call) const {
    LORADB_ASSIGN_OR_RETURN(PolicyRecord p, Policy(call));
    LORADB_ASSIGN_OR_RETURN(std::string alias, Alias(call));
    LORADB_ASSIGN_OR_RETURN(Located l, store_->Locate(p.name, alias));
    json loc = LocationJson(l.revision);
    return Reply::Json(
        {{"policy", p.name},
         {"alias", alias},
         {"base", BaseJson(l.base, false)},
         {"checkpoint",
          l.checkpoint.has_value() ? CheckpointJson(*l.checkpoint, p.name) : json(nullptr)},
         {"revision", RevisionJson(l.revision, p.name)},
         {"location", loc}});
  }

  // ---- aliases
  absl::StatusOr<Reply> ListAliases(const Call& call) const {
    LORADB_ASSIGN_OR_RETURN(PolicyRecord p, Policy(call));
    LORADB_ASSIGN_OR_RETURN(std::vector<AliasEntry> aliases, store_->catalog().ListAliases(p.id));
    json items = json::array();
    for (const AliasEntry& e : aliases) {
      items.push_back({{"alias", e.alias}, {"revision", e.revision}});
    }
    return Reply::Json({{"policy", p.name}, {"aliases", items}});
  }

  absl::StatusOr<Reply> GetAlias(const Call& call) const {
    LORADB_ASSIGN_OR_RETURN(PolicyRecord p, Policy(call));
    LORADB_ASSIGN_OR_RETURN(std::string alias, Alias(call));
    LORADB_ASSIGN_OR_RETURN(RevisionRecord r, store_->catalog().GetRevisionByAlias(p.id, alias));
    return Reply::Json(
        {{"policy", p.name}, {"alias", alias}, {"revision", RevisionJson(r, p.name)}});
  }

  absl::StatusOr<Reply> SetAlias(const Call& call) const {
    LORADB_ASSIGN_OR_RETURN(json body, ParseJsonObject(call, {"revision", "reason"}));
    LORADB_ASSIGN_OR_RETURN(std::optional<uint64_t> rev, GetUint(body, "revision", true));
    LORADB_ASSIGN_OR_RETURN(std::optional<std::string> reason, GetString(body, "reason", false));
    if (reason.has_value() && reason->size() > 256) {
      return absl::InvalidArgumentError("reason is longer than 256 bytes");
    }
    LORADB_ASSIGN_OR_RETURN(PolicyRecord p, Policy(call));
    LORADB_ASSIGN_OR_RETURN(std::string alias, Alias(call));
    if (alias == "latest") {
      return absl::InvalidArgumentError("'latest' is maintained by the store and cannot be set");
    }
    LORADB_RETURN_IF_ERROR(store_->SetAlias(p.name, alias, *rev, reason.value_or("set")));
    return Reply::Json(AliasJson(p.name, alias, *rev));
  }

  absl::StatusOr<Reply> Rollback(const Call& call) const {
    LORADB_ASSIGN_OR_RETURN(json body, ParseJsonObject(call, {}));
    (void)body;
    LORADB_ASSIGN_OR_RETURN(PolicyRecord p, Policy(call));
    LORADB_ASSIGN_OR_RETURN(std::string alias, Alias(call));
    LORADB_ASSIGN_OR_RETURN(uint64_t rev, store_->Rollback(p.name, alias));
    return Reply::Json(AliasJson(p.name, alias, rev));
  }

  absl::StatusOr<Reply> AliasHistory(const Call& call) const {
    LORADB_ASSIGN_OR_RETURN(PolicyRecord p, Policy(call));
    LORADB_ASSIGN_OR_RETURN(std::string alias, Alias(call));
    LORADB_ASSIGN_OR_RETURN(std::vector<AliasLogEntry> log,
                            store_->catalog().AliasLog(p.id, alias));
    json items = json::array();
    for (const AliasLogEntry& e : log) items.push_back(AliasLogJson(e));
    return Reply::Json({{"policy", p.name}, {"alias", alias}, {"entries", items}});
  }

  // ---- checkpoints
  absl::StatusOr<Reply> ListCheckpoints(const Call& call) const {
    LORADB_ASSIGN_OR_RETURN(PolicyRecord p, Policy(call));
    LORADB_ASSIGN_OR_RETURN(std::vector<CheckpointRecord> list,
                            store_->catalog().ListCheckpoints(p.id));
    json items = json::array();
    for (const CheckpointRecord& c : list) items.push_back(CheckpointJson(c, p.name));
    return Reply::Json({{"policy", p.name}, {"checkpoints", items}});
  }

  absl::StatusOr<Reply> GetCheckpoint(const Call& call) const {
    LORADB_ASSIGN_OR_RETURN(uint64_t id, RevisionId(call, "id"));
    LORADB_ASSIGN_OR_RETURN(CheckpointRecord c, store_->catalog().GetCheckpoint(id));
    return Reply::Json(CheckpointJson(c, PolicyName(c.policy_id)));
  }

 private:
  std::shared_ptr<Store> store_;
};

}  // namespace

absl::Status AddStoreRoutes(std::shared_ptr<Store> store, Server* server) {
  auto api = std::make_shared<StoreApi>(std::move(store));
  Router* r = server->router();
  r->AddSchemas(RecordSchemas());
  r->SetParamSchema("policy",
                    {{"type", "string"}, {"pattern", "^[A-Za-z0-9][A-Za-z0-9_./-]{0,127}$"}},
                    "team/p0");
  r->SetParamSchema("base",
                    {{"type", "string"}, {"pattern", "^[A-Za-z0-9][A-Za-z0-9_./-]{0,127}$"}},
                    "qwen3-tiny");
  r->SetParamSchema("alias", {{"type", "string"}, {"pattern", "^[A-Za-z][A-Za-z0-9_.-]{0,63}$"}},
                    "serving");
  r->SetParamSchema("id", {{"type", "integer"}, {"minimum", 0}}, 1);
  json policy_summary = RecordSchemas()["Policy"];
  policy_summary["properties"]["aliases"] = {{"type", "object"},
                                             {"additionalProperties", {{"type", "integer"}}}};
  policy_summary["properties"]["revision_count"] = {{"type", "integer"}, {"minimum", 0}};
  policy_summary["required"].push_back("aliases");
  policy_summary["required"].push_back("revision_count");
  r->AddSchemas({{"PolicySummary", policy_summary}});
  auto bind = [api](absl::StatusOr<Reply> (StoreApi::*fn)(const Call&) const) -> Handler {
    return [api, fn](const Call& call) { return ((*api).*fn)(call); };
  };
  auto object = [](json properties, std::vector<std::string> required) {
    return json{{"type", "object"},
                {"additionalProperties", false},
                {"required", required},
                {"properties", std::move(properties)}};
  };
  json alias_value = RecordSchemas()["Alias"];

  // Bases.
  LORADB_RETURN_IF_ERROR(r->Add(MakeRoute(
      "GET", "/v1/bases", bind(&StoreApi::ListBases),
      Operation(
          "List registered bases", "bases",
          {{"200", ResponseSpec("bases", {{"type", "object"},
                                          {"required", {"bases"}},
                                          {"properties", {{"bases", ArrayOf(Ref("Base"))}}}})}}))));
  json create_base_op = Operation("Register a base from a Qwen3 config.json or a module table",
                                  "bases", {{"201", ResponseSpec("the new base", Ref("Base"))}});
  create_base_op["requestBody"] =
      JsonBody(object({{"name", {{"type", "string"}}},
                       {"config", {{"type", "object"}}},
                       {"modules", ArrayOf(object({{"name", {{"type", "string"}}},
                                                   {"in", {{"type", "integer"}, {"minimum", 1}}},
                                                   {"out", {{"type", "integer"}, {"minimum", 1}}}},
                                                  {"name", "in", "out"}))},
                       {"family", {{"type", "string"}}},
                       {"weights_fingerprint", {{"type", "string"}}}},
                      {"name"}));
  LORADB_RETURN_IF_ERROR(
      r->Add(MakeRoute("POST", "/v1/bases", bind(&StoreApi::CreateBase), create_base_op)));
  LORADB_RETURN_IF_ERROR(
      r->Add(MakeRoute("GET", "/v1/bases/{base}", bind(&StoreApi::GetBase),
                       Operation("A base with its module table", "bases",
                                 {{"200", ResponseSpec("the base", Ref("Base"))}}))));

  // Policies.
  json list_policies_op = Operation(
      "List policies in id order (cursor pagination)", "policies",
      {{"200", ResponseSpec("a page of policies", {{"type", "object"},
                                                   {"required", {"policies", "next_cursor"}},
                                                   {"properties",
                                                    {{"policies", ArrayOf(Ref("PolicySummary"))},
                                                     {"next_cursor", Cursor()}}}})}});
  list_policies_op["parameters"] = PageParams();
  list_policies_op["parameters"].push_back(
      QueryParam("base", {{"type", "string"}}, "only policies bound to this base"));
  LORADB_RETURN_IF_ERROR(
      r->Add(MakeRoute("GET", "/v1/policies", bind(&StoreApi::ListPolicies), list_policies_op)));
  json create_policy_op =
      Operation("Create a policy bound to a base", "policies",
                {{"201", ResponseSpec("the new policy", Ref("PolicySummary"))}});
  create_policy_op["requestBody"] = JsonBody(
      object({{"name", {{"type", "string"}}},
              {"base", {{"type", "string"}}},
              {"labels", {{"type", "object"}, {"additionalProperties", {{"type", "string"}}}}}},
             {"name", "base"}));
  LORADB_RETURN_IF_ERROR(
      r->Add(MakeRoute("POST", "/v1/policies", bind(&StoreApi::CreatePolicy), create_policy_op)));
  LORADB_RETURN_IF_ERROR(
      r->Add(MakeRoute("GET", "/v1/policies/{policy}", bind(&StoreApi::GetPolicy),
                       Operation("A policy record (name URL-encoded: acme%2Fsupport)", "policies",
                                 {{"200", ResponseSpec("the policy", Ref("PolicySummary"))}}))));
  json archive_op =
      Operation("Archive (or with {\"archived\": false} unarchive) a policy", "policies",
                {{"200", ResponseSpec("the policy", Ref("PolicySummary"))}});
  archive_op["requestBody"] = JsonBody(object({{"archived", {{"type", "boolean"}}}}, {}));
  archive_op["requestBody"]["required"] = false;
  LORADB_RETURN_IF_ERROR(r->Add(MakeRoute("POST", "/v1/policies/{policy}/archive",
                                          bind(&StoreApi::ArchivePolicy), archive_op)));
  json list_revs_op = Operation(
      "A policy's revisions in sequence order (cursor pagination)", "revisions",
      {{"200", ResponseSpec("a page of revisions", {{"type", "object"},
                                                    {"required", {"revisions", "next_cursor"}},
                                                    {"properties",
                                                     {{"revisions", ArrayOf(Ref("Revision"))},
                                                      {"next_cursor", Cursor()}}}})}});
  list_revs_op["parameters"] = PageParams();
  list_revs_op["parameters"].push_back(QueryParam(
      "include_deleted", {{"type", "string"}, {"enum", {"true", "false"}}}, "list deleted too"));
  LORADB_RETURN_IF_ERROR(r->Add(MakeRoute("GET", "/v1/policies/{policy}/revisions",
                                          bind(&StoreApi::ListPolicyRevisions), list_revs_op)));

  // Revisions.
  LORADB_RETURN_IF_ERROR(
      r->Add(MakeRoute("GET", "/v1/revisions/{id}", bind(&StoreApi::GetRevision),
                       Operation("A revision's metadata", "revisions",
                                 {{"200", ResponseSpec("the revision", Ref("Revision"))}}),
                       {"id"})));
  LORADB_RETURN_IF_ERROR(
      r->Add(MakeRoute("DELETE", "/v1/revisions/{id}", bind(&StoreApi::DeleteRevision),
                       Operation("Delete a revision (409 while an alias points at it)", "revisions",
                                 {{"200", ResponseSpec("the deleted revision", Ref("Revision"))}}),
                       {"id"})));

  json location = {{"type", "object"},
                   {"required", {"tier", "blob_path", "blob_present", "hash", "bytes"}},
                   {"properties",
                    {{"tier", {{"type", "string"}, {"enum", {"storage", "cpu", "gpu"}}}},
                     {"slot", {{"type", {"integer", "null"}}, {"minimum", 0}}},
                     {"blob_path", {{"type", "string"}}},
                     {"blob_present", {{"type", "boolean"}}},
                     {"hash", {{"type", "string"}}},
                     {"bytes", {{"type", "integer"}, {"minimum", 0}}}}}};
  r->AddSchemas({{"Location", location}});
  json tensor = object({{"name", {{"type", "string"}}},
                        {"dtype", {{"type", "string"}}},
                        {"shape", ArrayOf({{"type", "integer"}})},
                        {"bytes", {{"type", "integer"}, {"minimum", 0}}}},
                       {"name", "dtype", "shape", "bytes"});
  // Reads (and checksums) the blob: a blocking read, answered off the event loops.
  Route tensors_route = MakeRoute(
      "GET", "/v1/revisions/{id}/tensors", bind(&StoreApi::RevisionTensors),
      Operation("A revision's tensors (read from its blob, checksums verified)", "revisions",
                {{"200",
                  ResponseSpec("the tensors", {{"type", "object"},
                                               {"required", {"revision", "tensors", "total_bytes"}},
                                               {"properties",
                                                {{"revision", {{"type", "integer"}}},
                                                 {"tensors", ArrayOf(tensor)},
                                                 {"total_bytes", {{"type", "integer"}}}}}})}}),
      {"id"});
  tensors_route.blocking = true;
  LORADB_RETURN_IF_ERROR(r->Add(std::move(tensors_route)));
  LORADB_RETURN_IF_ERROR(r->Add(MakeRoute(
      "GET", "/v1/revisions/{id}/tier", bind(&StoreApi::RevisionTier),
      Operation("The tier a revision's bytes are in", "revisions",
                {{"200", ResponseSpec("the location", {{"type", "object"},
                                                       {"required", {"revision", "location"}},
                                                       {"properties",
                                                        {{"revision", {{"type", "integer"}}},
                                                         {"location", Ref("Location")}}}})}}),
      {"id"})));

  // Aliases.
  LORADB_RETURN_IF_ERROR(r->Add(MakeRoute(
      "GET", "/v1/policies/{policy}/aliases/{alias}/locate", bind(&StoreApi::Locate),
      Operation(
          "The four answers for an alias: base, checkpoint, revision, location", "aliases",
          {{"200",
            ResponseSpec(
                "the answers",
                {{"type", "object"},
                 {"required", {"policy", "alias", "base", "checkpoint", "revision", "location"}},
                 {"properties",
                  {{"policy", {{"type", "string"}}},
                   {"alias", {{"type", "string"}}},
                   {"base", Ref("Base")},
                   {"checkpoint", {{"oneOf", {Ref("Checkpoint"), {{"type", "null"}}}}}},
                   {"revision", Ref("Revision")},
                   {"location", Ref("Location")}}}})}}))));
  LORADB_RETURN_IF_ERROR(r->Add(MakeRoute(
      "GET", "/v1/policies/{policy}/aliases", bind(&StoreApi::ListAliases),
      Operation(
          "A policy's aliases", "aliases",
          {{"200", ResponseSpec("aliases",
                                {{"type", "object"},
                                 {"required", {"policy", "aliases"}},
                                 {"properties",
                                  {{"policy", {{"type", "string"}}},
                                   {"aliases", ArrayOf(object({{"alias", {{"type", "string"}}},
                                                               {"revision", {{"type", "integer"}}}},
                                                              {"alias", "revision"}))}}}})}}))));
  LORADB_RETURN_IF_ERROR(r->Add(MakeRoute(
      "GET", "/v1/policies/{policy}/aliases/{alias}", bind(&StoreApi::GetAlias),
      Operation("The revision an alias points at ('latest': newest live revision)", "aliases",
                {{"200", ResponseSpec("the alias and its revision",
                                      {{"type", "object"},
                                       {"required", {"policy", "alias", "revision"}},
                                       {"properties",
                                        {{"policy", {{"type", "string"}}},
                                         {"alias", {{"type", "string"}}},
                                         {"revision", Ref("Revision")}}}})}}))));
  json set_alias_op = Operation("Set (promote) an alias to a revision of the policy", "aliases",
                                {{"200", ResponseSpec("the alias", alias_value)}});
  set_alias_op["requestBody"] = JsonBody(object(
      {{"revision", {{"type", "integer"}, {"minimum", 0}}}, {"reason", {{"type", "string"}}}},
      {"revision"}));
  LORADB_RETURN_IF_ERROR(r->Add(MakeRoute("PUT", "/v1/policies/{policy}/aliases/{alias}",
                                          bind(&StoreApi::SetAlias), set_alias_op)));
  json rollback_op = Operation("Move an alias back to its value before its last move", "aliases",
                               {{"200", ResponseSpec("the alias", alias_value)}});
  LORADB_RETURN_IF_ERROR(r->Add(MakeRoute("POST", "/v1/policies/{policy}/aliases/{alias}/rollback",
                                          bind(&StoreApi::Rollback), rollback_op)));
  LORADB_RETURN_IF_ERROR(r->Add(MakeRoute(
      "GET", "/v1/policies/{policy}/aliases/{alias}/history", bind(&StoreApi::AliasHistory),
      Operation(
          "An alias's move log, oldest first", "aliases",
          {{"200", ResponseSpec("the log", {{"type", "object"},
                                            {"required", {"policy", "alias", "entries"}},
                                            {"properties",
                                             {{"policy", {{"type", "string"}}},
                                              {"alias", {{"type", "string"}}},
                                              {"entries", ArrayOf(Ref("AliasLogEntry"))}}}})}}))));

  // Checkpoints.
  LORADB_RETURN_IF_ERROR(r->Add(MakeRoute(
      "GET", "/v1/policies/{policy}/checkpoints", bind(&StoreApi::ListCheckpoints),
      Operation("A policy's training checkpoints by step", "checkpoints",
                {{"200", ResponseSpec("checkpoints",
                                      {{"type", "object"},
                                       {"required", {"policy", "checkpoints"}},
                                       {"properties",
                                        {{"policy", {{"type", "string"}}},
                                         {"checkpoints", ArrayOf(Ref("Checkpoint"))}}}})}}))));
  return r->Add(MakeRoute("GET", "/v1/checkpoints/{id}", bind(&StoreApi::GetCheckpoint),
                          Operation("A checkpoint's metadata", "checkpoints",
                                    {{"200", ResponseSpec("the checkpoint", Ref("Checkpoint"))}}),
                          {"id"}));
}

}  // namespace loradb::http
