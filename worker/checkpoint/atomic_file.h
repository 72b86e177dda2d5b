// Crash-safe file replacement, shared by every checkpoint file we write.
#pragma once

#include <cstddef>
#include <span>
#include <string>

#include "absl/status/status.h"

namespace shardline::checkpoint {

// Writes the concatenation of `parts` to `path` through a temporary file in the same directory,
// fsync, rename and a directory fsync: afterwards `path` is the old file or the whole new one,
// even across a crash, and a failure leaves no temporary behind. Errors name the path and call.
absl::Status WriteFileAtomically(const std::string& path,
                                 std::span<const std::span<const std::byte>> parts);

}  // namespace shardline::checkpoint
