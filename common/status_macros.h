// RETURN_IF_ERROR / ASSIGN_OR_RETURN: Debian's Abseil (20220623) predates Abseil's own versions.
#pragma once

#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define SHARDLINE_CONCAT_INNER(a, b) a##b
#define SHARDLINE_CONCAT(a, b) SHARDLINE_CONCAT_INNER(a, b)

#define RETURN_IF_ERROR(expr)                       \
  do {                                              \
    ::absl::Status shardline_status_ = (expr);      \
    if (!shardline_status_.ok()) return shardline_status_; \
  } while (0)

#define ASSIGN_OR_RETURN(lhs, expr) \
  ASSIGN_OR_RETURN_IMPL(SHARDLINE_CONCAT(shardline_statusor_, __LINE__), lhs, expr)

#define ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                          \
  if (!tmp.ok()) return tmp.status();         \
  lhs = std::move(tmp).value()

namespace shardline {

// Returns `status` with "context: " put before its message, keeping its code.
inline absl::Status Annotate(const absl::Status& status, std::string_view context) {
  if (status.ok()) return status;
  return absl::Status(status.code(), std::string(context) + ": " + std::string(status.message()));
}

// Abseil 20220623 has its own string_view; this converts without surprises.
inline std::string ToString(absl::string_view s) { return std::string(s.data(), s.size()); }

}  // namespace shardline
