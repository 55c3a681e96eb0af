// The C API (loradb.h) over loradb::Store. Every entry point converts its arguments, calls the
// C++ API, and turns the absl::Status into a loradb_status_t plus an allocated message. No C++
// exception crosses this boundary: each entry point catches everything and reports
// LORADB_INTERNAL (std::bad_alloc included).
#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <new>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "api/c/loradb.h"
#include "storage/store/record_json.h"
#include "storage/maintenance/maintenance.h"
#include "storage/store/store.h"
#include "storage/store/store_tiers.h"
#include "storage/util/json.h"
#include "storage/util/status_macros.h"

struct loradb_store_t {
  std::unique_ptr<loradb::Store> store;
  // The residency tiers `store` owns; nullptr when it was opened without tiers.
  loradb::tiers::StoreTiers* tiers = nullptr;
  // Leases (CPU and batch) not yet released; loradb_close refuses while this is non-zero.
  std::atomic<int64_t> leases{0};
};

struct loradb_options_t {
  loradb::StoreOptions options;
  bool tiers_enabled = true;
  loradb::tiers::StoreTiersOptions tiers = [] {
    loradb::tiers::StoreTiersOptions t;
    t.device = loradb::tiers::DeviceKind::kNone;
    return t;
  }();
};

struct loradb_lease_t {
  loradb_store_t* store;
  loradb::tiers::CpuLease lease;
};

struct loradb_batch_lease_t {
  loradb_store_t* store;
  loradb::tiers::DeviceBatchLease lease;
};

struct loradb_tensors_t {
  loradb::TensorSet set;
};

namespace {

using loradb::Store;

// Live handles of every kind; a destroyed handle is removed, so a stale copy is detected
// (unless the allocator reused the address for a new handle of the same kind). The lock is a
// std::mutex, not absl::Mutex: Debian's Abseil is not built with ThreadSanitizer, which would
// then report every access to `live_` as a race (tools/dev test --tsan).
class HandleRegistry {
 public:
  void Add(const void* p) {
    std::lock_guard<std::mutex> lock(mu_);
    live_.insert(p);
  }
  bool Remove(const void* p) {
    std::lock_guard<std::mutex> lock(mu_);
    return live_.erase(p) == 1;
  }
  bool Contains(const void* p) const {
    std::lock_guard<std::mutex> lock(mu_);
    return live_.contains(p);
  }

