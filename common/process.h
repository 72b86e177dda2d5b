// Spawning, signalling and reaping child processes (the agent's actors, `shardline up`'s daemons).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace shardline {

struct SpawnOptions {
  std::vector<std::string> argv;  // argv[0] is the program's path
  std::vector<std::pair<std::string, std::string>> extra_env;  // added to, or replacing, ours
  // The child gets SIGKILL when the spawning thread's process dies, so a killed parent leaves
  // no orphans behind (Linux PR_SET_PDEATHSIG).
  bool die_with_parent = true;
  // Where the child's stdout/stderr go; empty inherits the parent's.
  std::string log_path;
};

struct ExitStatus {
  bool signaled = false;
  int code = 0;  // exit code, or the signal number when `signaled`
  bool success() const { return !signaled && code == 0; }
  std::string Describe() const;  // "exit code 3", "killed by signal 9 (Killed)"
};

// The CPUs this process may run on (its affinity mask; 1 if it cannot be read).
int UsableCpus();

// Forks and execs `options.argv`. Returns the child's pid.
absl::StatusOr<pid_t> Spawn(const SpawnOptions& options);

// Reaps `pid` if it has exited, without blocking. nullopt while it runs.
absl::StatusOr<std::optional<ExitStatus>> TryReap(pid_t pid);

// Waits up to `timeout` for `pid` to exit and reaps it; nullopt if it is still running.
absl::StatusOr<std::optional<ExitStatus>> WaitFor(pid_t pid, std::chrono::milliseconds timeout);

// Sends SIGTERM, waits up to `grace`, then SIGKILL, and reaps the child.
ExitStatus Terminate(pid_t pid, std::chrono::milliseconds grace);

// Path of the running executable, for re-executing ourselves as another subcommand.
std::string SelfExecutable();

}  // namespace shardline
