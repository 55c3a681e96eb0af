#include "api/http/tier_routes.h"

#include <map>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "storage/util/status_macros.h"

namespace loradb::http {
namespace {

using nlohmann::json;

double Ms(absl::Duration d) { return absl::ToDoubleMilliseconds(d); }

class TierApi {
 public:
  explicit TierApi(std::shared_ptr<Store> store)
      : store_(store), tiers_(std::move(store), store_->tiers()) {}
  ~TierApi() {
    std::lock_guard<std::mutex> lock(mu_);
    pins_.clear();  // leases release before the tiers go
  }

  json Residency() const {
    json out = json::array();
    tiers::CpuCacheStats c = tiers_->cpu().stats();
    out.push_back({{"tier", "cpu"},
                   {"entries", c.resident_entries},
                   {"bytes", c.resident_bytes},
                   {"budget_bytes", tiers_->cpu().options().budget_bytes},
                   {"pooled_bytes", c.pooled_bytes},
                   {"leased_bytes", c.leased_bytes},
                   {"over_budget_bytes", c.over_budget_bytes},
                   {"eviction_policy", tiers::EvictionPolicyName(tiers_->cpu().options().policy)}});
    if (tiers::DeviceSlots* d = tiers_->device()) {
      tiers::DeviceSlotsStats s = d->stats();
      out.push_back({{"tier", "gpu"},
                     {"entries", s.resident_adapters},
                     {"bytes", s.payload_bytes},
                     {"budget_bytes", d->options().arena_bytes},
                     {"leased_entries", s.leased_adapters},
                     {"pages_total", s.pages_total},
                     {"pages_free", s.pages_free},
                     {"largest_free_run", s.largest_free_run},
                     {"page_waste_bytes", s.page_waste_bytes},
                     {"fragmentation", s.fragmentation},
                     {"tp", Tp()}});
    }
    return out;
  }

  // The tiers' tensor-parallel placement: device slots hold rank `rank` of `degree`'s shard;
  // `derived`: the CPU tier holds each revision's derived per-rank blob.
  json Tp() const {
    const tiers::TpShardSpec tp = tiers_->tp();
    return {{"rank", tp.rank}, {"degree", tp.degree}, {"derived", tiers_->tp_derived()}};
  }

  absl::StatusOr<Reply> GetResidency(const Call&) const {
    return Reply::Json({{"tiers", Residency()}});
  }

  absl::StatusOr<Reply> GetStats(const Call&) const {
    tiers::CpuCacheStats c = tiers_->cpu().stats();
    json list = json::array();
    list.push_back({{"tier", "cpu"},
                    {"hits", c.hits},
                    {"misses", c.misses},
                    {"loads", c.loads},
                    {"load_failures", c.load_failures},
                    {"joined_waiters", c.joined_waiters},
                    {"rejections", c.rejections},
                    {"negative_hits", c.negative_hits},
                    {"prefetches", c.prefetches},
                    {"evictions", c.evictions},
                    {"bytes_in", c.bytes_in},
                    {"bytes_out", c.bytes_out},
                    {"inflight_loads", c.inflight_loads},
                    {"queued_loads", c.queued_loads},
                    {"resident_bytes", c.resident_bytes},
                    {"pooled_bytes", c.pooled_bytes},
                    {"pool_cap_bytes", c.pool_cap_bytes},
                    {"budget_bytes", tiers_->cpu().options().budget_bytes},
                    {"load_p50_ms", Ms(c.load_latency.Quantile(0.5))},
                    {"load_p99_ms", Ms(c.load_latency.Quantile(0.99))}});
    if (tiers::DeviceSlots* d = tiers_->device()) {
      tiers::DeviceSlotsStats s = d->stats();
      list.push_back({{"tier", "gpu"},
                      {"hits", s.hits},
                      {"misses", s.misses},
                      {"loads", s.misses},
                      {"joined_waiters", 0},
                      {"rejections", s.batch_failures},
                      {"evictions", s.evictions},
                      {"batches", s.batches},
                      {"bytes_copied", s.bytes_copied},
                      {"payload_bytes", s.payload_bytes},
                      {"arena_bytes", d->options().arena_bytes},
                      {"copy_p50_ms", Ms(s.copy_latency.Quantile(0.5))},
                      {"copy_p99_ms", Ms(s.copy_latency.Quantile(0.99))}});
    }
    tiers::LoaderStats l = tiers_->loader().stats();
    json loader = {{"backend", tiers::LoaderBackendName(l.backend)},
                   {"io_uring_init_errno", l.io_uring_init_errno},
                   {"files", l.files},
                   {"bytes", l.bytes},
                   {"chunks", l.chunks},
                   {"o_direct_files", l.o_direct_files},
                   {"buffered_files", l.buffered_files},
                   {"checksum_failures", l.checksum_failures},
                   {"read_errors", l.read_errors}};
    return Reply::Json({{"tiers", list}, {"loader", loader}, {"tp", Tp()}});
  }