 private:
  mutable std::mutex mu_;
  absl::flat_hash_set<const void*> live_;  // guarded by mu_
};

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

// Runs `fn` (returning loradb_status_t), converting any exception into LORADB_INTERNAL.
template <typename Fn>
loradb_status_t Guarded(char** errmsg, Fn&& fn) {
  if (errmsg != nullptr) *errmsg = nullptr;
  try {
    return fn();
  } catch (const std::bad_alloc&) {
    return Fail(LORADB_INTERNAL, "out of memory", errmsg);
  } catch (const std::exception& e) {
    return Fail(LORADB_INTERNAL, absl::StrCat("internal error: ", e.what()), errmsg);
  } catch (...) {
    return Fail(LORADB_INTERNAL, "internal error", errmsg);
  }
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

#define LORADB_C_STRING(var, ptr, len, what)                                                    \
  std::string var;                                                                              \
  if (!ToString(ptr, len, &var)) {                                                              \
    return Fail(LORADB_INVALID_ARGUMENT, absl::StrCat(what, " is NULL with a non-zero length"), \
                errmsg);                                                                        \
  }

// Checks a store handle: NULL -> INVALID_ARGUMENT, unknown/closed -> INVALID_HANDLE.
#define LORADB_C_CHECK_STORE(h)                                                                 \
  do {                                                                                          \
    if ((h) == nullptr) return Fail(LORADB_INVALID_ARGUMENT, "store handle is NULL", errmsg);   \
    if (!Registry().Contains(h)) {                                                              \
      return Fail(LORADB_INVALID_HANDLE, "store handle is closed or was never opened", errmsg); \
    }                                                                                           \
  } while (0)

#define LORADB_C_CHECK_STRUCT(p, type)                                                         \
  do {                                                                                         \
    if ((p) == nullptr) return Fail(LORADB_INVALID_ARGUMENT, #p " is NULL", errmsg);           \
    if ((p)->struct_size != sizeof(type)) {                                                    \
      return Fail(LORADB_INVALID_ARGUMENT,                                                     \
                  absl::StrCat(#p "->struct_size is ", (p)->struct_size, ", expected sizeof(", \
                               #type ") = ", sizeof(type)),                                    \
                  errmsg);                                                                     \
    }                                                                                          \
  } while (0)

// The integer a C caller stored in an enum-typed value. C allows any int there; in C++ loading
// an enum lvalue outside the enumeration's range is undefined (UBSan: "not a valid value for
// type"), so the bytes are read as the underlying integer and compared as such.
template <typename E>
int64_t RawEnum(const E& e) {
  std::underlying_type_t<E> v;
  static_assert(sizeof(v) == sizeof(E));
  std::memcpy(&v, &e, sizeof(v));
  return static_cast<int64_t>(v);
}

// The C API's enums convert through one table each, both ways: a C value outside the table is
// refused (read with RawEnum, never cast), and a C++ value maps to its enumerator.
template <typename Cpp>
struct EnumEntry {
  int64_t c;
  Cpp cpp;
};

template <typename Cpp, size_t N>
using EnumTable = std::array<EnumEntry<Cpp>, N>;

// The C++ value of what a C caller stored in `in`; nullopt for a value the table lacks.
template <typename C, typename Cpp, size_t N>
std::optional<Cpp> FromCEnum(const C& in, const EnumTable<Cpp, N>& table) {
  const int64_t v = RawEnum(in);
  for (const EnumEntry<Cpp>& e : table) {
    if (e.c == v) return e.cpp;
  }
  return std::nullopt;
}

// The C enumerator of `in` (every C++ value the tables serve is listed).
template <typename C, typename Cpp, size_t N>
C ToCEnum(Cpp in, const EnumTable<Cpp, N>& table) {
  for (const EnumEntry<Cpp>& e : table) {
    if (e.cpp == in) return static_cast<C>(e.c);
  }
  return static_cast<C>(table[0].c);
}

using loradb::DType;
constexpr EnumTable<DType, 15> kDTypes = {{
    {LORADB_DTYPE_BOOL, DType::kBool},
    {LORADB_DTYPE_U8, DType::kU8},
    {LORADB_DTYPE_I8, DType::kI8},
    {LORADB_DTYPE_I16, DType::kI16},
    {LORADB_DTYPE_U16, DType::kU16},
    {LORADB_DTYPE_I32, DType::kI32},
    {LORADB_DTYPE_U32, DType::kU32},
    {LORADB_DTYPE_I64, DType::kI64},
    {LORADB_DTYPE_U64, DType::kU64},
    {LORADB_DTYPE_F16, DType::kF16},
    {LORADB_DTYPE_BF16, DType::kBF16},
    {LORADB_DTYPE_F32, DType::kF32},
    {LORADB_DTYPE_F64, DType::kF64},
    {LORADB_DTYPE_F8_E4M3, DType::kF8E4M3},
    {LORADB_DTYPE_F8_E5M2, DType::kF8E5M2},
}};

using loradb::tiers::LoaderBackend;
constexpr EnumTable<LoaderBackend, 3> kLoaders = {{
    {LORADB_LOADER_AUTO, LoaderBackend::kAuto},
    {LORADB_LOADER_IO_URING, LoaderBackend::kIoUring},
    {LORADB_LOADER_PREAD, LoaderBackend::kPread},
}};

using loradb::tiers::DeviceKind;
constexpr EnumTable<DeviceKind, 4> kDevices = {{
    {LORADB_DEVICE_NONE, DeviceKind::kNone},
    {LORADB_DEVICE_HOST, DeviceKind::kHost},
    {LORADB_DEVICE_CUDA, DeviceKind::kCuda},
    {LORADB_DEVICE_AUTO, DeviceKind::kAuto},
}};

using loradb::Tier;
constexpr EnumTable<Tier, 3> kTiers = {{
    {LORADB_TIER_STORAGE, Tier::kStorage},
    {LORADB_TIER_CPU, Tier::kCpu},
    {LORADB_TIER_GPU, Tier::kGpu},
}};

bool ToDType(const loradb_dtype_t& in, loradb::DType* out) {
  std::optional<DType> d = FromCEnum(in, kDTypes);
  if (!d.has_value()) return false;
  *out = *d;
  return true;
}

// A struct the library fills that grew: its current size or the earlier one(s) in `accepted`.
// The library builds the whole current struct and copies the caller's struct_size bytes of it.
template <typename T>
bool AcceptedSize(size_t size, std::initializer_list<size_t> accepted) {
  if (size == sizeof(T)) return true;
  return std::find(accepted.begin(), accepted.end(), size) != accepted.end();
}

template <typename T>
void CopyOut(const T& full, T* out) {
  const size_t size = out->struct_size;
  std::memcpy(static_cast<void*>(out), &full, std::min(size, sizeof(T)));
  out->struct_size = size;
}

#define LORADB_C_CHECK_GROWN_STRUCT(p, type, v1_size)                                          \
  do {                                                                                         \
    if ((p) == nullptr) return Fail(LORADB_INVALID_ARGUMENT, #p " is NULL", errmsg);           \
    if (!AcceptedSize<type>((p)->struct_size, {static_cast<size_t>(v1_size)})) {               \
      return Fail(LORADB_INVALID_ARGUMENT,                                                     \
                  absl::StrCat(#p "->struct_size is ", (p)->struct_size, ", expected sizeof(", \
                               #type ") = ", sizeof(type), " or " #v1_size " = ", v1_size),    \
                  errmsg);                                                                     \
    }                                                                                          \
  } while (0)

void FillRevision(const loradb::RevisionRecord& r, loradb_revision_info_t* out) {
  const size_t size = out->struct_size;
  std::memset(out, 0, sizeof(*out));
  out->struct_size = size;
  out->id = r.id;
  out->policy_id = r.policy_id;
  out->seq = r.seq;
  out->parent = r.parent;
  out->blob_bytes = r.blob.bytes;
  out->tensor_count = r.blob.tensors;
  out->lora_r = r.lora.r;
  out->lora_alpha = r.lora.alpha;
  out->use_rslora = r.lora.use_rslora ? 1 : 0;
  out->deleted = r.state == loradb::RevisionState::kDeleted ? 1 : 0;
  out->packed = r.layout == loradb::Layout::kPacked ? 1 : 0;
  out->trained = r.source.kind == loradb::SourceKind::kTrained ? 1 : 0;
  out->checkpoint_id = r.source.checkpoint_id;
  out->created_us = r.created_us;
  const std::string hex = r.blob.hash.Hex();
  std::memcpy(out->blob_hash, hex.data(), std::min(hex.size(), sizeof(out->blob_hash) - 1));
}

void FillCheckpoint(const loradb::CheckpointRecord& c, loradb_checkpoint_info_t* out) {
  const size_t size = out->struct_size;
  std::memset(out, 0, sizeof(*out));
  out->struct_size = size;
  out->id = c.id;
  out->policy_id = c.policy_id;
  out->step = c.step;
  out->parent = c.parent;
  out->master_bytes = c.master.bytes;
  out->optimizer_bytes = c.optimizer.bytes;
  out->gradients_bytes = c.gradients.bytes;
  out->scheduler_position = c.scheduler_position;
  out->created_us = c.created_us;
}

// Converts caller tensors to views, checking pointers and that nbytes matches shape x dtype.
absl::Status ToViews(const loradb_tensor_t* tensors, size_t count, const char* what,
                     std::vector<loradb::TensorView>* out) {
  if (tensors == nullptr && count > 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, " is NULL with a non-zero count"));
  }
  for (size_t i = 0; i < count; ++i) {
    const loradb_tensor_t& t = tensors[i];
    loradb::TensorView v;
    if (!ToString(t.name, t.name_len, &v.name) || v.name.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(what, "[", i, "] has no name"));
    }
    if (!ToDType(t.dtype, &v.dtype)) {
      return absl::InvalidArgumentError(absl::StrCat(what, "[", i, "] has an unknown dtype"));
    }
    if (t.shape == nullptr && t.ndim > 0) {
      return absl::InvalidArgumentError(absl::StrCat(what, "[", i, "] shape is NULL"));
    }
    if (t.ndim > 8) return absl::InvalidArgumentError(absl::StrCat(what, "[", i, "] ndim > 8"));
    v.shape.assign(t.shape, t.shape + t.ndim);
    absl::StatusOr<uint64_t> expected = loradb::CheckedNumBytes(v.shape, v.dtype);
    if (!expected.ok()) return expected.status();
    if (*expected != t.nbytes) {
      return absl::InvalidArgumentError(absl::StrCat(what, "[", i, "] '", v.name, "': nbytes ",
                                                     t.nbytes, " != ", *expected,
                                                     " implied by shape and dtype"));
    }
    if (t.data == nullptr && t.nbytes > 0) {
      return absl::InvalidArgumentError(absl::StrCat(what, "[", i, "] data is NULL"));
    }
    v.data = static_cast<const std::byte*>(t.data);
    v.nbytes = t.nbytes;
    out->push_back(std::move(v));
  }
  return absl::OkStatus();
}

absl::Status ToPublishOptions(const loradb_publish_options_t* in, loradb::PublishOptions* out) {
  if (in == nullptr) return absl::OkStatus();
  if (in->struct_size != sizeof(loradb_publish_options_t)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "options->struct_size is ", in->struct_size,
        ", expected sizeof(loradb_publish_options_t) = ", sizeof(loradb_publish_options_t)));
  }
  if (!ToString(in->alias, in->alias_len, &out->alias)) {
    return absl::InvalidArgumentError("options->alias is NULL with a non-zero length");
  }
  if (in->lora_r < 0) return absl::InvalidArgumentError("options->lora_r is negative");
  if (in->use_rslora != 0 && in->use_rslora != 1) {
    return absl::InvalidArgumentError("options->use_rslora must be 0 or 1");
  }
  out->parent = in->parent;
  out->lora.r = in->lora_r;
  out->lora.alpha = in->lora_alpha;
  out->lora.use_rslora = in->use_rslora == 1;
  return absl::OkStatus();
}

loradb_status_t FinishRevision(const absl::StatusOr<loradb::RevisionRecord>& rec,
                               loradb_revision_info_t* out, char** errmsg) {
  if (!rec.ok()) return Report(rec.status(), errmsg);
  if (out != nullptr) FillRevision(*rec, out);
  return LORADB_OK;
}

// The prologue the three publish calls share, in this order: the store handle, `policy`, the
// source string (`source_what` names it in the error; the tensors call passes none), `out`'s
// struct_size when `out` is given, then `options`. Runs `publish(policy, source, options)` and
// reports its revision into `out`.
template <typename Fn>
loradb_status_t GuardedPublish(loradb_store_t* store, const char* policy, size_t policy_len,
                               const char* source, size_t source_len, const char* source_what,
                               const loradb_publish_options_t* options, loradb_revision_info_t* out,
                               char** errmsg, Fn&& publish) {
  return Guarded(errmsg, [&]() -> loradb_status_t {
    LORADB_C_CHECK_STORE(store);
    LORADB_C_STRING(p, policy, policy_len, "policy");
    LORADB_C_STRING(src, source, source_len, source_what);
    if (out != nullptr) LORADB_C_CHECK_STRUCT(out, loradb_revision_info_t);
    loradb::PublishOptions opts;
    absl::Status st = ToPublishOptions(options, &opts);
    if (!st.ok()) return Report(st, errmsg);
    return FinishRevision(publish(p, src, opts), out, errmsg);
  });
}

loradb_status_t ReturnJson(const nlohmann::json& j, char** json, size_t* json_len) {
  std::string text = j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  *json = CopyString(text);
  if (*json == nullptr) return LORADB_INTERNAL;
  if (json_len != nullptr) *json_len = text.size();
  return LORADB_OK;
}

bool TensorsLive(const loradb_tensors_t* t) { return t != nullptr && Registry().Contains(t); }

void FillView(const loradb::TensorView& t, loradb_tensor_view_t* view) {
  const size_t size = view->struct_size;
  std::memset(view, 0, sizeof(*view));
  view->struct_size = size;
  view->name = t.name.data();
  view->name_len = t.name.size();
  view->dtype = ToCEnum<loradb_dtype_t>(t.dtype, kDTypes);
  view->shape = t.shape.data();
  view->ndim = t.shape.size();
  view->data = t.data;
  view->nbytes = t.nbytes;
}

}  // namespace

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

// ---- options

