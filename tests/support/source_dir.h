// The repository root for unit tests that read files from it (examples/): $SHARDLINE_SOURCE_DIR
// when set, else the SHARDLINE_SOURCE_DIR_DEFAULT the test target was compiled with.
#pragma once

#include <cstdlib>
#include <string>

namespace shardline::test_support {

inline std::string SourceDir() {
  if (const char* dir = std::getenv("SHARDLINE_SOURCE_DIR"); dir != nullptr && *dir != '\0') {
    return dir;
  }
  return SHARDLINE_SOURCE_DIR_DEFAULT;
}

}  // namespace shardline::test_support
