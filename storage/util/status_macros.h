// Status propagation helpers shared by every loradb layer above kernels/.
#ifndef LORADB_STORAGE_UTIL_STATUS_MACROS_H_
#define LORADB_STORAGE_UTIL_STATUS_MACROS_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define LORADB_CONCAT_INNER_(a, b) a##b
#define LORADB_CONCAT_(a, b) LORADB_CONCAT_INNER_(a, b)

// Returns from the enclosing function if `expr` (an absl::Status) is not OK.
#define LORADB_RETURN_IF_ERROR(expr)                 \
  do {                                               \
    ::absl::Status _loradb_status = (expr);          \
    if (!_loradb_status.ok()) return _loradb_status; \
  } while (0)

// `lhs = value of rexpr` (an absl::StatusOr<T>), or returns its error.
#define LORADB_ASSIGN_OR_RETURN(lhs, rexpr) \
  LORADB_ASSIGN_OR_RETURN_IMPL_(LORADB_CONCAT_(_loradb_statusor_, __LINE__), lhs, rexpr)
#define LORADB_ASSIGN_OR_RETURN_IMPL_(var, lhs, rexpr) \
  auto var = (rexpr);                                  \
  if (!var.ok()) return std::move(var).status();       \
  lhs = std::move(var).value()

#endif  // LORADB_STORAGE_UTIL_STATUS_MACROS_H_