loradb_status_t loradb_options_create(loradb_options_t** out) {
  char** errmsg = nullptr;
  return Guarded(errmsg, [&]() -> loradb_status_t {
    if (out == nullptr) return LORADB_INVALID_ARGUMENT;
    *out = new loradb_options_t();
    Registry().Add(*out);
    return LORADB_OK;
  });
}

loradb_status_t loradb_options_destroy(loradb_options_t** options) {
  if (options == nullptr) return LORADB_INVALID_ARGUMENT;
  if (*options == nullptr) return LORADB_OK;
  if (!Registry().Remove(*options)) return LORADB_INVALID_HANDLE;
  delete *options;
  *options = nullptr;
  return LORADB_OK;
}

loradb_status_t loradb_options_set_create_if_missing(loradb_options_t* options, int value) {
  if (options == nullptr) return LORADB_INVALID_ARGUMENT;
  if (!Registry().Contains(options)) return LORADB_INVALID_HANDLE;
  if (value != 0 && value != 1) return LORADB_INVALID_ARGUMENT;
  options->options.create_if_missing = value == 1;
  options->options.catalog.create_if_missing = value == 1;
  return LORADB_OK;
}

loradb_status_t loradb_options_set_blob_root(loradb_options_t* options, const char* path,
                                             size_t path_len) {
  char** errmsg = nullptr;
  return Guarded(errmsg, [&]() -> loradb_status_t {
    if (options == nullptr) return LORADB_INVALID_ARGUMENT;
    if (!Registry().Contains(options)) return LORADB_INVALID_HANDLE;
    std::string root;
    if (!ToString(path, path_len, &root)) return LORADB_INVALID_ARGUMENT;
    options->options.blob_root = root;
    return LORADB_OK;
  });
}

loradb_status_t loradb_options_set_no_sync(loradb_options_t* options, int value) {
  if (options == nullptr) return LORADB_INVALID_ARGUMENT;
  if (!Registry().Contains(options)) return LORADB_INVALID_HANDLE;
  if (value != 0 && value != 1) return LORADB_INVALID_ARGUMENT;
  options->options.catalog.no_sync = value == 1;
  return LORADB_OK;
}

loradb_status_t loradb_options_set_cpu_cache(loradb_options_t* options, uint64_t budget_bytes,
                                             const char* eviction, size_t eviction_len,
                                             uint64_t expected_entries) {
  char** errmsg = nullptr;
  return Guarded(errmsg, [&]() -> loradb_status_t {
    if (options == nullptr) return LORADB_INVALID_ARGUMENT;
    if (!Registry().Contains(options)) return LORADB_INVALID_HANDLE;
    std::string name;
    if (!ToString(eviction, eviction_len, &name)) return LORADB_INVALID_ARGUMENT;
    loradb::tiers::EvictionPolicyKind policy = options->tiers.cpu.policy;
    if (!name.empty()) {
      absl::StatusOr<loradb::tiers::EvictionPolicyKind> parsed =
          loradb::tiers::ParseEvictionPolicy(name);
      if (!parsed.ok()) return LORADB_INVALID_ARGUMENT;
      policy = *parsed;
    }
    // Validated first: a refused call changes nothing.
    options->tiers_enabled = budget_bytes > 0;
    if (budget_bytes > 0) options->tiers.cpu.budget_bytes = budget_bytes;
    options->tiers.cpu.policy = policy;
    if (expected_entries > 0) options->tiers.cpu.expected_entries = expected_entries;
    return LORADB_OK;
  });
}

loradb_status_t loradb_options_set_loader(loradb_options_t* options, loradb_loader_t loader,
                                          uint32_t max_inflight_loads, uint32_t max_queued_loads,
                                          uint32_t negative_ttl_ms) {
  if (options == nullptr) return LORADB_INVALID_ARGUMENT;
  if (!Registry().Contains(options)) return LORADB_INVALID_HANDLE;
  constexpr uint32_t kMax = 65536;
  if (max_inflight_loads == 0 || max_inflight_loads > kMax || max_queued_loads > kMax) {
    return LORADB_INVALID_ARGUMENT;
  }
  std::optional<LoaderBackend> backend = FromCEnum(loader, kLoaders);
  if (!backend.has_value()) return LORADB_INVALID_ARGUMENT;
  options->tiers.loader.backend = *backend;
  options->tiers.cpu.max_inflight_loads = max_inflight_loads;
  options->tiers.cpu.max_queued_loads = max_queued_loads;
  options->tiers.cpu.negative_ttl = absl::Milliseconds(negative_ttl_ms);
  return LORADB_OK;
}

loradb_status_t loradb_options_set_device(loradb_options_t* options, loradb_device_t device,
                                          uint64_t arena_bytes, uint64_t page_bytes) {
  if (options == nullptr) return LORADB_INVALID_ARGUMENT;
  if (!Registry().Contains(options)) return LORADB_INVALID_HANDLE;
  std::optional<DeviceKind> found = FromCEnum(device, kDevices);
  if (!found.has_value()) return LORADB_INVALID_ARGUMENT;
  const DeviceKind kind = *found;
  if (kind != loradb::tiers::DeviceKind::kNone) {
    if (arena_bytes == 0) return LORADB_INVALID_ARGUMENT;
    if (page_bytes != 0 &&
        (page_bytes < 256 || (page_bytes & (page_bytes - 1)) != 0 || page_bytes > arena_bytes)) {
      return LORADB_INVALID_ARGUMENT;
    }
    options->tiers.slots.arena_bytes = arena_bytes;
    if (page_bytes != 0) options->tiers.slots.page_bytes = page_bytes;
  }
  options->tiers.device = kind;
  return LORADB_OK;
}

loradb_status_t loradb_options_set_tp(loradb_options_t* options, const loradb_tp_options_t* tp,
                                      char** errmsg) {
  return Guarded(errmsg, [&]() -> loradb_status_t {
    if (options == nullptr) return Fail(LORADB_INVALID_ARGUMENT, "options is NULL", errmsg);
    if (!Registry().Contains(options)) {
      return Fail(LORADB_INVALID_HANDLE, "options handle was destroyed", errmsg);
    }
    if (tp == nullptr) {
      options->tiers.slots.tp = {};
      options->tiers.tp_derived_dir.clear();
      options->tiers.cuda_device = 0;
      return LORADB_OK;
    }
    LORADB_C_CHECK_STRUCT(tp, loradb_tp_options_t);
    constexpr uint32_t kMaxDegree = 4096;
    if (tp->degree == 0 || tp->degree > kMaxDegree) {
      return Fail(LORADB_INVALID_ARGUMENT,
                  absl::StrCat("tp->degree is ", tp->degree, ": use 1..", kMaxDegree), errmsg);
    }
    if (tp->rank >= tp->degree) {
      return Fail(LORADB_INVALID_ARGUMENT,
                  absl::StrCat("tp->rank ", tp->rank, " is not below tp->degree ", tp->degree),
                  errmsg);
    }
    if (tp->cuda_device < -1) {
      return Fail(LORADB_INVALID_ARGUMENT,
                  absl::StrCat("tp->cuda_device is ", tp->cuda_device, ": use -1 or a device"),
                  errmsg);
    }
    LORADB_C_STRING(dir, tp->derived_dir, tp->derived_dir_len, "tp->derived_dir");
    if (dir.find('\0') != std::string::npos) {
      return Fail(LORADB_INVALID_ARGUMENT, "tp->derived_dir contains a NUL byte", errmsg);
    }
    if (!dir.empty() && tp->degree == 1) {
      return Fail(LORADB_INVALID_ARGUMENT,
                  "tp->derived_dir needs tp->degree > 1 (a TP 1 rank holds whole revisions)",
                  errmsg);
    }
    // Validated first: a refused call changes nothing.
    options->tiers.slots.tp = {static_cast<int>(tp->rank), static_cast<int>(tp->degree)};
    options->tiers.tp_derived_dir = dir;
    if (tp->cuda_device >= 0) options->tiers.cuda_device = tp->cuda_device;
    return LORADB_OK;
  });
}

// ---- store

