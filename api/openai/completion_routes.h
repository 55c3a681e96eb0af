// The OpenAI-compatible serving routes, as vLLM implements them, on the one HTTP endpoint
// (api/http): `POST /v1/completions` and `GET /v1/models` over a serving::CompletionService,
// plus `GET /v1/serving/stats` (the decoder's counters as JSON) and the same counters on
// /metrics. docs/openai-api.md lists every field served, refused, and where it differs from
// vLLM.
//
// Every request joins the service's running decoder; a streamed completion is written one
// server-sent event per generated token as the driver thread produces it, and a non-streamed one
// is answered when it finishes, neither holding an HTTP thread meanwhile (reply_stream.h). A
// client that disconnects cancels its request. The routes need the bearer token exactly when the
// server has one (Route::Auth::kBearerIfToken).
//
// Built only with LibTorch (the library `loradb_openai`); the header itself is LibTorch-free.
#ifndef LORADB_API_OPENAI_COMPLETION_ROUTES_H_
#define LORADB_API_OPENAI_COMPLETION_ROUTES_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "api/http/server.h"
#include "compute/serving/completion_service.h"
#include "text/tokenizer.h"

namespace loradb::openai {

struct CompletionRoutesOptions {
  // The base's tokenizer (tokenizer.json), for text prompts, stop strings and the `text` of
  // replies; null: token-id prompts only, and replies carry empty text (ask return_token_ids).
  std::shared_ptr<const text::Tokenizer> tokenizer;
  // Where the tokenizer was looked for, named in the error a text prompt gets without one.
  std::string tokenizer_path;
  // The base's end-of-sequence ids (config.json's eos_token_id): generation stops at them
  // unless a request sets ignore_eos, as vLLM does.
  std::vector<int64_t> eos_token_ids;
};

// Adds the routes to `server` (before it serves). `service` must outlive the server's Serve.
[[nodiscard]] absl::Status AddCompletionRoutes(std::shared_ptr<serving::CompletionService> service,
                                               CompletionRoutesOptions options,
                                               http::Server* server);

// What `loradb serve --model` does: starts a CompletionService on `options.model_dir` over
// `store` (may be null: the base alone), reads the directory's tokenizer.json (if any) and the
// eos ids of its config.json / generation_config.json, and adds the routes to `server`. The
// service returned keeps `store` alive until it is destroyed. Errors: the service's, a
// tokenizer.json that cannot be read or is unsupported, an unreadable config.
[[nodiscard]] absl::StatusOr<std::shared_ptr<serving::CompletionService>> AttachModel(
    serving::ServiceOptions options, std::shared_ptr<Store> store, http::Server* server);

}  // namespace loradb::openai

#endif  // LORADB_API_OPENAI_COMPLETION_ROUTES_H_
