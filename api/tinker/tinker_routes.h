// The Tinker-compatible training and sampling routes (docs/tinker-protocol.md): the `/api/v1/...`
// calls of Thinking Machines' `tinker` Python SDK, on the one HTTP endpoint, over compute's
// LibTorch-free training service (training runs, forward/backward, Adam steps, checkpoints,
// publishing) and completion service (sampling sessions on the base or a published revision).
//
// Every route authenticates with the SDK's `X-API-Key` header (http::Route::Auth::kApiKey).
// Errors the caller made are 400/404 with the endpoint's one error shape, never a status the SDK
// retries (408, 409, 429, 5xx); a long call answers a future at once and `retrieve_future` holds
// the poll open while it runs.
#ifndef LORADB_API_TINKER_TINKER_ROUTES_H_
#define LORADB_API_TINKER_TINKER_ROUTES_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "api/http/server.h"
#include "storage/store/store.h"

namespace loradb::tinker {

struct TinkerRoutesOptions {
  // The served base: a Hugging Face checkpoint directory (Qwen3 family).
  std::string model_dir;
  // The base's name in the store and the `base_model` clients pass; default: the model
  // directory's last component. Registered from config.json when the store lacks it.
  std::string base_name;
  // LibTorch intra-op threads (0: LibTorch's setting).
  int64_t threads = 0;
  // TrainingServiceOptions::shared_batches.
  bool shared_batches = false;
  // How long retrieve_future holds a poll open for a pending call before answering try_again
  // (the SDK's poll times out after 45 s).
  absl::Duration poll_wait = absl::Seconds(20);
  // Largest inflated forward_backward body (zstd).
  size_t max_inflated_bytes = size_t{256} << 20;
};

// Loads the model into a training service and a completion service over `store` and adds the
// Tinker routes to `server` (before Serve). The services live as long as the routes. Errors: the
// model's load errors, a route that clashes with one already added.
[[nodiscard]] absl::Status AddTinkerRoutes(std::shared_ptr<Store> store,
                                           const TinkerRoutesOptions& options,
                                           http::Server* server);

}  // namespace loradb::tinker

#endif  // LORADB_API_TINKER_TINKER_ROUTES_H_