loradb_status_t loradb_open(const char* dir, size_t dir_len, const loradb_options_t* options,
                            loradb_store_t** out, char** errmsg) {
  return Guarded(errmsg, [&]() -> loradb_status_t {
    if (out == nullptr) return Fail(LORADB_INVALID_ARGUMENT, "out is NULL", errmsg);
    *out = nullptr;
    LORADB_C_STRING(path, dir, dir_len, "dir");
    if (path.empty()) return Fail(LORADB_INVALID_ARGUMENT, "dir is empty", errmsg);
    if (path.find('\0') != std::string::npos) {
      return Fail(LORADB_INVALID_ARGUMENT, "dir contains a NUL byte", errmsg);
    }
    loradb::StoreOptions opts;
    if (options != nullptr) {
      if (!Registry().Contains(options)) {
        return Fail(LORADB_INVALID_HANDLE, "options handle was destroyed", errmsg);
      }
      opts = options->options;
    }
    bool tiers_enabled = true;
    loradb::tiers::StoreTiersOptions tier_opts = loradb_options_t().tiers;
    if (options != nullptr) {
      tiers_enabled = options->tiers_enabled;
      tier_opts = options->tiers;
    }
    // The Store owns the tiers (StoreOptions::tiers); its Locate reports the live tier and its
    // DeleteRevision drops unleased copies.
    if (tiers_enabled) opts.tiers = tier_opts;
    absl::StatusOr<std::unique_ptr<Store>> store = Store::Open(path, opts);
    if (!store.ok()) return Report(store.status(), errmsg);
    auto handle = std::make_unique<loradb_store_t>();
    handle->store = std::move(*store);
    handle->tiers = handle->store->tiers();
    Registry().Add(handle.get());
    *out = handle.release();
    return LORADB_OK;
  });
}

loradb_status_t loradb_close(loradb_store_t** store) {
  if (store == nullptr) return LORADB_INVALID_ARGUMENT;
  if (*store == nullptr) return LORADB_OK;
  if (!Registry().Contains(*store)) return LORADB_INVALID_HANDLE;
  // Leases point into the tiers: refuse (changing nothing) while any is alive.
  if ((*store)->leases.load() != 0) return LORADB_CONFLICT;
  if (!Registry().Remove(*store)) return LORADB_INVALID_HANDLE;
  delete *store;
  *store = nullptr;
  return LORADB_OK;
}

// ---- bases

loradb_status_t loradb_base_add_modules(loradb_store_t* store, const char* name, size_t name_len,
                                        const char* modules_json, size_t modules_json_len,
                                        char** errmsg) {
  return Guarded(errmsg, [&]() -> loradb_status_t {
    LORADB_C_CHECK_STORE(store);
    LORADB_C_STRING(n, name, name_len, "name");
    LORADB_C_STRING(j, modules_json, modules_json_len, "modules_json");
    return Report(store->store->AddBaseFromModuleTable(n, j).status(), errmsg);
  });
}

loradb_status_t loradb_base_add_config(loradb_store_t* store, const char* name, size_t name_len,
                                       const char* config_path, size_t config_path_len,
                                       const char* weights, size_t weights_len, char** errmsg) {
  return Guarded(errmsg, [&]() -> loradb_status_t {
    LORADB_C_CHECK_STORE(store);
    LORADB_C_STRING(n, name, name_len, "name");
    LORADB_C_STRING(c, config_path, config_path_len, "config_path");
    LORADB_C_STRING(w, weights, weights_len, "weights");
    return Report(store->store->AddBaseFromConfig(n, c, w).status(), errmsg);
  });
}

loradb_status_t loradb_base_list(loradb_store_t* store, char** json, size_t* json_len,
                                 char** errmsg) {
  return Guarded(errmsg, [&]() -> loradb_status_t {
    LORADB_C_CHECK_STORE(store);
    if (json == nullptr) return Fail(LORADB_INVALID_ARGUMENT, "json is NULL", errmsg);
    absl::StatusOr<std::vector<loradb::BaseRecord>> bases = store->store->ListBases();
    if (!bases.ok()) return Report(bases.status(), errmsg);
    nlohmann::json arr = nlohmann::json::array();
    for (const auto& b : *bases) arr.push_back(loradb::BaseJson(b, /*with_modules=*/false));
    return ReturnJson(arr, json, json_len);
  });
}

// ---- policies

loradb_status_t loradb_policy_create(loradb_store_t* store, const char* name, size_t name_len,
                                     const char* base, size_t base_len, const char* labels_json,
                                     size_t labels_json_len, uint64_t* policy_id, char** errmsg) {
  return Guarded(errmsg, [&]() -> loradb_status_t {
    LORADB_C_CHECK_STORE(store);
    LORADB_C_STRING(n, name, name_len, "name");
    LORADB_C_STRING(b, base, base_len, "base");
    LORADB_C_STRING(l, labels_json, labels_json_len, "labels_json");
    std::map<std::string, std::string> labels;
    if (!l.empty()) {
      absl::StatusOr<nlohmann::json> parsed = loradb::ParseJson(l, "labels_json");
      if (!parsed.ok()) return Report(parsed.status(), errmsg);
      const nlohmann::json& j = *parsed;
      if (!j.is_object()) {
        return Fail(LORADB_INVALID_ARGUMENT, "labels_json must be a JSON object", errmsg);
      }
      for (const auto& [k, v] : j.items()) {
        if (!v.is_string()) {
          return Fail(LORADB_INVALID_ARGUMENT, "label values must be strings", errmsg);
        }
        labels[k] = v.get<std::string>();
      }
    }
    absl::StatusOr<loradb::PolicyRecord> p = store->store->CreatePolicy(n, b, labels);
    if (!p.ok()) return Report(p.status(), errmsg);
    if (policy_id != nullptr) *policy_id = p->id;
    return LORADB_OK;
  });
}

loradb_status_t loradb_policy_archive(loradb_store_t* store, const char* name, size_t name_len,
                                      int archived, char** errmsg) {
  return Guarded(errmsg, [&]() -> loradb_status_t {
    LORADB_C_CHECK_STORE(store);
    LORADB_C_STRING(n, name, name_len, "name");
    if (archived != 0 && archived != 1) {
      return Fail(LORADB_INVALID_ARGUMENT, "archived must be 0 or 1", errmsg);
    }
    return Report(store->store->ArchivePolicy(n, archived == 1), errmsg);
  });
}

loradb_status_t loradb_policy_list(loradb_store_t* store, uint64_t after_id, size_t limit,
                                   char** json, size_t* json_len, uint64_t* next_cursor,
                                   char** errmsg) {
  return Guarded(errmsg, [&]() -> loradb_status_t {
    LORADB_C_CHECK_STORE(store);
    if (json == nullptr) return Fail(LORADB_INVALID_ARGUMENT, "json is NULL", errmsg);
    if (limit < 1 || limit > 1000) {
      return Fail(LORADB_INVALID_ARGUMENT, "limit must be 1..1000", errmsg);
    }
    absl::StatusOr<std::vector<loradb::PolicyRecord>> all = store->store->ListPolicies();
    if (!all.ok()) return Report(all.status(), errmsg);
    std::sort(all->begin(), all->end(), [](const auto& a, const auto& b) { return a.id < b.id; });
    nlohmann::json arr = nlohmann::json::array();
    uint64_t next = 0;
    for (const auto& p : *all) {
      if (p.id <= after_id) continue;
      if (arr.size() == limit) {
        next = arr.back()["id"].get<uint64_t>();
        break;
      }
      arr.push_back(loradb::PolicyJson(p));
    }
    if (next_cursor != nullptr) *next_cursor = next;
    return ReturnJson(arr, json, json_len);
  });
}

// ---- publishing

loradb_status_t loradb_publish_tensors(loradb_store_t* store, const char* policy, size_t policy_len,
                                       const loradb_tensor_t* tensors, size_t tensor_count,
                                       const loradb_publish_options_t* options,
                                       loradb_revision_info_t* out, char** errmsg) {
  return GuardedPublish(
      store, policy, policy_len, nullptr, 0, "source", options, out, errmsg,
      [&](const std::string& p, const std::string&,
          const loradb::PublishOptions& opts) -> absl::StatusOr<loradb::RevisionRecord> {
        std::vector<loradb::TensorView> views;
        LORADB_RETURN_IF_ERROR(ToViews(tensors, tensor_count, "tensors", &views));
        return store->store->PublishTensors(p, views, opts);
      });
}

loradb_status_t loradb_publish_peft_dir(loradb_store_t* store, const char* policy,
                                        size_t policy_len, const char* dir, size_t dir_len,
                                        const loradb_publish_options_t* options,
                                        loradb_revision_info_t* out, char** errmsg) {
  return GuardedPublish(store, policy, policy_len, dir, dir_len, "dir", options, out, errmsg,
                        [&](const std::string& p, const std::string& d,
                            loradb::PublishOptions opts) -> absl::StatusOr<loradb::RevisionRecord> {
                          // The LoRA settings come from the directory's adapter_config.json.
                          opts.lora = loradb::LoraSettings();
                          return store->store->PublishPeftDir(p, d, opts);
                        });
}

