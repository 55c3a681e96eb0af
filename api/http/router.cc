#include "api/http/router.h"

#include <algorithm>
#include <charconv>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "storage/util/json.h"
#include "storage/util/status_macros.h"

namespace loradb::http {
namespace {

constexpr char kMethodNotAllowed[] = "method_not_allowed";

bool IsParam(const std::string& seg) {
  return seg.size() > 2 && seg.front() == '{' && seg.back() == '}';
}

std::vector<std::string> PatternSegments(const std::string& pattern) {
  std::vector<std::string> out;
  for (absl::string_view s : absl::StrSplit(absl::string_view(pattern).substr(1), '/')) {
    out.emplace_back(s);
  }
  return out;
}

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

std::string Lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

}  // namespace

const std::string& Call::Param(const std::string& name) const {
  static const std::string* empty = new std::string();
  auto it = params.find(name);
  return it == params.end() ? *empty : it->second;
}

std::optional<std::string> Call::Query(const std::string& name) const {
  auto it = query.find(name);
  if (it == query.end()) return std::nullopt;
  return it->second;
}

Reply Reply::Json(const nlohmann::json& j, int status) {
  Reply r;
  r.status = status;
  r.body = j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  return r;
}

Reply Reply::Text(std::string body, std::string content_type, int status) {
  Reply r;
  r.status = status;
  r.body = std::move(body);
  r.content_type = std::move(content_type);
  return r;
}

Route MakeRoute(std::string method, std::string pattern, Handler handler, nlohmann::json operation,
                std::vector<std::string> integer_params) {
  Route r;
  r.method = std::move(method);
  r.pattern = std::move(pattern);
  r.handler = std::move(handler);
  r.operation = std::move(operation);
  r.integer_params = std::move(integer_params);
  return r;
}

nlohmann::json ResponseSpec(const std::string& description, nlohmann::json schema,
                            const std::string& media) {
  nlohmann::json content = nlohmann::json::object();
  content[media] = {{"schema", std::move(schema)}};
  return {{"description", description}, {"content", std::move(content)}};
}

nlohmann::json Operation(const std::string& summary, const std::string& tag,
                         nlohmann::json responses) {
  return {{"summary", summary},
          {"tags", nlohmann::json::array({tag})},
          {"responses", std::move(responses)}};
}

absl::Status Router::Add(Route route) {
  static const char* kMethods[] = {"GET", "POST", "PUT", "PATCH", "DELETE"};
  if (std::find(std::begin(kMethods), std::end(kMethods), route.method) == std::end(kMethods)) {
    return absl::InvalidArgumentError(absl::StrCat("unsupported method ", route.method));
  }
  if (route.pattern.empty() || route.pattern[0] != '/' || !route.handler) {
    return absl::InvalidArgumentError(absl::StrCat("malformed route ", route.pattern));
  }
  for (const Route& r : routes_) {
    if (r.method == route.method && r.pattern == route.pattern) {
      return absl::AlreadyExistsError(absl::StrCat("duplicate route ", route.pattern));
    }
  }
  if (route.blocking) {
    if (route.method != "GET") {
      return absl::InvalidArgumentError(
          absl::StrCat("only GET routes can be blocking reads: ", route.pattern));
    }
    blocking_patterns_.push_back(PatternSegments(route.pattern));
  }
  routes_.push_back(std::move(route));
  return absl::OkStatus();
}

bool Router::MayBlock(const std::string& target) const {
  if (blocking_patterns_.empty()) return false;
  absl::string_view path(target);
  size_t q = path.find('?');
  if (q != absl::string_view::npos) path = path.substr(0, q);
  if (path.empty() || path[0] != '/') return false;
  std::vector<absl::string_view> raw = absl::StrSplit(path.substr(1), '/');
  for (const std::vector<std::string>& pat : blocking_patterns_) {
    if (pat.size() != raw.size()) continue;
    bool ok = true;
    for (size_t i = 0; i < pat.size() && ok; ++i) {
      ok = IsParam(pat[i]) ? !raw[i].empty() : raw[i] == pat[i];
    }
    if (ok) return true;
  }
  return false;
}

absl::StatusOr<Match> Router::Resolve(const std::string& method, const std::string& target) const {
  absl::string_view path(target);
  size_t q = path.find('?');
  if (q != absl::string_view::npos) path = path.substr(0, q);
  if (path.empty() || path[0] != '/') return absl::InvalidArgumentError("malformed request path");
  std::vector<absl::string_view> raw = absl::StrSplit(path.substr(1), '/');
  const std::string effective = method == "HEAD" ? "GET" : method;
  bool path_matched = false;
  for (const Route& route : routes_) {
    std::vector<std::string> pat = PatternSegments(route.pattern);
    if (pat.size() != raw.size()) continue;
    Match m;
    bool ok = true;
    for (size_t i = 0; i < pat.size() && ok; ++i) {
      if (IsParam(pat[i])) {
        if (raw[i].empty()) {
          ok = false;
          break;
        }
        absl::StatusOr<std::string> decoded = DecodePathSegment(raw[i]);
        if (!decoded.ok()) return decoded.status();
        m.params[pat[i].substr(1, pat[i].size() - 2)] = *std::move(decoded);
      } else {
        ok = raw[i] == pat[i];
      }
    }
    if (!ok) continue;
    if (route.method != effective) {
      path_matched = true;
      continue;
    }
    m.route = &route;
    return m;
  }
  if (path_matched) return absl::FailedPreconditionError(kMethodNotAllowed);
  return absl::NotFoundError(absl::StrCat("no route for ", method, " ", path));
}

bool IsMethodNotAllowed(const absl::Status& status) {
  return status.code() == absl::StatusCode::kFailedPrecondition &&
         status.message() == kMethodNotAllowed;
}

absl::StatusOr<std::string> DecodePathSegment(absl::string_view segment) {
  std::string out;
  out.reserve(segment.size());
  for (size_t i = 0; i < segment.size(); ++i) {
    char c = segment[i];
    if (c == '%') {
      if (i + 2 >= segment.size()) {
        return absl::InvalidArgumentError("malformed percent escape in path");
      }
      int hi = HexValue(segment[i + 1]), lo = HexValue(segment[i + 2]);
      if (hi < 0 || lo < 0) return absl::InvalidArgumentError("malformed percent escape in path");
      out.push_back(static_cast<char>(hi * 16 + lo));
      i += 2;
    } else {
      out.push_back(c);
    }
  }
  if (out.find('\0') != std::string::npos) {
    return absl::InvalidArgumentError("NUL byte in path");
  }
  if (!IsValidUtf8(out)) return absl::InvalidArgumentError("path is not valid UTF-8");
  if (out == "." || out == "..") {
    return absl::InvalidArgumentError("'.' and '..' are not valid names");
  }
  return out;
}

bool IsValidUtf8(absl::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  size_t n = s.size(), i = 0;
  while (i < n) {
    unsigned char c = p[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t len;
    uint32_t cp;
    if (c >= 0xC2 && c <= 0xDF) {
      len = 2;
      cp = c & 0x1F;
    } else if (c >= 0xE0 && c <= 0xEF) {
      len = 3;
      cp = c & 0x0F;
    } else if (c >= 0xF0 && c <= 0xF4) {
      len = 4;
      cp = c & 0x07;
    } else {
      return false;
    }
    if (i + len > n) return false;
    for (size_t k = 1; k < len; ++k) {
      if ((p[i + k] & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (p[i + k] & 0x3F);
    }
    if ((len == 3 && cp < 0x800) || (len == 4 && (cp < 0x10000 || cp > 0x10FFFF)) ||
        (cp >= 0xD800 && cp <= 0xDFFF)) {
      return false;
    }
    i += len;
  }
  return true;
}

int HttpStatusFor(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kOk:
      return 200;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
      return 400;
    case absl::StatusCode::kUnauthenticated:
      return 401;
    case absl::StatusCode::kPermissionDenied:
      return 403;
    case absl::StatusCode::kNotFound:
      return 404;
    case absl::StatusCode::kAlreadyExists:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kAborted:
      return 409;
    case absl::StatusCode::kResourceExhausted:
      return 429;
    case absl::StatusCode::kUnimplemented:
      return 501;
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kCancelled:
      return 503;
    case absl::StatusCode::kDeadlineExceeded:
      return 504;
    default:
      return 500;
  }
}

std::string ErrorCodeFor(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kInvalidArgument:
      return "invalid_argument";
    case absl::StatusCode::kOutOfRange:
      return "out_of_range";
    case absl::StatusCode::kUnauthenticated:
      return "unauthenticated";
    case absl::StatusCode::kPermissionDenied:
      return "permission_denied";
    case absl::StatusCode::kNotFound:
      return "not_found";
    case absl::StatusCode::kAlreadyExists:
      return "already_exists";
    case absl::StatusCode::kFailedPrecondition:
      return "failed_precondition";
    case absl::StatusCode::kAborted:
      return "aborted";
    case absl::StatusCode::kResourceExhausted:
      return "resource_exhausted";
    case absl::StatusCode::kUnimplemented:
      return "unimplemented";
    case absl::StatusCode::kUnavailable:
      return "unavailable";
    case absl::StatusCode::kCancelled:
      return "cancelled";
    case absl::StatusCode::kDeadlineExceeded:
      return "deadline_exceeded";
    case absl::StatusCode::kDataLoss:
      return "data_loss";
    default:
      return "internal";
  }
}

Reply ErrorReply(int http_status, const std::string& code, const std::string& message) {
  Reply r = Reply::Json({{"error", {{"code", code}, {"message", message}}}}, http_status);
  if (http_status == 401) r.headers.emplace_back("WWW-Authenticate", "Bearer");
  return r;
}

Reply ErrorReply(const absl::Status& status) {
  Reply r = ErrorReply(HttpStatusFor(status.code()), ErrorCodeFor(status.code()),
                       std::string(status.message()));
  if (status.code() == absl::StatusCode::kResourceExhausted ||
      status.code() == absl::StatusCode::kUnavailable) {
    uint64_t seconds = 1;
    // storage/tiers (CpuCache) attaches its hint under this type URL.
    auto hint = status.GetPayload("type.loradb.dev/retry_after_ms");
    if (!hint.has_value()) hint = status.GetPayload("retry_after_ms");
    if (hint.has_value()) {
      std::string ms(*hint);
      uint64_t v = 0;
      auto [ptr, ec] = std::from_chars(ms.data(), ms.data() + ms.size(), v);
      if (ec == std::errc() && ptr == ms.data() + ms.size())
        seconds = std::max<uint64_t>(1, (v + 999) / 1000);
    }
    r.headers.emplace_back("Retry-After", std::to_string(seconds));
  }
  return r;
}

absl::StatusOr<nlohmann::json> ParseJsonObject(const Call& call,
                                               const std::vector<std::string>& allowed) {
  if (call.body.empty()) return nlohmann::json::object();
  if (!IsValidUtf8(call.body)) return absl::InvalidArgumentError("request body is not valid UTF-8");
  LORADB_ASSIGN_OR_RETURN(nlohmann::json j, ParseJson(call.body, "request body"));
  if (!j.is_object()) return absl::InvalidArgumentError("request body must be a JSON object");
  for (const auto& [key, value] : j.items()) {
    if (std::find(allowed.begin(), allowed.end(), key) == allowed.end()) {
      return absl::InvalidArgumentError(absl::StrCat("unknown field '", key, "'"));
    }
  }
  return j;
}

absl::StatusOr<std::optional<std::string>> GetString(const nlohmann::json& obj,
                                                     const std::string& key, bool required) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) {
    if (required) return absl::InvalidArgumentError(absl::StrCat("missing field '", key, "'"));
    return std::optional<std::string>();
  }
  if (!it->is_string()) {
    return absl::InvalidArgumentError(absl::StrCat("field '", key, "' must be a string"));
  }
  return std::optional<std::string>(it->get<std::string>());
}

