// The tier routes report the tensor-parallel placement and the host-buffer pool: /v1/stats and
// /v1/residency carry the TP rank/degree and whether the CPU tier holds derived blobs, a
// revision's residency carries its device-slot bytes (the rank's shard) and the placement, and
// the CPU entry shows the pooled bytes beside the budget. Handlers are called through the router.
#include "api/http/tier_routes.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "api/http/server.h"
#include "storage/store/store.h"
#include "storage/store/store_tiers.h"
#include "tests/storage/adapter_test_util.h"
#include "tests/test_util.h"

namespace loradb::http {
namespace {

nlohmann::json Get(Server& server, const std::string& target) {
  absl::StatusOr<Match> m = server.router()->Resolve("GET", target);
  EXPECT_TRUE(m.ok()) << m.status();
  if (!m.ok()) return nullptr;
  Call call;
  call.method = "GET";
  call.route = m->route->pattern;
  call.params = m->params;
  absl::StatusOr<Reply> r = m->route->handler(call);
  EXPECT_TRUE(r.ok()) << r.status();
  if (!r.ok()) return nullptr;
  EXPECT_EQ(r->status, 200);
  return nlohmann::json::parse(r->body);
}

nlohmann::json Tier(const nlohmann::json& list, const std::string& name) {
  for (const auto& t : list) {
    if (t["tier"] == name) return t;
  }
  ADD_FAILURE() << "no tier " << name << " in " << list.dump();
  return nlohmann::json::object();
}

TEST(TierRoutesTest, StatsAndResidencyReportTheTpPlacementAndPool) {
  testing::TempDir dir;
  StoreOptions so;
  so.tiers.emplace();
  so.tiers->cpu.budget_bytes = 64 << 20;
  so.tiers->device = tiers::DeviceKind::kHost;
  so.tiers->slots.arena_bytes = 1 << 20;
  so.tiers->slots.page_bytes = 256;
  so.tiers->slots.tp = {1, 2};
  so.tiers->tp_derived_dir = dir.file("derived");
  auto opened = loradb::testing::OpenStoreWithPolicy(
      dir.file("store"), "tiny",
      R"({"modules": [{"name": "layers.0.self_attn.q_proj", "in": 8, "out": 16}]})", "acme/tp", so);
  ASSERT_TRUE(opened.ok()) << opened.status();
  std::shared_ptr<Store> store = std::move(*opened);
  loradb::testing::Adapter a;
  a.Add("layers.0.self_attn.q_proj", false, 2, 8, 1.0f);
  a.Add("layers.0.self_attn.q_proj", true, 16, 2, 2.0f);
  auto rev = store->PublishTensors("acme/tp", a.views, {});
  ASSERT_TRUE(rev.ok()) << rev.status();

  ServerOptions o;
  o.port = 0;
  auto server = Server::Create(o);
  ASSERT_TRUE(server.ok()) << server.status();
  std::shared_ptr<tiers::StoreTiers> t(store, store->tiers());
  ASSERT_TRUE(AddTierRoutes(store, server->get()).ok());

  auto lease = t->device()->AcquireBatch(std::vector<uint64_t>{rev->id});
  ASSERT_TRUE(lease.ok()) << lease.status();
  // Rank 1 of 2: A (2x8) whole, B (16x2) rows 8..15.
  const uint64_t shard_bytes = (2 * 8 + 8 * 2) * sizeof(float);

  nlohmann::json place = Get(**server, absl::StrCat("/v1/revisions/", rev->id, "/residency"));
  EXPECT_EQ(place["tier"], "gpu");
  EXPECT_EQ(place["device_bytes"], shard_bytes);
  EXPECT_EQ(place["tp"]["rank"], 1);
  EXPECT_EQ(place["tp"]["degree"], 2);

  nlohmann::json stats = Get(**server, "/v1/stats");
  EXPECT_EQ(stats["tp"]["rank"], 1);
  EXPECT_EQ(stats["tp"]["degree"], 2);
  EXPECT_EQ(stats["tp"]["derived"], true);
  const nlohmann::json cpu = Tier(stats["tiers"], "cpu");
  EXPECT_EQ(cpu["budget_bytes"], uint64_t{64} << 20);
  EXPECT_LE(cpu["resident_bytes"].get<uint64_t>() + cpu["pooled_bytes"].get<uint64_t>(),
            cpu["budget_bytes"].get<uint64_t>());
  EXPECT_LE(cpu["pool_cap_bytes"].get<uint64_t>(), cpu["budget_bytes"].get<uint64_t>());
  EXPECT_EQ(Tier(stats["tiers"], "gpu")["payload_bytes"], shard_bytes);

  nlohmann::json residency = Get(**server, "/v1/residency");
  const nlohmann::json gpu = Tier(residency["tiers"], "gpu");
  EXPECT_EQ(gpu["tp"]["degree"], 2);
  EXPECT_EQ(gpu["bytes"], shard_bytes);
  EXPECT_TRUE(Tier(residency["tiers"], "cpu").contains("pooled_bytes"));
}

TEST(TierRoutesTest, WithoutAPlacementTheDegreeIsOne) {
  testing::TempDir dir;
  StoreOptions so;
  so.tiers.emplace();
  so.tiers->device = tiers::DeviceKind::kNone;
  auto opened = Store::Open(dir.file("store"), so);
  ASSERT_TRUE(opened.ok()) << opened.status();
  std::shared_ptr<Store> store = std::move(*opened);
  ServerOptions o;
  o.port = 0;
  auto server = Server::Create(o);
  ASSERT_TRUE(server.ok());
  ASSERT_TRUE(AddTierRoutes(store, server->get()).ok());
  nlohmann::json stats = Get(**server, "/v1/stats");
  EXPECT_EQ(stats["tp"]["rank"], 0);
  EXPECT_EQ(stats["tp"]["degree"], 1);
  EXPECT_EQ(stats["tp"]["derived"], false);
  // A revision the catalog does not know has no residency: NotFound (404), not a "storage" place.
  absl::StatusOr<Match> m = (*server)->router()->Resolve("GET", "/v1/revisions/7/residency");
  ASSERT_TRUE(m.ok()) << m.status();
  Call call;
  call.method = "GET";
  call.params = m->params;
  absl::StatusOr<Reply> missing = m->route->handler(call);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound) << missing.status();
}

TEST(TierRoutesTest, NeedAStoreWithTiers) {
  testing::TempDir dir;
  auto opened = Store::Open(dir.file("store"));
  ASSERT_TRUE(opened.ok()) << opened.status();
  auto server = Server::Create(ServerOptions{});
  ASSERT_TRUE(server.ok());
  EXPECT_EQ(AddTierRoutes(std::move(*opened), server->get()).code(),
            absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace loradb::http
