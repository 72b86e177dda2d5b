// For tests that run the built `shardline` binary as a process: where it is, a fresh temporary
// folder, and a file's whole text (a run's log).
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

namespace shardline::test_support {

// $SHARDLINE_BINARY when set, else the SHARDLINE_BINARY_PATH the test target was compiled with.
inline std::string ShardlineBinary() {
  const char* path = std::getenv("SHARDLINE_BINARY");
  return path != nullptr ? path : SHARDLINE_BINARY_PATH;
}

inline std::string MakeTestDir(const std::string& prefix) {
  std::string pattern = ::testing::TempDir() + "/" + prefix + "_XXXXXX";
  EXPECT_NE(::mkdtemp(pattern.data()), nullptr);
  return pattern;
}

inline std::string ReadWholeFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

}  // namespace shardline::test_support