loradb_status_t loradb_publish_safetensors(loradb_store_t* store, const char* policy,
                                           size_t policy_len, const char* path, size_t path_len,
                                           const loradb_publish_options_t* options,
                                           loradb_revision_info_t* out, char** errmsg) {
  return GuardedPublish(
      store, policy, policy_len, path, path_len, "path", options, out, errmsg,
      [&](const std::string& p, const std::string& f,
          const loradb::PublishOptions& opts) -> absl::StatusOr<loradb::RevisionRecord> {
        return store->store->PublishSafetensors(p, f, opts);
      });
}

// ---- revisions

loradb_status_t loradb_revision_get(loradb_store_t* store, uint64_t id, loradb_revision_info_t* out,
                                    char** errmsg) {
  return Guarded(errmsg, [&]() -> loradb_status_t {
    LORADB_C_CHECK_STORE(store);
    LORADB_C_CHECK_STRUCT(out, loradb_revision_info_t);
    return FinishRevision(store->store->GetRevision(id), out, errmsg);
  });
}

loradb_status_t loradb_revision_resolve(loradb_store_t* store, const char* ref, size_t ref_len,
                                        loradb_revision_info_t* out, char** errmsg) {
  return Guarded(errmsg, [&]() -> loradb_status_t {
    LORADB_C_CHECK_STORE(store);
    LORADB_C_STRING(r, ref, ref_len, "ref");
    LORADB_C_CHECK_STRUCT(out, loradb_revision_info_t);
    return FinishRevision(store->store->Resolve(r), out, errmsg);
  });
}

loradb_status_t loradb_revision_list(loradb_store_t* store, const char* policy, size_t policy_len,
                                     uint64_t after_seq, loradb_revision_info_t* out,
                                     size_t capacity, size_t* count, uint64_t* next_cursor,
                                     char** errmsg) {
  return Guarded(errmsg, [&]() -> loradb_status_t {
    LORADB_C_CHECK_STORE(store);
    LORADB_C_STRING(p, policy, policy_len, "policy");
    if (out == nullptr || count == nullptr) {
      return Fail(LORADB_INVALID_ARGUMENT, "out and count must not be NULL", errmsg);
    }
    *count = 0;
    if (capacity < 1 || capacity > 1000) {
      return Fail(LORADB_INVALID_ARGUMENT, "capacity must be 1..1000", errmsg);
    }
    for (size_t i = 0; i < capacity; ++i) {
      if (out[i].struct_size != sizeof(loradb_revision_info_t)) {
        return Fail(LORADB_INVALID_ARGUMENT,
                    absl::StrCat("out[", i, "].struct_size is ", out[i].struct_size,
                                 ", expected sizeof(loradb_revision_info_t) = ",
                                 sizeof(loradb_revision_info_t)),
                    errmsg);
      }
    }
    absl::StatusOr<loradb::Page<loradb::RevisionRecord>> page =
        store->store->ListRevisions(p, after_seq, capacity);
    if (!page.ok()) return Report(page.status(), errmsg);
    for (size_t i = 0; i < page->items.size() && i < capacity; ++i) {
      FillRevision(page->items[i], &out[i]);
    }
    *count = std::min(page->items.size(), capacity);
    if (next_cursor != nullptr) *next_cursor = page->next_after.value_or(0);
    return LORADB_OK;
  });
}

loradb_status_t loradb_revision_delete(loradb_store_t* store, uint64_t id, char** errmsg) {
  return Guarded(errmsg, [&]() -> loradb_status_t {
    LORADB_C_CHECK_STORE(store);
    return Report(store->store->DeleteRevision(id), errmsg);
  });
}

loradb_status_t loradb_revision_read_tensors(loradb_store_t* store, uint64_t id,
                                             loradb_tensors_t** out, char** errmsg) {
  return Guarded(errmsg, [&]() -> loradb_status_t {
    LORADB_C_CHECK_STORE(store);
    if (out == nullptr) return Fail(LORADB_INVALID_ARGUMENT, "out is NULL", errmsg);
    *out = nullptr;
    absl::StatusOr<loradb::RevisionRecord> rev = store->store->GetRevision(id);
    if (!rev.ok()) return Report(rev.status(), errmsg);
    absl::StatusOr<loradb::TensorSet> set = store->store->ReadTensors(*rev);
    if (!set.ok()) return Report(set.status(), errmsg);
    auto* handle = new loradb_tensors_t{std::move(*set)};
    Registry().Add(handle);
    *out = handle;
    return LORADB_OK;
  });
}

loradb_status_t loradb_revision_export_peft(loradb_store_t* store, uint64_t id, const char* out_dir,
                                            size_t out_dir_len, char** errmsg) {
  return Guarded(errmsg, [&]() -> loradb_status_t {
    LORADB_C_CHECK_STORE(store);
    LORADB_C_STRING(d, out_dir, out_dir_len, "out_dir");
    if (d.empty()) return Fail(LORADB_INVALID_ARGUMENT, "out_dir is empty", errmsg);
    absl::StatusOr<loradb::RevisionRecord> rev = store->store->GetRevision(id);
    if (!rev.ok()) return Report(rev.status(), errmsg);
    return Report(store->store->ExportPeftDir(*rev, d), errmsg);
  });
}

// ---- tensors

size_t loradb_tensors_count(const loradb_tensors_t* tensors) {
  return TensorsLive(tensors) ? tensors->set.size() : 0;
}

loradb_status_t loradb_tensors_at(const loradb_tensors_t* tensors, size_t index,
                                  loradb_tensor_view_t* view) {
  if (tensors == nullptr || view == nullptr) return LORADB_INVALID_ARGUMENT;
  if (!TensorsLive(tensors)) return LORADB_INVALID_HANDLE;
  if (view->struct_size != sizeof(loradb_tensor_view_t)) return LORADB_INVALID_ARGUMENT;
  if (index >= tensors->set.size()) return LORADB_OUT_OF_RANGE;
  FillView(tensors->set.tensors()[index], view);
  return LORADB_OK;
}

loradb_status_t loradb_tensors_find(const loradb_tensors_t* tensors, const char* name,
                                    size_t name_len, loradb_tensor_view_t* view) {
  char** errmsg = nullptr;
  return Guarded(errmsg, [&]() -> loradb_status_t {
    if (tensors == nullptr || view == nullptr) return LORADB_INVALID_ARGUMENT;
    if (!TensorsLive(tensors)) return LORADB_INVALID_HANDLE;
    if (view->struct_size != sizeof(loradb_tensor_view_t)) return LORADB_INVALID_ARGUMENT;
    std::string n;
    if (!ToString(name, name_len, &n)) return LORADB_INVALID_ARGUMENT;
    const loradb::TensorView* t = tensors->set.Find(n);
    if (t == nullptr) return LORADB_NOT_FOUND;
    FillView(*t, view);
    return LORADB_OK;
  });
}

loradb_status_t loradb_tensors_destroy(loradb_tensors_t** tensors) {
  if (tensors == nullptr) return LORADB_INVALID_ARGUMENT;
  if (*tensors == nullptr) return LORADB_OK;
  if (!Registry().Remove(*tensors)) return LORADB_INVALID_HANDLE;
  delete *tensors;
  *tensors = nullptr;
  return LORADB_OK;
}

// ---- aliases

loradb_status_t loradb_alias_set(loradb_store_t* store, const char* policy, size_t policy_len,
                                 const char* alias, size_t alias_len, uint64_t revision,
                                 const char* reason, size_t reason_len, char** errmsg) {
  return Guarded(errmsg, [&]() -> loradb_status_t {
    LORADB_C_CHECK_STORE(store);
    LORADB_C_STRING(p, policy, policy_len, "policy");
    LORADB_C_STRING(a, alias, alias_len, "alias");
    LORADB_C_STRING(r, reason, reason_len, "reason");
    return Report(store->store->SetAlias(p, a, revision, r.empty() ? "set" : r), errmsg);
  });
}

loradb_status_t loradb_alias_rollback(loradb_store_t* store, const char* policy, size_t policy_len,
                                      const char* alias, size_t alias_len, uint64_t* revision,
                                      char** errmsg) {
  return Guarded(errmsg, [&]() -> loradb_status_t {
    LORADB_C_CHECK_STORE(store);
    LORADB_C_STRING(p, policy, policy_len, "policy");
    LORADB_C_STRING(a, alias, alias_len, "alias");
    absl::StatusOr<uint64_t> now = store->store->Rollback(p, a);
    if (!now.ok()) return Report(now.status(), errmsg);
    if (revision != nullptr) *revision = *now;
    return LORADB_OK;
  });
}

