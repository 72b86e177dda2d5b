// For tests that run the built `shardline` binary as a process: where it is, a fresh temporary
// folder (removed when the test process exits), a file's whole text (a run's log), and a run of
// the binary to its end (RunShardline: the test links shardline_common).
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include "common/process.h"

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

// What a run of the binary printed and how it ended.
struct CommandResult {
  int exit_code = -1;  // -1: killed by a signal, not started, or past its deadline
  std::string out;     // stdout and stderr together
};

// Runs `shardline ARGS` to its end, at most `deadline` (then it is stopped and the result says
// so), its output through `log` (a file it overwrites).
inline CommandResult RunShardline(const std::vector<std::string>& args, const std::string& log,
                                  std::chrono::seconds deadline = std::chrono::seconds(60)) {
  SpawnOptions spawn;
  spawn.argv = {ShardlineBinary()};
  spawn.argv.insert(spawn.argv.end(), args.begin(), args.end());
  spawn.log_path = log;
  CommandResult run;
  absl::StatusOr<pid_t> pid = Spawn(spawn);
  if (!pid.ok()) {
    run.out = std::string(pid.status().message());
    return run;
  }
  absl::StatusOr<std::optional<ExitStatus>> exit = WaitFor(*pid, deadline);
  if (!exit.ok() || !exit->has_value()) {
    Terminate(*pid, std::chrono::seconds(1));
    run.out =
        "did not finish within " + std::to_string(deadline.count()) + " s: " + ReadWholeFile(log);
    return run;
  }
  run.exit_code = (*exit)->signaled ? -1 : (*exit)->code;
  run.out = ReadWholeFile(log);
  return run;
}

}  // namespace shardline::test_support
