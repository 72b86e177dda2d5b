// For tests that run the built `shardline` binary as a process: where it is, a fresh temporary
// folder (removed when the test process exits), and a file's whole text (a run's log).
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

namespace shardline::test_support {

// $SHARDLINE_BINARY when set, else the SHARDLINE_BINARY_PATH the test target was compiled with.
inline std::string ShardlineBinary() {
  const char* path = std::getenv("SHARDLINE_BINARY");
  return path != nullptr ? path : SHARDLINE_BINARY_PATH;
}

// The folders MakeTestDir made, removed when the process that made them exits (a forked child
// that exits leaves them). A failing test prints its logs before then.
class TestDirs {
 public:
  static TestDirs& Get() {
    static TestDirs dirs;
    return dirs;
  }
  void Add(const std::string& dir) {
    std::lock_guard<std::mutex> lock(mu_);
    dirs_.push_back(dir);
  }
  ~TestDirs() {
    if (::getpid() != owner_) return;
    std::error_code ignored;
    for (const std::string& dir : dirs_) std::filesystem::remove_all(dir, ignored);
  }

 private:
  TestDirs() = default;
  const pid_t owner_ = ::getpid();
  std::mutex mu_;
  std::vector<std::string> dirs_;
};

inline std::string MakeTestDir(const std::string& prefix) {
  std::string pattern = ::testing::TempDir() + "/" + prefix + "_XXXXXX";
  const bool made = ::mkdtemp(pattern.data()) != nullptr;
  EXPECT_TRUE(made) << pattern;
  if (made) TestDirs::Get().Add(pattern);
  return pattern;
}

inline std::string ReadWholeFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

}  // namespace shardline::test_support