loradb_status_t loradb_alias_history(loradb_store_t* store, const char* policy, size_t policy_len,
                                     const char* alias, size_t alias_len, char** json,
                                     size_t* json_len, char** errmsg) {
  return Guarded(errmsg, [&]() -> loradb_status_t {
    LORADB_C_CHECK_STORE(store);
    LORADB_C_STRING(p, policy, policy_len, "policy");
    LORADB_C_STRING(a, alias, alias_len, "alias");
    if (json == nullptr) return Fail(LORADB_INVALID_ARGUMENT, "json is NULL", errmsg);
    absl::Status st = loradb::ValidateAliasName(a);
    if (!st.ok()) return Report(st, errmsg);
    absl::StatusOr<loradb::PolicyRecord> pol = store->store->GetPolicy(p);
    if (!pol.ok()) return Report(pol.status(), errmsg);
    absl::StatusOr<std::vector<loradb::AliasLogEntry>> log =
        store->store->catalog().AliasLog(pol->id, a);
    if (!log.ok()) return Report(log.status(), errmsg);
    nlohmann::json arr = nlohmann::json::array();
    for (const auto& e : *log) arr.push_back(loradb::AliasLogJson(e));
    return ReturnJson(arr, json, json_len);
  });
}

loradb_status_t loradb_locate(loradb_store_t* store, const char* policy, size_t policy_len,
                              const char* alias, size_t alias_len, loradb_located_t* out,
                              char** errmsg) {
  return Guarded(errmsg, [&]() -> loradb_status_t {
    LORADB_C_CHECK_STORE(store);
    LORADB_C_STRING(p, policy, policy_len, "policy");
    LORADB_C_STRING(a, alias, alias_len, "alias");
    LORADB_C_CHECK_GROWN_STRUCT(out, loradb_located_t, LORADB_LOCATED_V1_SIZE);
    absl::StatusOr<loradb::Located> l = store->store->Locate(p, a);
    if (!l.ok()) return Report(l.status(), errmsg);
    loradb::tiers::TierPlace place;  // storage, no leases, when there are no tiers
    if (store->tiers != nullptr) place = store->tiers->Where(l->revision.id);
    loradb_located_t full{};
    full.base_name = CopyString(l->base.name);
    full.blob_path = CopyString(l->location.blob_path);
    if (full.base_name == nullptr || full.blob_path == nullptr) {
      std::free(full.base_name);
      std::free(full.blob_path);
      return Fail(LORADB_INTERNAL, "out of memory", errmsg);
    }
    full.checkpoint_id = l->checkpoint.has_value() ? l->checkpoint->id : 0;
    full.revision_id = l->revision.id;
    full.tier = ToCEnum<loradb_tier_t>(place.tier, kTiers);
    full.bytes = l->location.bytes;
    full.has_slot = place.slot.has_value() ? 1 : 0;
    full.slot = place.slot.value_or(0);
    full.cpu_leases = place.cpu_leases;
    full.device_leases = place.device_leases;
    full.device_bytes = place.device_bytes;
    full.tp_rank = static_cast<uint32_t>(place.tp.rank);
    full.tp_degree = static_cast<uint32_t>(place.tp.degree);
    CopyOut(full, out);
    return LORADB_OK;
  });
}

// ---- residency

namespace {

#define LORADB_C_CHECK_TIERS(h)                                                                 \
  do {                                                                                          \
    if ((h)->tiers == nullptr) {                                                                \
      return Fail(LORADB_UNAVAILABLE,                                                           \
                  "the store was opened without residency tiers (CPU cache budget 0)", errmsg); \
    }                                                                                           \
  } while (0)

// The suggested wait after a ResourceExhausted: the cache's own hint when it gave one, else
// the CPU cache's median load time (at least 10 ms). Always >= 1.
uint32_t RetryAfterMs(const absl::Status& status, loradb::tiers::StoreTiers* tiers) {
  std::optional<absl::Duration> hint = loradb::tiers::RetryAfterHint(status);
  double ms = 10;
  if (hint.has_value()) {
    ms = absl::ToDoubleMilliseconds(*hint);
  } else if (tiers != nullptr) {
    ms = std::max(ms, absl::ToDoubleMilliseconds(tiers->cpu().stats().load_latency.Quantile(0.5)));
  }
  ms = std::ceil(std::max(ms, 1.0));
  return ms > 3.6e6 ? 3600000u : static_cast<uint32_t>(ms);
}

loradb_status_t ReportResidency(const absl::Status& status, loradb_store_t* store,
                                uint32_t* retry_after_ms, char** errmsg) {
  if (retry_after_ms != nullptr && status.code() == absl::StatusCode::kResourceExhausted) {
    *retry_after_ms = RetryAfterMs(status, store->tiers);
  }
  return Report(status, errmsg);
}

bool LeaseLive(const loradb_lease_t* l) { return l != nullptr && Registry().Contains(l); }
bool BatchLive(const loradb_batch_lease_t* b) { return b != nullptr && Registry().Contains(b); }

void FillDeviceView(const loradb::tiers::DeviceTensor& t, loradb_tensor_view_t* view) {
  const size_t size = view->struct_size;
  std::memset(view, 0, sizeof(*view));
  view->struct_size = size;
  view->name = t.name.data();
  view->name_len = t.name.size();
  view->dtype = ToCEnum<loradb_dtype_t>(t.dtype, kDTypes);
  view->shape = t.shape.data();
  view->ndim = t.shape.size();
  view->data = t.data;
  view->nbytes = t.nbytes;
}

uint64_t Micros(absl::Duration d) { return static_cast<uint64_t>(absl::ToInt64Microseconds(d)); }

}  // namespace

loradb_status_t loradb_acquire(loradb_store_t* store, uint64_t revision, uint32_t timeout_ms,
                               loradb_lease_t** out, uint32_t* retry_after_ms, char** errmsg) {
  return Guarded(errmsg, [&]() -> loradb_status_t {
    if (retry_after_ms != nullptr) *retry_after_ms = 0;
    LORADB_C_CHECK_STORE(store);
    if (out == nullptr) return Fail(LORADB_INVALID_ARGUMENT, "out is NULL", errmsg);
    *out = nullptr;
    LORADB_C_CHECK_TIERS(store);
    std::optional<absl::Duration> timeout;
    if (timeout_ms > 0) timeout = absl::Milliseconds(timeout_ms);
    absl::StatusOr<loradb::tiers::CpuLease> lease =
        store->tiers->cpu().Acquire(revision, loradb::tiers::LoadPriority::kDecode, timeout);
    if (!lease.ok()) return ReportResidency(lease.status(), store, retry_after_ms, errmsg);
    auto handle = std::make_unique<loradb_lease_t>();
    handle->store = store;
    handle->lease = *std::move(lease);
    store->leases.fetch_add(1);
    Registry().Add(handle.get());
    *out = handle.release();
    return LORADB_OK;
  });
}

loradb_status_t loradb_lease_revision(const loradb_lease_t* lease, uint64_t* revision) {
  if (lease == nullptr || revision == nullptr) return LORADB_INVALID_ARGUMENT;
  if (!LeaseLive(lease)) return LORADB_INVALID_HANDLE;
  *revision = lease->lease.revision();
  return LORADB_OK;
}

size_t loradb_lease_tensor_count(const loradb_lease_t* lease) {
  return LeaseLive(lease) ? lease->lease.tensors().size() : 0;
}

loradb_status_t loradb_lease_tensor_at(const loradb_lease_t* lease, size_t index,
                                       loradb_tensor_view_t* view) {
  if (lease == nullptr || view == nullptr) return LORADB_INVALID_ARGUMENT;
  if (!LeaseLive(lease)) return LORADB_INVALID_HANDLE;
  if (view->struct_size != sizeof(loradb_tensor_view_t)) return LORADB_INVALID_ARGUMENT;
  const loradb::TensorSet& set = lease->lease.tensors();
  if (index >= set.size()) return LORADB_OUT_OF_RANGE;
  FillView(set.tensors()[index], view);
  return LORADB_OK;
}

