#include "storage/store/record_json.h"

namespace loradb {
namespace {

using nlohmann::json;

json Str() { return {{"type", "string"}}; }
json Int() { return {{"type", "integer"}}; }
json UInt() { return {{"type", "integer"}, {"minimum", 0}}; }
json Num() { return {{"type", "number"}}; }
json Bool() { return {{"type", "boolean"}}; }
json Ref(const std::string& name) { return {{"$ref", "#/components/schemas/" + name}}; }
json Obj(json properties) {
  json required = json::array();
  for (const auto& [k, v] : properties.items()) required.push_back(k);
  return {{"type", "object"}, {"required", required}, {"properties", std::move(properties)}};
}
json MapOf(json value) { return {{"type", "object"}, {"additionalProperties", std::move(value)}}; }
json ArrayOf(json items) { return {{"type", "array"}, {"items", std::move(items)}}; }

}  // namespace

json BlobRefJson(const BlobRef& blob) {
  return {{"hash", blob.empty() ? "" : blob.hash.Hex()},
          {"bytes", blob.bytes},
          {"tensors", blob.tensors}};
}

json BaseJson(const BaseRecord& base, bool with_modules) {
  json j = {{"name", base.name},
            {"architecture",
             {{"family", base.arch.family},
              {"hidden_size", base.arch.hidden_size},
              {"num_layers", base.arch.num_layers},
              {"num_heads", base.arch.num_heads},
              {"num_kv_heads", base.arch.num_kv_heads},
              {"head_dim", base.arch.head_dim},
              {"intermediate_size", base.arch.intermediate_size},
              {"num_experts", base.arch.num_experts},
              {"vocab_size", base.arch.vocab_size}}},
            {"module_count", base.modules.size()},
            {"weights_fingerprint", base.weights_fingerprint},
            {"created_us", base.created_us}};
  if (with_modules) {
    json mods = json::array();
    for (const ModuleShape& m : base.modules) {
      mods.push_back({{"name", m.name}, {"in", m.in}, {"out", m.out}});
    }
    j["modules"] = std::move(mods);
  }
  return j;
}

json PolicyJson(const PolicyRecord& p) {
  return {{"id", p.id},
          {"name", p.name},
          {"base", p.base},
          {"labels", p.labels},
          {"archived", p.archived},
          {"created_us", p.created_us},
          {"next_seq", p.next_seq}};
}

json RevisionJson(const RevisionRecord& r, const std::string& policy_name) {
  json modules = json::array();
  for (const ModuleLora& m : r.lora.modules) {
    json e = {{"pattern", m.pattern}, {"r", m.r}};
    e["alpha"] = m.has_alpha ? json(m.alpha) : json(nullptr);
    modules.push_back(std::move(e));
  }
  json source = {{"kind", r.source.kind == SourceKind::kTrained ? "trained" : "imported"}};
  if (r.source.kind == SourceKind::kTrained) {
    source["checkpoint_id"] = r.source.checkpoint_id;
    source["step"] = r.source.step;
  } else {
    source["origin"] = r.source.origin;
    source["content_hash"] = r.source.content_hash;
  }
  json evals = json::object();
  for (const auto& [k, v] : r.evals) evals[k] = v;
  return {{"id", r.id},
          {"policy", policy_name},
          {"policy_id", r.policy_id},
          {"seq", r.seq},
          {"base", r.base},
          {"parent", r.parent},
          {"source", source},
          {"lora",
           {{"r", r.lora.r},
            {"alpha", r.lora.alpha},
            {"use_rslora", r.lora.use_rslora},
            {"modules", modules},
            {"target_modules", r.lora.target_modules}}},
          {"dtype", r.dtype},
          {"layout", std::string(LayoutName(r.layout))},
          {"blob", BlobRefJson(r.blob)},
          {"tensors", r.blob.tensors},
          {"bytes", r.blob.bytes},
          {"created_us", r.created_us},
          {"state", std::string(RevisionStateName(r.state))},
          {"evals", evals}};
}

json AliasJson(const std::string& policy_name, const std::string& alias, uint64_t revision_id) {
  return {{"policy", policy_name}, {"alias", alias}, {"revision", revision_id}};
}

json AliasLogJson(const AliasLogEntry& e) {
  return {{"alias", e.alias},
          {"seq", e.seq},
          {"time_us", e.time_us},
          {"from_revision", e.from_revision},
          {"to_revision", e.to_revision},
          {"reason", e.reason}};
}

json CheckpointJson(const CheckpointRecord& c, const std::string& policy_name) {
  return {{"id", c.id},
          {"policy", policy_name},
          {"policy_id", c.policy_id},
          {"step", c.step},
          {"parent", c.parent},
          {"master", BlobRefJson(c.master)},
          {"optimizer", BlobRefJson(c.optimizer)},
          {"gradients", BlobRefJson(c.gradients)},
          {"scheduler", {{"name", c.scheduler_name}, {"position", c.scheduler_position}}},
          {"rng_state_bytes", c.rng_state.size()},
          {"rollout", BlobRefJson(c.rollout)},
          {"created_us", c.created_us}};
}

json RecordSchemas() {
  json blob = Obj({{"hash", Str()}, {"bytes", UInt()}, {"tensors", UInt()}});
  json arch = Obj({{"family", Str()},
                   {"hidden_size", Int()},
                   {"num_layers", Int()},
                   {"num_heads", Int()},
                   {"num_kv_heads", Int()},
                   {"head_dim", Int()},
                   {"intermediate_size", Int()},
                   {"num_experts", Int()},
                   {"vocab_size", Int()}});
  json base = Obj({{"name", Str()},
                   {"architecture", arch},
                   {"module_count", UInt()},
                   {"weights_fingerprint", Str()},
                   {"created_us", Int()}});
  base["properties"]["modules"] = ArrayOf(Obj({{"name", Str()}, {"in", Int()}, {"out", Int()}}));
  json policy = Obj({{"id", UInt()},
                     {"name", Str()},
                     {"base", Str()},
                     {"labels", MapOf(Str())},
                     {"archived", Bool()},
                     {"created_us", Int()},
                     {"next_seq", UInt()}});
  json source = {{"type", "object"},
                 {"required", {"kind"}},
                 {"properties",
                  {{"kind", {{"type", "string"}, {"enum", {"imported", "trained"}}}},
                   {"checkpoint_id", UInt()},
                   {"step", UInt()},
                   {"origin", Str()},
                   {"content_hash", Str()}}}};
  json module_lora = Obj(
      {{"pattern", Str()}, {"r", Int()}, {"alpha", {{"type", json::array({"number", "null"})}}}});
  json revision = Obj({{"id", UInt()},
                       {"policy", Str()},
                       {"policy_id", UInt()},
                       {"seq", UInt()},
                       {"base", Str()},
                       {"parent", UInt()},
                       {"source", source},
                       {"lora", Obj({{"r", Int()},
                                     {"alpha", Num()},
                                     {"use_rslora", Bool()},
                                     {"modules", ArrayOf(module_lora)},
                                     {"target_modules", ArrayOf(Str())}})},
                       {"dtype", Str()},
                       {"layout", {{"type", "string"}, {"enum", {"plain", "packed"}}}},
                       {"blob", Ref("BlobRef")},
                       {"tensors", UInt()},
                       {"bytes", UInt()},
                       {"created_us", Int()},
                       {"state", {{"type", "string"}, {"enum", {"live", "deleted"}}}},
                       {"evals", MapOf(Num())}});
  json alias = Obj({{"policy", Str()}, {"alias", Str()}, {"revision", UInt()}});
  json log = Obj({{"alias", Str()},
                  {"seq", UInt()},
                  {"time_us", Int()},
                  {"from_revision", UInt()},
                  {"to_revision", UInt()},
                  {"reason", Str()}});
  json checkpoint = Obj({{"id", UInt()},
                         {"policy", Str()},
                         {"policy_id", UInt()},
                         {"step", UInt()},
                         {"parent", UInt()},
                         {"master", Ref("BlobRef")},
                         {"optimizer", Ref("BlobRef")},
                         {"gradients", Ref("BlobRef")},
                         {"scheduler", Obj({{"name", Str()}, {"position", Int()}})},
                         {"rng_state_bytes", UInt()},
                         {"rollout", Ref("BlobRef")},
                         {"created_us", Int()}});
  return {{"BlobRef", blob},         {"Base", base},         {"Policy", policy},
          {"Revision", revision},    {"Alias", alias},       {"AliasLogEntry", log},
          {"Checkpoint", checkpoint}};
}

}  // namespace loradb
