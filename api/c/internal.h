// What every file of the C API (loradb.h) shares: the handle structs, the registry of live
// handles, the conversion of absl::Status into loradb_status_t plus an allocated message, the
// argument checks, and the enum tables. Not installed; only api/c/*.cc include it.
//
// Each entry point converts its arguments, calls the C++ API and reports the status. No C++
// exception crosses the boundary: entry points that can throw run inside Guarded, which reports
// LORADB_INTERNAL (std::bad_alloc included).
#ifndef LORADB_API_C_INTERNAL_H_
#define LORADB_API_C_INTERNAL_H_

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <new>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <type_traits>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "api/c/loradb.h"
#include "storage/formats/tensor.h"
#include "storage/store/store.h"
#include "storage/store/store_tiers.h"
#include "storage/util/mutex.h"

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

namespace loradb::capi {

// Live handles of every kind; a destroyed handle is removed, so a stale copy is detected
// (unless the allocator reused the address for a new handle of the same kind).
class HandleRegistry {
 public:
  void Add(const void* p) {
    MutexLock lock(&mu_);
    live_.insert(p);
  }
  bool Remove(const void* p) {
    MutexLock lock(&mu_);
    return live_.erase(p) == 1;
  }
  bool Contains(const void* p) const {
    MutexLock lock(&mu_);
    return live_.contains(p);
  }