loradb_status_t loradb_lease_tensor_find(const loradb_lease_t* lease, const char* name,
                                         size_t name_len, loradb_tensor_view_t* view) {
  char** errmsg = nullptr;
  return Guarded(errmsg, [&]() -> loradb_status_t {
    if (lease == nullptr || view == nullptr) return LORADB_INVALID_ARGUMENT;
    if (!LeaseLive(lease)) return LORADB_INVALID_HANDLE;
    if (view->struct_size != sizeof(loradb_tensor_view_t)) return LORADB_INVALID_ARGUMENT;
    std::string n;
    if (!ToString(name, name_len, &n)) return LORADB_INVALID_ARGUMENT;
    const loradb::TensorView* t = lease->lease.tensors().Find(n);
    if (t == nullptr) return LORADB_NOT_FOUND;
    FillView(*t, view);
    return LORADB_OK;
  });
}

loradb_status_t loradb_release(loradb_lease_t** lease) {
  if (lease == nullptr) return LORADB_INVALID_ARGUMENT;
  if (*lease == nullptr) return LORADB_OK;
  if (!Registry().Remove(*lease)) return LORADB_INVALID_HANDLE;
  loradb_store_t* store = (*lease)->store;
  delete *lease;  // drops the pin
  store->leases.fetch_sub(1);
  *lease = nullptr;
  return LORADB_OK;
}

loradb_status_t loradb_acquire_batch(loradb_store_t* store, const uint64_t* revisions, size_t count,
                                     loradb_batch_lease_t** out, uint32_t* retry_after_ms,
                                     char** errmsg) {
  return Guarded(errmsg, [&]() -> loradb_status_t {
    if (retry_after_ms != nullptr) *retry_after_ms = 0;
    LORADB_C_CHECK_STORE(store);
    if (out == nullptr) return Fail(LORADB_INVALID_ARGUMENT, "out is NULL", errmsg);
    *out = nullptr;
    if (revisions == nullptr) return Fail(LORADB_INVALID_ARGUMENT, "revisions is NULL", errmsg);
    if (count == 0 || count > 65536) {
      return Fail(LORADB_INVALID_ARGUMENT,
                  absl::StrCat("a batch holds 1..65536 revisions, got ", count), errmsg);
    }
    LORADB_C_CHECK_TIERS(store);
    loradb::tiers::DeviceSlots* device = store->tiers->device();
    if (device == nullptr) {
      return Fail(LORADB_UNAVAILABLE,
                  "the store was opened without a device tier (see loradb_options_set_device)",
                  errmsg);
    }
    absl::StatusOr<loradb::tiers::DeviceBatchLease> lease =
        device->AcquireBatch(std::span<const uint64_t>(revisions, count));
    if (!lease.ok()) return ReportResidency(lease.status(), store, retry_after_ms, errmsg);
    auto handle = std::make_unique<loradb_batch_lease_t>();
    handle->store = store;
    handle->lease = *std::move(lease);
    store->leases.fetch_add(1);
    Registry().Add(handle.get());
    *out = handle.release();
    return LORADB_OK;
  });
}

size_t loradb_batch_size(const loradb_batch_lease_t* batch) {
  return BatchLive(batch) ? batch->lease.size() : 0;
}

loradb_status_t loradb_batch_adapter(const loradb_batch_lease_t* batch, size_t index,
                                     loradb_batch_adapter_t* out) {
  if (batch == nullptr || out == nullptr) return LORADB_INVALID_ARGUMENT;
  if (!BatchLive(batch)) return LORADB_INVALID_HANDLE;
  if (out->struct_size != sizeof(loradb_batch_adapter_t)) return LORADB_INVALID_ARGUMENT;
  if (index >= batch->lease.size()) return LORADB_OUT_OF_RANGE;
  const loradb::tiers::DeviceAdapter& a = batch->lease[index];
  const size_t size = out->struct_size;
  std::memset(out, 0, sizeof(*out));
  out->struct_size = size;
  out->revision = a.revision;
  out->slot = a.slot;
  out->tensor_count = a.tensors.size();
  out->bytes = a.bytes;
  out->pages = a.pages;
  out->device_pointers = batch->store->tiers->device()->backend().is_device() ? 1 : 0;
  return LORADB_OK;
}

loradb_status_t loradb_batch_find(const loradb_batch_lease_t* batch, uint64_t revision,
                                  size_t* index) {
  if (batch == nullptr || index == nullptr) return LORADB_INVALID_ARGUMENT;
  if (!BatchLive(batch)) return LORADB_INVALID_HANDLE;
  for (size_t i = 0; i < batch->lease.size(); ++i) {
    if (batch->lease[i].revision == revision) {
      *index = i;
      return LORADB_OK;
    }
  }
  return LORADB_NOT_FOUND;
}

loradb_status_t loradb_batch_tensor_at(const loradb_batch_lease_t* batch, size_t adapter_index,
                                       size_t tensor_index, loradb_tensor_view_t* view) {
  if (batch == nullptr || view == nullptr) return LORADB_INVALID_ARGUMENT;
  if (!BatchLive(batch)) return LORADB_INVALID_HANDLE;
  if (view->struct_size != sizeof(loradb_tensor_view_t)) return LORADB_INVALID_ARGUMENT;
  if (adapter_index >= batch->lease.size()) return LORADB_OUT_OF_RANGE;
  const loradb::tiers::DeviceAdapter& a = batch->lease[adapter_index];
  if (tensor_index >= a.tensors.size()) return LORADB_OUT_OF_RANGE;
  FillDeviceView(a.tensors[tensor_index], view);
  return LORADB_OK;
}

loradb_status_t loradb_batch_tensor_find(const loradb_batch_lease_t* batch, size_t adapter_index,
                                         const char* name, size_t name_len,
                                         loradb_tensor_view_t* view) {
  char** errmsg = nullptr;
  return Guarded(errmsg, [&]() -> loradb_status_t {
    if (batch == nullptr || view == nullptr) return LORADB_INVALID_ARGUMENT;
    if (!BatchLive(batch)) return LORADB_INVALID_HANDLE;
    if (view->struct_size != sizeof(loradb_tensor_view_t)) return LORADB_INVALID_ARGUMENT;
    std::string n;
    if (!ToString(name, name_len, &n)) return LORADB_INVALID_ARGUMENT;
    if (adapter_index >= batch->lease.size()) return LORADB_OUT_OF_RANGE;
    const loradb::tiers::DeviceTensor* t = batch->lease[adapter_index].Find(n);
    if (t == nullptr) return LORADB_NOT_FOUND;
    FillDeviceView(*t, view);
    return LORADB_OK;
  });
}

loradb_status_t loradb_batch_release(loradb_batch_lease_t** batch) {
  if (batch == nullptr) return LORADB_INVALID_ARGUMENT;
  if (*batch == nullptr) return LORADB_OK;
  if (!Registry().Remove(*batch)) return LORADB_INVALID_HANDLE;
  loradb_store_t* store = (*batch)->store;
  delete *batch;  // drops every pin of the batch
  store->leases.fetch_sub(1);
  *batch = nullptr;
  return LORADB_OK;
}

loradb_status_t loradb_prefetch(loradb_store_t* store, uint64_t revision, uint32_t* retry_after_ms,
                                char** errmsg) {
  return Guarded(errmsg, [&]() -> loradb_status_t {
    if (retry_after_ms != nullptr) *retry_after_ms = 0;
    LORADB_C_CHECK_STORE(store);
    LORADB_C_CHECK_TIERS(store);
    // Refuse unknown or deleted revisions here, so a typo is an error now rather than a
    // failed background load later.
    absl::StatusOr<loradb::RevisionRecord> rev = store->store->GetRevision(revision);
    if (!rev.ok()) return Report(rev.status(), errmsg);
    if (rev->state != loradb::RevisionState::kLive) {
      return Fail(LORADB_NOT_FOUND, absl::StrCat("revision ", revision, " is deleted"), errmsg);
    }
    return ReportResidency(store->tiers->cpu().Prefetch(revision), store, retry_after_ms, errmsg);
  });
}

loradb_status_t loradb_evict(loradb_store_t* store, uint64_t revision, loradb_tier_t tier,
                             char** errmsg) {
  return Guarded(errmsg, [&]() -> loradb_status_t {
    LORADB_C_CHECK_STORE(store);
    const std::optional<Tier> t = FromCEnum(tier, kTiers);
    if (t != Tier::kCpu && t != Tier::kGpu) {
      return Fail(LORADB_INVALID_ARGUMENT, "evict from LORADB_TIER_CPU or LORADB_TIER_GPU", errmsg);
    }
    LORADB_C_CHECK_TIERS(store);
    if (t == Tier::kCpu) return Report(store->tiers->cpu().Evict(revision), errmsg);
    loradb::tiers::DeviceSlots* device = store->tiers->device();
    if (device == nullptr) {
      return Fail(LORADB_UNAVAILABLE, "the store was opened without a device tier", errmsg);
    }
    return Report(device->Evict(revision), errmsg);
  });
}

}  // extern "C"

