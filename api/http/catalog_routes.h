// The /v1/ routes over the catalog: bases, policies (cursor pagination, create, archive), a
// policy's revisions, revisions (metadata, delete), aliases (set = promote, rollback, history),
// checkpoints (metadata). docs/http-api.md lists them; /openapi.json describes them.
#ifndef LORADB_API_HTTP_CATALOG_ROUTES_H_
#define LORADB_API_HTTP_CATALOG_ROUTES_H_

#include <memory>

#include "absl/status/status.h"
#include "api/http/server.h"
#include "storage/catalog/catalog.h"

namespace loradb::http {

// Adds the routes to `server` (before Serve). The routes share ownership of `catalog`.
[[nodiscard]] absl::Status AddCatalogRoutes(std::shared_ptr<Catalog> catalog, Server* server);

}  // namespace loradb::http

#endif  // LORADB_API_HTTP_CATALOG_ROUTES_H_
