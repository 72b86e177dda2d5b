// One place that sets up spdlog for every binary: a component name and a level.
#pragma once

#include <string>

#include "absl/status/status.h"

namespace shardline {

// Sets the default logger to stderr, "[component] message", at `level`
// (trace, debug, info, warn, error, off). Bad levels are an InvalidArgument.
absl::Status InitLogging(const std::string& component, const std::string& level);

}  // namespace shardline
