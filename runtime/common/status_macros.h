// Early-return helpers for absl::Status / absl::StatusOr.
#ifndef PAGEDSERVE_RUNTIME_COMMON_STATUS_MACROS_H_
#define PAGEDSERVE_RUNTIME_COMMON_STATUS_MACROS_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"

// Returns the status of `expr` from the current function when it is not OK.
#define PS_RETURN_IF_ERROR(expr)                                               \
  do {                                                                         \
    if (absl::Status ps_status_ = (expr); !ps_status_.ok()) return ps_status_; \
  } while (0)

#define PS_CONCAT_INNER_(a, b) a##b
#define PS_CONCAT_(a, b) PS_CONCAT_INNER_(a, b)

// `PS_ASSIGN_OR_RETURN(auto x, MakeX());` assigns the value or returns the error.
#define PS_ASSIGN_OR_RETURN(lhs, expr) \
  PS_ASSIGN_OR_RETURN_IMPL_(PS_CONCAT_(ps_statusor_, __LINE__), lhs, expr)
#define PS_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                              \
  if (!tmp.ok()) return tmp.status();             \
  lhs = std::move(tmp).value()

#endif  // PAGEDSERVE_RUNTIME_COMMON_STATUS_MACROS_H_