  json Place(uint64_t id) const {
    bool pinned = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      pinned = pins_.count(id) > 0;
    }
    return PlaceJson(id, pinned);
  }

  json PlaceJson(uint64_t id, bool pinned) const {
    tiers::TierPlace p = tiers_->Where(id);
    return {{"revision", id},
            {"tier", std::string(TierName(p.tier))},
            {"slot", p.slot.has_value() ? json(*p.slot) : json(nullptr)},
            {"cpu_leases", p.cpu_leases},
            {"device_leases", p.device_leases},
            {"device_bytes", p.device_bytes},
            {"tp", {{"rank", p.tp.rank}, {"degree", p.tp.degree}}},
            {"pinned", pinned}};
  }

  absl::StatusOr<uint64_t> Id(const Call& call) const { return ParseUint(call.Param("id"), "id"); }

  absl::StatusOr<Reply> GetPlace(const Call& call) const {
    LORADB_ASSIGN_OR_RETURN(uint64_t id, Id(call));
    // A revision the catalog does not know has no place (NotFound -> 404), deleted ones do.
    LORADB_RETURN_IF_ERROR(store_->GetRevision(id).status());
    return Reply::Json(Place(id));
  }

  absl::StatusOr<Reply> Prefetch(const Call& call) const {
    LORADB_ASSIGN_OR_RETURN(json body, ParseJsonObject(call, {}));
    (void)body;
    LORADB_ASSIGN_OR_RETURN(uint64_t id, Id(call));
    LORADB_RETURN_IF_ERROR(tiers_->cpu().Prefetch(id));
    return Reply::Json(Place(id), 202);
  }

  absl::StatusOr<Reply> Evict(const Call& call) const {
    LORADB_ASSIGN_OR_RETURN(json body, ParseJsonObject(call, {}));
    (void)body;
    LORADB_ASSIGN_OR_RETURN(uint64_t id, Id(call));
    LORADB_RETURN_IF_ERROR(tiers_->cpu().Evict(id));
    return Reply::Json(Place(id));
  }

  absl::StatusOr<Reply> Pin(const Call& call) {
    LORADB_ASSIGN_OR_RETURN(json body, ParseJsonObject(call, {}));
    (void)body;
    LORADB_ASSIGN_OR_RETURN(uint64_t id, Id(call));
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (pins_.count(id) > 0) return Reply::Json(PlaceJson(id, /*pinned=*/true));
    }
    LORADB_ASSIGN_OR_RETURN(tiers::CpuLease lease, tiers_->AcquireCpu(id));
    {
      std::lock_guard<std::mutex> lock(mu_);
      pins_.emplace(id, std::move(lease));  // a racing pin of the same id keeps the first
    }
    return Reply::Json(Place(id));
  }

  absl::StatusOr<Reply> Unpin(const Call& call) {
    LORADB_ASSIGN_OR_RETURN(uint64_t id, Id(call));
    tiers::CpuLease lease;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = pins_.find(id);
      if (it == pins_.end()) {
        return absl::NotFoundError(absl::StrCat("revision ", id, " is not pinned"));
      }
      lease = std::move(it->second);
      pins_.erase(it);
    }
    lease.Release();
    return Reply::Json(Place(id));
  }

  void Metrics(std::string* out) const {
    tiers::CpuCacheStats c = tiers_->cpu().stats();
    auto counter = [out](const std::string& name, const std::string& help, uint64_t v,
                         const char* type = "counter") {
      absl::StrAppend(out, "# HELP ", name, " ", help, "\n# TYPE ", name, " ", type, "\n", name,
                      " ", v, "\n");
    };
    counter("loradb_cpu_cache_hits_total", "CPU cache acquires that found the entry.", c.hits);
    counter("loradb_cpu_cache_misses_total", "CPU cache acquires that did not.", c.misses);
    counter("loradb_cpu_cache_loads_total", "Successful CPU cache loads.", c.loads);
    counter("loradb_cpu_cache_load_failures_total", "Failed CPU cache loads.", c.load_failures);
    counter("loradb_cpu_cache_joined_waiters_total", "Requests that joined a pending load.",
            c.joined_waiters);
    counter("loradb_cpu_cache_rejections_total", "Loads refused (queue full).", c.rejections);
    counter("loradb_cpu_cache_evictions_total", "CPU cache evictions.", c.evictions);
    counter("loradb_cpu_cache_resident_bytes", "Bytes resident in the CPU cache.", c.resident_bytes,
            "gauge");
    counter("loradb_cpu_cache_resident_entries", "Revisions resident in the CPU cache.",
            c.resident_entries, "gauge");
    counter("loradb_host_buffer_pool_bytes",
            "Free host buffers kept for reuse; counted against the CPU cache budget.",
            c.pooled_bytes, "gauge");
    if (tiers::DeviceSlots* d = tiers_->device()) {
      tiers::DeviceSlotsStats s = d->stats();
      counter("loradb_device_hits_total", "Adapters already in a device slot.", s.hits);
      counter("loradb_device_misses_total", "Adapters copied into a device slot.", s.misses);
      counter("loradb_device_evictions_total", "Device slot evictions.", s.evictions);
      counter("loradb_device_resident_adapters", "Adapters in device slots.", s.resident_adapters,
              "gauge");
    }
  }

 private:
  std::shared_ptr<Store> store_;
  std::shared_ptr<tiers::StoreTiers> tiers_;  // store_'s tiers (aliasing store_'s ownership)
  mutable std::mutex mu_;
  std::map<uint64_t, tiers::CpuLease> pins_;
};

}  // namespace

