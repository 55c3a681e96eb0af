// The /v1/ routes over the residency tiers attached to the Store (storage/tiers StoreTiers):
// residency per tier, cache/device/loader stats, a revision's live tier, prefetch, evict, pin.
#ifndef LORADB_API_HTTP_TIER_ROUTES_H_
#define LORADB_API_HTTP_TIER_ROUTES_H_

#include <memory>

#include "absl/status/status.h"
#include "api/http/server.h"
#include "storage/store/store_tiers.h"

namespace loradb::http {

// Adds the routes and a /metrics source over the tiers `store` owns (StoreOptions::tiers;
// FailedPrecondition when it has none). The routes share ownership of `store`; pins taken
// through the API are released when the server (its routes) is destroyed.
[[nodiscard]] absl::Status AddTierRoutes(std::shared_ptr<Store> store, Server* server);

}  // namespace loradb::http

#endif  // LORADB_API_HTTP_TIER_ROUTES_H_