namespace {

// The full (current-version) stats of `t` (nullptr: no tiers, all zero).
void FillStats(loradb::tiers::StoreTiers* t, loradb_stats_t* o) {
  o->tp_degree = 1;
  if (t == nullptr) return;
  o->tiers = 1;
  const loradb::tiers::CpuCacheStats c = t->cpu().stats();
  o->cpu_budget_bytes = t->cpu().options().budget_bytes;
  o->cpu_hits = c.hits;
  o->cpu_misses = c.misses;
  o->cpu_loads = c.loads;
  o->cpu_load_failures = c.load_failures;
  o->cpu_joined = c.joined_waiters;
  o->cpu_rejections = c.rejections;
  o->cpu_negative_hits = c.negative_hits;
  o->cpu_prefetches = c.prefetches;
  o->cpu_evictions = c.evictions;
  o->cpu_bytes_in = c.bytes_in;
  o->cpu_bytes_out = c.bytes_out;
  o->cpu_resident_bytes = c.resident_bytes;
  o->cpu_resident_entries = c.resident_entries;
  o->cpu_leased_bytes = c.leased_bytes;
  o->cpu_inflight_loads = c.inflight_loads;
  o->cpu_queued_loads = c.queued_loads;
  o->cpu_load_p50_us = Micros(c.load_latency.Quantile(0.5));
  o->cpu_load_p99_us = Micros(c.load_latency.Quantile(0.99));
  o->cpu_pooled_bytes = c.pooled_bytes;
  o->cpu_pool_cap_bytes = c.pool_cap_bytes;
  o->tp_rank = static_cast<uint32_t>(t->tp().rank);
  o->tp_degree = static_cast<uint32_t>(t->tp().degree);
  o->tp_derived = t->tp_derived() ? 1 : 0;
  std::snprintf(o->eviction, sizeof(o->eviction), "%s",
                loradb::tiers::EvictionPolicyName(t->cpu().options().policy));
  const loradb::tiers::LoaderStats l = t->loader().stats();
  o->loader = l.backend == loradb::tiers::LoaderBackend::kIoUring ? LORADB_LOADER_IO_URING
                                                                  : LORADB_LOADER_PREAD;
  o->loader_io_uring_errno = l.io_uring_init_errno;
  o->loader_files = l.files;
  o->loader_bytes = l.bytes;
  o->loader_checksum_failures = l.checksum_failures;
  o->loader_read_errors = l.read_errors;
  loradb::tiers::DeviceSlots* device = t->device();
  if (device == nullptr) return;
  const loradb::tiers::DeviceSlotsStats d = device->stats();
  o->device = device->backend().is_device() ? LORADB_DEVICE_CUDA : LORADB_DEVICE_HOST;
  o->device_batches = d.batches;
  o->device_batch_failures = d.batch_failures;
  o->device_hits = d.hits;
  o->device_misses = d.misses;
  o->device_evictions = d.evictions;
  o->device_bytes_copied = d.bytes_copied;
  o->device_resident_adapters = d.resident_adapters;
  o->device_leased_adapters = d.leased_adapters;
  o->device_arena_bytes = device->options().arena_bytes;
  o->device_page_bytes = device->options().page_bytes;
  o->device_pages_total = d.pages_total;
  o->device_pages_free = d.pages_free;
  o->device_largest_free_run = d.largest_free_run;
  o->device_payload_bytes = d.payload_bytes;
  o->device_page_waste_bytes = d.page_waste_bytes;
  o->device_fragmentation = d.fragmentation;
}

}  // namespace

extern "C" {

loradb_status_t loradb_stats(loradb_store_t* store, loradb_stats_t* out, char** errmsg) {
  return Guarded(errmsg, [&]() -> loradb_status_t {
    LORADB_C_CHECK_STORE(store);
    LORADB_C_CHECK_GROWN_STRUCT(out, loradb_stats_t, LORADB_STATS_V1_SIZE);
    loradb_stats_t full{};
    FillStats(store->tiers, &full);
    CopyOut(full, out);
    return LORADB_OK;
  });
}

// ---- checkpoints

loradb_status_t loradb_checkpoint_put(loradb_store_t* store, const char* policy, size_t policy_len,
                                      uint64_t step, uint64_t parent, const loradb_tensor_t* master,
                                      size_t master_count, const loradb_tensor_t* optimizer,
                                      size_t optimizer_count, const loradb_tensor_t* gradients,
                                      size_t gradients_count, const char* scheduler_name,
                                      size_t scheduler_name_len, int64_t scheduler_position,
                                      const void* rng_state, size_t rng_state_len,
                                      const void* rollout, size_t rollout_len,
                                      loradb_checkpoint_info_t* out, char** errmsg) {
  return Guarded(errmsg, [&]() -> loradb_status_t {
    LORADB_C_CHECK_STORE(store);
    LORADB_C_STRING(p, policy, policy_len, "policy");
    LORADB_C_STRING(sched, scheduler_name, scheduler_name_len, "scheduler_name");
    if (out != nullptr) LORADB_C_CHECK_STRUCT(out, loradb_checkpoint_info_t);
    if (master_count == 0) {
      return Fail(LORADB_INVALID_ARGUMENT, "a checkpoint needs master tensors", errmsg);
    }
    if ((rng_state == nullptr && rng_state_len > 0) || (rollout == nullptr && rollout_len > 0)) {
      return Fail(LORADB_INVALID_ARGUMENT, "rng_state/rollout is NULL with a non-zero length",
                  errmsg);
    }
    loradb::CheckpointParts parts;
    absl::Status st = ToViews(master, master_count, "master", &parts.master);
    if (st.ok()) st = ToViews(optimizer, optimizer_count, "optimizer", &parts.optimizer);
    if (st.ok()) st = ToViews(gradients, gradients_count, "gradients", &parts.gradients);
    if (!st.ok()) return Report(st, errmsg);
    parts.scheduler_name = sched;
    parts.scheduler_position = scheduler_position;
    if (rng_state_len > 0)
      parts.rng_state.assign(static_cast<const char*>(rng_state), rng_state_len);
    if (rollout_len > 0) parts.rollout.assign(static_cast<const char*>(rollout), rollout_len);
    absl::StatusOr<loradb::CheckpointRecord> c =
        store->store->PutCheckpoint(p, step, parent, parts);
    if (!c.ok()) return Report(c.status(), errmsg);
    if (out != nullptr) FillCheckpoint(*c, out);
    return LORADB_OK;
  });
}

loradb_status_t loradb_checkpoint_get(loradb_store_t* store, uint64_t id,
                                      loradb_checkpoint_info_t* out, char** errmsg) {
  return Guarded(errmsg, [&]() -> loradb_status_t {
    LORADB_C_CHECK_STORE(store);
    LORADB_C_CHECK_STRUCT(out, loradb_checkpoint_info_t);
    absl::StatusOr<loradb::CheckpointRecord> c = store->store->GetCheckpoint(id);
    if (!c.ok()) return Report(c.status(), errmsg);
    FillCheckpoint(*c, out);
    return LORADB_OK;
  });
}

// ---- verification

loradb_status_t loradb_verify(loradb_store_t* store, int* ok, char** report_json,
                              size_t* report_json_len, char** errmsg) {
  return Guarded(errmsg, [&]() -> loradb_status_t {
    LORADB_C_CHECK_STORE(store);
    if (ok == nullptr) return Fail(LORADB_INVALID_ARGUMENT, "ok is NULL", errmsg);
    absl::StatusOr<loradb::StoreVerifyReport> rep = loradb::VerifyOpenStore(*store->store);
    if (!rep.ok()) return Report(rep.status(), errmsg);
    *ok = rep->ok() ? 1 : 0;
    if (report_json != nullptr) {
      nlohmann::json j = {{"ok", rep->ok()},
                          {"problems", rep->problems},
                          {"reclaimable", rep->reclaimable},
                          {"blobs_checked", rep->blobs_checked},
                          {"bytes_checked", rep->bytes_checked}};
      return ReturnJson(j, report_json, report_json_len);
    }
    return LORADB_OK;
  });
}

}  // extern "C"
