// The C API's plumbing: the handle registry, status and string conversion, and the calls that
// need no handle (loradb_version, loradb_status_name, loradb_free).
#include <cstdlib>
#include <cstring>
#include <string>

#include "api/c/internal.h"

namespace loradb::capi {

HandleRegistry& Registry() {
  static auto* registry = new HandleRegistry();
  return *registry;
}

char* CopyString(const std::string& s) {
  char* out = static_cast<char*>(std::malloc(s.size() + 1));
  if (out == nullptr) return nullptr;
  std::memcpy(out, s.data(), s.size());
  out[s.size()] = '\0';
  return out;
}

loradb_status_t CodeFor(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kOk:
      return LORADB_OK;
    case absl::StatusCode::kInvalidArgument:
      return LORADB_INVALID_ARGUMENT;
    case absl::StatusCode::kOutOfRange:
      return LORADB_OUT_OF_RANGE;
    case absl::StatusCode::kNotFound:
      return LORADB_NOT_FOUND;
    case absl::StatusCode::kAlreadyExists:
      return LORADB_ALREADY_EXISTS;
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kAborted:
      return LORADB_CONFLICT;
    case absl::StatusCode::kResourceExhausted:
      return LORADB_RESOURCE_EXHAUSTED;
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kCancelled:
    case absl::StatusCode::kDeadlineExceeded:
      return LORADB_UNAVAILABLE;
    case absl::StatusCode::kDataLoss:
      return LORADB_CORRUPT;
    case absl::StatusCode::kUnimplemented:
      return LORADB_UNIMPLEMENTED;
    case absl::StatusCode::kPermissionDenied:
    case absl::StatusCode::kUnknown:
      return LORADB_IO_ERROR;
    default:
      return LORADB_INTERNAL;
  }
}

// Reports `status` through `errmsg` (when given) and returns its code.
loradb_status_t Report(const absl::Status& status, char** errmsg) {
  if (errmsg != nullptr)
    *errmsg = status.ok() ? nullptr : CopyString(std::string(status.message()));
  return CodeFor(status.code());
}

loradb_status_t Fail(loradb_status_t code, const std::string& message, char** errmsg) {
  if (errmsg != nullptr) *errmsg = CopyString(message);
  return code;
}

// A (pointer, length) byte string; NULL is allowed only with length 0.
bool ToString(const char* p, size_t len, std::string* out) {
  if (p == nullptr) {
    out->clear();
    return len == 0;
  }
  out->assign(p, len);
  return true;
}

loradb_status_t ReturnJson(const nlohmann::json& j, char** json, size_t* json_len) {
  std::string text = j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  *json = CopyString(text);
  if (*json == nullptr) return LORADB_INTERNAL;
  if (json_len != nullptr) *json_len = text.size();
  return LORADB_OK;
}

}  // namespace loradb::capi

using loradb::capi::RawEnum;

extern "C" {

const char* loradb_version(void) { return "0.1.0"; }

const char* loradb_status_name(loradb_status_t status) {
  switch (RawEnum(status)) {
    case LORADB_OK:
      return "LORADB_OK";
    case LORADB_INVALID_ARGUMENT:
      return "LORADB_INVALID_ARGUMENT";
    case LORADB_NOT_FOUND:
      return "LORADB_NOT_FOUND";
    case LORADB_ALREADY_EXISTS:
      return "LORADB_ALREADY_EXISTS";
    case LORADB_CONFLICT:
      return "LORADB_CONFLICT";
    case LORADB_RESOURCE_EXHAUSTED:
      return "LORADB_RESOURCE_EXHAUSTED";
    case LORADB_UNAVAILABLE:
      return "LORADB_UNAVAILABLE";
    case LORADB_IO_ERROR:
      return "LORADB_IO_ERROR";
    case LORADB_CORRUPT:
      return "LORADB_CORRUPT";
    case LORADB_INTERNAL:
      return "LORADB_INTERNAL";
    case LORADB_UNIMPLEMENTED:
      return "LORADB_UNIMPLEMENTED";
    case LORADB_INVALID_HANDLE:
      return "LORADB_INVALID_HANDLE";
    case LORADB_OUT_OF_RANGE:
      return "LORADB_OUT_OF_RANGE";
  }
  return "LORADB_UNKNOWN_STATUS";
}

void loradb_free(void* ptr) { std::free(ptr); }

}  // extern "C"