absl::Status AddTierRoutes(std::shared_ptr<Store> store, Server* server) {
  if (store == nullptr || store->tiers() == nullptr) {
    return absl::FailedPreconditionError(
        "the tier routes need a Store opened with tiers (StoreOptions::tiers)");
  }
  auto api = std::make_shared<TierApi>(std::move(store));
  Router* r = server->router();
  json place = {
      {"type", "object"},
      {"required", {"revision", "tier", "slot", "cpu_leases", "device_leases", "pinned"}},
      {"properties",
       {{"revision", {{"type", "integer"}}},
        {"tier", {{"type", "string"}, {"enum", {"storage", "cpu", "gpu"}}}},
        {"slot", {{"type", json::array({"integer", "null"})}}},
        {"cpu_leases", {{"type", "integer"}}},
        {"device_leases", {{"type", "integer"}}},
        {"device_bytes", {{"type", "integer"}}},
        {"tp",
         {{"type", "object"},
          {"required", {"rank", "degree"}},
          {"properties", {{"rank", {{"type", "integer"}}}, {"degree", {{"type", "integer"}}}}}}},
        {"pinned", {{"type", "boolean"}}}}}};
  r->AddSchemas({{"TierPlace", place}});
  json place_ref = {{"$ref", "#/components/schemas/TierPlace"}};
  json tiers_list = {{"type", "object"},
                     {"required", {"tiers"}},
                     {"properties",
                      {{"tiers", {{"type", "array"}, {"items", {{"type", "object"}}}}},
                       {"loader", {{"type", "object"}}},
                       {"tp", {{"type", "object"}}}}}};
  LORADB_RETURN_IF_ERROR(r->Add(MakeRoute(
      "GET", "/v1/residency", [api](const Call& c) { return api->GetResidency(c); },
      Operation("What is in each tier: entries, bytes, budgets, fragmentation", "tiers",
                {{"200", ResponseSpec("residency", tiers_list)}}))));
  LORADB_RETURN_IF_ERROR(r->Add(MakeRoute(
      "GET", "/v1/stats", [api](const Call& c) { return api->GetStats(c); },
      Operation("Cache, device and loader counters", "tiers",
                {{"200", ResponseSpec("stats", tiers_list)}}))));
  LORADB_RETURN_IF_ERROR(r->Add(MakeRoute(
      "GET", "/v1/revisions/{id}/residency", [api](const Call& c) { return api->GetPlace(c); },
      Operation("The live tier of a revision (and its device slot)", "tiers",
                {{"200", ResponseSpec("the place", place_ref)}}),
      {"id"})));
  LORADB_RETURN_IF_ERROR(r->Add(MakeRoute(
      "POST", "/v1/revisions/{id}/prefetch", [api](const Call& c) { return api->Prefetch(c); },
      Operation("Start loading a revision into the CPU cache (429 when the load queue is full)",
                "tiers", {{"202", ResponseSpec("accepted", place_ref)}}),
      {"id"})));
  LORADB_RETURN_IF_ERROR(r->Add(
      MakeRoute("POST", "/v1/revisions/{id}/evict", [api](const Call& c) { return api->Evict(c); },
                Operation("Drop a revision from the CPU cache (409 while leased or loading)",
                          "tiers", {{"200", ResponseSpec("evicted", place_ref)}}),
                {"id"})));
  LORADB_RETURN_IF_ERROR(r->Add(
      MakeRoute("POST", "/v1/revisions/{id}/pin", [api](const Call& c) { return api->Pin(c); },
                Operation("Load and pin a revision in the CPU cache until unpinned", "tiers",
                          {{"200", ResponseSpec("pinned", place_ref)}}),
                {"id"})));
  LORADB_RETURN_IF_ERROR(r->Add(MakeRoute(
      "DELETE", "/v1/revisions/{id}/pin", [api](const Call& c) { return api->Unpin(c); },
      Operation("Release the API's pin", "tiers", {{"200", ResponseSpec("unpinned", place_ref)}}),
      {"id"})));
  server->AddMetricsSource([api](std::string* out) { api->Metrics(out); });
  return absl::OkStatus();
}

}  // namespace loradb::http
