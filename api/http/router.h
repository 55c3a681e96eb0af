// The HTTP admin endpoint's routing layer: a table of routes (method + path pattern + handler +
// OpenAPI description), path matching with percent-decoded, validated segments, JSON request
// helpers, and the one place that maps absl::StatusCode to an HTTP status and error code.
// Independent of the HTTP library so it can be unit-tested without sockets.
#ifndef LORADB_API_HTTP_ROUTER_H_
#define LORADB_API_HTTP_ROUTER_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace loradb::http {

class ReplyStream;  // reply_stream.h

// One request as a handler sees it. Path parameters are percent-decoded and validated (valid
// UTF-8, no NUL, not "." or ".."); query values are decoded by the HTTP library.
struct Call {
  std::string method;
  std::string route;  // the matched pattern, e.g. "/v1/revisions/{id}"
  std::map<std::string, std::string> params;
  std::multimap<std::string, std::string> query;
  std::string body;
  std::string content_type;
  std::string content_encoding;  // e.g. "zstd"; empty when absent
  std::string accept;            // the Accept header; empty when absent

  // The path parameter `name` (always present for a matched route).
  const std::string& Param(const std::string& name) const;
  // The first query value of `name`, if any.
  std::optional<std::string> Query(const std::string& name) const;
};

// What a handler returns on success. Errors are returned as a non-OK absl::Status instead.
struct Reply {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;
  // Set: the body (streamed) or the whole reply (deferred) comes later from another thread;
  // see reply_stream.h. `body` is then unused.
  std::shared_ptr<ReplyStream> stream;

  // A JSON reply; strings that are not valid UTF-8 are replaced, never thrown on.
  static Reply Json(const nlohmann::json& j, int status = 200);
  static Reply Text(std::string body, std::string content_type, int status = 200);
};

using Handler = std::function<absl::StatusOr<Reply>(const Call&)>;

// A route: method (GET, POST, PUT, PATCH, DELETE) + pattern of literal segments and `{name}`
// parameters. `operation` is the OpenAPI operation object without `parameters` for path
// parameters (derived from the pattern) and without the default error response (added).
struct Route {
  std::string method;
  std::string pattern;
  Handler handler;
  nlohmann::json operation;
  // Path parameters that are integers (OpenAPI type integer), e.g. {"id"}.
  std::vector<std::string> integer_params;
  // A GET that may block in file I/O (e.g. reads a blob): the event-loop engine answers it on
  // its blocking-read pool instead of the loop thread (see MayBlock).
  bool blocking = false;
  // How the caller proves it holds the server's token:
  // - kBearer: `Authorization: Bearer TOKEN` on mutating calls (and on reads with auth_reads);
  //   without a token mutating calls are refused.
  // - kBearerIfToken (the OpenAI-compatible serving routes): the bearer token on every call,
  //   whatever the method, exactly when the server has one (the OpenAI SDK sends its api_key
  //   so); without a token (a loopback listener) the route is open, like reads.
  // - kApiKey (protocol routes whose clients send `X-API-Key`, such as the Tinker SDK): the key
  //   (or a bearer token) must equal the token on every call when one is configured; without a
  //   token any key is accepted.
  enum class Auth { kBearer, kBearerIfToken, kApiKey };
  Auth auth = Auth::kBearer;
};

// Builds a Route (aggregate initialisation would need every field spelled out).
Route MakeRoute(std::string method, std::string pattern, Handler handler, nlohmann::json operation,
                std::vector<std::string> integer_params = {});

// OpenAPI helpers: a response object {"description", "content": {media: {"schema"}}} and an
// operation object {"summary", "tags", "responses"}.
nlohmann::json ResponseSpec(const std::string& description, nlohmann::json schema,
                            const std::string& media = "application/json");
nlohmann::json Operation(const std::string& summary, const std::string& tag,
                         nlohmann::json responses);

// The result of matching a request against the table.
struct Match {
  const Route* route = nullptr;
  std::map<std::string, std::string> params;
};