absl::StatusOr<std::optional<uint64_t>> GetUint(const nlohmann::json& obj, const std::string& key,
                                                bool required) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) {
    if (required) return absl::InvalidArgumentError(absl::StrCat("missing field '", key, "'"));
    return std::optional<uint64_t>();
  }
  if (!it->is_number_unsigned()) {
    return absl::InvalidArgumentError(
        absl::StrCat("field '", key, "' must be a non-negative integer"));
  }
  return std::optional<uint64_t>(it->get<uint64_t>());
}

absl::StatusOr<std::optional<bool>> GetBool(const nlohmann::json& obj, const std::string& key,
                                            bool required) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) {
    if (required) return absl::InvalidArgumentError(absl::StrCat("missing field '", key, "'"));
    return std::optional<bool>();
  }
  if (!it->is_boolean()) {
    return absl::InvalidArgumentError(absl::StrCat("field '", key, "' must be a boolean"));
  }
  return std::optional<bool>(it->get<bool>());
}

absl::StatusOr<uint64_t> ParseUint(absl::string_view text, absl::string_view what) {
  uint64_t v = 0;
  if (text.empty() || text.size() > 20) {
    return absl::InvalidArgumentError(absl::StrCat(what, " must be a non-negative integer"));
  }
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || ptr != text.data() + text.size()) {
    return absl::InvalidArgumentError(absl::StrCat(what, " must be a non-negative integer"));
  }
  return v;
}