 private:
  mutable Mutex mu_;
  absl::flat_hash_set<const void*> live_ ABSL_GUARDED_BY(mu_);
};

// The one registry of the process (never destroyed, so handles may outlive static teardown).
HandleRegistry& Registry();

// A malloc'ed, NUL-terminated copy of `s` the caller frees with loradb_free; nullptr when out
// of memory.
char* CopyString(const std::string& s);

loradb_status_t CodeFor(absl::StatusCode code);

// Reports `status` through `errmsg` (when given) and returns its code.
loradb_status_t Report(const absl::Status& status, char** errmsg);

// Reports `message` through `errmsg` (when given) and returns `code`.
loradb_status_t Fail(loradb_status_t code, const std::string& message, char** errmsg);

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
bool ToString(const char* p, size_t len, std::string* out);

// Returns `j` as compact JSON text in *json (the caller frees it with loradb_free).
loradb_status_t ReturnJson(const nlohmann::json& j, char** json, size_t* json_len);

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

inline constexpr EnumTable<DType, 15> kDTypes = {{
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

inline constexpr EnumTable<tiers::LoaderBackend, 3> kLoaders = {{
    {LORADB_LOADER_AUTO, tiers::LoaderBackend::kAuto},
    {LORADB_LOADER_IO_URING, tiers::LoaderBackend::kIoUring},
    {LORADB_LOADER_PREAD, tiers::LoaderBackend::kPread},
}};

inline constexpr EnumTable<tiers::DeviceKind, 4> kDevices = {{
    {LORADB_DEVICE_NONE, tiers::DeviceKind::kNone},
    {LORADB_DEVICE_HOST, tiers::DeviceKind::kHost},
    {LORADB_DEVICE_CUDA, tiers::DeviceKind::kCuda},
    {LORADB_DEVICE_AUTO, tiers::DeviceKind::kAuto},
}};

inline constexpr EnumTable<Tier, 3> kTiers = {{
    {LORADB_TIER_STORAGE, Tier::kStorage},
    {LORADB_TIER_CPU, Tier::kCpu},
    {LORADB_TIER_GPU, Tier::kGpu},
}};

// A struct the library fills that grew: its current size or the earlier one(s) in `accepted`.
// The library builds the whole current struct and copies the caller's struct_size bytes of it.
template <typename T>
bool AcceptedSize(size_t size, std::initializer_list<size_t> accepted) {
  if (size == sizeof(T)) return true;
  return std::find(accepted.begin(), accepted.end(), size) != accepted.end();
}

// Zeroes `*out` but keeps its struct_size.
template <typename T>
void ClearKeepingSize(T* out) {
  const size_t size = out->struct_size;
  std::memset(static_cast<void*>(out), 0, sizeof(*out));
  out->struct_size = size;
}

template <typename T>
void CopyOut(const T& full, T* out) {
  const size_t size = out->struct_size;
  std::memcpy(static_cast<void*>(out), &full, std::min(size, sizeof(T)));
  out->struct_size = size;
}

// Fills `view` (whose struct_size the caller checked) with `t`, a TensorView (host memory) or a
// tiers::DeviceTensor (device slot memory); the view points into `t`.
template <typename Tensor>
void FillView(const Tensor& t, loradb_tensor_view_t* view) {
  ClearKeepingSize(view);
  view->name = t.name.data();
  view->name_len = t.name.size();
  view->dtype = ToCEnum<loradb_dtype_t>(t.dtype, kDTypes);
  view->shape = t.shape.data();
  view->ndim = t.shape.size();
  view->data = t.data;
  view->nbytes = t.nbytes;
}

}  // namespace loradb::capi

// The argument checks below return from the enclosing entry point, reporting through its
// `errmsg`.

// Declares std::string `var` holding (ptr, len); a NULL `ptr` with a non-zero `len` is refused.
#define LORADB_C_STRING(var, ptr, len, what)                                                    \
  std::string var;                                                                              \
  if (!::loradb::capi::ToString(ptr, len, &var)) {                                              \
    return ::loradb::capi::Fail(LORADB_INVALID_ARGUMENT,                                        \
                                absl::StrCat(what, " is NULL with a non-zero length"), errmsg); \
  }

// Checks a store handle: NULL -> INVALID_ARGUMENT, unknown/closed -> INVALID_HANDLE.
#define LORADB_C_CHECK_STORE(h)                                                             \
  do {                                                                                      \
    if ((h) == nullptr) {                                                                   \
      return ::loradb::capi::Fail(LORADB_INVALID_ARGUMENT, "store handle is NULL", errmsg); \
    }                                                                                       \
    if (!::loradb::capi::Registry().Contains(h)) {                                          \
      return ::loradb::capi::Fail(LORADB_INVALID_HANDLE,                                    \
                                  "store handle is closed or was never opened", errmsg);    \
    }                                                                                       \
  } while (0)

// Checks a caller struct: not NULL, and its struct_size is this library's sizeof(type).
#define LORADB_C_CHECK_STRUCT(p, type)                                                            \
  do {                                                                                            \
    if ((p) == nullptr) {                                                                         \
      return ::loradb::capi::Fail(LORADB_INVALID_ARGUMENT, #p " is NULL", errmsg);                \
    }                                                                                             \
    if ((p)->struct_size != sizeof(type)) {                                                       \
      return ::loradb::capi::Fail(LORADB_INVALID_ARGUMENT,                                        \
                                  absl::StrCat(#p "->struct_size is ", (p)->struct_size,          \
                                               ", expected sizeof(", #type ") = ", sizeof(type)), \
                                  errmsg);                                                        \
    }                                                                                             \
  } while (0)

// Checks a struct the library fills that grew: struct_size is sizeof(type) or `v1_size`.
#define LORADB_C_CHECK_GROWN_STRUCT(p, type, v1_size)                                            \
  do {                                                                                           \
    if ((p) == nullptr) {                                                                        \
      return ::loradb::capi::Fail(LORADB_INVALID_ARGUMENT, #p " is NULL", errmsg);               \
    }                                                                                            \
    if (!::loradb::capi::AcceptedSize<type>((p)->struct_size, {static_cast<size_t>(v1_size)})) { \
      return ::loradb::capi::Fail(                                                               \
          LORADB_INVALID_ARGUMENT,                                                               \
          absl::StrCat(#p "->struct_size is ", (p)->struct_size, ", expected sizeof(",           \
                       #type ") = ", sizeof(type), " or " #v1_size " = ", v1_size),              \
          errmsg);                                                                               \
    }                                                                                            \
  } while (0)

#endif  // LORADB_API_C_INTERNAL_H_
