// Debian's Abseil (20220623) has its own absl::string_view, which absl::StrCat takes and
// std::string_view does not convert to implicitly.
#pragma once

#include <string_view>

#include "absl/strings/string_view.h"

namespace shardline::placement {

inline absl::string_view AbslView(std::string_view s) {
  return absl::string_view(s.data(), s.size());
}

}  // namespace shardline::placement