void Router::SetParamSchema(const std::string& name, nlohmann::json schema,
                            nlohmann::json example) {
  param_schemas_[name] = {std::move(schema), std::move(example)};
}

void Router::AddSchemas(const nlohmann::json& schemas) {
  for (const auto& [name, schema] : schemas.items()) schemas_[name] = schema;
}

nlohmann::json Router::OpenApi(const std::string& title, const std::string& version) const {
  using nlohmann::json;
  json paths = json::object();
  for (const Route& route : routes_) {
    json op = route.operation.is_object() ? route.operation : json::object();
    json params = op.contains("parameters") ? op["parameters"] : json::array();
    for (const std::string& seg : PatternSegments(route.pattern)) {
      if (!IsParam(seg)) continue;
      std::string name = seg.substr(1, seg.size() - 2);
      bool is_int = std::find(route.integer_params.begin(), route.integer_params.end(), name) !=
                    route.integer_params.end();
      json schema = is_int ? json{{"type", "integer"}, {"minimum", 0}}
                           : json{{"type", "string"}, {"minLength", 1}};
      json param = {{"name", name}, {"in", "path"}, {"required", true}, {"schema", schema}};
      auto custom = param_schemas_.find(name);
      if (custom != param_schemas_.end()) {
        param["schema"] = custom->second.first;
        param["example"] = custom->second.second;
      }
      params.push_back(std::move(param));
    }
    if (!params.empty()) op["parameters"] = params;
    if (!op.contains("operationId")) {
      std::string id = Lower(route.method);
      for (char c : route.pattern)
        id.push_back(std::isalnum(static_cast<unsigned char>(c)) ? c : '_');
      op["operationId"] = id;
    }
    if (!op.contains("responses")) op["responses"] = json::object();
    op["responses"]["default"] = {
        {"description", "error"},
        {"content",
         {{"application/json", {{"schema", {{"$ref", "#/components/schemas/Error"}}}}}}}};
    if (route.method != "GET") op["security"] = json::array({json{{"bearer", json::array()}}});
    paths[route.pattern][Lower(route.method)] = op;
  }
  json error_schema = {
      {"type", "object"},
      {"required", {"error"}},
      {"properties",
       {{"error",
         {{"type", "object"},
          {"required", {"code", "message"}},
          {"properties", {{"code", {{"type", "string"}}}, {"message", {{"type", "string"}}}}}}}}}};
  json schemas = schemas_;
  schemas["Error"] = error_schema;
  return {{"openapi", "3.1.0"},
          {"info", {{"title", title}, {"version", version}}},
          {"paths", paths},
          {"components",
           {{"schemas", schemas},
            {"securitySchemes", {{"bearer", {{"type", "http"}, {"scheme", "bearer"}}}}}}}};
}

}  // namespace loradb::http
