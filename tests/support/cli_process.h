// For tests that run the built `shardline` binary as a process: where it is, a fresh temporary
// folder (removed when the test process exits), a file's whole text (a run's log), and a run of
// the binary to its end and `shardline serve` up to its URL (RunShardline, StartServe: the test
// links shardline_common).
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
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

// Starts `shardline serve ARGS` (give it --listen 127.0.0.1:0), its output through `log`, and
// waits at most 60 s for the URL it prints; returns that port, with the process in `pid`. 0 (a
// test failure added, saying why: the spawn's error, the exit and the log, or the deadline) when
// there is none; `pid` is -1 then unless it is still running.
inline int StartServe(const std::vector<std::string>& args, const std::string& log, pid_t& pid) {
  SpawnOptions spawn;
  spawn.argv = {ShardlineBinary(), "serve"};
  spawn.argv.insert(spawn.argv.end(), args.begin(), args.end());
  spawn.log_path = log;
  pid = -1;
  absl::StatusOr<pid_t> started = Spawn(spawn);
  if (!started.ok()) {
    ADD_FAILURE() << started.status();
    return 0;
  }
  pid = *started;
  const std::regex url("at http://127\\.0\\.0\\.1:([0-9]+)/v1");
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (std::chrono::steady_clock::now() < deadline) {
    std::smatch m;
    const std::string out = ReadWholeFile(log);
    if (std::regex_search(out, m, url)) return std::stoi(m[1]);
    auto exit = TryReap(pid);
    if (exit.ok() && exit->has_value()) {
      pid = -1;
      ADD_FAILURE() << "serve exited (" << (*exit)->Describe() << "): " << out;
      return 0;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ADD_FAILURE() << "serve printed no URL within 60 s: " << ReadWholeFile(log);
  return 0;
}

// What a run of the binary printed and how it ended.
struct CommandResult {
  int exit_code = -1;  // -1: killed by a signal, not started, or past its deadline
  std::string out;     // stdout and stderr together
};

// Runs `shardline ARGS` to its end, at most `deadline` (then it is stopped and the result says
// so), its output through `log` (a file it overwrites).
inline CommandResult RunShardline(
    const std::vector<std::string>& args, const std::string& log,
    std::chrono::seconds deadline = std::chrono::seconds(60),
    const std::vector<std::pair<std::string, std::string>>& env = {}) {
  SpawnOptions spawn;
  spawn.extra_env = env;
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
