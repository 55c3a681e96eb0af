// The /v1/ routes over the Store: bases, policies (cursor pagination, create, archive), a
// policy's revisions, revisions (metadata, tensors, tier, delete), aliases (set = promote,
// rollback, history, locate), checkpoints (metadata). docs/http-api.md lists them;
// /openapi.json describes them.
#ifndef LORADB_API_HTTP_STORE_ROUTES_H_
#define LORADB_API_HTTP_STORE_ROUTES_H_

#include <memory>

#include "absl/status/status.h"
#include "api/http/server.h"
#include "storage/store/store.h"

namespace loradb::http {

// Adds the routes to `server` (before Serve). The routes share ownership of `store`.
[[nodiscard]] absl::Status AddStoreRoutes(std::shared_ptr<Store> store, Server* server);

}  // namespace loradb::http

#endif  // LORADB_API_HTTP_STORE_ROUTES_H_