class Router {
 public:
  // Adds a route. Fails on an unsupported method, a malformed pattern or a duplicate.
  [[nodiscard]] absl::Status Add(Route route);

  // Matches the raw request target (path + optional query, still percent-encoded). NotFound when
  // no pattern matches; FailedPrecondition("method_not_allowed") when the path matches with
  // another method (see IsMethodNotAllowed); InvalidArgument for a malformed path.
  [[nodiscard]] absl::StatusOr<Match> Resolve(const std::string& method,
                                              const std::string& target) const;

  const std::vector<Route>& routes() const { return routes_; }

  // True when `target` (raw path + optional query) has the shape of a GET route marked
  // `blocking`: literal segments equal, parameters non-empty (not decoded or validated; the
  // handler's Resolve does that). Cheap when no route is blocking; thread-safe once routes are
  // no longer added.
  bool MayBlock(const std::string& target) const;

  // Documents every path parameter called `name` with `schema` and an `example` value.
  void SetParamSchema(const std::string& name, nlohmann::json schema, nlohmann::json example);

  // Adds component schemas (name -> JSON Schema) to the OpenAPI document.
  void AddSchemas(const nlohmann::json& schemas);

  // The OpenAPI 3.1 document describing every route in the table.
  nlohmann::json OpenApi(const std::string& title, const std::string& version) const;

 private:
  std::vector<Route> routes_;
  std::vector<std::vector<std::string>> blocking_patterns_;  // segments of blocking GET routes
  nlohmann::json schemas_ = nlohmann::json::object();
  std::map<std::string, std::pair<nlohmann::json, nlohmann::json>> param_schemas_;
};

// True when `status` is the Resolve error meaning "known path, other method".
bool IsMethodNotAllowed(const absl::Status& status);

// Percent-decodes one path segment; InvalidArgument on a bad escape, invalid UTF-8, NUL or a
// "."/".." segment.
[[nodiscard]] absl::StatusOr<std::string> DecodePathSegment(absl::string_view segment);

// True when `s` is well-formed UTF-8 (no overlongs, no surrogates, <= U+10FFFF).
bool IsValidUtf8(absl::string_view s);

// The HTTP status for an absl status code (the only place this mapping lives).
int HttpStatusFor(absl::StatusCode code);
// The stable error code string for an absl status code, e.g. "not_found".
std::string ErrorCodeFor(absl::StatusCode code);
// {"error":{"code":..,"message":..}} with the matching HTTP status; ResourceExhausted gets a
// Retry-After header (seconds, rounded up, from the "type.loradb.dev/retry_after_ms" status
// payload that storage/tiers attaches, else 1).
Reply ErrorReply(const absl::Status& status);
// An error reply for a status the HTTP layer itself produces (e.g. 413, 401).
Reply ErrorReply(int http_status, const std::string& code, const std::string& message);

// Parses `call.body` as a JSON object whose keys are all in `allowed`. InvalidArgument on
// malformed JSON, invalid UTF-8, a non-object, or an unknown field (named in the message). An
// empty body is an empty object.
[[nodiscard]] absl::StatusOr<nlohmann::json> ParseJsonObject(
    const Call& call, const std::vector<std::string>& allowed);

// Typed field readers for ParseJsonObject results. `required` fields missing -> InvalidArgument.
[[nodiscard]] absl::StatusOr<std::optional<std::string>> GetString(const nlohmann::json& obj,
                                                                   const std::string& key,
                                                                   bool required);
[[nodiscard]] absl::StatusOr<std::optional<uint64_t>> GetUint(const nlohmann::json& obj,
                                                              const std::string& key,
                                                              bool required);
[[nodiscard]] absl::StatusOr<std::optional<bool>> GetBool(const nlohmann::json& obj,
                                                          const std::string& key, bool required);

// Parses a decimal u64 (no sign, no spaces, no overflow); InvalidArgument naming `what`.
[[nodiscard]] absl::StatusOr<uint64_t> ParseUint(absl::string_view text, absl::string_view what);

}  // namespace loradb::http

#endif  // LORADB_API_HTTP_ROUTER_H_
